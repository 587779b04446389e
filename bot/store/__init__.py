"""The only package that speaks SQL. ``open_store(url)`` picks the backend."""

from __future__ import annotations

from .base import AdmitResult, ReplayResult, StoreMissing, SweepResult
from .sql import SqlStore as Store  # the contract: see base.py


def create_store(url: str) -> Store:
    """A Store for ``sqlite:///path`` or ``postgresql://...`` (not yet opened)."""
    if url.startswith("sqlite://"):
        from .sqlite import SQLiteStore

        return SQLiteStore(url)
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStore

        return PostgresStore(url)
    raise ValueError(f"unknown store URL {url!r}; expected sqlite:///path or postgresql://...")


__all__ = ["create_store", "Store", "StoreMissing", "AdmitResult", "ReplayResult", "SweepResult"]
