"""What sessions are made of: their shapes, the kinds of turn and each kind's token budget."""

from __future__ import annotations

from typing import Final, Literal

from proxy.tokens import WRITING_CHARS_PER_TOKEN

Shape = Literal["edit-heavy", "explain", "mixed"]
TurnKind = Literal["read", "search", "write", "edit", "explain"]
SHAPES: Final[tuple[Shape, ...]] = ("edit-heavy", "explain", "mixed")
# The load tests' task names for agent sessions of each shape.
AGENT_TASKS: Final = tuple(f"agent-{shape}" for shape in SHAPES)
# A tool call is a few dozen tokens; a whole-file write is cut after MAX_TOKENS["write"]
# (files run 600-2,000 tokens), which still measures hundreds of tokens copied from the prompt.
MAX_TOKENS: Final[dict[TurnKind, int]] = {
    "read": 48,
    "search": 48,
    "write": 600,
    "edit": 200,
    "explain": 200,
}
# The tool each kind of turn asks for; explanations ask for none.
EXPECTED_TOOL: Final[dict[TurnKind, str | None]] = {
    "read": "read_file",
    "search": "grep",
    "write": "write_file",
    "edit": "edit",
    "explain": None,
}
DEFAULT_SYSTEM_TOKENS: Final = 6000
DEFAULT_TURNS: Final = 12
AFFINITY_HEADER: Final = "x-session-affinity"
CHARS_PER_TOKEN: Final = WRITING_CHARS_PER_TOKEN


def is_agent_task(task: str) -> bool:
    """Whether a load-test task name stands for agent sessions (agent-<shape>)."""
    return task in AGENT_TASKS


def estimate_tokens(text: str) -> int:
    """Roughly how many tokens a text is for a Qwen2.5-style tokenizer."""
    return round(len(text) / CHARS_PER_TOKEN)
