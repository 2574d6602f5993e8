"""The record types and projects the generated repositories are made of."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Entity:
    """A record type the generated application manages, with its fields by kind."""

    name: str
    plural: str
    fields: tuple[tuple[str, str], ...]
    statuses: tuple[str, ...]

    @property
    def cls(self) -> str:
        """The class name, e.g. Invoice."""
        return "".join(part.title() for part in self.name.split("_"))

    @property
    def camel(self) -> str:
        """The JavaScript variable name, e.g. invoice."""
        return camel_case(self.name)

    @property
    def plural_camel(self) -> str:
        """The JavaScript name of a list of them."""
        return camel_case(self.plural)


ENTITIES: Final[tuple[Entity, ...]] = (
    Entity(
        "invoice",
        "invoices",
        (
            ("customer_email", "email"),
            ("amount_cents", "money"),
            ("currency", "str"),
            ("due_date", "date"),
            ("paid", "bool"),
            ("memo", "optional"),
        ),
        ("draft", "sent", "paid", "void"),
    ),
    Entity(
        "order",
        "orders",
        (
            ("customer_id", "int"),
            ("total_cents", "money"),
            ("shipping_address", "str"),
            ("placed_on", "date"),
            ("gift", "bool"),
            ("coupon_code", "optional"),
        ),
        ("pending", "paid", "shipped", "delivered", "cancelled"),
    ),
    Entity(
        "ticket",
        "tickets",
        (
            ("title", "str"),
            ("reporter_email", "email"),
            ("priority", "int"),
            ("opened_on", "date"),
            ("escalated", "bool"),
            ("assignee", "optional"),
        ),
        ("open", "in_progress", "resolved", "closed"),
    ),
    Entity(
        "product",
        "products",
        (
            ("sku", "str"),
            ("name", "str"),
            ("price_cents", "money"),
            ("stock", "int"),
            ("discount_rate", "float"),
            ("discontinued", "bool"),
        ),
        ("draft", "listed", "archived"),
    ),
    Entity(
        "booking",
        "bookings",
        (
            ("guest_email", "email"),
            ("room_number", "int"),
            ("check_in", "date"),
            ("nights", "int"),
            ("deposit_cents", "money"),
            ("special_requests", "optional"),
        ),
        ("requested", "confirmed", "checked_in", "completed", "cancelled"),
    ),
    Entity(
        "subscription",
        "subscriptions",
        (
            ("account_email", "email"),
            ("plan", "str"),
            ("monthly_cents", "money"),
            ("started_on", "date"),
            ("auto_renew", "bool"),
            ("cancel_reason", "optional"),
        ),
        ("trial", "active", "past_due", "cancelled"),
    ),
    Entity(
        "shipment",
        "shipments",
        (
            ("tracking_number", "str"),
            ("carrier", "str"),
            ("weight_grams", "int"),
            ("shipped_on", "date"),
            ("insured", "bool"),
            ("signed_by", "optional"),
        ),
        ("created", "in_transit", "delivered", "returned"),
    ),
    Entity(
        "expense",
        "expenses",
        (
            ("employee_email", "email"),
            ("amount_cents", "money"),
            ("category", "str"),
            ("incurred_on", "date"),
            ("reimbursed", "bool"),
            ("receipt_url", "optional"),
        ),
        ("submitted", "approved", "rejected", "paid"),
    ),
)
# (project name, Python package, what it does)
PROJECTS: Final = (
    ("ledgerly", "ledger", "bookkeeping for small businesses"),
    ("stockpile", "stock", "inventory and order tracking for a warehouse"),
    ("deskmate", "desk", "an internal help desk"),
    ("harborline", "harbor", "logistics for a shipping company"),
    ("tallyhub", "tally", "expense reporting for a consultancy"),
    ("fernway", "fern", "bookings for a chain of small hotels"),
)


def camel_case(snake: str) -> str:
    """snake_case as camelCase, e.g. due_date -> dueDate."""
    head, *rest = snake.split("_")
    return head + "".join(p.title() for p in rest)


def with_article(noun: str) -> str:
    """The noun after "a" or "an", its underscores as spaces."""
    return ("an " if noun[0] in "aeiou" else "a ") + noun.replace("_", " ")
