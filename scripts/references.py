"""Rewrite the generated sections of the docs: the settings reference in docs/configuration.md
(from the settings model) and the route reasons table in docs/routing.md (from the router's).

    .venv/bin/python scripts/references.py          # rewrite them
    .venv/bin/python scripts/references.py --check  # exit 1 if one is out of date

tests/fast/test_config_reference.py and tests/fast/test_route_reasons.py fail when a document and
the code disagree.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy import config_reference, reasons_reference  # noqa: E402

GENERATED: list[tuple[Path, Callable[[str], str]]] = [
    (ROOT / "docs" / "configuration.md", config_reference.updated),
    (ROOT / "docs" / "routing.md", reasons_reference.updated),
]


def main() -> int:
    """Rewrite, or with --check compare, every generated section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether they are current")
    args = parser.parse_args()
    stale = 0
    for doc, updated in GENERATED:
        text = doc.read_text()
        fresh = updated(text)
        if args.check:
            if fresh != text:
                print(f"{doc} is out of date: run scripts/references.py", file=sys.stderr)
                stale += 1
            continue
        doc.write_text(fresh)
        print(f"wrote {doc}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
