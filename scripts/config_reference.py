"""Rewrite the settings reference in docs/configuration.md from the settings model.

    .venv/bin/python scripts/config_reference.py          # rewrite it
    .venv/bin/python scripts/config_reference.py --check  # exit 1 if it is out of date

tests/fast/test_config_reference.py fails when the document and the model disagree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.config_reference import updated  # noqa: E402

DOC = ROOT / "docs" / "configuration.md"


def main() -> int:
    """Rewrite, or with --check compare, the reference block."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args()
    text = DOC.read_text()
    fresh = updated(text)
    if args.check:
        if fresh != text:
            print(f"{DOC} is out of date: run scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
