"""Numbered schema migrations of the SQLite store.

``MIGRATIONS[n - 1]`` takes the database from version ``n - 1`` to ``n``; the version
lives in ``PRAGMA user_version``. A migration is never edited once released: a change
is a new entry appended at the end (never "ALTER and ignore the error").

The PostgreSQL backend mirrors these tables column for column, so the SQL stays
portable where it can: plain types (TEXT, INTEGER, REAL), epoch-second REAL times,
JSON kept as TEXT. ``WITHOUT ROWID`` and the triggers are SQLite-only extras.
"""

from __future__ import annotations

_V1 = [
    # Set membership written at fetch. WITHOUT ROWID clusters rows on the primary key,
    # so the "which of these 50 ids are new" lookup reads one b-tree, not two.
    """CREATE TABLE seen_items (
        pipeline TEXT NOT NULL,
        scope    TEXT NOT NULL,
        item_id  TEXT NOT NULL,
        seen_at  REAL NOT NULL,
        PRIMARY KEY (pipeline, scope, item_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX seen_items_seen_at ON seen_items (seen_at)",
    # The durable work queue: one row per unit of work, key = pipeline|scope|item|recipe.
    """CREATE TABLE drafts (
        id                  INTEGER PRIMARY KEY,
        key                 TEXT NOT NULL UNIQUE,
        pipeline            TEXT NOT NULL,
        scope               TEXT NOT NULL,
        item_id             TEXT NOT NULL,
        recipe              TEXT NOT NULL,
        status              TEXT NOT NULL,
        payload             TEXT NOT NULL,
        attempt             INTEGER NOT NULL DEFAULT 0,
        lease_until         REAL,
        fence               INTEGER NOT NULL DEFAULT 0,
        body                TEXT NOT NULL DEFAULT '',
        version             INTEGER NOT NULL DEFAULT 1,
        instruction         TEXT NOT NULL DEFAULT '',
        approval_chat       TEXT,
        approval_message_id TEXT,
        decided_by          TEXT,
        decided_at          REAL,
        sent_id             TEXT,
        error               TEXT,
        tokens_in           INTEGER NOT NULL DEFAULT 0,
        tokens_out          INTEGER NOT NULL DEFAULT 0,
        created_at          REAL NOT NULL,
        updated_at          REAL NOT NULL
    )""",
    "CREATE INDEX drafts_pipeline_status ON drafts (pipeline, status, id)",
    "CREATE INDEX drafts_pipeline_item ON drafts (pipeline, item_id)",
    # The sweeper and start-up recovery look rows up by status across pipelines.
    "CREATE INDEX drafts_status_updated ON drafts (status, updated_at)",
    """CREATE TABLE pipeline_runs (
        id            INTEGER PRIMARY KEY,
        pipeline      TEXT NOT NULL,
        scheduled_for REAL,
        started_at    REAL NOT NULL,
        ended_at      REAL,
        status        TEXT NOT NULL,
        error_text    TEXT,
        counts        TEXT NOT NULL DEFAULT '{}'
    )""",
    "CREATE INDEX pipeline_runs_pipeline_started ON pipeline_runs (pipeline, started_at DESC)",
    """CREATE TABLE audit (
        id          INTEGER PRIMARY KEY,
        at          REAL NOT NULL,
        actor       TEXT NOT NULL,
        action      TEXT NOT NULL,
        draft_key   TEXT,
        text_sha256 TEXT,
        detail      TEXT
    )""",
    "CREATE INDEX audit_draft_key ON audit (draft_key, id)",
    # Append-only is enforced by the database, not by convention.
    """CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
       BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END""",
    """CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
       BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END""",
    """CREATE TABLE cursors (
        pipeline   TEXT NOT NULL,
        scope      TEXT NOT NULL,
        value      TEXT,
        updated_at REAL NOT NULL,
        PRIMARY KEY (pipeline, scope)
    )""",
    """CREATE TABLE token_usage (
        pipeline TEXT NOT NULL,
        day      TEXT NOT NULL,
        tokens   INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (pipeline, day)
    )""",
    """CREATE TABLE pipeline_flags (
        pipeline   TEXT PRIMARY KEY,
        paused     INTEGER NOT NULL DEFAULT 0,
        updated_at REAL NOT NULL,
        updated_by TEXT
    )""",
    """CREATE TABLE locks (
        name       TEXT PRIMARY KEY,
        holder     TEXT NOT NULL,
        expires_at REAL NOT NULL
    )""",
]

# Version 2: what the hardening needs to remember across processes.
_V2 = [
    # 1 while the approval card may not show the draft's state (its last edit failed);
    # a later tick or the next start re-renders it until an edit succeeds.
    "ALTER TABLE drafts ADD COLUMN card_stale INTEGER NOT NULL DEFAULT 0",
    "CREATE INDEX drafts_card_stale ON drafts (card_stale) WHERE card_stale = 1",
    # The process (host, boot, pid) that moved a draft to `sending`, so a crashed
    # sender is recognised at once on its own host and by its lapsed heartbeat elsewhere.
    "ALTER TABLE drafts ADD COLUMN send_holder TEXT",
    # Why a pipeline's drafting is held (setup error, Retry-After, spent budget) and
    # until when, so `status` in another process tells the truth.
    "ALTER TABLE pipeline_flags ADD COLUMN hold_reason TEXT",
    "ALTER TABLE pipeline_flags ADD COLUMN hold_until REAL",
]

# perf16 (status at scale): `status` and `status <pipeline>` count seen marks and drafts
# by status; on a year of mail (1M seen marks, 200k drafts) a COUNT(*) reads every row
# (0.1-0.3 s). The counts are kept by triggers, in the same transaction as the rows, so
# no store method (nor migrate-store, whose inserts fire them) has to remember them.
_V3 = [
    """CREATE TABLE seen_counts (
        pipeline TEXT NOT NULL,
        scope    TEXT NOT NULL,
        n        INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (pipeline, scope)
    ) WITHOUT ROWID""",
    "INSERT INTO seen_counts (pipeline, scope, n) "
    "SELECT pipeline, scope, COUNT(*) FROM seen_items GROUP BY pipeline, scope",
    """CREATE TRIGGER seen_counts_insert AFTER INSERT ON seen_items BEGIN
        INSERT INTO seen_counts (pipeline, scope, n) VALUES (NEW.pipeline, NEW.scope, 1)
        ON CONFLICT (pipeline, scope) DO UPDATE SET n = n + 1; END""",
    """CREATE TRIGGER seen_counts_delete AFTER DELETE ON seen_items BEGIN
        UPDATE seen_counts SET n = n - 1 WHERE pipeline = OLD.pipeline AND scope = OLD.scope;
        END""",
    # Drafts in a final status (sent, failed, skipped, rejected, expired: nearly all of
    # them after a year) are counted here; the few unfinished ones are counted live
    # (sql.py), so the hot transitions (claim, finish, post, approve) write no counter.
    """CREATE TABLE draft_counts (
        pipeline TEXT NOT NULL,
        status   TEXT NOT NULL,
        n        INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (pipeline, status)
    ) WITHOUT ROWID""",
    "INSERT INTO draft_counts (pipeline, status, n) SELECT pipeline, status, COUNT(*) "
    "FROM drafts WHERE status IN ('sent', 'failed', 'skipped', 'rejected', 'expired') GROUP BY pipeline, status",
    """CREATE TRIGGER draft_counts_insert AFTER INSERT ON drafts
        WHEN NEW.status IN ('sent', 'failed', 'skipped', 'rejected', 'expired') BEGIN
        INSERT INTO draft_counts (pipeline, status, n) VALUES (NEW.pipeline, NEW.status, 1)
        ON CONFLICT (pipeline, status) DO UPDATE SET n = n + 1; END""",
    """CREATE TRIGGER draft_counts_delete AFTER DELETE ON drafts
        WHEN OLD.status IN ('sent', 'failed', 'skipped', 'rejected', 'expired') BEGIN
        UPDATE draft_counts SET n = n - 1 WHERE pipeline = OLD.pipeline AND status = OLD.status;
        END""",
    """CREATE TRIGGER draft_counts_leave AFTER UPDATE OF pipeline, status ON drafts
        WHEN OLD.status IN ('sent', 'failed', 'skipped', 'rejected', 'expired')
        AND (OLD.pipeline IS NOT NEW.pipeline OR OLD.status IS NOT NEW.status) BEGIN
        UPDATE draft_counts SET n = n - 1 WHERE pipeline = OLD.pipeline AND status = OLD.status;
        END""",
    """CREATE TRIGGER draft_counts_enter AFTER UPDATE OF pipeline, status ON drafts
        WHEN NEW.status IN ('sent', 'failed', 'skipped', 'rejected', 'expired')
        AND (OLD.pipeline IS NOT NEW.pipeline OR OLD.status IS NOT NEW.status) BEGIN
        INSERT INTO draft_counts (pipeline, status, n) VALUES (NEW.pipeline, NEW.status, 1)
        ON CONFLICT (pipeline, status) DO UPDATE SET n = n + 1; END""",
    # `pending`: the oldest drafts waiting for a person, without walking a year of
    # finished ones in id order (the predicate is sql.PENDING_SQL, word for word).
    "CREATE INDEX drafts_pending ON drafts (id) WHERE status IN "
    "('ready', 'awaiting', 'approved', 'sending', 'send_failed', 'send_unknown')",
]

#: Each entry is the list of statements of one migration, in order.
MIGRATIONS: list[list[str]] = [_V1, _V2, _V3]

#: The schema version this code writes and understands.
LATEST = len(MIGRATIONS)
