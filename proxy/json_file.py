"""A JSON document written whole: other readers and writers of the file never see half of it."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


def write_json(path: Path, document: Any) -> None:
    """Write document to path atomically, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own: proxies sharing one file (a volume in Kubernetes) may save at the same
    # moment, and a shared temporary name would make one's rename fail.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(document, indent=1))
    os.replace(tmp, path)
