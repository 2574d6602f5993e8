"""specproxy: an OpenAI-compatible proxy that routes each request to the fastest way to decode."""

__version__ = "0.1.0"
