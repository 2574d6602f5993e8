"""Tool calls a model wrote as text: which answers are calls of the declared tools, and which
could still become one while they stream.

Small local models (Qwen2.5-Coder among them) answer a request that offers tools with the call
written out, as a fenced ```json block, bare JSON, `<tools>` or an unparsed `<tool_call>`, and
llama-server's parser leaves it as text, so the agent that asked does nothing. An answer is a
call only when all of it is calls, each naming a declared tool with arguments its JSON schema
accepts; anything else stays text, as written (docs/surfaces.md, "Tool calls written as text").
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import exceptions as schema_errors
from jsonschema import validators
from jsonschema.protocols import Validator
from referencing.exceptions import Unresolvable

# The API a request came in on, which says where its tools and its answer's calls are.
CallApi = Literal["chat", "messages", "responses"]

_NAME_KEYS = ("name", "function", "tool", "tool_name")
_ARGUMENT_KEYS = ("arguments", "parameters", "input", "args")
# What an answer that is a call starts with, after leading whitespace.
_OPENERS = ("```", "{", "[", "<tools>", "<tool_call>")
_FENCE_LANGUAGES = ("", "json", "tool_call", "tool_code", "jsonc", "tool")
# The first key of a call object, as such models write it.
_FIRST_KEYS = (*_NAME_KEYS, *_ARGUMENT_KEYS, "type", "id")
_TAGGED = re.compile(r"<(tools|tool_call)>\s*(.*?)\s*</\1>", re.DOTALL)
_FENCED = re.compile(r"```([A-Za-z_]*)[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)


@dataclass(frozen=True)
class TextCall:
    """One call recovered from text: a declared tool, and arguments its schema accepts."""

    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        """The arguments as the JSON string OpenAI-style calls carry."""
        return json.dumps(self.arguments, ensure_ascii=False)


def _fresh_id() -> str:
    return uuid.uuid4().hex[:24]


def _declared(api: CallApi, tool: Any) -> tuple[str, dict[str, Any]] | None:
    """A declared function tool's name and its argument schema, in the shape of its API."""
    if not isinstance(tool, Mapping):
        return None
    if api == "chat":
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
            return None
        name, schema = function.get("name"), function.get("parameters")
    elif api == "messages":
        # Anthropic's server tools (web_search_…, bash_…) have a `type` and run elsewhere.
        if tool.get("type") not in (None, "custom"):
            return None
        name, schema = tool.get("name"), tool.get("input_schema")
    else:
        if tool.get("type") != "function":
            return None  # custom (free-text) and hosted tools take no JSON arguments
        name, schema = tool.get("name"), tool.get("parameters")
    if not isinstance(name, str) or not name:
        return None
    return name, schema if isinstance(schema, dict) else {"type": "object"}


def _checker(schema: dict[str, Any]) -> Validator | None:
    """A checker of arguments against a tool's schema, in the draft the schema names."""
    try:
        kind = validators.validator_for(schema)
        kind.check_schema(schema)
        return kind(schema)
    except schema_errors.SchemaError:
        return None


def _accepts(checker: Validator | None, arguments: dict[str, Any]) -> bool:
    if checker is None:
        return False
    try:
        return bool(checker.is_valid(arguments))
    except (schema_errors.UnknownType, Unresolvable):
        return False  # a schema we cannot apply proves nothing: the text stays text


def _chosen(api: CallApi, choice: Any) -> tuple[bool, str | None]:
    """Whether tool_choice allows calls, and the one tool it names (None: any declared)."""
    if choice is None:
        return True, None
    if isinstance(choice, str):
        return choice != "none", None
    if not isinstance(choice, Mapping):
        return True, None
    kind = choice.get("type")
    if kind == "none":
        return False, None
    if api == "chat" and isinstance(choice.get("function"), Mapping):
        name = choice["function"].get("name")
        return True, name if isinstance(name, str) else None
    if kind in ("tool", "function") and isinstance(choice.get("name"), str):
        return True, choice["name"]
    return True, None


@dataclass(frozen=True)
class ToolCatalog:
    """The function tools one request declared, each with its argument schema."""

    api: CallApi
    # Each tool's checker of arguments; None where its schema cannot be checked, so no text
    # ever becomes a call of it.
    checkers: Mapping[str, Validator | None]

    @classmethod
    def of(cls, api: CallApi, body: Mapping[str, Any]) -> ToolCatalog | None:
        """The request's catalog; None where it declares no function tool or forbids calls."""
        allowed, only = _chosen(api, body.get("tool_choice"))
        tools = body.get("tools")
        if not allowed or not isinstance(tools, list):
            return None
        checkers = {}
        for tool in tools:
            declared = _declared(api, tool)
            if declared is not None and (only is None or declared[0] == only):
                checkers[declared[0]] = _checker(declared[1])
        return cls(api, checkers) if checkers else None

    def call(self, raw: Any) -> TextCall | None:
        """The call a JSON value written by the model makes, if it names a declared tool with
        arguments its schema accepts."""
        if not isinstance(raw, Mapping):
            return None
        function = raw.get("function")
        if isinstance(function, Mapping):  # OpenAI's own shape, written out
            raw = function
        name = next((raw[k] for k in _NAME_KEYS if isinstance(raw.get(k), str)), "")
        if name not in self.checkers:
            return None
        present = [k for k in _ARGUMENT_KEYS if k in raw]
        arguments: Any = raw[present[0]] if present else {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict) or not _accepts(self.checkers[name], arguments):
            return None
        return TextCall(_fresh_id(), name, arguments)

    def calls_in(self, text: str) -> list[TextCall] | None:
        """The calls that make up all of `text`, or None if any of it is not such a call."""
        values = _values_in(text.strip())
        if not values:
            return None
        calls = []
        for value in values:
            call = self.call(value)
            if call is None:
                return None
            calls.append(call)
        return calls


def _json_values(text: str) -> list[Any] | None:
    """The JSON values `text` is made of, one after another (arrays flattened); None if any
    of it is not JSON."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    at, end = 0, len(text)
    while at < end:
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        values.extend(value if isinstance(value, list) else [value])
        while at < end and text[at] in " \t\r\n,":
            at += 1
    return values


def _values_in(text: str) -> list[Any] | None:
    """The call-shaped values an answer is made of, in each form such models write."""
    if text.startswith("```"):
        return _pieces(text, _FENCED, lambda m: m.group(1).lower() in _FENCE_LANGUAGES)
    if text.startswith("<"):
        return _pieces(text, _TAGGED, lambda m: True)
    return _json_values(text) if text[:1] in ("{", "[") else None


def _pieces(text: str, pattern: re.Pattern[str], fits: Any) -> list[Any] | None:
    """The values of the blocks that make up all of `text` (whitespace between them only)."""
    values: list[Any] = []
    at = 0
    for match in pattern.finditer(text):
        if text[at : match.start()].strip() or not fits(match):
            return None
        inner = match.group(2).strip()
        inside = _values_in(inner) if inner.startswith("<") else _json_values(inner)
        if not inside:
            return None
        values.extend(inside)
        at = match.end()
    return values if at and not text[at:].strip() else None


def could_be_calls(text: str) -> bool:
    """Whether an answer that starts with `text` may still turn out to be calls: what a stream
    holds back. Decided on the first characters, so other answers pass at once."""
    head = text.lstrip()
    if not head:
        return True
    if not head.startswith(_OPENERS):
        return any(opener.startswith(head) for opener in _OPENERS)
    if head.startswith("```"):
        language, newline, rest = head[3:].partition("\n")
        language = language.strip().lower()
        if not newline:
            return any(known.startswith(language) for known in _FENCE_LANGUAGES)
        return language in _FENCE_LANGUAGES and could_be_calls_body(rest)
    if head.startswith("<"):
        return True
    return could_be_calls_body(head)


def could_be_calls_body(head: str) -> bool:
    """Whether JSON that starts with `head` may be a call object or an array of them."""
    head = head.lstrip()
    if not head:
        return True
    if head.startswith("<"):
        return any(t.startswith(head) or head.startswith(t) for t in ("<tools>", "<tool_call>"))
    if head.startswith("["):
        rest = head[1:].lstrip()
        return not rest or (rest.startswith("{") and could_be_calls_body(rest))
    if not head.startswith("{"):
        return False
    rest = head[1:].lstrip()
    if not rest:
        return True
    if not rest.startswith('"'):
        return False
    key, quote, _ = rest[1:].partition('"')
    if quote:
        return key in _FIRST_KEYS
    return any(k.startswith(key) for k in _FIRST_KEYS)
