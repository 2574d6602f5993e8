"""Build the classifier's evaluation set from public sources: requests labelled by their answer.

Each item is a request body in a shape clients really send (plain chat, a generic system
prompt, aider's published edit formats with the files in the chat, a second turn after a
reference answer), labelled ``code``, ``echo`` or ``prose`` by the shape of the source's own
reference answer where it has one (see ``answer_shape``), else by the source's task category.
Items whose reference answer is mixed (neither mostly code nor mostly text, or half copied)
are left out: no class is right for them.

Sources (snapshots of public GitHub repositories, commits pinned in ``SOURCES``):

- OpenAssistant prompts and answers, and CommitPackFT commits (message + old file -> new
  file), as sampled in bigcode-project/octopack ``dataset/oasst/oasstcommitpackftmanual.jsonl``
- HumanEvalPack (octopack): write (synthesize), fix a planted bug, explain, in 6 languages
- yizhongw/self-instruct ``human_eval/user_oriented_instructions.jsonl`` (252 user tasks)
- MT-bench and Vicuna-bench questions (lm-sys/FastChat), MT-bench second turns after the
  GPT-4 reference answer
- teknium1/GPTeacher ``Codegen/codegen-instruct.json``
- Aider-AI/aider: its edit-format system prompts and ``tests/fixtures/chat-history.md``
  (real requests to aider, with aider's answers)

The split is fixed by a hash of each item's id (``part_of``), made before any error was looked
at; ``tests/data/classifier_eval_split.tsv`` pins it (id, part, label). The built files are data
from other projects, so they are not committed: put them under ``shared/classifier-eval/`` (or
point ``SPECPROXY_CLASSIFIER_EVAL`` at them) for the tests to use.

    .venv/bin/python scripts/build_classifier_eval.py --mirror /work/.mirror --out DIR
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import random
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPLIT_FILE = ROOT / "tests" / "data" / "classifier_eval_split.tsv"
TEST_SHARE = 40  # percent of items in the test part

SOURCES: dict[str, tuple[str, str, str]] = {
    # key: (repository, commit, licence)
    "octopack": (
        "bigcode-project/octopack",
        "e17a8f6470264286bc6a52eb8263582083bf3bf6",
        "MIT (OpenAssistant data: Apache-2.0; CommitPackFT samples: their repositories' "
        "permissive licences)",
    ),
    "self-instruct": (
        "yizhongw/self-instruct",
        "0b26ccaa415992100fa32df62d41b994cf928e23",
        "Apache-2.0",
    ),
    "fastchat": ("lm-sys/FastChat", "0e6d3e4beaab66f4d3f93db72541a4abab8af28d", "Apache-2.0"),
    "gpteacher": ("teknium1/GPTeacher", "481075123c29854bddb82655badeef6a438f2436", "MIT"),
    "aider": ("Aider-AI/aider", "5dc9490bb35f9729ef2c95d00a19ccd30c26339c", "Apache-2.0"),
}

GENERIC_SYSTEM = "You are a helpful assistant."
FENCE = "```"


# --------------------------------------------------------------------------- sources


class Mirror:
    """Files of the pinned commits of the source repositories."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, source: str, path: str) -> str:
        repo, commit, _ = SOURCES[source]
        git_dir = self.root / repo.replace("/", "+") / "repo"
        return subprocess.run(
            ["git", "-C", str(git_dir), "show", f"{commit}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def jsonl(self, source: str, path: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.read(source, path).splitlines() if line.strip()]


@dataclass(frozen=True)
class AiderFormat:
    """One of aider's edit formats: its system prompt and example turns, as aider sends them."""

    name: str
    system: str
    examples: tuple[dict[str, str], ...]
    files_prefix: str
    files_reply: str


def _class_strings(source: str) -> dict[str, Any]:
    """String attributes and example messages of the prompt class in an aider prompts module."""
    out: dict[str, Any] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name):
            continue
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out[target.id] = node.value.value
        elif target.id == "example_messages" and isinstance(node.value, ast.List):
            messages = []
            for call in node.value.elts:
                if isinstance(call, ast.Call):
                    fields = {
                        kw.arg: kw.value.value
                        for kw in call.keywords
                        if isinstance(kw.value, ast.Constant)
                    }
                    messages.append(fields)
            out[target.id] = messages
    return out


def aider_formats(mirror: Mirror) -> dict[str, AiderFormat]:
    base = _class_strings(mirror.read("aider", "aider/coders/base_prompts.py"))
    fills = {
        "fence": (FENCE, FENCE),
        "final_reminders": "",
        "shell_cmd_prompt": "",
        "shell_cmd_reminder": "",
        "quad_backtick_reminder": "",
        "rename_with_shell": "",
        "go_ahead_tip": "",
        "language": "the same language they are using",
        "platform": "",
        "lazy_prompt": "",
        "overeager_prompt": "",
    }
    formats = {}
    for name, module in (
        ("editblock", "editblock_prompts"),
        ("wholefile", "wholefile_prompts"),
        ("udiff", "udiff_prompts"),
        ("ask", "ask_prompts"),
    ):
        attrs = {**base, **_class_strings(mirror.read("aider", f"aider/coders/{module}.py"))}
        system = attrs["main_system"].format(**fills)
        reminder = attrs.get("system_reminder", "")
        if reminder:
            system += "\n" + reminder.format(**fills)
        examples = tuple(
            {"role": m["role"], "content": m["content"].format(**fills)}
            for m in attrs.get("example_messages", [])
            if "role" in m and "content" in m
        )
        formats[name] = AiderFormat(
            name,
            system,
            examples,
            attrs["files_content_prefix"],
            attrs["files_content_assistant_reply"],
        )
    return formats


# --------------------------------------------------------------------------- labels


_CODE_LINE = re.compile(
    r"^\s*(?:def |class |import |from \S+ import|return\b|#include|public |private |protected "
    r"|static |func |fn |let |const |var |package |using |select |insert |update |create |"
    r"<[a-z/!]|@\w|[{}\])]|//|/\*|\*/|#!|\$ |elif\b|else\b|try:|except\b|while\b|for\b.*[:{]"
    r"\s*$|if\b.*[:{]\s*$|end\b)"
    r"|[;{}(,:]\s*$|^\s{2,}\S.*[=(){};]|^\s*\w[\w.\[\]]*\s*[+\-*/]?=\s*\S",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"^[^=;{}<>]*[a-z]{2,}[^=;{}<>]*[.?!:]$")


def code_share(answer: str) -> float:
    """Share of the answer's characters that are code: in fences, or code-looking lines."""
    total = code = 0
    fenced = False
    for raw in answer.splitlines():
        line = raw.strip()
        if line.startswith("```") or line.startswith("~~~"):
            fenced = not fenced
            continue
        if not line or line in ("<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"):
            continue
        total += len(line)
        words = len(line.split())
        looks_code = bool(_CODE_LINE.search(raw)) and not (
            words >= 8 and _SENTENCE.match(line) and not line.endswith(":")
        )
        if fenced or looks_code:
            code += len(line)
    return code / total if total else 0.0


def echo_share(answer: str, prompt: str) -> float:
    """Share of the answer's characters copied from the prompt (difflib matching blocks)."""
    answer = answer.strip()
    if not answer or not prompt:
        return 0.0
    if len(answer) * len(prompt) > 40_000_000:
        # Line level for long texts: the share of answer lines found in the prompt.
        lines = {line.strip() for line in prompt.splitlines() if line.strip()}
        kept = [line.strip() for line in answer.splitlines() if line.strip()]
        total = sum(len(line) for line in kept)
        return sum(len(line) for line in kept if line in lines) / total if total else 0.0
    matcher = difflib.SequenceMatcher(None, prompt, answer, autojunk=False)
    # Runs of 20+ characters: shared phrases ("the second person") are not a copy.
    copied = sum(block.size for block in matcher.get_matching_blocks() if block.size >= 20)
    return copied / len(answer)


_TRANSLATE = re.compile(r"\btranslat", re.IGNORECASE)
_WORD = re.compile(r"[^\W\d_]{3,}")


def payload_of(prompt: str, instruction: str) -> str:
    """The pasted text in a prompt: what follows the instruction, or its first line or colon."""
    if instruction and instruction in prompt and len(prompt) > len(instruction) + 20:
        return prompt.replace(instruction, "", 1)
    head = re.match(r"[^\n:]*[:\n]", prompt)
    return prompt[head.end() :] if head else ""


def word_share(answer: str, payload: str) -> float:
    """Share of the answer's words (3+ letters) that occur in the payload."""
    seen = {w.lower() for w in _WORD.findall(payload)}
    found = [w.lower() for w in _WORD.findall(answer)]
    return sum(w in seen for w in found) / len(found) if found else 0.0


def answer_shape(answer: str, prompt: str, instruction: str = "") -> tuple[str | None, str]:
    """The class of a reference answer (None when mixed), and why.

    echo: the answer copies the prompt (60 % of its characters in runs of 20+), or it is a
    version of the pasted payload: about as long (0.5-2.5 times) and made of its words (60 %),
    as a refactor or a rewrite in another programming language is, or a translation of it
    (the definition counts translating a pasted text as echo).
    code / prose: 60 % of the answer is code / at most 30 % is.
    """
    echo = echo_share(answer, prompt)
    code = code_share(answer)
    basis = f"reference answer: {echo:.0%} copied from the prompt, {code:.0%} code"
    if echo >= 0.6 and len(answer) >= 100:
        return "echo", basis
    payload = payload_of(prompt, instruction).strip()
    ratio = len(answer.strip()) / len(payload) if payload else 0.0
    if len(payload) >= 80 and 0.5 <= ratio <= 2.5:
        words = word_share(answer, payload)
        if words >= 0.6:
            return "echo", basis + f"; a version of the pasted text ({words:.0%} of its words)"
        if _TRANSLATE.search(prompt[: len(prompt) - len(payload)] or prompt[:200]):
            return "echo", basis + "; a translation of the pasted text"
    if echo >= 0.35:
        return None, basis
    if code >= 0.6:
        return "code", basis
    if code <= 0.3:
        return "prose", basis
    return None, basis


# --------------------------------------------------------------------------- items


@dataclass
class Item:
    id: str
    source: str
    label: str
    basis: str
    body: dict[str, Any]


def chat(*messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in messages], **extra}


def pick(rng: random.Random, seq: list[Any], n: int) -> list[Any]:
    return rng.sample(seq, min(n, len(seq)))


def wrap_plain(rng: random.Random, user: str) -> dict[str, Any]:
    """A chat request as general clients send it: with or without a generic system prompt."""
    if rng.random() < 0.5:
        return chat(("system", GENERIC_SYSTEM), ("user", user))
    return chat(("user", user))


_EXT_LANG = {
    "py": "python",
    "js": "javascript",
    "ts": "typescript",
    "go": "go",
    "rs": "rust",
    "java": "java",
    "cpp": "cpp",
    "c": "c",
    "h": "c",
    "rb": "ruby",
    "php": "php",
    "cs": "csharp",
    "kt": "kotlin",
    "swift": "swift",
    "scala": "scala",
    "sh": "bash",
    "js ": "javascript",
}


def aider_request(
    fmt: AiderFormat, files: list[tuple[str, str]], request: str, examples: bool = True
) -> dict[str, Any]:
    """The messages aider sends: system prompt, example turns, the files in the chat, the ask."""
    messages: list[tuple[str, str]] = [("system", fmt.system)]
    if examples:
        messages += [(m["role"], m["content"]) for m in fmt.examples]
    if files:
        listing = "".join(f"\n{path}\n{FENCE}\n{text}{FENCE}\n" for path, text in files)
        messages += [("user", fmt.files_prefix + listing), ("assistant", fmt.files_reply)]
    messages.append(("user", request))
    return chat(*messages)


def pasted_edit(rng: random.Random, message: str, path: str, code: str) -> dict[str, Any]:
    """A change asked about a file pasted into a general chat, instruction before or after."""
    lang = _EXT_LANG.get(path.rsplit(".", 1)[-1], "")
    block = f"{FENCE}{lang}\n{code}{FENCE}"
    if rng.random() < 0.5:
        return wrap_plain(rng, f"{message}\n\n{block}")
    return wrap_plain(rng, f"{path}:\n{block}\n\n{message}")


# Rows before this are OpenAssistant conversations, from it on CommitPackFT commits.
_FIRST_COMMIT = 725


def oasst_and_commits(mirror: Mirror, formats: dict[str, AiderFormat]) -> Iterator[Item]:
    rows = mirror.jsonl("octopack", "dataset/oasst/oasstcommitpackftmanual.jsonl")
    rng = random.Random(11)
    for n, row in enumerate(rows):
        prompt, answer = row["prompt"], row["completion"]
        first, _, rest = prompt.partition("\n")
        if n >= _FIRST_COMMIT and not rest.strip():
            # A commit that adds a file: the message asks for new code.
            label, basis = answer_shape(answer, first)
            if label is None:
                continue
            body = wrap_plain(rng, first)
            if rng.random() < 0.5:
                body = aider_request(formats["editblock"], [], first)
            yield Item(f"commitpackft-{n}", "octopack", label, basis, body)
        elif n >= _FIRST_COMMIT:
            label, basis = answer_shape(answer, rest)
            if label is None:
                continue
            path = f"src/module.{_guess_ext(rest)}"
            style = rng.random()
            if style < 0.35:
                body = aider_request(formats["wholefile"], [(path, rest)], first)
            elif style < 0.7:
                body = aider_request(formats["editblock"], [(path, rest)], first)
            else:
                body = pasted_edit(rng, first, path, rest)
            yield Item(f"commitpackft-{n}", "octopack", label, basis, body)
        else:
            label, basis = answer_shape(answer, prompt)
            if label is None:
                continue
            yield Item(f"oasst-{n}", "octopack", label, basis, wrap_plain(rng, prompt))


def _guess_ext(code: str) -> str:
    if "#include" in code:
        return "cpp"
    if re.search(r"^package \w+\s*$", code, re.MULTILINE):
        return "go"
    if re.search(r"^(?:package [\w.]+;|import java)", code, re.MULTILINE):
        return "java"
    if re.search(r"^\s*(?:fn |use \w+::|extern crate)", code, re.MULTILINE):
        return "rs"
    if re.search(r"^\s*(?:def |import \w+$|from \S+ import)", code, re.MULTILINE):
        return "py"
    if re.search(r"\b(?:function|const|require\(|=>)", code):
        return "js"
    return "txt"


_HE_LANGS = ("python", "js", "go", "cpp", "java", "rust")
_HE_EXT = {"python": "py", "js": "js", "go": "go", "cpp": "cpp", "java": "java", "rust": "rs"}


def humanevalpack(mirror: Mirror, formats: dict[str, AiderFormat]) -> Iterator[Item]:
    rng = random.Random(12)
    for lang in _HE_LANGS:
        rows = mirror.jsonl(
            "octopack", f"evaluation/create/humaneval-x/data/{lang}/data/humanevalpack.jsonl"
        )
        ext = _HE_EXT[lang]
        for row in pick(rng, rows, 30):
            task = row["task_id"].replace("/", "-")
            kind = rng.choice(("synthesize", "fix", "fix", "explain"))
            path = f"{row['entry_point']}.{ext}"
            if kind == "synthesize":
                # HumanEvalSynthesize: the dataset's instruction, nothing pasted.
                body = wrap_plain(rng, row["instruction"])
                if rng.random() < 0.3:
                    body = aider_request(formats["editblock"], [], row["instruction"])
                label, basis = answer_shape(
                    row["declaration"] + row["canonical_solution"], row["instruction"]
                )
            elif kind == "fix":
                # HumanEvalFix: "Fix bugs in f." over the buggy function (and its tests).
                buggy = row["declaration"] + row["buggy_solution"]
                ask = f"Fix bugs in {row['entry_point']}."
                style = rng.random()
                if style < 0.4:
                    body = aider_request(formats["editblock"], [(path, buggy)], ask)
                elif style < 0.6:
                    body = aider_request(formats["wholefile"], [(path, buggy)], ask)
                else:
                    body = pasted_edit(rng, ask, path, buggy + row["test"])
                label, basis = answer_shape(row["declaration"] + row["canonical_solution"], buggy)
            else:
                # HumanEvalExplain: describe the code in at most as many characters as its
                # docstring; the reference answer is the docstring.
                code = row["declaration"] + row["canonical_solution"]
                ask = (
                    "Provide a concise natural language description of the code using at most "
                    f"{len(row['docstring'])} characters."
                )
                if rng.random() < 0.3:
                    body = aider_request(formats["ask"], [(path, code)], ask, examples=False)
                else:
                    body = pasted_edit(rng, ask, path, code)
                label, basis = "prose", "HumanEvalExplain: a description in words (the docstring)"
            if label is None:
                continue
            yield Item(f"humanevalpack-{kind}-{task}", "octopack", label, basis, body)


def self_instruct(mirror: Mirror) -> Iterator[Item]:
    rng = random.Random(13)
    for row in mirror.jsonl("self-instruct", "human_eval/user_oriented_instructions.jsonl"):
        instance = row["instances"][0]
        text = instance["input"].strip()
        instruction = row["instruction"].strip()
        if text:
            style = rng.random()
            if style < 0.6:
                user = f"{instruction}\n\n{text}"
            elif style < 0.8:
                user = f"{text}\n\n{instruction}"
            else:
                user = f"{instruction}\nInput: {text}"
        else:
            user = instruction
        label, basis = answer_shape(instance["output"], user, instruction)
        if label is None:
            continue
        yield Item(
            row["id"].replace("_", "-"), "self-instruct", label, basis, wrap_plain(rng, user)
        )


_MT_LABEL = {
    "writing": "prose",
    "roleplay": "prose",
    "reasoning": "prose",
    "math": "prose",
    "stem": "prose",
    "humanities": "prose",
    "coding": "code",
}


def mt_bench(mirror: Mirror) -> Iterator[Item]:
    rng = random.Random(14)
    base = "fastchat/llm_judge/data/mt_bench"
    refs = {
        r["question_id"]: r["choices"][0]["turns"]
        for r in mirror.jsonl("fastchat", f"{base}/reference_answer/gpt-4.jsonl")
    }
    for row in mirror.jsonl("fastchat", f"{base}/question.jsonl"):
        qid, category, turns = row["question_id"], row["category"], row["turns"]
        label: str | None  # None: the reference answer is mixed, no item
        if category == "extraction":
            continue  # JSON/CSV extraction: structured data, neither code nor prose
        ref = refs.get(qid)
        if category in ("math", "reasoning"):
            # Worked solutions: sentences and equations, which the code measure misreads.
            label, basis = "prose", f"MT-bench category {category}"
        elif ref:
            label, basis = answer_shape(ref[0], turns[0])
        else:
            label, basis = _MT_LABEL[category], f"MT-bench category {category}"
        if label is not None:
            yield Item(f"mtbench-{qid}-1", "fastchat", label, basis, wrap_plain(rng, turns[0]))
        if ref and len(ref) > 1:
            if category in ("math", "reasoning"):
                label, basis = "prose", f"MT-bench category {category}"
            else:
                label, basis = answer_shape(ref[1], ref[0] + "\n" + turns[1])
            if label is None:
                continue
            body = wrap_plain(rng, turns[0])
            body["messages"] += [
                {"role": "assistant", "content": ref[0]},
                {"role": "user", "content": turns[1]},
            ]
            yield Item(f"mtbench-{qid}-2", "fastchat", label, basis, body)


def vicuna_bench(mirror: Mirror) -> Iterator[Item]:
    rng = random.Random(15)
    rows = mirror.jsonl("fastchat", "fastchat/llm_judge/data/vicuna_bench/question.jsonl")
    refs = {
        r["question_id"]: r["choices"][0]["turns"]
        for r in mirror.jsonl(
            "fastchat", "fastchat/llm_judge/data/vicuna_bench/reference_answer/gpt-4.jsonl"
        )
    }
    for row in rows:
        qid, category, turn = row["question_id"], row["category"], row["turns"][0]
        if qid in refs and category == "coding":
            label, basis = answer_shape(refs[qid][0], turn)
        else:
            label = "code" if category == "coding" else "prose"
            basis = f"Vicuna-bench category {category}"
        if label is None:
            continue
        yield Item(f"vicuna-{qid}", "fastchat", label, basis, wrap_plain(rng, turn))


def gpteacher(mirror: Mirror, formats: dict[str, AiderFormat]) -> Iterator[Item]:
    rng = random.Random(16)
    rows = json.loads(mirror.read("gpteacher", "Codegen/codegen-instruct.json"))
    indexed = list(enumerate(rows))
    # Every row that pastes code (edits, explanations, translations) and a sample of the rest.
    pasting = [(n, r) for n, r in indexed if code_share(r["input"]) >= 0.5 and len(r["input"]) > 80]
    others = [(n, r) for n, r in indexed if (n, r) not in pasting]
    for n, row in pick(rng, pasting, 170) + pick(rng, others, 90):
        instruction, text = row["instruction"].strip(), row["input"].strip()
        user = f"{instruction}\n\n{text}" if text else instruction
        if text and code_share(text) >= 0.5 and rng.random() < 0.5:
            user = f"{instruction}\n\n{FENCE}\n{text}\n{FENCE}"
        label, basis = answer_shape(row["response"], user, instruction)
        if label is None:
            continue
        body = wrap_plain(rng, user)
        if rng.random() < 0.25:
            body = aider_request(formats["editblock"], [], user)
        yield Item(f"gpteacher-codegen-{n}", "gpteacher", label, basis, body)


_AIDER_ADDED = re.compile(r"^> Added (\S+) to the chat", re.MULTILINE)


def aider_history(mirror: Mirror, formats: dict[str, AiderFormat]) -> Iterator[Item]:
    """Requests from aider's own chat history, with the files it had in the chat."""
    text = mirror.read("aider", "tests/fixtures/chat-history.md")
    rng = random.Random(17)
    sessions = text.split("\n# aider chat started at ")
    candidates: list[tuple[int, int, list[str], str, str]] = []
    for s_index, session in enumerate(sessions):
        files: list[str] = []
        blocks = re.split(r"\n(?=#### )", session)
        for b_index, block in enumerate(blocks):
            files += _AIDER_ADDED.findall(block)
            if not block.startswith("#### "):
                continue
            lines = block.split("\n")
            request_lines = []
            i = 0
            while i < len(lines) and lines[i].startswith("####"):
                request_lines.append(lines[i][5:].rstrip())
                i += 1
            answer = "\n".join(line for line in lines[i:] if not line.startswith(">")).strip()
            request = "\n".join(request_lines).strip()
            if (
                not request
                or request.startswith("/")
                or len(answer) < 80
                or "Running:" in request
                or "Repo-map:" in request
                or "<<<<<<< ORIGINAL" in request
                or len(request) > 3000
            ):
                continue
            candidates.append((s_index, b_index, sorted(set(files)), request, answer))
    # The history repeats some sessions (test fixtures): one item per distinct request.
    unique = {c[3]: c for c in candidates if len(c[3].split()) >= 3}
    for s_index, b_index, files, request, answer in pick(rng, list(unique.values()), 220):
        label: str | None  # None: the reference answer is mixed, no item
        contents = []
        for path in files[:3]:
            try:
                body_text = mirror.read("aider", path)
            except subprocess.CalledProcessError:
                continue
            if len(body_text) <= 24_000:
                contents.append((path, body_text))
        prompt = request + "".join(t for _, t in contents)
        if "<<<<<<< SEARCH" in answer or "<<<<<<< ORIGINAL" in answer:
            # An answer in search/replace blocks reproduces the code it changes: echo, unless
            # the blocks only create new files (empty SEARCH sections).
            searches = re.findall(r"<<<<<<< (?:SEARCH|ORIGINAL)\n(.*?)=======", answer, re.DOTALL)
            if any(s.strip() for s in searches):
                label, basis = "echo", "reference answer: search/replace blocks over existing code"
            else:
                label, basis = "code", "reference answer: search/replace blocks creating new files"
        else:
            label, basis = answer_shape(answer, prompt, request)
        if label is None:
            continue
        body = aider_request(formats["editblock"], contents, request)
        yield Item(f"aider-history-{s_index}-{b_index}", "aider", label, basis, body)


# Labels corrected by hand after reading the reference answer (None: left out), with why.
OVERRIDES: dict[str, tuple[str | None, str]] = {
    "user-oriented-task-140": ("prose", "solving an equation: worked steps, not code"),
    "user-oriented-task-142": ("prose", "a proof in sentences and formulas"),
    "user-oriented-task-144": ("prose", "a formula, not code"),
    "user-oriented-task-227": ("echo", "fix and rewrite the pasted code (lines changed a little)"),
    "aider-history-535-1": (None, "translates files that are not in the snapshot"),
    "aider-history-546-3": (None, "translates files that are not in the snapshot"),
    "aider-history-548-1": (None, "translates files that are not in the snapshot"),
    "aider-history-654-1": (None, "translates files that are not in the snapshot"),
}


def corrected(items: list[Item]) -> list[Item]:
    out = []
    for item in items:
        if item.id in OVERRIDES:
            label, reason = OVERRIDES[item.id]
            if label is None:
                continue
            item.label, item.basis = label, f"by hand: {reason}"
        out.append(item)
    return out


# --------------------------------------------------------------------------- split


def part_of(item_id: str) -> str:
    """``test`` or ``tune``, fixed by a hash of the item id."""
    digest = int(hashlib.sha256(item_id.encode()).hexdigest()[:8], 16)
    return "test" if digest % 100 < TEST_SHARE else "tune"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "classifier-eval")
    args = parser.parse_args()
    mirror = Mirror(args.mirror)
    formats = aider_formats(mirror)
    items: list[Item] = corrected(
        [
            *oasst_and_commits(mirror, formats),
            *humanevalpack(mirror, formats),
            *self_instruct(mirror),
            *mt_bench(mirror),
            *vicuna_bench(mirror),
            *gpteacher(mirror, formats),
            *aider_history(mirror, formats),
        ]
    )
    ids = Counter(item.id for item in items)
    assert max(ids.values()) == 1, [i for i, n in ids.items() if n > 1]
    # Sources repeat some requests (the same commit message, the same question): a request that
    # occurs twice is left out altogether, so that no test request is also a training one.
    bodies = Counter(json.dumps(item.body, sort_keys=True) for item in items)
    items = [item for item in items if bodies[json.dumps(item.body, sort_keys=True)] == 1]
    args.out.mkdir(parents=True, exist_ok=True)
    files = {
        part: (args.out / f"{part}.jsonl").open("w", encoding="utf-8") for part in ("tune", "test")
    }
    split_rows = []
    for item in sorted(items, key=lambda i: i.id):
        part = part_of(item.id)
        repo, commit, licence = SOURCES[item.source]
        record = {
            "id": item.id,
            "label": item.label,
            "basis": item.basis,
            "source": f"{repo}@{commit[:12]}",
            "licence": licence,
            "body": item.body,
        }
        files[part].write(json.dumps(record, ensure_ascii=False) + "\n")
        split_rows.append(f"{item.id}\t{part}\t{item.label}")
    for fh in files.values():
        fh.close()
    SPLIT_FILE.write_text("id\tpart\tlabel\n" + "\n".join(split_rows) + "\n", encoding="utf-8")
    counts = Counter((part_of(i.id), i.label) for i in items)
    by_source = Counter((i.source, i.label) for i in items)
    print(f"{len(items)} items -> {args.out}")
    print(dict(sorted(counts.items())))
    print(dict(sorted(by_source.items())))


if __name__ == "__main__":
    main()
