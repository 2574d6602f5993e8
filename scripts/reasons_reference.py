"""Rewrite the route reasons table in docs/routing.md from the reasons the router gives.

    .venv/bin/python scripts/reasons_reference.py          # rewrite it
    .venv/bin/python scripts/reasons_reference.py --check  # exit 1 if it is out of date

tests/fast/test_route_reasons.py fails when the document and the code disagree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.reasons_reference import updated  # noqa: E402

DOC = ROOT / "docs" / "routing.md"


def main() -> int:
    """Rewrite, or with --check compare, the reasons table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args()
    text = DOC.read_text()
    fresh = updated(text)
    if args.check:
        if fresh != text:
            print(f"{DOC} is out of date: run scripts/reasons_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
