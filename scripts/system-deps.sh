#!/usr/bin/env bash
# Installs, once, the Debian packages a purpose needs, only those missing:
#   serve  what building and running llama-server needs (cmake, g++, ninja, ccache, patch)
#   test   that, and what the tests drive: Prometheus, podman, runc, debootstrap and buildah for
#          the container image tests, chromium for the status page, Node.js and npm for the agents
set -euo pipefail
purpose="${1:-serve}"
pairs=(cmake:cmake g++:g++ ninja:ninja-build ccache:ccache patch:patch)
case "$purpose" in
  serve) ;;
  test) pairs+=(prometheus:prometheus podman:podman runc:runc debootstrap:debootstrap
                chromium:chromium node:nodejs npm:npm) ;;
  *) echo "usage: $0 serve|test" >&2; exit 2 ;;
esac
need=()
for pair in "${pairs[@]}"; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair##*:}")
done
[ ${#need[@]} -eq 0 ] && exit 0
# podman's own helpers, as installed where the image tests were first run (networking, ids).
for pkg in "${need[@]}"; do
  [ "$pkg" = podman ] && need+=(buildah netavark aardvark-dns uidmap slirp4netns fuse-overlayfs)
done
if ! command -v apt-get >/dev/null 2>&1; then
  echo "specproxy: please install: ${need[*]} (or set SPECPROXY_LLAMA_SERVER to your llama-server)" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "[specproxy] installing Debian packages for $purpose: ${need[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
