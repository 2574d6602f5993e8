"""The names a generated file offers for instructions to point at."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Symbols:
    """Names in a file that instructions can point at."""

    functions: tuple[str, ...]
    constants: tuple[tuple[str, str], ...]
    classes: tuple[str, ...]


_PY_DEF = re.compile(r"^\s*def (\w+)\(", re.M)
_PY_CLASS = re.compile(r"^class (\w+)", re.M)
_JS_FUNC = re.compile(r"^export (?:async )?function\*? ?(\w+)\(", re.M)
_NUM_CONST = re.compile(r"^(?:export )?(?:const )?([A-Z][A-Z0-9_]+) = ([0-9][0-9_.]*);?$", re.M)


def symbols(path: str, text: str) -> Symbols:
    """Public functions, numeric module constants and classes of a Python or JS file."""
    if path.endswith(".py"):
        functions = [f for f in _PY_DEF.findall(text) if not f.startswith("_")]
        classes = _PY_CLASS.findall(text)
    else:
        functions = _JS_FUNC.findall(text)
        classes = []
    constants = [(n, v.rstrip(";")) for n, v in _NUM_CONST.findall(text)]
    return Symbols(tuple(dict.fromkeys(functions)), tuple(constants), tuple(classes))
