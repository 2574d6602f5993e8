"""What code looks like in a prompt: keywords, operators, calls, flags, file names, error
output, FIM markers, and the system prompts of coding assistants and edit formats."""

from __future__ import annotations

import re
from typing import Final

from proxy.routing.phrases import alternation, bounded, words

# Source-code syntax: statements that open a line, operators, calls, command-line flags.
LINE_KEYWORDS: Final = (
    *(
        f"{word} "
        for word in """def class import from function const let var public private protected
        fn func package using select insert return struct impl use export async""".split()
    ),
    "#include",
    "create table",
    "@",
)

OPERATORS: Final = r"=>|->|::|!=|==|&&|\|\||\+=|:="

CALL: Final = r"\([\w\s,.'\"=]{0,40}\)"

CLI_FLAG: Final = r" --?[a-z][\w-]*(?=[ \t=]|$)"

# A file name is an extension right after a word character: "src/app.py", "routes.ts".
FILE_EXTENSIONS: Final = words(
    """py js ts tsx jsx rs go java kt c cc cpp h hpp cs rb php swift sql sh yml yaml toml ini
    cfg gradle vue svelte ipynb"""
)

FILE_EXTENSION: Final = r"\." + alternation(FILE_EXTENSIONS) + r"\b"

ERROR_MARKERS: Final = (
    "Traceback (most recent call last)",
    "npm ERR!",
    "panic:",
    "Segmentation fault",
    "error:",
    "error[",
)

FIM: Final = (
    r"<\|?fim[_▁-]?(?:prefix|suffix|middle|begin|hole|end|pad)\|?>|<｜fim▁(?:begin|hole|end)｜>"
    r"|<(?:PRE|SUF|MID)>"
)

CODING_SYSTEM_PHRASES: Final = frozenset(
    {"software engineer", "software developer", "software development", "programmer",
     "programming assistant", "coding assistant", "code assistant", "programming", "coding",
     "codebase", "code base", "write code", "source code", "search/replace", "developer",
     "engineer", "assistente di programmazione", "programmazione", "programación",
     "programmation"}
)  # fmt: skip

CODING_SYSTEM: Final = bounded(CODING_SYSTEM_PHRASES, ("programmier",))

# A system prompt that makes every change a copy of the code it changes: whole files, edit
# blocks or diffs (aider's edit formats, "reply with the COMPLETE updated file").
EDIT_FORMAT_PHRASES: Final = frozenset(
    {"search/replace", "entire content of the updated file", "complete updated file",
     "the entire file", "whole file", "unified diff", "diff -u", "file listing",
     "full updated file", "complete file"}
)  # fmt: skip

EDIT_FORMAT: Final = bounded(EDIT_FORMAT_PHRASES)

FILES_IN_CHAT: Final = ("added these files to the chat", "*added these files to the chat*")


OPERATORS_RE: Final = re.compile(OPERATORS)

CALL_RE: Final = re.compile(CALL)

CLI_FLAG_RE: Final = re.compile(CLI_FLAG, re.MULTILINE)

FILE_EXTENSION_RE: Final = re.compile(FILE_EXTENSION)

FIM_RE: Final = re.compile(FIM)

CODING_SYSTEM_RE: Final = re.compile(CODING_SYSTEM, re.IGNORECASE)

EDIT_FORMAT_RE: Final = re.compile(EDIT_FORMAT, re.IGNORECASE)
