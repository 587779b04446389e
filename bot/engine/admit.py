"""Storing what a fetch returned: the admit step of a tick, in bounded batches.

A fetch brings at most ``max_per_tick`` new items. They are stored
:data:`ADMIT_BATCH` to a transaction (each batch marks its items seen and queues
them in one transaction, as ``Store.admit`` promises), so a big fetch is not one
big write, and a store error in one batch is narrowed down item by item: one item
the store cannot take (a full disk, a row it refuses) does not keep the others out.
"""

from __future__ import annotations

import logging
from typing import Callable

from ..config.load import PipelineConfig
from ..errors import StoreUnavailable, describe_error
from ..models import FetchResult, Item, RunCounts, draft_key
from ..store import AdmitResult, Store

log = logging.getLogger("draftgate.engine")

#: New items stored per admit transaction.
ADMIT_BATCH = 50


async def admit_fetched(store: Store, p: PipelineConfig, scope: str, result: FetchResult,
                        counts: RunCounts, *, check: Callable[[], None],
                        clock: Callable[[], float]) -> list[tuple[str, str]]:
    """Store ``result``'s items and cursor; count them in ``counts``. Returns the
    items the store refused as (item id, error): they are not marked seen, and then
    the cursor is not stored either, so the next fetch lists them again (the seen
    marks keep the others from being admitted twice). The cursor goes with the last
    batch, so a crash midway also re-lists from the old cursor. ``check`` raises if
    the tick must stop (its pipeline lock was lost)."""
    refused: list[tuple[str, str]] = []
    items = result.items
    batches = [items[i:i + ADMIT_BATCH] for i in range(0, len(items), ADMIT_BATCH)] or [[]]
    seen = 0
    for n, batch in enumerate(batches):
        check()
        cursor = result.cursor if n == len(batches) - 1 and not refused else None
        try:
            results = [await _admit(store, p, scope, batch, cursor, clock)]
        except StoreUnavailable:
            raise  # the store is down, not this batch: left unseen, fetched again
        except Exception as exc:
            if not batch:
                raise  # only the cursor: nothing to narrow down
            if len(batch) == 1:
                refused.append((batch[0].item_id, describe_error(exc)))
                continue
            log.warning("%s: storing %d new item(s) at once failed (%s); storing them one "
                        "by one", p.name, len(batch), describe_error(exc))
            results = await _one_by_one(store, p, scope, batch, refused, check, clock)
            if cursor is not None and not refused:
                results.append(await _admit(store, p, scope, [], cursor, clock))
        by_key = {draft_key(p.name, scope, it.item_id, p.recipe): it for it in batch}
        for admitted in results:
            counts.new += len(admitted.new)
            counts.skipped += len(admitted.skipped)
            seen += admitted.already_seen
            for key in admitted.skipped:
                if key in by_key:
                    log.info("%s: skipped %s: %s", p.name, by_key[key].item_id,
                             by_key[key].skip_reason)
            if admitted.skipped and p.mark_seen == "on_success":
                # Skipped is final: seen now, or a source would list it on every tick
                # and, with max_per_tick of them first in line, never get past them.
                await store.mark_seen(p.name, scope, [by_key[k].item_id for k in
                                                      admitted.skipped if k in by_key], now=clock())
    if counts.new or counts.skipped:
        log.info("%s: fetched %d, admitted %d new, %d skipped, %d seen before",
                 p.name, counts.fetched, counts.new, counts.skipped, seen)
    return refused


async def _one_by_one(store: Store, p: PipelineConfig, scope: str, batch: list[Item],
                      refused: list[tuple[str, str]], check: Callable[[], None],
                      clock: Callable[[], float]) -> list[AdmitResult]:
    """Each item of ``batch`` in its own transaction; the refused ones are added to
    ``refused``. Three refusals in a row with none taken: the store is down, not one
    item, so the error is raised instead of trying the rest one by one."""
    results: list[AdmitResult] = []
    failures = 0
    for item in batch:
        check()
        try:
            results.append(await _admit(store, p, scope, [item], None, clock))
            failures = 0
        except StoreUnavailable:
            raise
        except Exception as exc:
            failures += 1
            if failures >= 3 and not results:
                raise
            refused.append((item.item_id, describe_error(exc)))
            log.warning("%s: could not store %s: %s", p.name, item.item_id, describe_error(exc))
    return results


async def _admit(store: Store, p: PipelineConfig, scope: str, items: list[Item],
                 cursor: str | None, clock: Callable[[], float]) -> AdmitResult:
    if not items and cursor is None:
        return AdmitResult()
    return await store.admit(p.name, scope, p.recipe, items, cursor=cursor,
                             mark_seen=p.mark_seen == "at_fetch", now=clock())
