"""A chaos soak of draftgate itself: real ``python -m bot run`` processes against the
fake Gmail, Bot API and model servers, with mail arriving, faults, SIGKILLs and
simulated operators, then a judgement of the three promises.

``scripts/chaos`` runs it from the command line; ``tests/test_chaos.py`` runs a short
seed in the suite. What happens, for ``seconds``:

* ``mails`` customer emails arrive at the fake Gmail at random moments;
* the fake model answers 5xx, 429 (Retry-After 1 s) or refuses (400) at random, and
  the fake Gmail answers 5xx and 429 to reads and sends, or performs a send and then
  drops the connection or answers 500 (the reply went out; the bot cannot know);
* a random host is SIGKILLed every ``kill_every`` seconds on average and restarted;
  with ``kill_sends`` some kills are aimed at the moment a send POST reaches Gmail
  (the process that made it is killed, and the fake then accepts the send or not);
  without it, operators pause and every send finishes before a kill;
* operators tap every button they see in the fake Telegram chats (mostly Approve,
  sometimes Edit, Regenerate or Reject and answer the prompt; Retry on failed
  sends), sometimes twice, sometimes a second operator at once, sometimes the same
  update is delivered again, and now and then a stranger taps; they run
  ``draftgate replay`` for what the notices (and ``draftgate status --json``) say
  failed.

Then faults and kills stop, every host runs, and the system gets ``drain`` seconds to
settle before it is judged. The seed fixes every random choice (arrivals, faults,
kills, taps); thread and process timing still varies from run to run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email
import email.policy
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bot.approvals import cards
from bot.models import sha256_text
from tests.fakes.telegram import FakeTelegram
from tests.support.gmail_telegram import gmail_telegram_deployment

from ._chaos_parts import (
    ChaosGmail,
    ChaosLLM,
    StoreView,
    _fresh_pg_url,
    _pg_admin,
    _pid_of_client,
    _quiet_resets,
    _redacted,
)
from ._multihost import TOKEN_ENV, Host, ticket_email, tickets_of

ROOT = Path(__file__).resolve().parent.parent
ANNA, BOB, STRANGER = 42, 43, 666  # two operators, and someone not on the allow-list
OPERATORS = {ANNA: "Anna", BOB: "Bob"}
CHAT, OPS_CHAT = 5001, 5002
# What a human reads in a prompt (the bot knows its prompts by message id, not text).
_PROMPT_TEXT = [
    (cards.PROMPT_EDIT, re.compile(r"reply with the new text for #(\d+) v(\d+)")),
    (cards.PROMPT_REGENERATE, re.compile(r"instruction for regenerating #(\d+) v(\d+)")),
    (cards.PROMPT_REJECT, re.compile(r"reason for rejecting #(\d+) v(\d+)")),
]


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Kill a CLI process and read its pipes to the end (closing their transports)."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.communicate(), 10)


def _read_prompt(text: str | None) -> tuple[str, int, int] | None:
    for kind, rx in _PROMPT_TEXT:
        if m := rx.search(text or ""):
            return kind, int(m.group(1)), int(m.group(2))
    return None
_IN_REPLY_TO = re.compile(r"<ticket-(\d+)@customer\.example>")
OPEN = ("queued", "drafting", "ready", "awaiting", "approved", "sending")
SHOWN_BY_PENDING = ("ready", "awaiting", "approved", "sending", "send_failed", "send_unknown")
VISIBLE_TERMINAL = ("rejected", "failed", "skipped", "expired")
MAX_REPLAYS, MAX_ROUNDS = 3, 4  # per item; taps of one card or Retry button


@dataclass
class ChaosOptions:
    mails: int = 100
    seconds: float = 300.0  # the fault phase; mail arrives in its first 75%
    seed: int = 1
    store: str | None = None  # a postgresql:// URL; None: SQLite in the work folder
    hosts: int = 1
    max_crash_recovery: float | None = 30.0  # None: measured and reported, not judged
    drain: float = 120.0  # longest wait for the system to settle after the faults
    kill_every: float = 10.0  # mean seconds between kills; 0: no kills
    kill_sends: bool = True  # kills may cut sends (some are aimed at them)
    faults: float = 1.0  # scale of every fault probability; 0: no faults
    workdir: Path | None = None  # default: a temporary folder, removed at the end
    keep: bool = False  # keep the work folder (logs, SQLite) and the PostgreSQL schema
    say: Callable[[str], None] = lambda line: None  # progress lines


@dataclass
class ChaosReport:
    seed: int = 0
    store: str = ""
    hosts: int = 1
    mails: int = 0
    kills: int = 0
    kills_at_send: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    send_posts: int = 0
    sends_accepted: int = 0
    replies_max: int = 0
    duplicated: list[int] = field(default_factory=list)  # tickets replied to twice or more
    lost: list[str] = field(default_factory=list)  # neither replied to nor visibly pending
    unapproved_sends: list[str] = field(default_factory=list)
    stranger_actions: int = 0
    crashed_sends: int = 0
    crash_recovery_max: float = 0.0
    crash_recovery_open: int = 0  # crashed sends still unfinished when judged
    crash_recovery_limit: float | None = None
    settled_after: float | None = None  # seconds of drain; None: not settled in time
    statuses: dict[str, int] = field(default_factory=dict)
    replied_not_sent: list[str] = field(default_factory=list)  # in Gmail, store disagrees
    taps: int = 0
    prompt_replies: int = 0
    replays: int = 0
    model_requests: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    cards_max: int = 0  # cards of one draft still in the approvals chat
    tracebacks: int = 0
    stop_codes: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        rec = f"{self.crash_recovery_max:.1f}s"
        if self.crash_recovery_open:
            rec = f">= {rec} ({self.crash_recovery_open} still unfinished when judged)"
        limit = "not judged" if self.crash_recovery_limit is None else \
            f"limit {self.crash_recovery_limit:g}s"
        settled = "not settled" if self.settled_after is None else f"{self.settled_after:.1f}s"
        return [
            f"seed {self.seed} · store {self.store} · hosts {self.hosts}",
            f"mails                     {self.mails}",
            f"kills                     {self.kills} ({self.kills_at_send} aimed at a send)",
            f"unexpected exits          {len(self.unexpected_exits)}",
            f"send POSTs                {self.send_posts} ({self.sends_accepted} accepted)",
            f"replies per mail, max     {self.replies_max} (must be 1)"
            + (f"  DUPLICATED tickets {self.duplicated}" if self.duplicated else ""),
            f"lost mails                {len(self.lost)} (must be 0: neither replied to "
            f"nor visibly pending)",
            f"sends without approval    {len(self.unapproved_sends)} (must be 0)",
            f"stranger actions          {self.stranger_actions} (must be 0)",
            f"crashed sends             {self.crashed_sends}, longest unfinished {rec} "
            f"({limit})",
            f"settled after drain       {settled}",
            "final states              "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())),
            f"replied, store disagrees  {len(self.replied_not_sent)}",
            f"operator taps             {self.taps}, prompt replies {self.prompt_replies}, "
            f"replays {self.replays}",
            f"model requests            {self.model_requests}",
            "faults injected           "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"),
            f"cards of one draft, max   {self.cards_max}",
            f"tracebacks in host logs   {self.tracebacks}",
            f"exit codes at SIGTERM     {self.stop_codes}",
        ] + [f"FAIL: {f}" for f in self.failures] + (
            [] if self.failures else ["OK: every invariant held"])


# -- the soak ---------------------------------------------------------------------------------

@dataclass
class _Crash:
    at: float  # the kill
    ops_mark: int  # ops chat messages before the kill: a later notice tells the operator
    done: float | None = None


@dataclass
class _Button:
    rounds: int = 0
    last: float = 0.0


class Soak:
    def __init__(self, opts: ChaosOptions):
        self.o = opts
        self.rng = random.Random(opts.seed)
        self.report = ChaosReport(seed=opts.seed, hosts=opts.hosts, mails=opts.mails,
                                  crash_recovery_limit=opts.max_crash_recovery)
        self.gmail = ChaosGmail(self.rng.randrange(2**32))
        self.llm = ChaosLLM(self.rng.randrange(2**32))
        self.tg = FakeTelegram()
        self.hosts: list[Host] = []
        self.roles: list[str] = []
        self.killed: set[int] = set()  # pids we SIGKILLed
        self.kill_events: list[tuple[float, str]] = []  # (time, draft key or "")
        self.kill_lock = threading.Lock()
        self.hook_rng = random.Random(self.rng.randrange(2**32))
        self.crashes: dict[int, _Crash] = {}
        self.originals: dict[str, int] = {}  # Gmail id -> ticket number
        self.buttons: dict[tuple, _Button] = {}
        self.card_choice: dict[tuple[int, int], str] = {}
        self.regens: collections.Counter[int] = collections.Counter()
        self.answered_prompts: set[int] = set()
        self.replayed: collections.Counter[str] = collections.Counter()
        self.replay_notices: set[int] = set()
        self.taps: dict[str, float] = {}  # callback query id we made -> when
        self.tasks: set[asyncio.Task] = set()
        self.harness_errors: list[str] = []
        self.log_start: dict[int, int] = {}  # host index -> its log's size at its start
        self.operators_go = asyncio.Event()
        self.operators_go.set()
        self.draining = False
        self.stop_chaos = asyncio.Event()
        self.cli_procs: set[asyncio.subprocess.Process] = set()
        self.rows: list[dict] = []
        self.workdir: Path | None = None
        self.pg_schema: str | None = None

    # -- set-up and tear-down ----------------------------------------------------------------
    def _deploy(self, store: str) -> Path:
        tmp = self.workdir
        return gmail_telegram_deployment(tmp, """\
            name: support
            schedule: 1s
            source: {type: gmail, account: support, query: "in:inbox"}
            drafter: {model: local, prompt: prompt.md}
            approval: {channel: telegram}
            sender: {type: gmail_reply, account: support}
            lease: 10s
            max_attempts: 3
            """, store=store, tg=self.tg, gmail=self.gmail, llm=self.llm, token_env=TOKEN_ENV,
            operators=[ANNA, BOB], chat=CHAT, ops_chat=OPS_CHAT, account={"timeout": "10s"},
            model={"timeout": "4s"})

    def _start_host(self, i: int) -> None:
        log = self.cfg.parent / f"host{i + 1}.log"
        self.log_start[i] = log.stat().st_size if log.exists() else 0
        h = Host(f"host{i + 1}", self.cfg, self.tg, receive=self.roles[i])
        if i < len(self.hosts):
            self.hosts[i] = h
        else:
            self.hosts.append(h)

    async def run(self) -> ChaosReport:
        o = self.o
        self.workdir = Path(o.workdir) if o.workdir else Path(
            tempfile.mkdtemp(prefix="draftgate-chaos-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        if o.store and o.store.startswith("postgres"):
            self.url, self.pg_schema = _fresh_pg_url(o.store)
        else:
            self.url = f"sqlite:///{self.workdir / 'state.db'}"
        self.report.store = _redacted(self.url)
        self.view = StoreView(self.url)
        try:
            for fake in (self.gmail, self.llm, self.tg):
                fake.start()
                _quiet_resets(fake._server)
            self.cfg = self._deploy(self.url)
            await self.view.open()
            self.roles = ["polling"] + ["off"] * (o.hosts - 1)
            for i in range(o.hosts):
                self._start_host(i)
            o.say(f"work folder {self.workdir}; store {self.report.store}")
            await self._until(self._cursor_recorded, 120, "the first tick to record Gmail's cursor")
            await self._soak()
            await self._stop_tasks()
            await self._judge()
        finally:
            await self._stop_tasks()
            await self._cleanup()
        return self.report

    async def _cleanup(self) -> None:
        for p in list(self.cli_procs):
            await _end(p)
        for h in self.hosts:
            with contextlib.suppress(Exception):
                h.ensure_dead()
        with contextlib.suppress(Exception):
            await self.view.close()
        for fake in (self.llm, self.tg, self.gmail):
            with contextlib.suppress(Exception):
                fake.stop()
        if self.pg_schema is not None and not self.o.keep:
            with contextlib.suppress(Exception):
                await _pg_admin(self.url, f'DROP SCHEMA IF EXISTS "{self.pg_schema}" CASCADE')
        if self.workdir is not None and not self.o.keep and self.o.workdir is None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def _all_up(self) -> bool:
        def up(i: int, h: Host) -> bool:
            if h.proc.poll() is not None:
                return False
            with h.log.open("rb") as f:
                f.seek(self.log_start[i])
                return b"draftgate running" in f.read()
        return all(up(i, h) for i, h in enumerate(self.hosts))

    async def _cursor_recorded(self) -> bool:
        return bool(await self.view.rows("SELECT 1 FROM cursors WHERE pipeline='support'"))

    async def _until(self, check, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            if value := await check():
                return value
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {h.name} ---\n{h.text()[-4000:]}" for h in self.hosts)
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{logs}")
            await asyncio.sleep(0.2)

    # -- the phases ----------------------------------------------------------------------------
    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(self._harness_error)
        return task

    def _harness_error(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.harness_errors.append(f"{type(exc).__name__}: {exc}")
            self.o.say(f"chaos harness error in {task.get_coro().__name__}: "
                       f"{type(exc).__name__}: {exc}")

    async def _stop_tasks(self) -> None:
        """Operators, the monitor and the supervisor stop (before hosts are stopped)."""
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def _soak(self) -> None:
        o = self.o
        self.llm.rate = 0.15 * o.faults
        self.gmail.read_rate = 0.04 * o.faults
        self.gmail.send_rate = 0.25 * o.faults
        t0 = time.monotonic()
        o.say(f"chaos for {o.seconds:g}s: {o.mails} mails, kills every ~{o.kill_every:g}s"
              f"{'' if o.kill_sends else ' (never during a send)'}")
        for coro in (self._feed(t0), self._supervise(), self._operate(), self._monitor()):
            self._spawn(coro)
        killer = self._spawn(self._kill_loop())
        await asyncio.sleep(o.seconds)
        self.stop_chaos.set()
        await killer
        self.llm.rate = self.gmail.read_rate = self.gmail.send_rate = 0.0
        with self.gmail.lock:
            self.gmail.kill_hook = None
        self.operators_go.set()
        self.draining = True
        o.say(f"faults and kills stopped; draining for up to {o.drain:g}s")
        start = time.monotonic()
        while time.monotonic() - start < o.drain:
            if await self._settled():
                self.report.settled_after = time.monotonic() - start
                break
            await asyncio.sleep(0.5)
        o.say("settled" if self.report.settled_after is not None else "drain time is up")

    async def _feed(self, t0: float) -> None:
        """Mail arrives at random moments of the first 75% of the fault phase."""
        at = sorted(self.rng.uniform(0, 0.75 * self.o.seconds) for _ in range(self.o.mails))
        for n, offset in enumerate(at):
            await asyncio.sleep(max(0.0, t0 + offset - time.monotonic()))
            self.originals[self.gmail.add_message(ticket_email(n))] = n

    async def _supervise(self) -> None:
        """Restart every host that died; a death we did not cause is a finding."""
        while True:
            self._restart_dead()
            await asyncio.sleep(0.2)

    def _restart_dead(self) -> None:
        for i, h in enumerate(list(self.hosts)):
            code = h.proc.poll()
            if code is None:
                continue
            if not (code == -signal.SIGKILL and h.pid in self.killed):
                self.report.unexpected_exits.append(
                    f"{h.name} pid {h.pid} exited with {code}: {h.text()[-1500:]}")
            self._start_host(i)

    # -- kills ---------------------------------------------------------------------------------
    async def _kill_loop(self) -> None:
        o = self.o
        if o.kill_every <= 0:
            return
        while not self.stop_chaos.is_set():
            wait = min(max(2.0, self.rng.expovariate(1 / o.kill_every)), 3 * o.kill_every)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop_chaos.wait(), wait)
                return
            if o.kill_sends and self.rng.random() < 0.4 and await self._kill_at_send():
                continue
            await self._kill_random()

    def _record_kill(self, pid: int, key: str = "") -> None:
        with self.kill_lock:
            self.killed.add(pid)
            self.kill_events.append((time.time(), key))
            self.report.kills += 1

    async def _kill_random(self) -> None:
        i = self.rng.randrange(len(self.hosts))
        if not self.o.kill_sends and not await self._quiesce():
            self.operators_go.set()
            return  # sends did not finish in time: no kill this round
        try:
            h = self.hosts[i]
            if h.proc.poll() is None:
                self._record_kill(h.pid)
                h.proc.send_signal(signal.SIGKILL)
                await asyncio.to_thread(h.proc.wait, 10)
        finally:
            self.operators_go.set()

    async def _quiesce(self) -> bool:
        """Operators pause; True once every tap was answered and no draft is approved
        or being sent (so a kill cannot cut a send)."""
        self.operators_go.clear()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            # A tap that a killed host took with it is never answered: only recent ones.
            unanswered = [c for c, at in self.taps.items()
                          if c not in self.tg.answers and time.monotonic() - at < 15]
            busy = await self.view.rows(
                "SELECT id FROM drafts WHERE status IN ('approved', 'sending')")
            if not unanswered and not busy:
                return True
            await asyncio.sleep(0.1)
        return False

    async def _kill_at_send(self) -> bool:
        """Kill the host whose send POST reaches Gmail next (within 15 s)."""
        fired = threading.Event()

        def hook(port: int, key: str) -> bool:
            pid = _pid_of_client(port, [h.pid for h in self.hosts])
            if pid is not None:
                self._record_kill(pid, key)
                self.report.kills_at_send += 1
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            fired.set()
            with self.kill_lock:
                return self.hook_rng.random() < 0.5  # the send goes out, or not

        with self.gmail.lock:
            self.gmail.kill_hook = hook
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not self.stop_chaos.is_set():
            if fired.is_set():
                return True
            await asyncio.sleep(0.05)
        with self.gmail.lock:
            if self.gmail.kill_hook is hook:
                self.gmail.kill_hook = None
                return False
        return True

    # -- watching the store ----------------------------------------------------------------------
    async def _monitor(self) -> None:
        """Keep a snapshot of the drafts, start a clock for every send cut by a kill and
        stop it when the row is sent, failed, or unknown with the operator told."""
        seen_events = 0
        while True:
            try:
                self.rows = await self.view.drafts()
            except Exception as exc:  # a busy store: look again
                self.o.say(f"(monitor: {type(exc).__name__}: {exc})")
                await asyncio.sleep(0.5)
                continue
            with self.kill_lock:
                events = self.kill_events[seen_events:]
                seen_events = len(self.kill_events)
            ops_mark = len(self.tg.chat_messages(OPS_CHAT))
            for at, key in events:
                for r in self.rows:
                    if (r["status"] == "sending" or r["key"] == key) and \
                            (r["id"] not in self.crashes or self.crashes[r["id"]].done):
                        self.crashes[r["id"]] = _Crash(at, ops_mark)
            notices = self.tg.chat_messages(OPS_CHAT)
            for r in self.rows:
                c = self.crashes.get(r["id"])
                if c is None or c.done is not None:
                    continue
                told = any(f"support #{r['id']}:" in m.text for m in notices[c.ops_mark:])
                if r["status"] in ("sent", "send_failed") or (
                        r["status"] == "send_unknown" and told):
                    c.done = time.time()
            await asyncio.sleep(0.25)

    async def _settled(self) -> bool:
        rows = self.rows
        items = {r["item_id"] for r in rows}
        if not set(self.originals) <= items:
            return False
        if any(r["status"] in OPEN for r in rows):
            return False
        if any(r["status"] == "failed" and self.replayed[r["item_id"]] < MAX_REPLAYS
               for r in rows):
            return False
        if any(r["status"] in ("send_failed", "send_unknown") and self._retry_left(r)
               for r in rows):
            return False
        return all(c.done is not None for c in self.crashes.values())

    def _retry_left(self, r: dict) -> bool:
        data = cards.callback_data(cards.RETRY, r["id"], r["version"])
        used = [b.rounds for k, b in self.buttons.items() if k[2] == data]
        return not used or max(used) < MAX_ROUNDS

    # -- operators -------------------------------------------------------------------------------
    def _tap(self, uid: int, chat: int, mid: int, data: str, extras: bool = True) -> None:
        upd = self.tg.tap(uid, chat, mid, data, OPERATORS.get(uid, "Mallory"))
        self.taps[upd["callback_query"]["id"]] = time.monotonic()
        self.report.taps += 1
        r = self.rng.random() if extras and not self.draining else 1.0
        if r < 0.08:  # a double tap
            again = self.tg.tap(uid, chat, mid, data, OPERATORS.get(uid, "Mallory"))
            self.taps[again["callback_query"]["id"]] = time.monotonic()
        elif r < 0.14:  # the same callback query delivered again in a new update
            self.tg.inject({"callback_query": upd["callback_query"]})
        elif r < 0.18:  # the same update again (it reaches the bot if not yet confirmed)
            self.tg.redeliver(upd)

    async def _operate(self) -> None:
        last_scan = 0.0
        while True:
            await self.operators_go.wait()
            now = time.monotonic()
            for chat in (CHAT, OPS_CHAT):
                for m in self.tg.chat_messages(chat):
                    if not self.operators_go.is_set():
                        break
                    self._buttons(chat, m, now)
                    if chat == CHAT:
                        self._prompt(m)
                    else:
                        self._notice(m)
            if now - last_scan > (5 if self.draining else 15):
                last_scan = now
                self._spawn(self._scan_status())
            await asyncio.sleep(0.3)

    def _buttons(self, chat: int, m, now: float) -> None:
        rows = (m.reply_markup or {}).get("inline_keyboard") or []
        datas = [b.get("callback_data", "") for row in rows for b in row]
        parsed = [cards.parse_callback(d) for d in datas if d]
        decisions = [c for c in parsed if c.action in (cards.APPROVE, cards.EDIT,
                                                       cards.REGENERATE, cards.REJECT)]
        if decisions:
            c = decisions[0]
            action = self._choice(c.draft_id, c.version)
            data = cards.callback_data(action, c.draft_id, c.version)
            self._press(chat, m.message_id, data, now, race=[d.action for d in decisions])
        for c in parsed:
            data = cards.callback_data(c.action, c.draft_id, c.version)
            if c.action == cards.REPLAY and (chat, m.message_id, data) not in self.buttons:
                self.report.replays += 1  # a failure notice's button: replay what failed
            if c.action in (cards.RETRY, cards.REPLAY):
                self._press(chat, m.message_id, cards.callback_data(c.action, c.draft_id,
                                                                    c.version), now)

    def _choice(self, draft_id: int, version: int) -> str:
        key = (draft_id, version)
        if key not in self.card_choice:
            r = self.rng.random()
            action = cards.APPROVE
            if not self.draining and self.regens[draft_id] < 2:
                action = (cards.EDIT if r < 0.06 else cards.REGENERATE if r < 0.13
                          else cards.REJECT if r < 0.18 else cards.APPROVE)
            if action in (cards.EDIT, cards.REGENERATE):
                self.regens[draft_id] += 1
            self.card_choice[key] = action
        return self.card_choice[key]

    def _press(self, chat: int, mid: int, data: str, now: float,
               race: list[str] = ()) -> None:
        """Tap ``data`` once; again if it is still on the message 20 s later (its tap
        was lost with a killed host, say), up to MAX_ROUNDS times."""
        b = self.buttons.setdefault((chat, mid, data), _Button())
        if b.rounds >= MAX_ROUNDS or (b.rounds and now - b.last < 20):
            return
        b.rounds += 1
        b.last = now
        if b.rounds == 1 and not self.draining and self.rng.random() < 0.03:
            self._tap(STRANGER, chat, mid, cards.callback_data(
                cards.APPROVE, *map(int, data.split(":")[1:])), extras=False)
        self._tap(ANNA, chat, mid, data)
        if race and b.rounds == 1 and not self.draining and self.rng.random() < 0.05:
            other = self.rng.choice(race)  # a second operator taps at the same moment
            self._tap(BOB, chat, mid, cards.callback_data(
                other, *map(int, data.split(":")[1:])), extras=False)

    def _prompt(self, m) -> None:
        """Answer an Edit / Regenerate / Reject prompt (once; now and then twice)."""
        if m.message_id in self.answered_prompts or "inline_keyboard" in (m.reply_markup or {}):
            return
        parsed = _read_prompt(m.text)
        if parsed is None:
            return
        kind, draft_id, version = parsed
        self.answered_prompts.add(m.message_id)
        text = {cards.PROMPT_EDIT: f"Edited by hand: we are on it (#{draft_id} v{version}).",
                cards.PROMPT_REGENERATE: self.rng.choice(["/skip", "shorter, please"]),
                cards.PROMPT_REJECT: self.rng.choice(["/skip", "not a real customer"])}[kind]
        times = 2 if self.rng.random() < 0.05 else 1
        for _ in range(times):
            self.tg.say(ANNA, CHAT, text, reply_to=m.message_id, first_name="Anna")
            self.report.prompt_replies += 1

    def _notice(self, m) -> None:
        if m.message_id in self.replay_notices:
            return
        self.replay_notices.add(m.message_id)
        if "draft(s) failed" in m.text:  # no button: the notice names no one draft
            self._spawn(self._scan_status())

    async def _scan_status(self) -> None:
        """What `draftgate status support --json` lists as failed: replay it."""
        out = await self._cli("status", "support", "--json")
        with contextlib.suppress(ValueError, TypeError):
            for a in json.loads(out or "{}").get("attention", []):
                if a.get("status") == "failed":
                    await self._replay(a["item_id"])

    async def _replay(self, item_id: str) -> None:
        if self.replayed[item_id] >= MAX_REPLAYS:
            return
        row = next((r for r in self.rows if r["item_id"] == item_id), None)
        if row is not None and row["status"] != "failed":
            return  # already moving again
        self.replayed[item_id] += 1
        await self.operators_go.wait()
        await self._cli("replay", "support", item_id)
        self.report.replays += 1

    async def _cli(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", *args[:1], "-c", str(self.cfg), *args[1:],
            cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self.cli_procs.add(proc)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 120)
        finally:
            if proc.returncode is None:  # cancelled or timed out: end it and read its pipes
                await _end(proc)         # to EOF, so no transport outlives the loop
            self.cli_procs.discard(proc)
        if proc.returncode not in (0, 1):
            self.o.say(f"draftgate {' '.join(args)} exited {proc.returncode}: "
                       f"{err.decode(errors='replace')[-500:]}")
        return out.decode(errors="replace")

    # -- the judgement ---------------------------------------------------------------------------
    async def _judge(self) -> None:
        rep, o = self.report, self.o
        out = await self._cli("pending", "--json")
        try:
            pending = json.loads(out)
        except ValueError:
            self.harness_errors.append(f"`draftgate pending --json` printed no JSON: {out[:300]!r}")
            pending = []
        rows = await self.view.drafts()
        audit = await self.view.rows("SELECT actor, action, draft_key, text_sha256 FROM audit")
        # A host restarted a moment ago is let finish starting: then SIGTERM stops it
        # cleanly (exit 0), which is judged too.
        # A kill in the last moment of the chaos may have come after the supervisor's
        # last look: such a host is started again here, so SIGTERM meets a live one.
        self._restart_dead()
        await self._until(self._all_up, 60, "every host to finish starting")
        codes = await asyncio.gather(*(asyncio.to_thread(h.terminate) for h in self.hosts))
        rep.stop_codes = list(codes)

        sends = self.gmail.calls_to("messages.send")
        rep.send_posts = len(sends)
        sent = self.gmail.sent()
        rep.sends_accepted = len(sent)
        replies: collections.Counter[int] = collections.Counter()
        approved: dict[str, set[str]] = collections.defaultdict(set)
        for a in audit:
            if a["action"] == "approve" and any(a["actor"].startswith(f"tg:{u} ")
                                                 for u in OPERATORS):
                approved[a["draft_key"]].add(a["text_sha256"])
        rep.stranger_actions = sum(1 for a in audit if a["actor"].startswith(f"tg:{STRANGER}"))
        for m in sent:
            msg = email.message_from_bytes(m.raw, policy=email.policy.default)
            ticket = _IN_REPLY_TO.search(str(msg.get("In-Reply-To", "")))
            if ticket:
                replies[int(ticket.group(1))] += 1
            key = str(msg.get("X-Draftgate-Key", ""))
            text = msg.get_content().replace("\r\n", "\n")
            if not {sha256_text(text), sha256_text(text.rstrip("\n"))} & approved.get(key, set()):
                rep.unapproved_sends.append(f"{key or m.id}: no operator approved this text")
        rep.replies_max = max(replies.values(), default=0)
        rep.duplicated = sorted(n for n, c in replies.items() if c > 1)

        now = time.time()
        by_item = {r["item_id"]: r for r in rows}
        listed = {p["item_id"] for p in pending}
        for gid, n in sorted(self.originals.items(), key=lambda kv: kv[1]):
            r = by_item.get(gid)
            status = r["status"] if r else None
            if replies[n]:
                if status != "sent":
                    rep.replied_not_sent.append(f"ticket {n} #{r and r['id']}: {status}")
                continue
            if r is None:
                rep.lost.append(f"ticket {n} (Gmail {gid}): never admitted")
            elif status == "sent":
                rep.lost.append(f"ticket {n} #{r['id']}: sent in the store, no reply in Gmail")
            elif status in SHOWN_BY_PENDING and gid not in listed:
                rep.lost.append(f"ticket {n} #{r['id']}: {status} but `pending` does not list it")
            elif status in ("queued", "drafting") and (stuck := _stuck(r, now)):
                rep.lost.append(f"ticket {n} #{r['id']}: {stuck}")
            elif status not in SHOWN_BY_PENDING + VISIBLE_TERMINAL + ("queued", "drafting"):
                rep.lost.append(f"ticket {n} #{r['id']}: {status}")
        rep.statuses = dict(collections.Counter(r["status"] for r in rows))

        rep.crashed_sends = len(self.crashes)
        times = [(c.done or now) - c.at for c in self.crashes.values()]
        rep.crash_recovery_max = max(times, default=0.0)
        rep.crash_recovery_open = sum(1 for c in self.crashes.values() if c.done is None)
        rep.model_requests = len(tickets_of(self.llm))
        rep.faults = dict(self.llm.injected + self.gmail.injected)
        per_draft: collections.Counter[int] = collections.Counter()
        for m in self.tg.chat_messages(CHAT):
            head = re.search(r"^📨 [^\n]* · #(\d+) v\d+$", m.text, re.M)
            if head and m.kind == "text":
                per_draft[int(head.group(1))] += 1
        rep.cards_max = max(per_draft.values(), default=0)
        rep.tracebacks = sum(h.text().count("Traceback") for h in self.hosts)

        if self.harness_errors:  # the soak itself broke: its figures mean little
            rep.failures.append(f"chaos harness errors: {self.harness_errors[:3]}")
        if rep.replies_max > 1:
            rep.failures.append(f"tickets replied to more than once: {rep.duplicated}")
        if rep.lost:
            rep.failures.append(f"{len(rep.lost)} mail(s) neither replied to nor visibly "
                                f"pending: {rep.lost[:10]}")
        if rep.unapproved_sends:
            rep.failures.append(f"sends without an operator's approval of that text: "
                                f"{rep.unapproved_sends[:10]}")
        if rep.stranger_actions:
            rep.failures.append(f"{rep.stranger_actions} action(s) by a user not on the "
                                f"allow-list")
        if rep.unexpected_exits:
            rep.failures.append(f"{len(rep.unexpected_exits)} host exit(s) nobody caused: "
                                f"{rep.unexpected_exits[0][:2000]}")
        if any(code != 0 for code in rep.stop_codes):
            rep.failures.append(f"SIGTERM did not stop every host cleanly: exit codes "
                                f"{rep.stop_codes}")
        if o.max_crash_recovery is not None and rep.crash_recovery_max > o.max_crash_recovery:
            rep.failures.append(f"a send cut by a kill stayed unfinished "
                                f"{rep.crash_recovery_max:.1f}s (limit "
                                f"{o.max_crash_recovery:g}s)")


def _stuck(r: dict, now: float, grace: float = 60.0) -> str | None:
    """Why a queued or drafting row counts as lost: every tick (each second) drafts
    what is queued and requeues expired leases, so one left like that for a minute
    with the faults off is something nothing moves."""
    if r["status"] == "drafting" and r["lease_until"] and now - float(r["lease_until"]) > grace:
        return f"drafting, its lease expired {now - float(r['lease_until']):.0f}s ago"
    if r["status"] == "queued" and now - float(r["updated_at"]) > grace:
        return f"queued for {now - float(r['updated_at']):.0f}s with nothing drafting it"
    return None


async def run_chaos(opts: ChaosOptions) -> ChaosReport:
    return await Soak(opts).run()
