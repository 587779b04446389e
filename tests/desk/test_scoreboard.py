"""The scoreboard (issue 25 item 1) from a history the test builds through the store's
own transitions, with an injected clock, on every backend (the ``store`` fixture:
SQLite, and PostgreSQL when DRAFTGATE_TEST_PG_DSN is set): sent as drafted, edits and
their size, regenerations, rejections, time from card to decision, triage overrides,
unsupported claims; by pipeline, operator and week."""

from __future__ import annotations

import pytest

from bot import scoreboard
from bot.desk import stats
from bot.errors import ConfigError
from tests.support.store_data import DAY, T0, S, _items

ANNA, BO = "tg:42 (Anna)", "tg:43 (Bo)"
FIRST = "Hello Alice, your order ships today by courier."
EDITED = "Hello Alice, your order shipped yesterday by post."


def levenshtein(a: str, b: str) -> int:
    """The textbook dynamic programme, to check the library's answer."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


async def drafted(store, item: str, t: float, body: str = "Hi, it ships today.", *,
                  pipeline: str = "support", claims: tuple[str, ...] = ()):
    [key] = (await store.admit(pipeline, S, "v1", _items(item), now=t)).new
    d = await store.claim_key(key, 600, now=t)
    return await store.finish_draft(d.id, d.fence, body, now=t,
                                    used={"unsupported": list(claims)} if claims else None)


async def posted(store, d, t: float):
    return await store.mark_posted(d.id, d.version, "-100123", "77", now=t)


async def sent(store, d, who: str, t: float):
    await store.approve(d.id, d.version, who, now=t)
    await store.begin_send(d.id)
    return await store.mark_sent(d.id, f"msg-{d.id}", now=t)


async def history(store) -> None:
    """Five decisions and two overrides in the window, two decisions outside it."""
    d = await posted(store, await drafted(store, "m1", T0, claims=("€25", "14 days")), T0 + 100)
    await sent(store, d, ANNA, T0 + 700)  # as drafted, 10 min, both claims sent unchanged
    d = await posted(store, await drafted(store, "m2", T0, FIRST, claims=("today",)), T0 + 1000)
    d = await store.edit(d.id, d.version, EDITED, ANNA, now=T0 + 1200, used={"unsupported": []})
    d = await posted(store, d, T0 + 1300)
    await sent(store, d, BO, T0 + 2800)  # edited by Anna, approved by Bo after 30 min
    d = await posted(store, await drafted(store, "m3", T0), T0 + 3000)
    d = await store.regenerate(d.id, d.version, ANNA, "shorter", now=T0 + 3100)
    d = await store.claim_key(d.key, 600, now=T0 + 3200)
    d = await posted(store, await store.finish_draft(d.id, d.fence, "Shipped.", now=T0 + 3200),
                     T0 + 3300)
    await sent(store, d, ANNA, T0 + 6600)  # regenerated once, an hour after its first card
    d = await posted(store, await drafted(store, "m4", T0 + 8 * DAY), T0 + 8 * DAY)
    await store.reject(d.id, d.version, BO, "wrong order", now=T0 + 8 * DAY + 7200)
    d = await posted(store, await drafted(store, "m7", T0, pipeline="sales"), T0 + 5 * DAY)
    await sent(store, d, ANNA, T0 + 5 * DAY + 60)
    d = await posted(store, await drafted(store, "m8", T0 - 3 * DAY, pipeline="sales"),
                     T0 - 2 * DAY)
    await sent(store, d, BO, T0 - 2 * DAY)  # before the window
    # Triage overridden: a skipped item replayed by Anna, an FYI answered by Bo.
    for item, action in (("m5", "skip"), ("m6", "notify")):
        [key] = (await store.admit("support", S, "v1", _items(item), now=T0)).new
        d = await store.claim_key(key, 600, now=T0)
        d = await store.record_triage(d.id, d.fence, action, "newsletter", lease_seconds=600,
                                      now=T0)
    assert (await store.replay("support", "m5", ANNA, now=T0 + 9 * DAY)).outcome == "requeued"
    [fyi] = await store.item_drafts("support", "m6")
    fyi = await posted(store, fyi, T0 + 10)
    assert await store.draft_reply(fyi.id, fyi.version, BO, now=T0 + 9 * DAY + 10) is not None


async def test_the_scoreboard_counts_the_history_the_store_kept(store):
    """Decided 5 in the window: 2 sent as drafted of 4 sent, 1 edited (its size measured
    from the first version's text, kept by the edit), 1 regenerated, 1 rejected; card to
    decision p50 30 min, p90 2 h; 2 triage overrides; 3 claims flagged, 2 sent unchanged."""
    await history(store)
    since, until = T0, T0 + 14 * DAY
    decisions, overrides = await store.quality(since, until)
    size = levenshtein(FIRST, EDITED) / max(len(FIRST), len(EDITED))
    # Measured when it was sent, from the first version's text the edit kept.
    assert [d.size for d in decisions if d.size is not None] == [pytest.approx(size)]
    assert [tuple(r) for r in await store._query(
        "SELECT first_body FROM drafts WHERE item_id = 'm2'")] == [(FIRST,)]
    board = scoreboard.build(decisions, overrides, since=since, until=until)
    t = board.total
    assert (t.decided, t.sent, t.sent_as_drafted, t.edited, t.rejected) == (5, 4, 2, 1, 1)
    assert t.edit_size_median == pytest.approx(size)
    assert (t.regenerations, t.regenerations_per_sent) == (1, 0.25)
    assert (t.decision_p50, t.decision_p90) == (1800, 7200)
    assert t.overridden == 2
    assert (t.flagged, t.flagged_sent, t.flagged_per_draft) == (3, 2, pytest.approx(0.6))
    assert t.as_drafted_share == 0.5
    assert {k: (f.decided, f.sent, f.overridden) for k, f in board.pipelines.items()} == {
        "support": (4, 3, 2), "sales": (1, 1, 0)}
    assert {k: (f.decided, f.sent_as_drafted, f.rejected, f.overridden)
            for k, f in board.operators.items()} == {"tg:42": (3, 2, 0, 1),
                                                     "tg:43": (2, 0, 1, 1)}
    assert board.names == {"tg:42": ANNA, "tg:43": BO}
    # Weeks from Monday 13 Nov 2023 (T0 is a Tuesday): the first holds m1-m3 and m7.
    assert [(scoreboard._day(w), f.decided, f.overridden) for w, f in board.weeks] == [
        ("2023-11-13", 4, 0), ("2023-11-20", 1, 2), ("2023-11-27", 0, 0)]
    only, _ = await store.quality(since, until, "sales")
    assert [d.pipeline for d in only] == ["sales"]


async def test_a_sent_draft_nobody_touched_keeps_no_second_copy_of_its_text(store):
    """The first version is kept only when an edit or a regenerate replaces it."""
    d = await posted(store, await drafted(store, "m1", T0), T0 + 1)
    await sent(store, d, ANNA, T0 + 2)
    [decision], _ = await store.quality(T0, T0 + DAY)
    assert (decision.size, decision.edits, decision.regenerations) == (None, 0, 0)
    assert [tuple(r) for r in await store._query("SELECT first_body FROM drafts")] == [(None,)]


async def test_metrics_carry_the_scoreboard_of_each_pipeline_as_gauges(store):
    """/metrics: draftgate_scoreboard{pipeline, figure}, the same figures as the board;
    no item id, draft id or address in a label."""
    from prometheus_client.parser import text_string_to_metric_families

    from bot.service.metrics import Metrics, Observer

    await history(store)
    observer = Observer(Metrics("test"))
    await observer.refresh_store(store, now=T0 + 14 * DAY)
    [family] = [f for f in text_string_to_metric_families(observer.exposition().decode())
                if f.name == "draftgate_scoreboard"]
    got = {(s.labels["pipeline"], s.labels["figure"]): s.value for s in family.samples}
    # 30 days back from T0 + 14 days: m8, before the 14-day window, is in this one.
    assert got[("support", "decided")] == 4 and got[("sales", "decided")] == 2
    assert got[("support", "as_drafted_share")] == pytest.approx(1 / 3)
    assert got[("support", "decision_p90")] == 7200 and got[("support", "overridden")] == 2
    assert {k for k, _ in got} == {"support", "sales"}


def test_the_summary_says_what_the_window_holds():
    board = scoreboard.build([], [], since=T0, until=T0 + 30 * DAY, pipeline="support")
    assert "no draft decided in this window" in stats.summary(board)
    d = scoreboard.Decision("support", ANNA, "sent", T0 + 10, T0, 0, 0, 0, 0)
    text = stats.report(scoreboard.build([d], [], since=T0, until=T0 + 30 * DAY))
    assert "sent as drafted 100% (1/1)" in text and "decision p50 10s" in text
    assert "Anna" in text


@pytest.mark.parametrize("text,days", [("30d", 30), ("8w", 56), ("14", 14), (" 2.5d ", 2.5)])
def test_a_window_is_days_or_weeks(text, days):
    assert stats.parse_window(text) == days


@pytest.mark.parametrize("text", ["", "0d", "-3d", "30x", "1000d", "d"])
def test_a_bad_window_says_what_is_expected(text):
    with pytest.raises(ConfigError, match="expected a window like 30d, 8w or 14"):
        stats.parse_window(text)
