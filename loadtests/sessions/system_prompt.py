"""A session's system prompt: the agent's instructions, then its project's context."""

from __future__ import annotations

import random
import re
from functools import cache
from pathlib import Path
from typing import Final

from loadtests.sessions.names import symbols
from loadtests.sessions.repository import build_repository, hash_seed
from loadtests.sessions.shapes import CHARS_PER_TOKEN, estimate_tokens

# Shared by every session, as one agent's instructions are: a server that has seen one session
# holds this prefix for the next.
_INSTRUCTIONS: Final = Path(__file__).parent / "instructions.md"


@cache
def _core_prompt() -> str:
    # The file ends in a newline as text files do; the prompt's parts are joined by blank lines.
    return _INSTRUCTIONS.read_text(encoding="utf-8").removesuffix("\n")


def _project_notes(description: str, repo: dict[str, str]) -> str:
    pkg = next(p.split("/")[0] for p in repo if p.endswith(".py"))
    return (
        "# Project notes (AGENTS.md)\n\n"
        f"This repository is {description}. The Python package `{pkg}/` holds the server: "
        f"records in `{pkg}/models/`, SQLite storage in `{pkg}/repositories/`, business rules "
        f"in `{pkg}/services/`, settings in `{pkg}/config.py` and the command line in "
        f"`{pkg}/cli.py`. The browser client lives in `web/src/` (ES modules, no build step "
        "for development). Python 3.11, type hints everywhere, `ruff check` and `mypy` must "
        "pass; run the tests with `pytest -q` and the web tests with `npm test` in `web/`. "
        "Keep functions small, raise the module's own error types rather than bare "
        "exceptions, and never log personal data such as email addresses."
    )


def _repository_map(repo: dict[str, str]) -> str:
    lines = ["# Repository map", ""]
    for path, text in repo.items():
        syms = symbols(path, text)
        names = ", ".join([*syms.classes, *syms.functions][:12])
        lines.append(f"- {path} ({text.count(chr(10))} lines): {names}")
    return "\n".join(lines)


def _environment(session_id: str, rng: random.Random) -> str:
    day = 1 + rng.randrange(28)
    return (
        "# Environment\n\n"
        f"Working directory: /home/dev/src/{session_id}\n"
        "Is a git repository: yes\n"
        "Platform: linux\n"
        f"Today's date: 2026-11-{day:02d}\n"
        "Shell: bash"
    )


def _trim_to(text: str, tokens: int) -> str:
    """Cut text at a line end so that it is about `tokens` long."""
    limit = int(tokens * CHARS_PER_TOKEN)
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    if cut < limit // 2:
        cut = text.rfind(" ", 0, limit)
    return text[: max(cut, 0)].rstrip()


def _outline(path: str, text: str) -> str:
    """The signature lines of a file: its defs, classes and exported functions."""
    keep = [
        line.rstrip()
        for line in text.splitlines()
        if re.match(r"\s*(def |class |export |async def )", line)
    ]
    return f"## {path}\n\n" + "\n".join(keep)


def build_system_prompt(
    tokens: int, session_id: str, description: str, repo: dict[str, str], rng: random.Random
) -> str:
    """Agent instructions (shared by every session) then this session's project context.

    Grows to about `tokens`: the instructions, the environment, the project's notes, a map of
    its files, then outlines of the files' signatures (what an agent's repository map holds).
    """
    parts = [
        _core_prompt(),
        _environment(session_id, rng),
        _project_notes(description, repo),
        _repository_map(repo),
        *(_outline(p, t) for p, t in repo.items()),
    ]
    text = "\n\n".join(parts)
    if estimate_tokens(text) < tokens:
        # Larger than everything above: outlines of the files of further generated projects,
        # as an agent that indexed a monorepo would include.
        extra = _more_outlines(tokens - estimate_tokens(text), session_id)
        text = text + "\n\n# Other packages in the workspace\n\n" + extra
    return _trim_to(text, tokens)


def _more_outlines(tokens: int, session_id: str) -> str:
    """Outlines of further generated repositories until they make about `tokens`."""
    chunks: list[str] = []
    size = 0
    n = 0
    while size < tokens:
        repo, description = build_repository(hash_seed(f"{session_id}:more:{n}"))
        chunk = f"{description}\n\n" + "\n\n".join(_outline(p, t) for p, t in repo.items())
        chunks.append(chunk)
        size += estimate_tokens(chunk)
        n += 1
    return "\n\n".join(chunks)
