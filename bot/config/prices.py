"""``models.<name>.price``: what a model costs, for ``draftgate eval``'s estimate.

::

    models:
      default:
        provider: openai
        model: gpt-4.1-mini
        price: {input: 0.4, output: 1.6}   # US dollars per million tokens

Both figures are per million tokens, input (the request) and output (the draft). A
model without ``price`` has no estimate: eval shows its tokens and no cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .checker import Checker


@dataclass(frozen=True)
class Price:
    input: float  # per million input tokens
    output: float  # per million output tokens

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input + tokens_out * self.output) / 1_000_000


def parse_price(ck: Checker, model: dict[str, Any], where: str) -> Price | None:
    """``model["price"]`` checked (errors name the key path), or None when absent."""
    if model.get("price") is None:
        return None
    path = f"{where}.price"
    raw = ck.mapping(model["price"], path)
    ck.unknown(raw, ("input", "output"), path)
    figures = []
    for key in ("input", "output"):
        value = ck.get(raw, key, path, float)
        if value is not None and value < 0:
            ck.error(f"{path}.{key}", f"expected a price of 0 or more per million tokens, "
                                      f"got {value}")
            value = None
        figures.append(value)
    if None in figures:
        return None
    return Price(float(figures[0]), float(figures[1]))
