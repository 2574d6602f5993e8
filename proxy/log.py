"""Structured logging: JSON lines when not on a terminal, readable console output otherwise."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from proxy.config import LogFormat


def configure_logging(fmt: LogFormat = "auto", level: str = "info") -> None:
    """Set up structlog once for the whole process, writing to stderr."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> Any:
    """A logger bound to a component name."""
    return structlog.get_logger(name)
