"""Shared test helpers (moved from test_triage.py, which other tests imported)."""

from __future__ import annotations


def is_triage(req) -> bool:
    """Was this request a triage call (asked for the decision's JSON schema)?"""
    return "response_format" in req.body or "output_config" in req.body


