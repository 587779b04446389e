"""Shared test helpers (moved from test_store_contract.py, which other tests imported)."""

from __future__ import annotations

from bot.models import Item, Message

T0 = 1_700_000_000.0  # a fixed "now" so TTL arithmetic is exact


DAY = 86400.0


P, S, R = "support", "inbox", "v1"


def _msg(i: str) -> Message:
    return Message(message_id=f"<{i}@mail.example>", from_addr=f"{i}@customer.example",
                   reply_to=f"{i}@customer.example", to=["support@shop.example"],
                   subject=f"Order {i}", body=f"Where is order {i}? Grüße ✓",
                   references=["<x@y>"], headers={"List-Id": "none"}, thread_id=f"t-{i}")


def _items(*ids: str, skip: dict[str, str] | None = None) -> list[Item]:
    skip = skip or {}
    return [Item(i, _msg(i), skip_reason=skip.get(i)) for i in ids]


