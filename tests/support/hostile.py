"""Shared test helpers (moved from test_hostile_emails.py, which other tests imported)."""

from __future__ import annotations

from pathlib import Path

CORPUS = sorted((Path(__file__).parents[1] / "corpus_hostile").glob("*.eml"))


