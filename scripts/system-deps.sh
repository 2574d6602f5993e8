#!/usr/bin/env bash
# Installs, once, the Debian packages a purpose needs, only those missing:
#   serve  what building and running llama-server needs (cmake, g++, ninja, ccache, patch)
#   test   that, and what the tests drive: Prometheus, podman, runc, debootstrap and buildah for
#          the container image tests, chromium for the status page, Node.js and npm for the agents
# Without apt-get it installs nothing: it names what is missing and fails until it is there
# (building llama-server needs cmake, a C++ compiler, ninja or make, and GNU patch).
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
  # No apt: nothing is installed, only what is missing named. Building llama-server needs cmake,
  # a C++ compiler, ninja or make, and GNU patch (its patches use GNU options); ccache only
  # speeds up rebuilds. A llama-server of your own (SPECPROXY_LLAMA_SERVER) is no way around
  # them with the default config: its shared engine needs specproxy's patched build.
  has() { command -v "$1" >/dev/null 2>&1; }
  missing=()
  has cmake || missing+=(cmake)
  has c++ || has g++ || has clang++ || missing+=("a C++ compiler (g++ or clang++)")
  has ninja || has make || missing+=("ninja or make")
  case "$(patch --version 2>/dev/null)" in
    *"GNU patch"*) ;;
    *) missing+=("GNU patch") ;;
  esac
  if [ "$purpose" = test ]; then
    for tool in prometheus podman runc debootstrap node npm; do
      has "$tool" || missing+=("$tool")
    done
    has chromium || has chromium-browser || missing+=(chromium)
  fi
  [ ${#missing[@]} -eq 0 ] && exit 0
  echo "specproxy: no apt-get here; please install: ${missing[*]}" >&2
  echo "  (then run make again; ccache is optional)" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "[specproxy] installing Debian packages for $purpose: ${need[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
