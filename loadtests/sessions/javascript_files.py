"""The JavaScript half of a generated repository: API client, routes, store and formatting."""

from __future__ import annotations

import random

from loadtests.sessions.entities import Entity, camel_case
from loadtests.sessions.templating import fill, template


def js_api(project: str, e: Entity, rng: random.Random) -> str:
    """The browser's client of the record's endpoints."""
    return fill(
        template("api.js.txt"),
        page=str(rng.choice((20, 25, 50))),
        ttl=str(rng.choice((5000, 15000))),
        **_names(project, e),
    )


def js_routes(project: str, e: Entity, rng: random.Random) -> str:
    """The server's Express routes of the record, with its validation."""
    return fill(
        template("routes.js.txt"),
        max_page=str(rng.choice((100, 200))),
        max_text=str(rng.choice((200, 500))),
        statuses=", ".join(f"'{s}'" for s in e.statuses),
        checks="\n".join(_js_checks(e)),
        **_names(project, e),
    )


def js_store(project: str, e: Entity, rng: random.Random) -> str:
    """The client-side state of the record's screen."""
    return fill(
        template("store.js.txt"), reload=str(rng.choice((30000, 60000))), **_names(project, e)
    )


def js_format(rng: random.Random) -> str:
    """Formatting helpers shared by the screens."""
    return fill(
        template("format.js.txt"),
        locale=rng.choice(("en-US", "en-GB", "de-DE")),
        currency=rng.choice(("USD", "EUR", "GBP")),
        truncate=str(rng.choice((80, 120))),
        debounce=str(rng.choice((200, 300))),
    )


def _names(project: str, e: Entity) -> dict[str, str]:
    """The markers every per-record template shares."""
    return {
        "project": project,
        "plural": e.plural,
        "Plural": e.plural_camel[0].upper() + e.plural_camel[1:],
        "Cls": e.cls,
        "name": e.name,
        "camel": e.camel,
    }


def _js_checks(e: Entity) -> list[str]:
    out = []
    for name, kind in e.fields:
        c = camel_case(name)
        if kind in ("int", "money"):
            out += [
                f"  if (!Number.isInteger(body.{c}) || body.{c} < 0) {{",
                f"    errors.push('{c} must be a non-negative integer');",
                "  }",
            ]
        elif kind == "str":
            out += [
                f"  if (typeof body.{c} !== 'string' || body.{c}.trim() === '') {{",
                f"    errors.push('{c} is required');",
                f"  }} else if (body.{c}.length > MAX_TEXT_LENGTH) {{",
                f"    errors.push('{c} is too long');",
                "  }",
            ]
        elif kind == "email":
            out += [
                f"  if (typeof body.{c} !== 'string' || !EMAIL_RE.test(body.{c})) {{",
                f"    errors.push('{c} must be an email address');",
                "  }",
            ]
        elif kind == "date":
            out += [
                f"  if (typeof body.{c} !== 'string' || Number.isNaN(Date.parse(body.{c}))) {{",
                f"    errors.push('{c} must be an ISO date');",
                "  }",
            ]
        elif kind == "bool":
            out += [
                f"  if (body.{c} !== undefined && typeof body.{c} !== 'boolean') {{",
                f"    errors.push('{c} must be true or false');",
                "  }",
            ]
        elif kind == "float":
            out += [
                f"  if (typeof body.{c} !== 'number' || body.{c} < 0 || body.{c} > 1) {{",
                f"    errors.push('{c} must be a number between 0 and 1');",
                "  }",
            ]
        elif kind == "optional":
            out += [
                f"  if (body.{c} != null && typeof body.{c} !== 'string') {{",
                f"    errors.push('{c} must be a string');",
                "  }",
            ]
    return out
