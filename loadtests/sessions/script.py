"""A session's script: the user's instructions about the repository's files, by shape."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from loadtests.sessions.entities import camel_case
from loadtests.sessions.names import Symbols, symbols
from loadtests.sessions.shapes import Shape, TurnKind

# What a rename instruction puts in place of a function name's verb.
_RENAMES: Final = (
    ("get", "fetch"),
    ("list", "list_all"),
    ("create", "add"),
    ("load", "read"),
    ("parse", "read"),
    ("change", "update"),
    ("find", "lookup"),
    ("print", "show"),
    ("build", "make"),
    ("format", "render"),
    ("validate", "check"),
    ("select", "choose"),
    ("clear", "reset"),
    ("iterate", "walk"),
    ("move", "transition"),
)


def _renamed(name: str) -> str:
    for old, new in _RENAMES:
        if name == old:
            return new
        for sep in ("_", ""):
            if name.startswith(old + sep) and len(name) > len(old + sep):
                rest = name[len(old) :]
                return (new if sep else camel_case(new)) + rest
    return name + ("_impl" if "_" in name or name.islower() else "Impl")


def _bigger(value: str) -> str:
    clean = value.replace("_", "")
    number = float(clean) if "." in clean else int(clean)
    doubled = number * 2
    return repr(doubled) if isinstance(doubled, float) else str(doubled)


@dataclass(frozen=True)
class Task:
    """One instruction of the user and the turns it is expected to take."""

    prompt: str
    kinds: tuple[TurnKind, ...]
    path: str | None = None


def _read_task(path: str, shape: Shape, rng: random.Random) -> Task:
    why = "I have some questions about it" if shape == "explain" else "I want to change it"
    prompt = rng.choice(
        (
            f"Read {path}; {why}.",
            f"Open {path} so we can work on it.",
            f"Have a look at {path} first.",
            f"Show me {path}.",
        )
    )
    return Task(prompt, ("read",), path)


def _search_task(path: str, syms: Symbols, rng: random.Random) -> Task | None:
    names = list(syms.functions) + [c for c, _ in syms.constants]
    if not names:
        return None
    name = rng.choice(names)
    prompt = rng.choice(
        (
            f"Where is `{name}` used in the repository? Search for it and tell me briefly.",
            f"Find every place that refers to `{name}`, and tell me which files depend on it.",
        )
    )
    return Task(prompt, ("search", "explain"), path)


def _write_task(path: str, syms: Symbols, rng: random.Random) -> Task | None:
    options = []
    for f in syms.functions:
        options.append(
            f"Rename `{f}` to `{_renamed(f)}` everywhere in {path}, callers included, and "
            "write the complete updated file with write_file."
        )
    for c, v in syms.constants:
        options.append(
            f"In {path}, change {c} from {v} to {_bigger(v)}. Reply with a write_file call "
            "containing the whole updated file."
        )
    if path.endswith(".py") and syms.functions:
        f = rng.choice(syms.functions)
        options.append(
            f"Add a module-level `logger = logging.getLogger(__name__)` to {path} (import "
            f"logging if needed) and log a debug message at the start of `{f}`. Write the whole "
            "file back with write_file."
        )
    if path.endswith(".js") and syms.functions:
        f = rng.choice(syms.functions)
        options.append(
            f"Add a JSDoc comment above `{f}` in {path} describing its parameters and return "
            "value. Use write_file with the complete file."
        )
    if not options:
        return None
    return Task(rng.choice(options), ("write",), path)


def _edit_task(path: str, syms: Symbols, rng: random.Random) -> Task | None:
    options = []
    for c, v in syms.constants:
        options.append(
            f"Change {c} in {path} from {v} to {_bigger(v)}. Use the edit tool "
            "(old_string/new_string), not a full rewrite."
        )
    for f in syms.functions:
        if path.endswith(".py"):
            options.append(
                f"Replace the docstring of `{f}` in {path} with a clearer one-line summary. "
                "Make the change with edit."
            )
        else:
            options.append(
                f"Add a one-line comment above `{f}` in {path} saying what it returns. Use "
                "edit with old_string and new_string."
            )
    if not options:
        return None
    return Task(rng.choice(options), ("edit",), path)


def _explain_task(path: str, syms: Symbols, rng: random.Random) -> Task:
    options = [f"Summarise what {path} is responsible for, in a few sentences."]
    for f in syms.functions:
        options.append(
            f"Explain what `{f}` in {path} does and what happens when its input is invalid. "
            "No code, just prose."
        )
    for c, _ in syms.constants:
        options.append(f"What would change for callers if {c} in {path} were doubled?")
    for cls in syms.classes:
        options.append(
            f"How is `{cls}` in {path} meant to be used? Keep it short, and point out any edge "
            "case that looks wrong."
        )
    return Task(rng.choice(options), ("explain",), path)


# Per shape: the tasks that follow reading a file, as (kind, weight).
_FOLLOW_UPS: Final[dict[Shape, tuple[tuple[str, int], ...]]] = {
    "edit-heavy": (("write", 5), ("edit", 4), ("search", 1)),
    "explain": (("explain", 6), ("search", 2)),
    "mixed": (("write", 3), ("edit", 3), ("explain", 3), ("search", 1)),
}


def build_script(shape: Shape, repo: dict[str, str], turns: int, rng: random.Random) -> list[Task]:
    """Tasks for a shape until they are expected to take at least `turns` requests."""
    paths = list(repo)
    rng.shuffle(paths)
    tasks: list[Task] = []
    expected = 0
    kinds = [k for k, _ in _FOLLOW_UPS[shape]]
    weights = [w for _, w in _FOLLOW_UPS[shape]]
    for path in _cycle(paths):
        if expected >= turns:
            break
        syms = symbols(path, repo[path])
        tasks.append(_read_task(path, shape, rng))
        expected += 1
        for _ in range(rng.choice((2, 3))):
            kind = rng.choices(kinds, weights)[0]
            task: Task | None
            if kind == "write":
                task = _write_task(path, syms, rng)
            elif kind == "edit":
                task = _edit_task(path, syms, rng)
            elif kind == "search":
                task = _search_task(path, syms, rng)
            else:
                task = _explain_task(path, syms, rng)
            if task is None:
                task = _explain_task(path, syms, rng)
            tasks.append(task)
            expected += len(task.kinds)
    return tasks


def _cycle(items: Sequence[str]) -> Iterator[str]:
    """The items over and over (a long session reads files again, as agents do)."""
    while True:
        yield from items
