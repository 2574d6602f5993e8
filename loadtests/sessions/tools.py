"""The agent's tools in OpenAI chat ``tools`` format, as an agent such as Codex declares them."""

from __future__ import annotations

from typing import Any, Final


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


_TOOL_TEXT: Final[dict[str, str]] = {
    "read_file": (
        "Reads a file from the repository and returns its contents. The path is relative to "
        "the repository root. By default the whole file is returned; for long files pass "
        "offset (the first line, counted from 1) and limit (how many lines). Read a file "
        "before editing it. Binary files and files over 2000 lines are refused."
    ),
    "write_file": (
        "Writes a file, replacing it if it exists. The content must be the complete file: "
        "every line, with nothing omitted or elided. Use it for new files and for changes that "
        "touch most of a file, or when the user asks for the whole updated file; prefer edit "
        "for small changes. Parent directories are created as needed."
    ),
    "edit": (
        "Replaces text in a file. old_string must match the file exactly, including "
        "whitespace and indentation, and must occur exactly once unless replace_all is true; "
        "include enough surrounding lines to make it unique. new_string replaces it and must "
        "differ from old_string. Read the file first. To delete text, pass an empty "
        "new_string. The edit fails if old_string is not found."
    ),
    "grep": (
        "Searches file contents with a regular expression and returns matching lines as "
        "path:line:text, at most 50. Searches the whole repository unless path names a "
        'directory or file; include filters file names with a glob such as "*.py" or '
        '"*.{js,ts}". Use it to find definitions and usages before changing them.'
    ),
    "list_files": (
        "Lists the files under a directory of the repository (default: the root), one path "
        "per line, directories first. Hidden files and build output are left out."
    ),
    "run_shell": (
        "Runs a shell command in the repository root and returns its exit code and output "
        "(stdout and stderr together, the last 200 lines). Commands run without a terminal "
        "and time out after timeout seconds (default 120). Use it for tests, linters and "
        "builds, not for reading, searching or editing files, which have their own tools. "
        "Never run interactive programs or commands that do not exit."
    ),
}


def tool_definitions(brief: bool = False) -> list[dict[str, Any]]:
    """The agent's tools in OpenAI chat `tools` format; brief: one sentence of description each."""

    def text(name: str) -> str:
        full = _TOOL_TEXT[name]
        return full.split(". ")[0] + "." if brief else full

    path = {"type": "string", "description": "path relative to the repository root"}
    return [
        _tool(
            "read_file",
            text("read_file"),
            {
                "path": path,
                "offset": {"type": "integer", "description": "first line to read, from 1"},
                "limit": {"type": "integer", "description": "how many lines to read"},
            },
            ["path"],
        ),
        _tool(
            "write_file",
            text("write_file"),
            {"path": path, "content": {"type": "string", "description": "the complete file"}},
            ["path", "content"],
        ),
        _tool(
            "edit",
            text("edit"),
            {
                "path": path,
                "old_string": {"type": "string", "description": "the exact text to replace"},
                "new_string": {"type": "string", "description": "the text to put in its place"},
                "replace_all": {
                    "type": "boolean",
                    "description": "replace every occurrence (default false)",
                },
            },
            ["path", "old_string", "new_string"],
        ),
        _tool(
            "grep",
            text("grep"),
            {
                "pattern": {"type": "string", "description": "a regular expression"},
                "path": {"type": "string", "description": "directory or file to search"},
                "include": {"type": "string", "description": "glob of file names to search"},
            },
            ["pattern"],
        ),
        _tool(
            "list_files",
            text("list_files"),
            {"path": {"type": "string", "description": "directory to list"}},
            [],
        ),
        _tool(
            "run_shell",
            text("run_shell"),
            {
                "command": {"type": "string", "description": "the command line"},
                "timeout": {"type": "integer", "description": "seconds before it is stopped"},
            },
            ["command"],
        ),
    ]
