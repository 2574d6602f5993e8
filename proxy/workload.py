"""A realistic coding-assistant workload: edits of real files, FIM, new code, technical Q&A.

Used by start-up calibration, ``scripts/routing_benchmark.py`` and the load tests (``specproxy
bench`` keeps the lab's reference prompts, ``proxy/prompts.py``). The files are modules of the
running Python's standard library (PSF licence), read at run time, not invented snippets:

- **echo** — whole-file edits (a system prompt asking for the COMPLETE updated file, a 60-200
  line module pasted in full, a small change asked: rename a function everywhere, add type
  hints, add a helper) and search/replace edits (the SEARCH/REPLACE block format of editing
  assistants) over the same kind of files;
- **code** — new code asked under a coding assistant's system prompt;
- **prose** — technical questions answered in prose, under the same system prompt;
- **fim** — ``/infill`` bodies (``input_prefix``/``input_suffix``): a stdlib module cut in the
  middle of a function, three lines of it left out.

Requests come in a fixed order, shortest files first within a class, so the first few of a
class (what calibration uses) are the cheapest to process.

``measurement_pool`` holds the requests that measure (the routing benchmark, the load tests),
in the same shapes but never the ones calibration sends: ngram-mod remembers every prompt and
answer it has served, so a request it saw before comes back faster, and a measurement on
calibration requests, or on requests another mode has just sent, rewards history, not routing.
Its echo requests are whole-file and search/replace edits generated for each function of four
other standard-library modules; its code and prose requests ask to implement, or to explain,
documented functions of the standard library (their signatures and docstrings).

``WorkloadRequest.renamed`` makes a request new to an engine that has served it: the names its
answer must write (the function an edit changes and the names the edit gives, a function to
implement and its parameters, the alias a question's function goes by) take a made-up suffix
(``fresh_word``), so the answer differs wherever it names them, and ngram-mod finds no answer it
generated before to copy. A benchmark that sends one prompt to several modes sharing an engine
renames it per mode (issue 45 measured the copy: an identical whole-file edit after plain's
answer drafted 458 of 502 tokens accepted, 2.6x plain).
"""

from __future__ import annotations

import ast
import itertools
import re
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Final, TypeVar

_T = TypeVar("_T")

CODING_SYSTEM: Final = (
    "You are an expert software developer working in the user's editor. Give concise, correct "
    "answers. When you write code, put it in a fenced block with the language and the file "
    "path. Prefer the standard library and the conventions of the user's code."
)
WHOLE_FILE_SYSTEM: Final = (
    "You are a coding assistant that edits the user's files. Take requests for changes to the "
    "supplied file. When you change a file, reply with the path of the file and then the "
    "COMPLETE updated file in one fenced code block. Never omit, skip or elide any part of the "
    "file, and do not add explanations after the block."
)
SEARCH_REPLACE_SYSTEM: Final = (
    "You are a coding assistant that edits the user's files with SEARCH/REPLACE blocks. For "
    "each change, write the file path on its own line, then a fenced block containing a line "
    "<<<<<<< SEARCH, the exact existing lines to change, a line =======, the lines to put in "
    "their place, and a line >>>>>>> REPLACE. Keep each SEARCH part short but unique in the "
    "file. Reply with the edit blocks only."
)


# Syllables of the made-up words: consonant and vowel, so a word reads as one (and tokenizes
# into a few pieces, as a real identifier does).
_SYLLABLES: Final = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")


def fresh_word(n: int) -> str:
    """A made-up lowercase word of three syllables or more, a different one for every n >= 0."""
    base = len(_SYLLABLES)
    # n's digits in base 70 behind a leading one: never two n the same word.
    n += base * base
    syllables: list[str] = []
    while n:
        n, digit = divmod(n, base)
        syllables.append(_SYLLABLES[digit])
    return "".join(reversed(syllables))


# Code in Markdown: a fenced block or an inline span.
_CODE: Final = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)


def rename_identifiers(
    text: str, names: Iterable[str], word: str, *, code_only: bool = False
) -> str:
    """text with each of names suffixed ``_word`` wherever it is an identifier or begins one.

    ``name``, ``self.name(`` and ``name_impl`` become ``name_word``, ``self.name_word(`` and
    ``name_word_impl``; ``rename`` and ``_name`` stay. Case counts. With code_only, only in
    Markdown code (fenced blocks, `spans`), for names that are English words too ("which").
    """
    ordered = sorted(set(names), key=len, reverse=True)
    if not ordered:
        return text
    alternatives = "|".join(map(re.escape, ordered))
    pattern = re.compile(rf"(?<![A-Za-z0-9_])({alternatives})(?![A-Za-z0-9])")

    def rename(code: str) -> str:
        return pattern.sub(lambda m: f"{m.group(1)}_{word}", code)

    return _CODE.sub(lambda m: rename(m.group(0)), text) if code_only else rename(text)


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of the workload: its task class, kind, endpoint and body (no sampling).

    ``names`` are the identifiers its answer must write, which ``renamed`` renames (with
    ``names_in_code_only``, in the request's Markdown code only); where ``imported_from`` names a
    module, they are that module's real functions, which ``renamed`` gives an alias instead.
    """

    task: str
    kind: str
    path: str
    body: dict[str, Any] = field(hash=False)
    names: tuple[str, ...] = ()
    names_in_code_only: bool = False
    imported_from: str = ""

    def with_sampling(
        self, max_tokens: int, temperature: float = 0.0, seed: int = 42
    ) -> dict[str, Any]:
        """The body with a token budget and deterministic sampling, for its endpoint."""
        budget = {"n_predict": max_tokens} if self.path == "/infill" else {"max_tokens": max_tokens}
        return {**self.body, **budget, "temperature": temperature, "seed": seed}

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat messages (empty for ``/infill`` bodies)."""
        return list(self.body.get("messages", []))

    def renamed(self, word: str) -> WorkloadRequest:
        """The same request with its names suffixed ``_word`` (``fresh_word``): the same task
        and size, but an answer that differs wherever it names them.

        Only what the user sends changes (user messages, the infill prefix and suffix); a
        system prompt stays, as a client's would. A question about a real function asks about
        it under an alias, to be used in the answer.
        """
        if not self.names:
            raise ValueError(f"this {self.kind} request names nothing its answer must write")

        def fresh(text: str) -> str:
            if not self.imported_from:
                return rename_identifiers(text, self.names, word, code_only=self.names_in_code_only)
            for name in self.names:
                alias = f"{name}_{word}"
                text = text.replace(f"{self.imported_from}.{name}", alias) + (
                    f" In my code it is imported as {alias} (`from {self.imported_from} import "
                    f"{name} as {alias}`), so call it {alias} in your answer."
                )
            return text

        if self.path == "/infill":
            body = {k: fresh(v) if k.startswith("input_") else v for k, v in self.body.items()}
        else:
            body = {
                **self.body,
                "messages": [
                    {**m, "content": fresh(m["content"])} if m["role"] == "user" else m
                    for m in self.messages
                ],
            }
        return replace(self, body=body)

    def prompt_chars(self) -> int:
        """Characters the model must read: messages, or the infill prefix and suffix."""
        if self.path == "/infill":
            return len(self.body["input_prefix"]) + len(self.body["input_suffix"])
        return sum(len(m["content"]) for m in self.messages)


# (module, edit instruction, names the file must define for the instruction to make sense,
# names the answer writes: what ``WorkloadRequest.renamed`` renames)
_WHOLE_FILE_EDITS: Final = (
    (
        "nturl2path.py",
        "Rename the parameter url of url2pathname to url_path, and the parameter p of "
        "pathname2url to path. Change nothing else.",
        ("url2pathname", "pathname2url"),
        ("url2pathname", "pathname2url", "url_path"),
    ),
    (
        "bisect.py",
        "Add type hints to insort_right and bisect_right (a: list, x, lo: int, hi: int | None, "
        "key). Change nothing else.",
        ("insort_right", "bisect_right"),
        ("insort_right", "bisect_right"),
    ),
    (
        "colorsys.py",
        "Rename the function rgb_to_hls to rgb_to_hsl everywhere in this module, including "
        "__all__ and any callers.",
        ("rgb_to_hls",),
        ("rgb_to_hls", "rgb_to_hsl"),
    ),
    (
        "genericpath.py",
        "Add a private helper _stat(filename) that returns os.stat(filename), and use it in "
        "getsize, getmtime, getatime and getctime instead of calling os.stat directly.",
        ("getsize", "getmtime", "getatime", "getctime"),
        ("getsize", "getmtime", "getatime", "getctime", "_stat"),
    ),
    (
        "linecache.py",
        "Rename the parameter module_globals to globals_dict in every function that takes it.",
        ("getline", "getlines", "updatecache"),
        ("module_globals", "globals_dict"),
    ),
)
_SEARCH_REPLACE_EDITS: Final = (
    (
        "tty.py",
        "Rename the parameter when to when_flag in setraw and setcbreak.",
        ("setraw", "setcbreak"),
        ("setraw", "setcbreak", "when_flag"),
    ),
    (
        "fnmatch.py",
        "Add a one-line docstring to _compile_pattern.",
        ("_compile_pattern",),
        ("_compile_pattern",),
    ),
    (
        "sched.py",
        "Make scheduler.empty() return len(self._queue) == 0 instead of not self._queue.",
        ("empty",),
        ("empty",),
    ),
    (
        "reprlib.py",
        "Raise the default maxstring and maxother limits of Repr from 30 to 60.",
        ("repr1",),
        ("maxstring", "maxother"),
    ),
    (
        "codeop.py",
        "In compile_command, rename the parameter symbol to mode and update its docstring.",
        ("compile_command",),
        ("compile_command",),
    ),
)
_NEW_CODE: Final = (
    "Write a thread-safe LRU cache class in Python with get and put in O(1) and a maximum size; "
    "use type hints.",
    "Write an INI file parser in Python (sections, key = value pairs, comments starting with ; "
    "or #) that returns a dict of dicts, with pytest tests.",
    "Implement a token bucket rate limiter class in Python with an async acquire() method, and "
    "a short usage example.",
    "Write a command-line tool in Python that converts a CSV file to JSON lines, with argparse "
    "options for the delimiter and the output file.",
    "Write a Python function that walks a directory tree and returns the N largest files, using "
    "pathlib and heapq.",
)
_QUESTIONS: Final = (
    "What is the difference between a process and a thread in Python, and when should I use "
    "multiprocessing instead of threading?",
    "Explain how Python's garbage collector deals with reference cycles.",
    "Why are mutable default arguments a problem in Python? A short explanation is enough.",
    "What are the trade-offs between asyncio and threads for an I/O-bound web scraper?",
)
# (module, function whose body loses three lines)
_FIM_CUTS: Final = (
    ("bisect.py", "bisect_right"),
    ("colorsys.py", "rgb_to_hls"),
    ("linecache.py", "checkcache"),
    ("sched.py", "run"),
)
_FIM_LINES: Final = 3


def stdlib_file(name: str) -> str | None:
    """The text of a standard-library module of the running Python, or None if it is missing."""
    path = Path(sysconfig.get_paths()["stdlib"]) / name
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _defines(source: str, names: tuple[str, ...]) -> bool:
    defined = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
    return set(names) <= defined


def _edit(
    system: str, kind: str, module: str, source: str, instruction: str, names: tuple[str, ...]
) -> WorkloadRequest:
    user = f"Lib/{module}\n```python\n{source}```\n\n{instruction}"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return WorkloadRequest("echo", kind, "/v1/chat/completions", {"messages": messages}, names)


def _chat(task: str, kind: str, question: str) -> WorkloadRequest:
    messages = [{"role": "system", "content": CODING_SYSTEM}, {"role": "user", "content": question}]
    return WorkloadRequest(task, kind, "/v1/chat/completions", {"messages": messages})


def _fim(source: str, function: str) -> WorkloadRequest | None:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            first = node.body[0].lineno - 1
            if ast.get_docstring(node) is not None and len(node.body) > 1:
                first = node.body[1].lineno - 1
            lines = source.splitlines(keepends=True)
            cut = first + 1
            body = {
                "input_prefix": "".join(lines[:cut]),
                "input_suffix": "".join(lines[cut + _FIM_LINES :]),
            }
            return WorkloadRequest("fim", "fill in the middle", "/infill", body, (function,))
    return None


@cache
def workload() -> tuple[WorkloadRequest, ...]:
    """Every request of the workload, by class: echo, code, prose, fim."""
    requests: list[WorkloadRequest] = []
    for edits, system, kind in (
        (_WHOLE_FILE_EDITS, WHOLE_FILE_SYSTEM, "whole-file edit"),
        (_SEARCH_REPLACE_EDITS, SEARCH_REPLACE_SYSTEM, "search/replace edit"),
    ):
        for module, instruction, defined, written in edits:
            source = stdlib_file(module)
            if source is not None and _defines(source, defined):
                requests.append(_edit(system, kind, module, source, instruction, written))
    requests += [_chat("code", "new code", q) for q in _NEW_CODE]
    requests += [_chat("prose", "technical question", q) for q in _QUESTIONS]
    for module, function in _FIM_CUTS:
        source = stdlib_file(module)
        fim = _fim(source, function) if source is not None else None
        if fim is not None:
            requests.append(fim)
    # Shortest first within a class: the first few of a class are the cheapest to calibrate.
    order = {"echo": 0, "code": 1, "prose": 2, "fim": 3}
    return tuple(sorted(requests, key=lambda r: (order[r.task], r.prompt_chars())))


def of_task(task: str) -> list[WorkloadRequest]:
    """The workload's requests of one task class, shortest first."""
    return [r for r in workload() if r.task == task]


# --------------------------------------------------------------------------- measurement pool

# Modules whose functions the pool's edits change; none of them is a calibration file.
_POOL_FILES: Final = ("signal.py", "curses/ascii.py", "email/parser.py", "wsgiref/simple_server.py")
# Modules whose documented functions the pool's new-code and technical questions are about.
_API_MODULES: Final = (
    "textwrap", "shlex", "posixpath", "heapq", "statistics", "calendar", "base64", "difflib",
    "filecmp", "ipaddress", "mimetypes", "quopri", "shutil", "tempfile", "functools", "copy",
    "pprint", "glob", "fileinput", "hmac", "secrets", "uuid", "traceback", "warnings",
    "inspect", "tokenize", "contextlib", "string", "gettext", "dis",
)  # fmt: skip


def _round_robin(groups: Iterable[Sequence[_T]]) -> Iterator[_T]:
    """One item of each group in turn, so that any run of the items spans every group."""
    for row in itertools.zip_longest(*groups):
        yield from (item for item in row if item is not None)


def _functions(source: str) -> list[ast.FunctionDef]:
    """Functions and methods of a module, dunder methods and closures left out."""
    defs = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)]
    nested = {
        id(i) for d in defs for i in ast.walk(d) if i is not d and isinstance(i, ast.FunctionDef)
    }
    return [d for d in defs if not d.name.startswith("__") and id(d) not in nested]


def _edit_instructions(function: ast.FunctionDef) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Small changes an editing assistant is asked for, about one function, each with the
    names the changed lines write (``{name}_impl`` is renamed with ``{name}``)."""
    name = function.name
    yield f"Add type hints to {name}. Change nothing else.", (name,)
    if ast.get_docstring(function) is None:
        yield f"Add a one-line docstring to {name}.", (name,)
    else:
        yield f"Replace the docstring of {name} with a one-line summary.", (name,)
    yield f"Rename {name} to {name}_impl everywhere in this file, callers included.", (name,)
    for arg in function.args.args:
        if arg.arg not in ("self", "cls"):
            instruction = f"Rename the parameter {arg.arg} of {name} to {arg.arg}_value."
            yield instruction, (name, f"{arg.arg}_value")
    yield (
        f"At the start of {name}, log the call at debug level with a module logger (add "
        "`import logging` and `logger = logging.getLogger(__name__)` after the imports).",
        (name, "logger"),
    )


def _pool_edits() -> Iterator[WorkloadRequest]:
    """Edits of the pool files, one file after another round-robin, both edit formats."""
    per_file: list[list[WorkloadRequest]] = []
    for module in _POOL_FILES:
        source = stdlib_file(module)
        if source is None:
            continue
        edits: list[WorkloadRequest] = []
        # Methods of two classes can share a name (parse), and then an instruction.
        instructions: dict[str, tuple[str, ...]] = {}
        for function in _functions(source):
            for instruction, names in _edit_instructions(function):
                instructions.setdefault(instruction, names)
        for i, (instruction, names) in enumerate(instructions.items()):
            system, kind = (
                (WHOLE_FILE_SYSTEM, "whole-file edit")
                if i % 2 == 0
                else (SEARCH_REPLACE_SYSTEM, "search/replace edit")
            )
            edits.append(_edit(system, kind, module, source, instruction, names))
        per_file.append(edits)
    yield from _round_robin(per_file)


def _documented_functions() -> Iterator[tuple[str, ast.FunctionDef, str]]:
    """(module, function, docstring) of public documented functions, modules round-robin."""
    per_module: list[list[tuple[str, ast.FunctionDef, str]]] = []
    for module in _API_MODULES:
        source = stdlib_file(f"{module}.py")
        if source is None:
            continue
        found: list[tuple[str, ast.FunctionDef, str]] = []
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                doc = (ast.get_docstring(node) or "").split("\n\n")[0].strip()
                if len(doc.split()) >= 4:
                    found.append((module, node, doc))
        per_module.append(found)
    yield from _round_robin(per_module)


# Parameters this short are words of the docstrings too ("a", "s"): renaming them would garble
# the text rather than the code.
_SHORTEST_RENAMED_PARAMETER: Final = 3


def _new_code(module: str, function: ast.FunctionDef, doc: str) -> WorkloadRequest:
    signature = f"{function.name}({ast.unparse(function.args)})"
    question = (
        f"Implement `{signature}` in Python from this docstring, with type hints, without "
        f"importing `{module}`:\n\n{doc}"
    )
    a = function.args
    parameters = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
    # The function and its parameters: the body an answer writes uses the parameters throughout.
    names = (
        function.name,
        *(p.arg for p in parameters if len(p.arg) >= _SHORTEST_RENAMED_PARAMETER),
    )
    # In the signature only: a docstring's words can be names too ("return the path which").
    return replace(_chat("code", "new code", question), names=names, names_in_code_only=True)


def _question(module: str, function: ast.FunctionDef, index: int) -> WorkloadRequest:
    name = f"{module}.{function.name}()"
    question = (
        f"What does {name} do, and when would I use it instead of writing my own? Explain "
        "briefly in prose, without code."
        if index % 2 == 0
        else f"How does {name} handle edge cases and errors? A short explanation in prose is "
        "enough."
    )
    request = _chat("prose", "technical question", question)
    return replace(request, names=(function.name,), imported_from=module)


@cache
def measurement_pool(task: str) -> tuple[WorkloadRequest, ...]:
    """Requests of a class that calibration never sends, varied from one to the next."""
    if task == "echo":
        return tuple(_pool_edits())
    functions = list(_documented_functions())
    if task == "code":
        return tuple(_new_code(*f) for f in functions)
    if task == "prose":
        return tuple(_question(m, f, i) for i, (m, f, _) in enumerate(functions))
    return ()
