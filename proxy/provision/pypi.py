"""Files from a PyPI simple index (PEP 691 JSON), downloaded with sha256 verification."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from proxy.provision.progress import Progress


class ProvisionError(Exception):
    """A download or build could not produce a verified artefact; the message says why."""


@dataclass(frozen=True)
class IndexFile:
    """One distribution file listed by the index."""

    filename: str
    url: str
    sha256: str
    size: int | None


def find_file(index: str, project: str, filename: str) -> IndexFile:
    """Look up one exact file of a project on a PEP 691 simple index."""
    url = f"{index.rstrip('/')}/{project}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            listing = json.load(resp)
    except OSError as exc:
        raise ProvisionError(
            f"cannot read {url}: {exc}; check network access to the package index "
            "or set SPECPROXY_PYPI_INDEX"
        ) from exc
    for entry in listing.get("files", []):
        if entry.get("filename") == filename:
            return IndexFile(
                filename=filename,
                url=entry["url"],
                sha256=entry.get("hashes", {}).get("sha256", ""),
                size=entry.get("size"),
            )
    raise ProvisionError(f"{filename} is not listed at {url}")


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def download(file: IndexFile, dest: Path, label: str | None) -> Path:
    """Download to dest (atomically), verifying the index's sha256; progress if labelled."""
    if dest.is_file() and file.sha256 and sha256_of(dest) == file.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".part{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(file.url, timeout=120) as resp, tmp.open("wb") as out:
            size = file.size or int(resp.headers.get("Content-Length", 0))
            progress = Progress(label, size) if label else None
            while block := resp.read(1 << 20):
                out.write(block)
                digest.update(block)
                if progress:
                    progress.advance(len(block))
            if progress:
                progress.finish()
        if file.sha256 and digest.hexdigest() != file.sha256:
            raise ProvisionError(
                f"{file.filename}: sha256 {digest.hexdigest()} != index's {file.sha256}; "
                "the download was corrupted, run the command again"
            )
        os.replace(tmp, dest)
    except OSError as exc:
        raise ProvisionError(f"download of {file.url} failed: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return dest
