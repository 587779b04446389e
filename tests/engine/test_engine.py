"""The engine keeps the three promises across ticks, failures and decisions.

Stages here are small recording doubles of the stage Protocols (the real sources,
drafters, senders and channels have their own tests against fake servers); the store
is the real SQLite store on a file.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from bot.approvals.base import DeskChannel
from bot.config.load import load_settings
from bot.config.options import FilterOptions
from bot.engine.engine import Engine
from bot.errors import (
    DrafterError,
    DrafterRetryable,
    SendFailed,
    SendUnknown,
    SourceError,
    StoreError,
)
from bot.models import DraftResult, FetchResult, Item, Message, SendResult
from bot.stages import PostedRef
from bot.store import create_store
from tests.support.desk import op, started
from tests.support.held import Held

T0 = 1_764_410_400.0  # 2025-11-29T10:00:00Z


class Clock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class ListSource:
    scope = "test"

    def __init__(self, messages: list[Message] | None = None):
        self.messages = list(messages or [])
        self.fail: Exception | None = None
        self.calls = 0

    async def fetch(self, ctx):
        self.calls += 1
        if self.fail:
            raise self.fail
        return FetchResult([Item(m.message_id, m) for m in self.messages])

    async def close(self):
        pass


class ScriptDrafter:
    name = "script"

    def __init__(self):
        self.calls: list[str] = []
        self.errors: list[Exception] = []
        self.tokens = 0

    async def draft(self, request):
        self.calls.append(request.draft_key)
        if self.errors:
            raise self.errors.pop(0)
        text = f"Hello {request.message.from_name or 'there'}, about {request.message.subject}."
        if request.instruction:
            text += f" ({request.instruction})"
        return DraftResult(text, tokens_in=self.tokens, tokens_out=self.tokens)

    async def close(self):
        pass


class RecordingSender:
    name = "rec"

    def __init__(self):
        self.sent: list[tuple[str, str]] = []  # (key, body)
        self.script: list[Exception] = []
        self.delivered_on_unknown = False
        self.check_calls = 0
        self.calls = 0

    async def send(self, draft):
        self.calls += 1
        self.sent.append((draft.key, draft.body))
        if self.script:
            exc = self.script.pop(0)
            if isinstance(exc, SendUnknown) and not self.delivered_on_unknown:
                self.sent.pop()
            raise exc
        return SendResult(f"sent-{draft.id}")

    async def check(self, draft):
        self.check_calls += 1
        return f"found-{draft.id}" if any(k == draft.key for k, _ in self.sent) else None

    async def close(self):
        pass


class RecordingChannel(DeskChannel):
    name = "console"

    def __init__(self, auto_approve: bool = False):
        self.auto_approve = auto_approve
        self.posts: list[tuple[int, int]] = []  # (draft id, version)
        self.new_cards = 0
        self.updates: list[tuple[int, str]] = []
        self.notes: list[str] = []
        self.retry_offered: list[int] = []
        self.down = False

    async def post(self, draft):
        from bot.errors import ApprovalError

        if self.down:
            raise ApprovalError("unreachable")
        self.posts.append((draft.id, draft.version))
        if not draft.approval_message_id:
            self.new_cards += 1
        return PostedRef("chat", draft.approval_message_id or f"m{draft.id}")

    async def on_posted(self, draft):
        if self.auto_approve:
            await self.desk.approve(op("tester"), draft.id, draft.version)
        return self.auto_approve

    async def update(self, draft):
        self.updates.append((draft.id, draft.status))

    async def notify(self, text, *, retry_draft=None):
        self.notes.append(text)
        if retry_draft is not None:
            self.retry_offered.append(retry_draft.id)

    async def stop(self):
        pass


def msg(n: int, **kw) -> Message:
    base = dict(message_id=f"<m{n}@example.com>", from_name=f"User{n}", from_addr=f"u{n}@example.com",
                reply_to=f"u{n}@example.com", subject=f"Question {n}", body=f"Body {n}")
    base.update(kw)
    return Message(**base)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "draftgate.yaml").write_text(
        f"store: sqlite:///{tmp_path}/state.db\npipelines: pipelines/*.yaml\nmax_in_flight: 4\n")
    for name in ("alpha", "beta"):
        (tmp_path / "pipelines" / f"{name}.yaml").write_text(
            f"name: {name}\nschedule: 5m\nsource: {{type: maildir, path: inbox}}\n"
            f"sender: {{type: outbox, path: out, from: s@shop.example}}\nmax_attempts: 2\nlease: 60s\n"
            f"daily_token_budget: 100\n")
    return tmp_path / "draftgate.yaml"


class World:
    def __init__(self, app, store, sources, drafter, sender, channel, clock):
        self.engine, self.desk, self.store, self.sources = app.engine, app.desk, store, sources
        self.drafter, self.sender, self.channel, self.clock = drafter, sender, channel, clock


@pytest.fixture
async def world(config):
    settings = load_settings(config)
    store = create_store(settings.store)
    await store.open()
    clock = Clock()
    sources = {"alpha": ListSource(), "beta": ListSource()}
    drafter, sender, channel = ScriptDrafter(), RecordingSender(), RecordingChannel()
    app = await started(settings, store, {"console": channel}, clock=clock,
                        sources=sources, drafters={"alpha": drafter, "beta": drafter},
                        senders={"alpha": sender, "beta": sender}, send_check_delay=0.01)
    yield World(app, store, sources, drafter, sender, channel, clock)
    await app.close()
    await store.close()


async def test_a_tick_drafts_posts_and_a_second_tick_admits_nothing(world):
    world.sources["alpha"].messages = [msg(1), msg(2)]
    first = await world.engine.tick("alpha")
    assert (first.fetched, first.new, first.drafted, first.posted) == (2, 2, 2, 2)
    second = await world.engine.tick("alpha")
    assert (second.fetched, second.new, second.drafted, second.posted) == (2, 0, 0, 0)
    assert len(world.drafter.calls) == 2 and world.channel.new_cards == 2
    runs = await world.store.recent_runs("alpha")
    assert [r.status for r in runs] == ["ok", "ok"]
    assert runs[1].counts["drafted"] == 2 and runs[0].counts["new"] == 0


async def test_approve_sends_once_and_a_second_approval_sends_nothing(world):
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    after = await world.desk.approve(op("anna"), d.id, d.version)
    assert after.status == "sent" and after.sent_id == f"sent-{d.id}"
    assert await world.desk.approve(op("bob"), d.id, d.version) is None
    both = await asyncio.gather(world.desk.approve(op("x"), d.id, d.version),
                                world.desk.approve(op("y"), d.id, d.version))
    assert both == [None, None]
    assert len(world.sender.sent) == 1
    assert (d.id, "sent") in world.channel.updates


async def test_concurrent_approvals_of_one_card_send_once(world):
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    results = await asyncio.gather(*(world.desk.approve(op(f"op{i}"), d.id, d.version) for i in range(5)))
    assert sum(r is not None for r in results) == 1
    assert len(world.sender.sent) == 1


async def test_edit_makes_a_new_version_on_the_same_card_and_the_old_button_is_dead(world):
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    edited = await world.desk.edit(op("anna"), d.id, d.version, "Shorter answer.")
    assert edited.version == d.version + 1 and edited.status == "awaiting"
    assert world.channel.new_cards == 1 and world.channel.posts[-1] == (d.id, d.version + 1)
    assert await world.desk.approve(op("anna"), d.id, d.version) is None
    assert world.sender.sent == []
    done = await world.desk.approve(op("anna"), d.id, edited.version)
    assert done.status == "sent" and world.sender.sent == [(d.key, "Shorter answer.")]


async def test_regenerate_redrafts_with_the_instruction_as_version_plus_one(world):
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    again = await world.desk.regenerate(op("anna"), d.id, d.version, "mention the refund")
    assert again.version == d.version + 1
    await world.engine.drain("alpha")
    now = await world.store.get_draft(d.id)
    assert now.status == "awaiting" and "mention the refund" in now.body
    assert len(world.drafter.calls) == 2 and world.channel.new_cards == 1


async def test_reject_is_final_and_sends_nothing(world):
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    rejected = await world.desk.reject(op("anna"), d.id, d.version, "spam")
    assert rejected.status == "rejected"
    assert await world.desk.approve(op("anna"), d.id, d.version) is None
    assert world.sender.sent == []


async def test_a_failing_source_records_a_red_run_and_other_pipelines_go_on(world):
    world.sources["alpha"].fail = SourceError("Gmail 503: backend error")
    world.sources["beta"].messages = [msg(7)]
    await asyncio.gather(world.engine.tick("alpha"), world.engine.tick("beta"))
    [red] = await world.store.recent_runs("alpha")
    assert red.status == "error" and "Gmail 503" in red.error_text
    [green] = await world.store.recent_runs("beta")
    assert green.status == "ok" and green.counts["drafted"] == 1
    assert any("alpha" in n and "Gmail 503" in n for n in world.channel.notes)
    world.sources["alpha"].fail = None
    await world.engine.tick("alpha")
    assert any("alpha is green again" in n for n in world.channel.notes)


async def test_retryable_drafting_errors_requeue_then_fail_with_the_reason(world):
    world.sources["alpha"].messages = [msg(1)]
    world.drafter.errors = [DrafterRetryable("429 rate limited"), DrafterRetryable("500 upstream")]
    await world.engine.tick("alpha")  # attempt 1 fails -> back in the queue for the next tick
    [d] = await world.store.item_drafts("alpha", "<m1@example.com>")
    assert d.status == "queued" and d.attempt == 1 and world.channel.notes == []
    await world.engine.tick("alpha")  # attempt 2 of max_attempts 2 fails -> failed
    [d] = await world.store.item_drafts("alpha", "<m1@example.com>")
    assert d.status == "failed" and "500 upstream" in d.error
    assert any("drafting failed" in n for n in world.channel.notes)
    assert world.channel.retry_offered == [d.id]  # the channel offers the replay
    assert world.channel.posts == []


async def test_a_model_outage_costs_one_attempt_per_tick_not_one_per_queued_item(world):
    """A provider outage is not the items' fault: after the first retryable failure the
    tick stops claiming, later ticks send one probe, and a success resumes full speed."""
    ids = [f"<m{n}@example.com>" for n in range(1, 7)]

    async def drafts():
        return [d for i in ids for d in await world.store.item_drafts("alpha", i)]

    world.sources["alpha"].messages = [msg(n) for n in range(1, 7)]
    world.drafter.errors = [DrafterRetryable("503 overloaded")] * 50
    await world.engine.tick("alpha")
    burned = [d for d in await drafts() if d.attempt]
    assert 1 <= len(burned) <= 4  # only what was already in flight (max_in_flight 4)
    assert {d.status for d in await drafts()} == {"queued"}
    calls = len(world.drafter.calls)
    world.clock.t += 300
    await world.engine.tick("alpha")
    assert len(world.drafter.calls) == calls + 1  # one probe
    world.drafter.errors = []
    world.clock.t += 300
    await world.engine.tick("alpha")
    statuses = [d.status for d in await drafts()]
    # Only the probed item reached max_attempts (2); every other item got drafted.
    assert statuses.count("awaiting") == 5 and statuses.count("failed") == 1


async def test_a_retry_after_from_the_model_holds_drafting_across_ticks(world):
    world.sources["alpha"].messages = [msg(1), msg(2)]
    world.drafter.errors = [DrafterRetryable("429 quota exceeded", retry_after=600)]
    await world.engine.tick("alpha")  # m2 may have been in flight beside m1
    calls = len(world.drafter.calls)
    [waiting] = [d for d in await world.store.item_drafts("alpha", "<m1@example.com>")]
    assert waiting.status == "queued" and "429" in waiting.error
    world.clock.t += 300
    await world.engine.tick("alpha")
    assert len(world.drafter.calls) == calls  # the model said 10 minutes
    world.clock.t += 301
    await world.engine.tick("alpha")
    assert world.drafter.calls[calls:][0].startswith("alpha|test|<m1@")
    assert [d.status for d in await world.store.pending("alpha")] == ["awaiting", "awaiting"]


async def test_when_one_drafting_worker_fails_the_others_stop_with_the_tick(world):
    """A worker that hits a store error ends the tick; its siblings are stopped (their
    claims handed back), not left drafting outside the tick and its lock."""
    world.sources["alpha"].messages = [msg(n) for n in range(1, 9)]

    async def broken_fail(*a, **kw):
        raise StoreError("database is locked")

    world.store.fail_draft = broken_fail
    active, calls, others_busy = set(), [], asyncio.Event()

    async def draft(request):
        calls.append(request.draft_key)
        if len(calls) == 1:
            await others_busy.wait()
            raise RuntimeError("drafter crashed")
        active.add(request.draft_key)
        if len(active) == 3:  # max_in_flight 4: every other worker is drafting
            others_busy.set()
        try:
            await asyncio.Event().wait()  # never answers on its own
        finally:
            active.discard(request.draft_key)

    world.drafter.draft = draft
    await world.engine.tick("alpha")
    assert active == set() and len(calls) == 4
    # The siblings handed their claims back; only the item whose failure could not be
    # recorded keeps its lease (it returns to the queue when the lease expires).
    assert await world.store.count_by_status("alpha") == {"drafting": 1, "queued": 7}
    [run] = await world.store.recent_runs("alpha", limit=1)
    assert run.status == "error" and "database is locked" in run.error_text


async def test_a_tick_that_loses_its_pipeline_lock_stops_before_posting(world):
    """The lease could not be renewed and another process took the pipeline: this
    tick finishes the drafts in hand but posts nothing, so no two ticks overlap."""
    world.engine.leases.ttl = 0.3
    world.sources["alpha"].messages = [msg(1), msg(2)]
    world.drafter.draft = held = Held(world.drafter.draft)
    entered, release = held.entered, held.release
    tick = asyncio.create_task(world.engine.tick("alpha"))
    await entered.wait()
    world.clock.t += 60  # the lease ran out; another host takes the pipeline
    assert await world.store.try_lock("pipeline:alpha", "otherhost:1:x", 60, now=world.clock())
    await asyncio.wait_for(world.engine.leases.lost["alpha"].wait(), 10)
    release.set()
    await tick
    assert world.channel.posts == []
    [run] = await world.store.recent_runs("alpha", limit=1)
    assert run.status == "error" and "lost the pipeline lock" in run.error_text
    assert await world.store.lock_holder("pipeline:alpha") == "otherhost:1:x"


async def test_a_pipeline_whose_schedule_fails_is_reported_and_retried_not_silently_dead(
        world, monkeypatch):
    from bot import scheduler

    real_last_due, calls = scheduler.last_due, []
    told, retried = asyncio.Event(), asyncio.Event()

    def last_due(p, now):
        if p.name == "alpha":
            calls.append(now)
            if len(calls) == 2:
                retried.set()
            raise ValueError("this cron never fires")
        return real_last_due(p, now)

    monkeypatch.setattr(scheduler, "last_due", last_due)
    plain_notify = world.channel.notify

    async def notify(text, **kw):
        await plain_notify(text, **kw)
        told.set()

    world.channel.notify = notify
    alpha = world.engine.pipeline("alpha")
    stop = asyncio.Event()
    loop = asyncio.create_task(world.engine.loop.supervised(alpha, stop, restart_after=0.01))
    await asyncio.wait_for(told.wait(), 10)
    await asyncio.wait_for(retried.wait(), 10)  # and it keeps trying
    stop.set()
    await loop
    [note] = world.channel.notes  # once, however often it fails
    assert "alpha: its schedule stopped working" in note and "this cron never fires" in note


async def test_a_tick_stopped_midway_closes_its_run_row(world):
    world.sources["alpha"].messages = [msg(1)]
    entered = asyncio.Event()

    async def hang(request):
        entered.set()
        await asyncio.Event().wait()

    world.drafter.draft = hang
    tick = asyncio.create_task(world.engine.tick("alpha"))
    await entered.wait()
    tick.cancel()
    with pytest.raises(asyncio.CancelledError):
        await tick
    [run] = await world.store.recent_runs("alpha", limit=1)
    assert run.status == "stopped" and run.error_text.startswith("stopped: draftgate was stopped")
    assert await world.store.count_by_status("alpha") == {"queued": 1}  # handed back


async def test_a_sender_that_cannot_be_built_sends_nothing_and_is_not_called_unknown(
        world, monkeypatch):
    from bot.engine import engine as engine_module
    from bot.errors import ConfigError

    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")

    def broken(p, settings):
        raise ConfigError("pipelines/alpha.yaml: sender: WEBHOOK_SECRET is not set")

    # The sender is built on first use (as after a restart with the secret unset).
    monkeypatch.setattr(engine_module, "build_sender", broken)
    monkeypatch.delitem(world.engine._senders, "alpha")
    with pytest.raises(ConfigError):
        await world.desk.approve(op("anna"), d.id, d.version)
    assert (await world.store.get_draft(d.id)).status == "approved"  # sent on a later tick
    assert world.channel.retry_offered == []


async def test_a_model_that_cannot_be_used_keeps_items_queued_and_says_so_once(world):
    """A wrong key or model name is the setup's fault: nothing fails or burns an
    attempt, the operators are told once, and later ticks probe with one item."""
    from bot.errors import DrafterSetupError

    world.sources["alpha"].messages = [msg(n) for n in range(1, 6)]
    world.drafter.errors = [DrafterSetupError("models.default: HTTP 401: check OPENAI_API_KEY")] * 20
    await world.engine.tick("alpha")
    assert await world.store.count_by_status("alpha") == {"queued": 5}
    ids = [f"<m{n}@example.com>" for n in range(1, 6)]
    drafts = [d for i in ids for d in await world.store.item_drafts("alpha", i)]
    assert [d.attempt for d in drafts] == [0] * 5
    calls = len(world.drafter.calls)
    world.clock.t += 300
    await world.engine.tick("alpha")
    assert len(world.drafter.calls) == calls + 1  # one probe
    [note] = world.channel.notes
    assert "alpha: drafting is stopped" in note and "OPENAI_API_KEY" in note
    world.drafter.errors = []
    world.clock.t += 300
    await world.engine.tick("alpha")
    assert await world.store.count_by_status("alpha") == {"awaiting": 5}


async def test_an_endless_retry_after_holds_drafting_an_hour_at_most(world):
    world.sources["alpha"].messages = [msg(1)]
    world.drafter.errors = [DrafterRetryable("429 slow down", retry_after=float("inf"))]
    await world.engine.tick("alpha")
    world.clock.t += 3000
    await world.engine.tick("alpha")
    assert await world.store.count_by_status("alpha") == {"queued": 1}
    assert any("asked to wait 60 min" in n for n in world.channel.notes)
    world.clock.t += 601
    await world.engine.tick("alpha")
    assert await world.store.count_by_status("alpha") == {"awaiting": 1}


async def test_regenerate_is_refused_with_the_reason_when_nothing_would_draft_it(world):
    from bot.errors import BudgetExhausted

    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    await world.store.add_tokens("alpha", 100, now=world.clock())  # the budget is 100
    with pytest.raises(BudgetExhausted, match="Not regenerated: alpha's daily token budget"):
        await world.desk.regenerate(op("anna"), d.id, d.version, "shorter")
    assert (await world.store.get_draft(d.id)).status == "awaiting"


async def test_a_definite_drafting_error_fails_at_once(world):
    world.sources["alpha"].messages = [msg(1)]
    world.drafter.errors = [DrafterError("401: check OPENAI_API_KEY")]
    await world.engine.tick("alpha")
    [d] = await world.store.item_drafts("alpha", "<m1@example.com>")
    assert d.status == "failed" and len(world.drafter.calls) == 1


async def test_the_daily_budget_keeps_items_queued_until_the_next_day(world):
    """Drafting stops once the day's tokens are spent (overshooting by at most the
    drafts already in flight), the operator is told once, and it resumes next day."""
    world.drafter.tokens = 30  # 60 per draft; the budget is 100
    world.sources["alpha"].messages = [msg(n) for n in range(1, 9)]
    await world.engine.tick("alpha")
    first = await world.store.count_by_status("alpha")
    assert 2 <= first.get("awaiting", 0) <= 2 + 3 and first.get("queued", 0) >= 3
    await world.engine.tick("alpha")
    assert await world.store.count_by_status("alpha") == first
    assert sum("budget" in n for n in world.channel.notes) == 1
    assert world.engine.pipelines["alpha"].daily_token_budget == 100
    world.clock.t += 86400
    await world.engine.tick("alpha")
    await world.engine.tick("alpha")
    world.clock.t += 86400
    await world.engine.tick("alpha")
    assert (await world.store.count_by_status("alpha")).get("awaiting") == 8


async def test_unknown_send_is_checked_not_resent(world):
    world.sources["alpha"].messages = [msg(1), msg(2)]
    await world.engine.tick("alpha")
    d1, d2 = await world.store.pending("alpha")
    # d1: delivered but the answer was lost; d2: not delivered.
    world.sender.delivered_on_unknown = True
    world.sender.script = [SendUnknown("connection reset")]
    after = await world.desk.approve(op("anna"), d1.id, d1.version)
    assert after.status == "send_unknown"
    world.sender.delivered_on_unknown = False
    world.sender.script = [SendUnknown("timed out")]
    await world.desk.approve(op("anna"), d2.id, d2.version)
    # drain returns once the delayed checks asked about both (a tick may ask again
    # about one still unknown; asking never sends).
    await world.engine.drain("alpha")
    assert world.sender.check_calls >= 2
    assert (await world.store.get_draft(d1.id)).status == "sent"
    assert (await world.store.get_draft(d2.id)).status == "send_unknown"
    assert d2.id in world.channel.retry_offered
    assert [k for k, _ in world.sender.sent] == [d1.key]  # one POST each, d2 never resent
    retried = await world.desk.retry_send(op("anna"), d2.id)
    assert retried.status == "sent"
    assert [k for k, _ in world.sender.sent] == [d1.key, d2.key]


async def test_retry_tapped_before_the_check_does_not_send_a_reply_that_arrived(world):
    """The operator taps Retry at once on an unknown send that did go out: Retry asks
    first, finds it, and sends nothing."""
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    world.sender.delivered_on_unknown = True
    world.sender.script = [SendUnknown("connection reset")]
    assert (await world.desk.approve(op("anna"), d.id, d.version)).status == "send_unknown"
    retried = await world.desk.retry_send(op("anna"), d.id)
    assert (retried.status, retried.sent_id) == ("sent", f"found-{d.id}")
    assert world.sender.calls == 1


async def test_a_send_cut_off_by_a_crash_is_checked_on_the_first_tick_after_restart(world):
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    await world.store.approve(d.id, d.version, "anna")
    # A process of this machine began the send and was killed there; the restart
    # sees its pid gone and checks at once (no grace to wait out).
    await world.store.begin_send(d.id, _dead_local_holder())
    await world.engine.tick("alpha")
    assert world.sender.check_calls == 1
    assert (await world.store.get_draft(d.id)).status == "send_unknown"
    assert world.channel.retry_offered == [d.id]  # told at once, with Retry


async def test_a_start_marks_a_send_its_crashed_process_left_send_unknown_before_any_tick(
        world, config):
    """The product's own recovery at start (not a test-only query): a row left in
    ``sending`` by a process of this machine that is gone is send_unknown as soon as
    the next process has started, before its first tick, and nothing was sent."""
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    await world.store.approve(d.id, d.version, "anna")
    await world.store.begin_send(d.id, _dead_local_holder())
    settings = load_settings(config)
    channel = RecordingChannel()
    app = await started(settings, world.store, {"console": channel}, clock=world.clock,
                        sources={"alpha": ListSource(), "beta": ListSource()},
                        drafters={"alpha": world.drafter, "beta": world.drafter},
                        senders={"alpha": world.sender, "beta": world.sender})
    try:
        after = await world.store.get_draft(d.id)
        assert after.status == "send_unknown" and after.error.startswith("interrupted")
        assert world.sender.sent == []
    finally:
        await app.close()


async def test_another_process_leaves_a_fresh_unknown_send_to_the_one_that_made_it(world, config):
    """Host A's send just ended unknown (it was delivered; Gmail's search may not show
    it yet). Host B's tick must not check it at once and tell the operator 'not in
    Sent, tap Retry': A checks it after its delay."""
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    host_b_sender = RecordingSender()
    host_b = Engine(load_settings(config), world.store, {"console": RecordingChannel()},
                    clock=world.clock, sources=world.sources,
                    drafters={"alpha": world.drafter}, senders={"alpha": host_b_sender})
    world.sender.delivered_on_unknown = True
    world.sender.script = [SendUnknown("connection reset")]
    await world.desk.approve(op("anna"), d.id, d.version)
    await host_b.drain("alpha")
    assert host_b_sender.check_calls == 0
    await world.engine.wait_idle()  # A's own delayed check
    assert (await world.store.get_draft(d.id)).status == "sent"
    assert world.channel.retry_offered == []


async def test_a_definite_send_failure_offers_retry(world):
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    world.sender.script = [SendFailed("400 invalid recipient")]
    after = await world.desk.approve(op("anna"), d.id, d.version)
    assert after.status == "send_failed" and "400" in after.error
    assert (d.id, "send_failed") in world.channel.updates


async def test_an_approved_draft_left_by_a_crash_is_sent_once_on_the_next_tick(world):
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    await world.store.approve(d.id, d.version, "anna")  # the process died right here
    await world.engine.tick("alpha")
    await world.engine.tick("alpha")
    assert len(world.sender.sent) == 1
    assert (await world.store.get_draft(d.id)).status == "sent"


async def test_cards_wait_in_ready_while_the_channel_is_down(world):
    world.sources["alpha"].messages = [msg(1)]
    world.channel.down = True
    counts = await world.engine.tick("alpha")
    assert counts.drafted == 1 and counts.posted == 0
    [d] = await world.store.pending("alpha")
    assert d.status == "ready"
    world.channel.down = False
    assert await world.engine.post_unposted() == 1
    assert (await world.store.get_draft(d.id)).status == "awaiting"
    assert world.channel.new_cards == 1


async def test_filters_skip_with_a_reason_before_any_drafting(world, config):
    ps = world.engine.settings.pipelines
    ps[:] = [dataclasses.replace(p, filters=FilterOptions(skip_senders=("noreply@*",)))
             if p.name == "alpha" else p for p in ps]
    world.sources["alpha"].messages = [msg(1, from_addr="noreply@shop.example",
                                           reply_to="noreply@shop.example")]
    counts = await world.engine.tick("alpha")
    assert counts.skipped == 1 and world.drafter.calls == []
    [d] = await world.store.item_drafts("alpha", "<m1@example.com>")
    assert d.status == "skipped" and "noreply@" in d.error


async def test_stopping_mid_draft_hands_the_item_back_to_the_queue(world):
    """SIGTERM during a model call: the claim is released at once, not left to expire."""
    started = asyncio.Event()
    never = asyncio.Event()

    async def slow_draft(request):
        started.set()
        await never.wait()

    world.drafter.draft = slow_draft
    world.sources["alpha"].messages = [msg(1)]
    tick = asyncio.create_task(world.engine.tick("alpha"))
    await asyncio.wait_for(started.wait(), 10)
    [d] = await world.store.item_drafts("alpha", "<m1@example.com>")
    assert d.status == "drafting"
    tick.cancel()
    await asyncio.gather(tick, return_exceptions=True)
    [d] = await world.store.item_drafts("alpha", "<m1@example.com>")
    assert d.status == "queued" and d.attempt == 0


async def test_an_unknown_send_is_announced_once_per_episode_even_across_restarts(world, config):
    world.sources["alpha"].messages = [msg(1)]
    await world.engine.tick("alpha")
    [d] = await world.store.pending("alpha")
    world.sender.script = [SendUnknown("timed out")]
    await world.desk.approve(op("anna"), d.id, d.version)
    await world.engine.wait_idle()  # the delayed check (10 ms)
    await world.engine.drain("alpha")
    assert world.channel.retry_offered == [d.id]
    # A restarted process (same store) does not announce the same episode again.
    again = Engine(load_settings(config), world.store, {"console": world.channel},
                   clock=world.clock, sources=world.sources, send_check_delay=0.01,
                   drafters={"alpha": world.drafter}, senders={"alpha": world.sender})
    await again.drain("alpha")
    assert world.channel.retry_offered == [d.id]
    # Retry ends unknown again: that is a new episode, and the operator hears of it.
    world.sender.script = [SendUnknown("reset")]
    await world.desk.retry_send(op("anna"), d.id)
    await world.engine.wait_idle()
    await world.engine.drain("alpha")
    assert world.channel.retry_offered == [d.id, d.id]
    assert world.sender.calls == 2  # the approval and the operator's Retry; never on its own


def _dead_local_holder(nonce: str = "dead") -> str:
    """The holder name of a process of this machine that has exited."""
    import subprocess
    import sys

    from bot.engine.lease import process_home

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return f"{process_home()}:{gone.stdout.strip()}:{nonce}"


async def test_a_pipeline_lock_left_by_a_dead_local_process_is_taken_over_at_once(world):
    """A restart after SIGKILL does not wait out the dead process's lease."""
    dead = _dead_local_holder()
    alive_elsewhere = f"otherhost/x/y:{dead.split(':')[-2]}:far"
    world.sources["alpha"].messages = [msg(1)]

    assert await world.store.try_lock("pipeline:alpha", alive_elsewhere, 60, now=world.clock())
    assert (await world.engine.tick("alpha")).fetched == 0  # another machine's: respected
    await world.store.unlock("pipeline:alpha", alive_elsewhere)

    assert await world.store.try_lock("pipeline:alpha", dead, 60, now=world.clock())
    assert (await world.engine.tick("alpha")).drafted == 1  # a dead local one: taken over
    assert await world.store.lock_holder("pipeline:alpha") is None


async def test_a_tick_that_overran_its_interval_is_followed_at_once_by_one_catch_up(world):
    """A 5m tick that took 7m: the next tick runs at once for the slot it overran (not
    at the slot after, with new mail waiting and the channel idle), and each tick is
    told to stop claiming one interval after it began."""
    from bot.engine.loop import Loop

    clock, calls, stop = Clock(T0 - T0 % 300 + 10), [], asyncio.Event()

    async def tick(name, slot, until=None):
        calls.append((slot, until, clock.t))
        clock.t += 420 if len(calls) == 1 else 1  # the first overruns by 2 minutes
        if len(calls) == 2:
            stop.set()
        return None

    loop = Loop(world.engine.settings, world.store, world.engine.channels, tick, clock)
    alpha = world.engine.pipeline("alpha")
    await asyncio.wait_for(loop.supervised(alpha, stop), 30)  # no real waiting: at once
    (s1, u1, t1), (s2, u2, t2) = calls
    assert s2 == s1 + 300 and t2 == t1 + 420  # the overrun slot, caught up at once
    assert u1 == t1 + 300 and u2 == t2 + 300  # drafting stops an interval after the start
