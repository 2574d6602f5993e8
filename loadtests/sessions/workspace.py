"""The session's repository as the agent's tools see it: each call's deterministic result."""

from __future__ import annotations

import difflib
import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Workspace:
    """The session's repository as the agent's tools see it, changed by its writes and edits."""

    files: dict[str, str]
    written: set[str] = field(default_factory=set)

    def run(self, name: str, arguments: dict[str, Any]) -> str:
        """The deterministic result of one tool call."""
        handler = {
            "read_file": self._read,
            "write_file": self._write,
            "edit": self._edit,
            "grep": self._grep,
            "list_files": self._list,
            "run_shell": self._shell,
        }.get(name)
        if handler is None:
            known = "read_file, write_file, edit, grep, list_files, run_shell"
            return f"Error: unknown tool {name!r}; the tools are {known}."
        try:
            return handler(arguments)
        except (KeyError, TypeError, ValueError) as exc:
            return f"Error: bad arguments for {name}: {exc}"

    def _read(self, args: dict[str, Any]) -> str:
        path = _norm_path(args["path"])
        if path not in self.files:
            return f"Error: file not found: {path}"
        lines = self.files[path].splitlines(keepends=True)
        offset = max(int(args.get("offset") or 1), 1)
        limit = int(args.get("limit") or len(lines))
        return "".join(lines[offset - 1 : offset - 1 + limit])

    def _write(self, args: dict[str, Any]) -> str:
        path = _norm_path(args["path"])
        content = str(args["content"])
        old = self.files.get(path, "")
        diff = list(difflib.ndiff(old.splitlines(), content.splitlines()))
        added = sum(1 for d in diff if d.startswith("+ "))
        removed = sum(1 for d in diff if d.startswith("- "))
        self.files[path] = content
        self.written.add(path)
        lines = content.count("\n") + (not content.endswith("\n") and bool(content))
        return f"ok: wrote {path} ({lines} lines; +{added} -{removed})"

    def _edit(self, args: dict[str, Any]) -> str:
        path = _norm_path(args["path"])
        if path not in self.files:
            return f"Error: file not found: {path}"
        old, new = str(args["old_string"]), str(args["new_string"])
        text = self.files[path]
        count = text.count(old) if old else 0
        if count == 0:
            return (
                f"Error: old_string was not found in {path}. Read the file again and copy the "
                "text exactly, including indentation."
            )
        if count > 1 and not args.get("replace_all"):
            return (
                f"Error: old_string occurs {count} times in {path}; add surrounding lines to "
                "make it unique, or pass replace_all."
            )
        self.files[path] = (
            text.replace(old, new) if args.get("replace_all") else text.replace(old, new, 1)
        )
        self.written.add(path)
        return f"ok: {path} edited ({count if args.get('replace_all') else 1} replacement)"

    def _grep(self, args: dict[str, Any]) -> str:
        pattern = str(args["pattern"])
        try:
            regex = re.compile(pattern)
        except re.error:
            regex = re.compile(re.escape(pattern))
        where = _norm_path(args.get("path") or "").rstrip("/")
        include = str(args.get("include") or "")
        hits = []
        for path, text in self.files.items():
            if where and not (path == where or path.startswith(where + "/")):
                continue
            if include and not any(
                fnmatch.fnmatch(path.rsplit("/", 1)[-1], g) for g in _globs(include)
            ):
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if regex.search(line):
                    hits.append(f"{path}:{number}:{line}")
        if not hits:
            return "No matches found."
        shown = hits[:50]
        more = f"\n({len(hits) - 50} more matches not shown)" if len(hits) > 50 else ""
        return "\n".join(shown) + more

    def _list(self, args: dict[str, Any]) -> str:
        where = _norm_path(args.get("path") or "").rstrip("/")
        paths = [p for p in self.files if not where or p.startswith(where + "/")]
        return "\n".join(paths) if paths else f"Error: no such directory: {where}"

    def _shell(self, args: dict[str, Any]) -> str:
        command = str(args["command"]).strip()
        if command.startswith("git status"):
            changed = "".join(f"\tmodified:   {p}\n" for p in sorted(self.written))
            body = f"Changes not staged for commit:\n{changed}" if changed else "nothing to commit"
            return f"exit code 0\nOn branch main\n{body}"
        if command.startswith(("ls", "find")):
            return "exit code 0\n" + "\n".join(self.files)
        if "pytest" in command:
            tests = 12 + len(self.files)
            return f"exit code 0\n{'.' * tests}\n{tests} passed in 0.84s"
        if "npm test" in command or "node --test" in command:
            return "exit code 0\n# tests 9\n# pass 9\n# fail 0"
        if command.startswith(("ruff", "mypy", "npx eslint")):
            return "exit code 0\nAll checks passed!"
        return "exit code 0"


def _globs(include: str) -> list[str]:
    match = re.fullmatch(r"(.*)\{(.*)\}(.*)", include)
    if match:
        head, alternatives, tail = match.groups()
        return [head + a + tail for a in alternatives.split(",")]
    return [include]


def _norm_path(path: object) -> str:
    text = str(path or "").strip()
    for prefix in ("./", "/workspace/", "/repo/"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    if text.startswith("/home/dev/src/"):
        text = text.split("/", 5)[-1]
    return "" if text in (".", "/") else text
