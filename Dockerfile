# specproxy with a llama-server built from the pinned llama.cpp (CPU). For CUDA, build your own
# llama-server and set SPECPROXY_LLAMA_SERVER; mount a config with your models.
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends cmake g++ ninja-build ccache \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip install --no-cache-dir .
ENV XDG_CACHE_HOME=/cache
# Builds llama-server and fetches the default models into the image's cache (about 15 minutes).
RUN specproxy provision
EXPOSE 8080
# Inside a container the proxy must listen beyond loopback: publish the port only to networks you trust.
CMD ["specproxy", "serve", "--host", "0.0.0.0"]
