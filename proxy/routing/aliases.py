"""Model aliases: the model names clients insist on, mapped to auto, auto-<task> or a backend."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

_GLOB_CHARS = frozenset("*?[")


def is_pattern(name: str) -> bool:
    """Whether an alias key is a glob pattern (`claude-*`) rather than an exact name."""
    return any(c in _GLOB_CHARS for c in name)


class ModelAliases:
    """Exact names first, then glob patterns in the order the config lists them."""

    def __init__(self, aliases: Mapping[str, str]) -> None:
        self.exact = {name: target for name, target in aliases.items() if not is_pattern(name)}
        self.patterns = [(name, target) for name, target in aliases.items() if is_pattern(name)]

    def resolve(self, model: str) -> str | None:
        """The target for model, or None when no alias matches it."""
        target = self.exact.get(model)
        if target is not None:
            return target
        for pattern, target in self.patterns:
            # Case-sensitive on every platform: model ids are.
            if fnmatch.fnmatchcase(model, pattern):
                return target
        return None
