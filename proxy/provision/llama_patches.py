"""specproxy's changes to the pinned llama.cpp: a patch series, applied and checked with GNU patch.

Each patch in patches/ is one concern (why it exists is its header) and applies to the pristine
tree on its own. A patch is either applied in a tree (it reverses cleanly), applies to it (it
applies cleanly), or stale: then upstream moved the code it edits, or the tree carries another
version of it. Patches apply exactly (no fuzz), so a moved line fails loudly instead of landing
in the wrong place. `scripts/regen_patches.py` writes the series from an edited llama.cpp tree.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from proxy.provision.pypi import ProvisionError

PATCH_DIR = Path(__file__).with_name("patches")
# Text only a binary built with the series holds (a request field's description that
# 0002-per-request-speculation.patch adds): how a llama-server is known to be specproxy's build,
# wherever it came from (the cache, the image).
BUILD_MARKER = b"default: all loaded; specproxy build"
# How a patch is changed: named in every error about one.
REGENERATE = "scripts/regen_patches.py (docs/development.md, 'Changing llama.cpp')"

PatchState = Literal["applied", "applies", "stale"]
_HUNK_FAILED = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_FILE_LINE = re.compile(r"^(?:checking|patching) file (.+)$")


class StalePatchError(ProvisionError):
    """A patch neither applies to a tree nor is applied in it; the message names its hunks."""

    def __init__(self, patch: Path, source: Path, failures: Sequence[str]) -> None:
        self.patch = patch
        self.source = source
        self.failures = tuple(failures)
        super().__init__(
            f"specproxy's llama.cpp patch {patch.name} neither applies to nor is applied in "
            f"{source}: " + "; ".join(self.failures)
        )


@dataclass(frozen=True)
class PatchFile:
    """One patch of the series: its file, the files it edits and each file's hunk headers."""

    path: Path
    hunks: dict[str, tuple[str, ...]]

    @property
    def files(self) -> tuple[str, ...]:
        """The paths it edits, relative to llama.cpp/."""
        return tuple(self.hunks)

    @classmethod
    def read(cls, path: Path) -> PatchFile:
        """Parse a unified diff's file names (a/ b/ prefixes) and its "@@" lines, in order."""
        hunks: dict[str, list[str]] = {}
        old = current = None
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("--- "):
                old = _strip_prefix(line[4:])
            elif line.startswith("+++ ") and old is not None:
                new = _strip_prefix(line[4:])
                current = old if new == "/dev/null" else new
                hunks.setdefault(current, [])
                old = None
            elif line.startswith("@@ ") and current is not None:
                hunks[current].append(line)
        if not hunks:
            raise ProvisionError(f"{path} holds no unified diff")
        return cls(path, {name: tuple(lines) for name, lines in hunks.items()})


def _strip_prefix(name: str) -> str:
    """A diff header's file name without its timestamp and its a/ or b/ (patch -p1)."""
    name = name.split("\t", 1)[0]
    return name if name == "/dev/null" else name.split("/", 1)[-1]


def patch_files(directory: Path = PATCH_DIR) -> tuple[Path, ...]:
    """The series: every NNNN-name.patch in `directory`, in order."""
    return tuple(sorted(directory.glob("[0-9][0-9][0-9][0-9]-*.patch")))


def patch_set_id(patches: Sequence[Path] | None = None) -> str:
    """sha256 of the series' names and contents, for the build stamp: a changed patch rebuilds."""
    digest = hashlib.sha256()
    for patch in patch_files() if patches is None else patches:
        digest.update(patch.name.encode() + b"\0" + patch.read_bytes() + b"\0")
    return digest.hexdigest()


def patch_state(source: Path, patch: Path) -> tuple[PatchState, list[str]]:
    """Whether a patch is applied in the tree at `source`, applies to it, or neither; for a stale
    one, what failed (file and hunk) when applying it."""
    if _run_patch(source, patch, dry_run=True, reverse=True)[0]:
        return "applied", []
    ok, output = _run_patch(source, patch, dry_run=True)
    if ok:
        return "applies", []
    return "stale", _failures(PatchFile.read(patch), output)


def apply_patches(source: Path, patches: Sequence[Path] | None = None) -> list[Path]:
    """Bring the tree at `source` to the series: every patch checked before any is applied,
    those already in it skipped, and each verified after. Returns the patches applied now."""
    series = patch_files() if patches is None else tuple(patches)
    pending = []
    for patch in series:
        state, failures = patch_state(source, patch)
        if state == "stale":
            raise StalePatchError(patch, source, failures)
        if state == "applies":
            pending.append(patch)
    for patch in pending:
        ok, output = _run_patch(source, patch, dry_run=False)
        if not ok:
            raise ProvisionError(
                f"applying {patch.name} to {source} failed after its dry run passed:\n{output}"
            )
    for patch in series:
        if not _run_patch(source, patch, dry_run=True, reverse=True)[0]:
            raise ProvisionError(
                f"{patch.name} does not verify in {source} once the series is applied (another "
                "patch edits the same lines): each patch must apply to the pristine tree on its "
                f"own; fix the series with {REGENERATE}"
            )
    return pending


def _run_patch(
    source: Path, patch: Path, *, dry_run: bool, reverse: bool = False
) -> tuple[bool, str]:
    """Run GNU patch exactly: no fuzz, no questions, no .orig or .rej files left behind."""
    tool = shutil.which("patch")
    if tool is None:
        raise ProvisionError(
            "applying specproxy's llama.cpp patches needs GNU patch (Debian: apt-get install "
            "patch; scripts/system-deps.sh serve installs it)"
        )
    argv = [tool, "-p1", "-d", str(source), "-i", str(patch.resolve()), "--batch", "--forward"]
    argv += ["--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-"]
    argv += ["--dry-run"] * dry_run + ["--reverse"] * reverse
    # Its messages parsed in English, file names unquoted; POSIX mode would keep backups.
    env = {k: v for k, v in os.environ.items() if k != "POSIXLY_CORRECT"}
    env |= {"LC_ALL": "C", "QUOTING_STYLE": "literal"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    return done.returncode == 0, done.stdout + done.stderr


def _failures(patch: PatchFile, output: str) -> list[str]:
    """GNU patch's complaints, as "file: hunk #n (its @@ line) ..." for the error message."""
    failures: list[str] = []
    current = None
    for line in output.splitlines():
        if match := _FILE_LINE.match(line):
            current = match.group(1)
        elif line.startswith("|+++ ") or line.startswith("|--- "):
            current = _strip_prefix(line[5:])  # the header of a file it cannot find
        elif match := _HUNK_FAILED.match(line):
            number, at = int(match.group(1)), match.group(2)
            heads = patch.hunks.get(current or "", ())
            head = f" ({heads[number - 1]})" if number <= len(heads) else ""
            failures.append(f"{current}: hunk #{number}{head} does not match at line {at}")
        elif line.startswith("Reversed (or previously applied) patch detected"):
            failures.append(f"{current}: already carries this change (the patch is partly applied)")
        elif line.startswith("No file to patch"):
            failures.append(f"{current}: no such file")
        elif line.startswith("The next patch would create the file"):
            failures.append(f"{current}: exists already, the patch creates it")
    return failures or [output.strip() or "GNU patch failed without saying why"]


def is_specproxy_build(binary: Path) -> bool:
    """Whether a llama-server binary was built with the series (it holds BUILD_MARKER)."""
    try:
        with binary.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(BUILD_MARKER) >= 0
    except (OSError, ValueError):
        return False
