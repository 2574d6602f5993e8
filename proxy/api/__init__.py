"""The OpenAI-compatible HTTP API: validation, routing hand-off, relay and errors."""
