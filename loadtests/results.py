"""Result files (docs/results/*.json) and the doc sections rendered from them, so a figure in the
docs is the figure a run wrote: `replace_section` puts a rendering between its markers, and
tests/fast/test_results.py fails when a doc and its result file disagree."""

from __future__ import annotations

import re
from typing import Any

AGENT_ORDER = ("aider", "continue", "opencode", "qwen-code", "claude-code", "codex")


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- results:{name} -->", f"<!-- /results:{name} -->"


def section(doc: str, name: str) -> str:
    """The rendered text between a section's markers."""
    begin, end = _markers(name)
    found = re.search(re.escape(begin) + r"\n(.*?)" + re.escape(end), doc, re.DOTALL)
    if found is None:
        raise ValueError(f"the doc has no {begin} … {end} section")
    return found.group(1)


def replace_section(doc: str, name: str, body: str) -> str:
    """The doc with the section's text replaced by body."""
    begin, end = _markers(name)
    section(doc, name)  # it must be there
    pattern = re.escape(begin) + r"\n.*?" + re.escape(end)
    return re.sub(pattern, lambda _: f"{begin}\n{body}{end}", doc, count=1, flags=re.DOTALL)


def not_run(script: str) -> str:
    """A section whose result file does not exist yet: it says so, and how to make it."""
    return f"not run yet: `.venv/bin/python {script}`\n"


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "not run"
    made = "**made**" if row["made"] else "not made"
    killed = ", killed at the time limit" if row.get("returncode") == -9 else ""
    return f"{made}, {row['requests']} requests, {row['seconds']:.0f} s{killed}"


def render_agents_oneline(result: dict[str, Any]) -> str:
    """The one-line task's table: per agent, through bare llama-server and through specproxy."""
    runs: dict[str, list[dict[str, Any]]] = result["runs"]
    by_server = {server: {r["agent"]: r for r in rows} for server, rows in runs.items()}
    names = [n for n in AGENT_ORDER if any(n in rows for rows in by_server.values())]
    lines = [
        "| agent | bare llama-server | specproxy |",
        "| --- | --- | --- |",
        *(
            f"| {n} | {_cell(by_server.get('bare', {}).get(n))} "
            f"| {_cell(by_server.get('specproxy', {}).get(n))} |"
            for n in names
        ),
    ]
    made = {s: sum(r["made"] for r in rows.values()) for s, rows in by_server.items()}
    total = {s: len(rows) for s, rows in by_server.items()}
    summary = ", ".join(f"{s}: {made[s]} of {total[s]}" for s in ("bare", "specproxy") if s in made)
    return (
        "\n".join(lines)
        + f"\n\nFiles made: {summary}. Run {result['started']}, `{result['command']}`; "
        f"result file `docs/results/agents-oneline.json`.\n"
    )


def render_text_calls(result: dict[str, Any]) -> str:
    """The captured edit turns' table: per agent and mode, what the answer was."""
    modes: list[str] = result["modes"]
    rows = {(r["agent"], r["mode"]): r for r in result["rows"]}
    agents = [a for a in AGENT_ORDER if any((a, m) in rows for m in modes)]

    def cell(row: dict[str, Any] | None) -> str:
        if row is None:
            return "not run"
        if row["edit_call"]:
            return "edit call, " + ("right file" if row["correct_edit"] else "wrong file")
        if row["calls"]:
            return f"call of {', '.join(row['calls'])}"
        return f"text ({row['text_form']})"

    lines = [
        "| agent | " + " | ".join(modes) + " |",
        "| --- |" + " --- |" * len(modes),
        *(f"| {a} | " + " | ".join(cell(rows.get((a, m))) for m in modes) + " |" for a in agents),
    ]
    calls = {m: sum(rows[(a, m)]["edit_call"] for a in agents if (a, m) in rows) for m in modes}
    summary = ", ".join(f"{m}: {calls[m]} of {len(agents)}" for m in modes)
    unfinished = "" if result.get("complete", True) else " The run was stopped before its end."
    return (
        "\n".join(lines)
        + f"\n\nAnswers that are a call of the agent's edit tool: {summary}.{unfinished} Run "
        f"{result['started']}, `{result['command']}`; result file `docs/results/text-calls.json`.\n"
    )
