"""The Python half of a generated repository: models, storage, services, settings and a CLI."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Final

from loadtests.sessions.entities import Entity, with_article
from loadtests.sessions.templating import fill, template

_PY_TYPES: Final = {
    "email": "str",
    "money": "int",
    "str": "str",
    "int": "int",
    "date": "date",
    "bool": "bool",
    "optional": "str | None",
    "float": "float",
}
_SQL_TYPES: Final = {
    "email": "TEXT NOT NULL",
    "money": "INTEGER NOT NULL",
    "str": "TEXT NOT NULL",
    "int": "INTEGER NOT NULL",
    "date": "TEXT NOT NULL",
    "bool": "INTEGER NOT NULL DEFAULT 0",
    "optional": "TEXT",
    "float": "REAL NOT NULL",
}


def _required(e: Entity) -> list[tuple[str, str]]:
    return [(n, k) for n, k in e.fields if k not in ("bool", "optional")]


def _defaulted(e: Entity) -> list[tuple[str, str]]:
    return [(n, k) for n, k in e.fields if k in ("bool", "optional")]


def _py_checks(e: Entity) -> list[str]:
    out: list[str] = []
    for name, kind in e.fields:
        if kind == "money":
            out += [
                f"        if self.{name} <= 0:",
                f'            raise ValidationError("{name}", "must be a positive amount")',
                f"        if self.{name} > MAX_AMOUNT_CENTS:",
                f'            raise ValidationError("{name}", "is above the allowed maximum")',
            ]
        elif kind == "int":
            out += [
                f"        if self.{name} < 0:",
                f'            raise ValidationError("{name}", "must not be negative")',
            ]
        elif kind == "str":
            out += [
                f"        if not self.{name}.strip():",
                f'            raise ValidationError("{name}", "must not be empty")',
                f"        if len(self.{name}) > MAX_TEXT_LENGTH:",
                f'            raise ValidationError("{name}", "is too long")',
            ]
        elif kind == "email":
            out += [
                f"        if not EMAIL_PATTERN.fullmatch(self.{name}):",
                f'            raise ValidationError("{name}", "is not a valid email address")',
            ]
        elif kind == "float":
            out += [
                f"        if not 0.0 <= self.{name} <= 1.0:",
                f'            raise ValidationError("{name}", "must be between 0 and 1")',
            ]
        elif kind == "optional":
            out += [
                f"        if self.{name} is not None and len(self.{name}) > MAX_TEXT_LENGTH:",
                f'            raise ValidationError("{name}", "is too long")',
            ]
    return out


def _py_from_dict(name: str, kind: str) -> str:
    return {
        "email": f'str(data["{name}"]).strip().lower()',
        "money": f'int(data["{name}"])',
        "int": f'int(data["{name}"])',
        "str": f'str(data["{name}"])',
        "date": f'date.fromisoformat(data["{name}"])',
        "bool": f'bool(data.get("{name}", False))',
        "optional": f'data.get("{name}")',
        "float": f'float(data["{name}"])',
    }[kind]


def py_model(pkg: str, e: Entity, rng: random.Random) -> str:
    """The record's dataclass: fields, validation, status changes and JSON conversion."""
    cls = e.cls
    a_name = with_article(e.name)
    money = any(k == "money" for _, k in e.fields)
    email = any(k == "email" for _, k in e.fields)
    first, *_ = e.statuses
    transitions = []
    for i, status in enumerate(e.statuses):
        nexts = [s for s in e.statuses[i + 1 :] if s != status][:2]
        if status != e.statuses[-1] and e.statuses[-1] not in nexts:
            nexts.append(e.statuses[-1])
        inner = ", ".join(f"{cls}Status.{s.upper()}" for s in nexts)
        value = f"frozenset({{{inner}}})" if nexts else "frozenset()"
        transitions.append(f"    {cls}Status.{status.upper()}: {value},")
    constants = [f"MAX_TEXT_LENGTH = {rng.choice((200, 255, 500))}"]
    constants.append(f"MAX_TAGS = {rng.choice((8, 10, 16))}")
    if money:
        constants.append(f"MAX_AMOUNT_CENTS = {rng.choice(('5_000_000', '10_000_000'))}")
    if email:
        constants.append('EMAIL_PATTERN = re.compile(r"[^@\\s]+@[^@\\s]+\\.[a-z]{2,}")')
    date_fields = [n for n, k in e.fields if k == "date"]
    lines = [
        f'"""{cls} records: their fields, validation and conversion to and from JSON."""',
        "",
        "from __future__ import annotations",
        "",
        "import enum",
        *(["import re"] if email else []),
        "from dataclasses import asdict, dataclass, field",
        "from datetime import date, datetime, timezone",
        "from typing import Any",
        "",
        *constants,
        "",
        "",
        f"class {cls}Status(str, enum.Enum):",
        f'    """Where {a_name} is in its life cycle."""',
        "",
        *[f'    {s.upper()} = "{s}"' for s in e.statuses],
        "",
        "",
        "class ValidationError(ValueError):",
        f'    """{a_name.capitalize()} field holds a value the application does not accept."""',
        "",
        "    def __init__(self, field_name: str, message: str) -> None:",
        '        super().__init__(f"{field_name}: {message}")',
        "        self.field_name = field_name",
        "",
        "",
        "# Which status may follow which; anything else is a stale client or a bug.",
        f"_TRANSITIONS: dict[{cls}Status, frozenset[{cls}Status]] = {{",
        *transitions,
        "}",
        "",
        "",
        "@dataclass",
        f"class {cls}:",
        f'    """One {e.name} as stored and as the API returns it."""',
        "",
        *[f"    {n}: {_PY_TYPES[k]}" for n, k in _required(e)],
        "    id: int | None = None",
        f"    status: {cls}Status = {cls}Status.{first.upper()}",
        "    tags: list[str] = field(default_factory=list)",
        "    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))",
        *[
            f"    {n}: {_PY_TYPES[k]} = {'False' if k == 'bool' else 'None'}"
            for n, k in _defaulted(e)
        ],
        "",
        "    def validate(self) -> None:",
        '        """Raise ValidationError for the first field that is not acceptable."""',
        *_py_checks(e),
        "        if len(self.tags) > MAX_TAGS:",
        '            raise ValidationError("tags", f"at most {MAX_TAGS} tags are allowed")',
        "",
        f"    def transition(self, new_status: {cls}Status) -> None:",
        '        """Move to new_status, or raise ValidationError if that step is not allowed."""',
        "        if new_status not in _TRANSITIONS[self.status]:",
        "            raise ValidationError(",
        '                "status", f"cannot go from {self.status.value} to {new_status.value}"',
        "            )",
        "        self.status = new_status",
        "",
        "    @property",
        "    def is_final(self) -> bool:",
        '        """Whether no further status change is possible."""',
        "        return not _TRANSITIONS[self.status]",
        "",
        "    def to_dict(self) -> dict[str, Any]:",
        '        """A JSON-ready dict: enums as their values, dates as ISO 8601 strings."""',
        "        data = asdict(self)",
        '        data["status"] = self.status.value',
        '        data["created_at"] = self.created_at.isoformat()',
        *[f'        data["{n}"] = self.{n}.isoformat()' for n in date_fields],
        "        return data",
        "",
        "    @classmethod",
        f"    def from_dict(cls, data: dict[str, Any]) -> {cls}:",
        '        """Build one from a request body or a stored document; validates it."""',
        "        item = cls(",
        *[f"            {n}={_py_from_dict(n, k)}," for n, k in _required(e)],
        '            id=data.get("id"),',
        f'            status={cls}Status(data.get("status", "{first}")),',
        '            tags=parse_tags(data.get("tags", "")),',
        *[f"            {n}={_py_from_dict(n, k)}," for n, k in _defaulted(e)],
        "        )",
        '        if "created_at" in data:',
        '            item.created_at = datetime.fromisoformat(data["created_at"])',
        "        item.validate()",
        "        return item",
        "",
        "",
        "def parse_tags(raw: str | list[str]) -> list[str]:",
        '    """Tags from a comma-separated string or a list: trimmed, lower-case, unique."""',
        '    items = raw.split(",") if isinstance(raw, str) else raw',
        "    seen: dict[str, None] = {}",
        "    for tag in items:",
        "        tag = tag.strip().lower()",
        "        if tag:",
        "            seen.setdefault(tag, None)",
        "    return list(seen)",
    ]
    return "\n".join(lines) + "\n"


def py_repository(pkg: str, e: Entity, rng: random.Random) -> str:
    """The record's SQLite storage."""
    values = []
    from_row = []
    for n, k in e.fields:
        values.append(f"item.{n}.isoformat()" if k == "date" else f"item.{n}")
        if k == "date":
            from_row.append(f'            {n}=date.fromisoformat(row["{n}"]),')
        elif k == "bool":
            from_row.append(f'            {n}=bool(row["{n}"]),')
        else:
            from_row.append(f'            {n}=row["{n}"],')
    return fill(
        template("repository.py.txt"),
        pkg=pkg,
        name=e.name,
        a_name=with_article(e.name),
        cls=e.cls,
        plural=e.plural,
        plural_title=e.plural.title(),
        columns=", ".join(f'"{n}"' for n, _ in e.fields) + ",",
        timeout=str(rng.choice((5, 10, 30))),
        limit=str(rng.choice((50, 100))),
        sql="\n".join(f"    {n} {_SQL_TYPES[k]}," for n, k in e.fields),
        values=", ".join(values) + ",",
        from_row="\n".join(from_row),
    )


def py_service(pkg: str, e: Entity, rng: random.Random) -> str:
    """The record's business rules, and a total of its money field if it has one."""
    money = next((n for n, k in e.fields if k == "money"), None)
    extra = ""
    if money is not None:
        extra = fill(
            '''
    def <<method>>(self, status: str | None = None) -> int:
        """The sum of <<money>> over <<plural>>, optionally of one status only."""
        total = 0
        offset = 0
        while True:
            page = self.page(offset, MAX_PAGE_SIZE, status)
            total += sum(item.<<money>> for item in page.items)
            if not page.has_more:
                return total
            offset += len(page.items)
''',
            money=money,
            plural=e.plural,
            # "total_total_cents" would read like a typo.
            method=f"sum_{money}" if money.startswith("total") else f"total_{money}",
        )
    return fill(
        template("service.py.txt"),
        pkg=pkg,
        name=e.name,
        a_name=with_article(e.name),
        cls=e.cls,
        plural=e.plural,
        page=str(rng.choice((20, 25, 50))),
        max_page=str(rng.choice((100, 200, 500))),
        retries=str(rng.choice((3, 4, 5))),
        delay=str(rng.choice((0.1, 0.2, 0.25))),
        stale=str(rng.choice((30, 60, 90))),
        FIRST=e.statuses[0].upper(),
        LAST=e.statuses[-1].upper(),
        last=e.statuses[-1],
        extra=extra,
    )


def py_cli(pkg: str, entities: Sequence[Entity], rng: random.Random) -> str:
    """The command line: one sub-command per record type, plus a summary."""
    imports = []
    commands = []
    handlers = []
    for e in entities:
        imports.append(f"from {pkg}.repositories.{e.name}_repository import {e.cls}Repository")
        imports.append(f"from {pkg}.services.{e.name}_service import {e.cls}Service")
        commands += [
            f'    {e.name} = sub.add_parser("{e.plural}", help="list {e.plural}")',
            f'    {e.name}.add_argument("--status", help="only {e.plural} in this status")',
            f'    {e.name}.add_argument("--limit", type=int, default=DEFAULT_LIMIT)',
            f"    {e.name}.set_defaults(handler=list_{e.plural})",
        ]
        handlers += [
            "",
            "",
            f"def list_{e.plural}(args: argparse.Namespace, settings: Settings) -> int:",
            f'    """Print {e.plural} as JSON lines."""',
            f"    service = {e.cls}Service({e.cls}Repository(str(settings.database)))",
            "    page = service.page(0, args.limit, args.status)",
            "    for item in page.items:",
            "        print(json.dumps(item.to_dict()))",
            "    if page.has_more:",
            '        print(f"... more; raise --limit (now {args.limit})", file=sys.stderr)',
            "    return 0",
        ]
    summaries = [
        f'    counts["{e.plural}"] = {e.cls}Service({e.cls}Repository(db)).summary()'
        for e in entities
    ]
    lines = [
        f'"""The `{pkg}` command: inspect and maintain the database from a terminal."""',
        "",
        "from __future__ import annotations",
        "",
        "import argparse",
        "import json",
        "import logging",
        "import sys",
        "",
        f"from {pkg}.config import ConfigError, Settings, load_settings",
        *sorted(imports),
        "",
        f"DEFAULT_LIMIT = {rng.choice((20, 50))}",
        "",
        "",
        "def build_parser() -> argparse.ArgumentParser:",
        '    """The command line: one sub-command per record type, plus summary."""',
        f'    parser = argparse.ArgumentParser(prog="{pkg}")',
        '    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output")',
        '    sub = parser.add_subparsers(dest="command", required=True)',
        *commands,
        '    summary = sub.add_parser("summary", help="counts by status")',
        "    summary.set_defaults(handler=print_summary)",
        "    return parser",
        *handlers,
        "",
        "",
        "def print_summary(args: argparse.Namespace, settings: Settings) -> int:",
        '    """Print how many records are in each status, as one JSON object."""',
        "    db = str(settings.database)",
        "    counts: dict[str, dict[str, int]] = {}",
        *summaries,
        "    print(json.dumps(counts, indent=2))",
        "    return 0",
        "",
        "",
        "def main(argv: list[str] | None = None) -> int:",
        '    """Parse the command line and run the sub-command; the exit status."""',
        "    args = build_parser().parse_args(argv)",
        "    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)",
        "    try:",
        "        settings = load_settings()",
        "    except ConfigError as exc:",
        '        print(f"configuration error: {exc}", file=sys.stderr)',
        "        return 2",
        "    return int(args.handler(args, settings))",
        "",
        "",
        'if __name__ == "__main__":',
        "    sys.exit(main())",
    ]
    return "\n".join(lines) + "\n"


def py_config(pkg: str, rng: random.Random) -> str:
    """The settings module, read from the environment."""
    return fill(
        template("config.py.txt"),
        PKG=pkg.upper(),
        pkg=pkg,
        port=str(rng.choice((8000, 8080, 5000))),
        workers=str(rng.choice((2, 4))),
    )


def py_cache(rng: random.Random) -> str:
    """An in-process cache with a time to live."""
    return fill(
        template("cache.py.txt"),
        ttl=str(rng.choice((30.0, 60.0, 300.0))),
        entries=str(rng.choice((256, 1024))),
    )


def py_http(rng: random.Random) -> str:
    """A client of a payment provider's HTTP API, with retries."""
    return fill(
        template("http_client.py.txt"),
        timeout=str(rng.choice((5.0, 10.0))),
        retries=str(rng.choice((2, 3, 4))),
        backoff=str(rng.choice((0.5, 1.0))),
    )
