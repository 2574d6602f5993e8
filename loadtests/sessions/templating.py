"""The generated repository's template files and the filling of their <<name>> markers."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Final

_TEMPLATES: Final = Path(__file__).parent / "templates"


@cache
def template(name: str) -> str:
    """The text of templates/<name>, e.g. "repository.py.txt"."""
    return (_TEMPLATES / name).read_text(encoding="utf-8")


def fill(template: str, **values: str) -> str:
    """Replace <<name>> markers; templates keep Python's and JavaScript's own braces intact."""
    for key, value in values.items():
        template = template.replace(f"<<{key}>>", value)
    left = re.search(r"<<\w+>>", template)
    assert left is None, f"no value for {left.group()}"
    return template
