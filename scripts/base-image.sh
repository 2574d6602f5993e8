#!/usr/bin/env bash
# Makes localhost/debian:bookworm from Debian's own packages, for hosts that reach no image registry.
# Usage: scripts/base-image.sh [image] ; the mirror is the one apt already uses (or $DEBIAN_MIRROR).
set -euo pipefail
image="${1:-localhost/debian:bookworm}"
if podman image exists "$image"; then
  exit 0
fi
mirror="${DEBIAN_MIRROR:-$( (grep -rhE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true) \
  | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n1 | tr -d ' ')}"
mirror="${mirror:-http://deb.debian.org/debian}"
rootfs="$(mktemp -d /var/tmp/specproxy-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
echo "[specproxy] debootstrapping bookworm from $mirror into $image (about a minute)" >&2
# ca-certificates is included here so that a build which mounts the host's CA bundle over
# /etc/ssl/certs/ca-certificates.crt never has to (re)install the package under that mount.
nice -n 19 debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" "$mirror" >/dev/null
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | podman import --quiet --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
echo "[specproxy] $image: $(podman image inspect --format '{{.Size}}' "$image") bytes" >&2
