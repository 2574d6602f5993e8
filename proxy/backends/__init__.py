"""Backends: llama-server processes, their command lines, model checks and supervision."""
