"""Numbered schema migrations of the SQLite store.

``MIGRATIONS[n - 1]`` takes the database from version ``n - 1`` to ``n``; the version
lives in ``PRAGMA user_version``. A migration is never edited once released: a change
is a new entry appended at the end (never "ALTER and ignore the error").

The PostgreSQL backend mirrors these tables column for column, so the SQL stays
portable where it can: plain types (TEXT, INTEGER, REAL), epoch-second REAL times,
JSON kept as TEXT. ``WITHOUT ROWID`` and the triggers are SQLite-only extras.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from .chain import GENESIS, seal

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

# Team approval desk (issue 14): quorum votes, and reminders/digests sent once.
_V_DESK = [
    # One row per operator approving one version of a draft: the quorum is counted
    # here, so the same operator twice counts once and a new version starts with none.
    """CREATE TABLE approvals (
        draft_id INTEGER NOT NULL,
        version  INTEGER NOT NULL,
        operator TEXT NOT NULL,
        actor    TEXT NOT NULL,
        at       REAL NOT NULL,
        PRIMARY KEY (draft_id, version, operator)
    )""",
    # A reminder (remind|draft|version|n) or a digest (digest|slot) is claimed here
    # before it is sent, so no restart or second host sends it twice.
    """CREATE TABLE sent_notices (
        key TEXT PRIMARY KEY,
        at  REAL NOT NULL
    )""",
]

# Triage (issue 13): the decision (reply | notify | skip) and the model's reason, stored
# with the draft key, so a crash or a restart never triages an email twice.
_V_TRIAGE = [
    "ALTER TABLE drafts ADD COLUMN triage TEXT",
    "ALTER TABLE drafts ADD COLUMN triage_reason TEXT",
]

# Context for drafts (issue 13): team memory (examples), knowledge passages,
# and what each draft was given. Full-text search is FTS5 (bm25) over external-content
# tables kept in step by triggers; porter stemming so "refund" finds "Refunds".
_V_CONTEXT = [
    # One sent reply with its original email: an example of how its pipeline answers.
    """CREATE TABLE examples (
        id        INTEGER PRIMARY KEY,
        pipeline  TEXT NOT NULL,
        item_id   TEXT NOT NULL,
        draft_key TEXT NOT NULL UNIQUE,
        original  TEXT NOT NULL,
        reply     TEXT NOT NULL,
        edited    INTEGER NOT NULL DEFAULT 0,
        sent_at   REAL NOT NULL
    )""",
    "CREATE INDEX examples_pipeline_item ON examples (pipeline, item_id)",
    "CREATE INDEX examples_pipeline_id ON examples (pipeline, id)",  # the memory window
    # The pipeline is indexed too, so a search ranks only its own pipeline's rows.
    """CREATE VIRTUAL TABLE examples_fts USING fts5(pipeline, original, content='examples',
        content_rowid='id', tokenize='porter unicode61')""",
    """CREATE TRIGGER examples_fts_insert AFTER INSERT ON examples BEGIN
        INSERT INTO examples_fts (rowid, pipeline, original)
        VALUES (new.id, new.pipeline, new.original); END""",
    """CREATE TRIGGER examples_fts_delete AFTER DELETE ON examples BEGIN
        INSERT INTO examples_fts (examples_fts, rowid, pipeline, original)
        VALUES ('delete', old.id, old.pipeline, old.original); END""",
    # The knowledge files of each pipeline as last indexed (re-indexed when the hash changes).
    """CREATE TABLE knowledge_files (
        pipeline TEXT NOT NULL,
        path     TEXT NOT NULL,
        sha256   TEXT NOT NULL,
        mtime_ns INTEGER NOT NULL,
        size     INTEGER NOT NULL,
        PRIMARY KEY (pipeline, path)
    )""",
    """CREATE TABLE knowledge_passages (
        id       INTEGER PRIMARY KEY,
        pipeline TEXT NOT NULL,
        path     TEXT NOT NULL,
        heading  TEXT NOT NULL,
        text     TEXT NOT NULL
    )""",
    "CREATE INDEX knowledge_passages_file ON knowledge_passages (pipeline, path)",
    """CREATE VIRTUAL TABLE knowledge_fts USING fts5(pipeline, heading, text,
        content='knowledge_passages', content_rowid='id', tokenize='porter unicode61')""",
    """CREATE TRIGGER knowledge_fts_insert AFTER INSERT ON knowledge_passages BEGIN
        INSERT INTO knowledge_fts (rowid, pipeline, heading, text)
        VALUES (new.id, new.pipeline, new.heading, new.text); END""",
    """CREATE TRIGGER knowledge_fts_delete AFTER DELETE ON knowledge_passages BEGIN
        INSERT INTO knowledge_fts (knowledge_fts, rowid, pipeline, heading, text)
        VALUES ('delete', old.id, old.pipeline, old.heading, old.text); END""",
    # What the draft's request was given (JSON), for its card and `pending --json`.
    "ALTER TABLE drafts ADD COLUMN used TEXT",
]

# The audit chain (issue 14): each audit row carries its chain position and
# sha256(prev_hash || canonical row); audit_head is the chain's last position and hash.
# Rows written before this version are chained here, in id order (bot.store.chain).
_V_CHAIN: list[str | Callable[[Any], Awaitable[None]]] = [
    "ALTER TABLE audit ADD COLUMN seq INTEGER",
    "ALTER TABLE audit ADD COLUMN prev_hash TEXT",
    "ALTER TABLE audit ADD COLUMN hash TEXT",
    "CREATE UNIQUE INDEX audit_seq ON audit (seq)",
    """CREATE TABLE audit_head (
        one  INTEGER PRIMARY KEY CHECK (one = 1),
        seq  INTEGER NOT NULL,
        hash TEXT NOT NULL
    )""",
    f"INSERT INTO audit_head (one, seq, hash) VALUES (1, 0, '{GENESIS}')",
    # The only UPDATE the audit table ever gets: chaining the rows already there.
    "DROP TRIGGER audit_no_update",
    seal,
    """CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
       BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END""",
]

# Status at scale (issue 16): `status` and `status <pipeline>` count seen marks and drafts
# by status; on a year of mail (1M seen marks, 200k drafts) a COUNT(*) reads every row
# (0.1-0.3 s). The counts are kept by triggers, in the same transaction as the rows, so
# no store method (nor migrate-store, whose inserts fire them) has to remember them.
_V_COUNTS = [
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
    "FROM drafts WHERE status IN ('sent', 'failed', 'skipped', 'rejected', 'expired', 'dismissed') GROUP BY pipeline, status",
    """CREATE TRIGGER draft_counts_insert AFTER INSERT ON drafts
        WHEN NEW.status IN ('sent', 'failed', 'skipped', 'rejected', 'expired', 'dismissed') BEGIN
        INSERT INTO draft_counts (pipeline, status, n) VALUES (NEW.pipeline, NEW.status, 1)
        ON CONFLICT (pipeline, status) DO UPDATE SET n = n + 1; END""",
    """CREATE TRIGGER draft_counts_delete AFTER DELETE ON drafts
        WHEN OLD.status IN ('sent', 'failed', 'skipped', 'rejected', 'expired', 'dismissed') BEGIN
        UPDATE draft_counts SET n = n - 1 WHERE pipeline = OLD.pipeline AND status = OLD.status;
        END""",
    """CREATE TRIGGER draft_counts_leave AFTER UPDATE OF pipeline, status ON drafts
        WHEN OLD.status IN ('sent', 'failed', 'skipped', 'rejected', 'expired', 'dismissed')
        AND (OLD.pipeline IS NOT NEW.pipeline OR OLD.status IS NOT NEW.status) BEGIN
        UPDATE draft_counts SET n = n - 1 WHERE pipeline = OLD.pipeline AND status = OLD.status;
        END""",
    """CREATE TRIGGER draft_counts_enter AFTER UPDATE OF pipeline, status ON drafts
        WHEN NEW.status IN ('sent', 'failed', 'skipped', 'rejected', 'expired', 'dismissed')
        AND (OLD.pipeline IS NOT NEW.pipeline OR OLD.status IS NOT NEW.status) BEGIN
        INSERT INTO draft_counts (pipeline, status, n) VALUES (NEW.pipeline, NEW.status, 1)
        ON CONFLICT (pipeline, status) DO UPDATE SET n = n + 1; END""",
    # `pending`: the oldest drafts waiting for a person, without walking a year of
    # finished ones in id order (the predicate is sql_reads.PENDING_SQL, word for word).
    "CREATE INDEX drafts_pending ON drafts (id) WHERE status IN "
    "('ready', 'awaiting', 'approved', 'sending', 'send_failed', 'send_unknown', 'notified')",
]

# The operator desk (issue 23): what an Edit / Regenerate / Reject prompt message asks
# about, so a reply to it finds its draft after a restart. These were audit rows under
# a ``prompt|chat|mid`` key (the audit doubled as a key-value store); the rows already
# recorded are copied, and stay in the chained audit where they are.
_V_PROMPTS = [
    """CREATE TABLE prompts (
        chat       TEXT NOT NULL,
        message_id TEXT NOT NULL,
        record     TEXT NOT NULL,
        actor      TEXT NOT NULL,
        at         REAL NOT NULL,
        PRIMARY KEY (chat, message_id)
    ) WITHOUT ROWID""",
    "INSERT OR REPLACE INTO prompts (chat, message_id, record, actor, at) "
    "SELECT substr(draft_key, 8, instr(substr(draft_key, 8), '|') - 1), "
    "substr(substr(draft_key, 8), instr(substr(draft_key, 8), '|') + 1), "
    "COALESCE(detail, ''), actor, at FROM audit "
    "WHERE action = 'prompt' AND draft_key LIKE 'prompt|%|%' ORDER BY id",
]

# Hybrid retrieval (issue 24): embedding vectors of passages and examples, keyed by the
# sha256 of the embedded text and the embedding model (the same text in two pipelines
# is embedded once; a change of model embeds again, beside the old vectors).
_V_VECTORS = [
    """CREATE TABLE embeddings (
        model TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        vector BLOB NOT NULL,
        PRIMARY KEY (model, sha256))""",
]

# Deferred sends (issue 28): an approved draft is sent only when ``send_after`` has
# passed (the undo window, a chosen later time, the next sending hour); NULL: at once.
_V_SEND_AFTER = [
    "ALTER TABLE drafts ADD COLUMN send_after REAL",
]

# Files an operator attached to a reply (issue 28): a JSON list of paths; NULL: none.
_V_ATTACHED = [
    "ALTER TABLE drafts ADD COLUMN attached TEXT",
]

# Embedding progress (issue 24): how far the background embedding of a model has got,
# written by the process that embeds, so `draftgate status` elsewhere can show it.
_V_EMBED_PROGRESS = [
    """CREATE TABLE embedding_progress (
        model      TEXT PRIMARY KEY,
        done       INTEGER NOT NULL,
        total      INTEGER NOT NULL,
        updated_at REAL NOT NULL)""",
]

# Style notes learned from edits (issue 25): each version of a pipeline's rules, proposed
# by the model and decided by an operator; the drafter is given the newest approved one.
# ``drafts.first_body``: the text a version had before its first edit (what the model
# wrote and a human changed), the first half of an edit pair.
_V_STYLE_NOTES = [
    "ALTER TABLE drafts ADD COLUMN first_body TEXT",
    """CREATE TABLE style_notes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        pipeline TEXT NOT NULL,
        version INTEGER NOT NULL,
        rules TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at REAL NOT NULL,
        created_by TEXT NOT NULL,
        decided_by TEXT,
        decided_at REAL,
        approval_chat TEXT,
        approval_message_id TEXT,
        UNIQUE (pipeline, version))""",
]

# Unguessable reply Message-IDs (issue 22): a random part, drawn when a draft first
# moves to `sending` and kept for every later check and retry of that send. A row that
# was already in a send state before this version keeps the id derived from its key
# alone (marked ''), so its unknown-send check still finds what it sent.
_V_REPLY_NONCE = [
    "ALTER TABLE drafts ADD COLUMN reply_nonce TEXT",
    "UPDATE drafts SET reply_nonce = '' WHERE status IN ('sending', 'send_unknown', "
    "'send_failed')",
]

# The scoreboard (issue 25): what the quality figures are read from. An operator's edit
# replaces the model's text; that text is kept in first_body at the first edit (NULL:
# not edited since the model drafted it; a regenerate starts over), so the edit size
# between what the model drafted and what was sent is measured when it is sent (the
# same column and meaning as style notes' edit pairs on main). The counts are
# kept with the row (not counted from the audit at read time), so a month of
# decisions is one range read of drafts_decided. Drafts decided before this version
# get their edits and regenerations counted from the audit here; their first text and
# their card's time were never kept.
# (first_body came with the style notes, _V_STYLE_NOTES, with the same meaning.)
_V_QUALITY = [
    "ALTER TABLE drafts ADD COLUMN edits INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE drafts ADD COLUMN regenerations INTEGER NOT NULL DEFAULT 0",
    # Measured when an edited draft is sent (bot.scoreboard.edit_size): no read of the
    # scoreboard compares texts.
    "ALTER TABLE drafts ADD COLUMN edit_size REAL",
    "ALTER TABLE drafts ADD COLUMN posted_at REAL",  # the first card of the draft went up
    # An operator answered the triage (Draft a reply on an FYI card; /reply or /replay
    # of an item triage skipped): when, and who.
    "ALTER TABLE drafts ADD COLUMN overridden_at REAL",
    "ALTER TABLE drafts ADD COLUMN overridden_by TEXT",
    # Unsupported claims (the grounding check) of the first version, and of the current one.
    "ALTER TABLE drafts ADD COLUMN flagged INTEGER",
    "ALTER TABLE drafts ADD COLUMN unsupported INTEGER NOT NULL DEFAULT 0",
    # Covering (every column Store.quality reads): a month is ~10k rows, read from the
    # index alone, not looked up one by one among a year of drafts with their bodies.
    # Only decided drafts have an entry, so edits and regenerations before a decision
    # write nothing here.
    "CREATE INDEX drafts_decided ON drafts (decided_at, status, pipeline, decided_by, posted_at, "
    "edits, regenerations, flagged, unsupported, edit_size) WHERE decided_at IS NOT NULL",
    "CREATE INDEX drafts_overridden ON drafts (overridden_at) WHERE overridden_at IS NOT NULL",
    "UPDATE drafts SET edits = (SELECT COUNT(*) FROM audit WHERE audit.draft_key = drafts.key "
    "AND audit.action = 'edit'), regenerations = (SELECT COUNT(*) FROM audit "
    "WHERE audit.draft_key = drafts.key AND audit.action = 'regenerate') "
    "WHERE decided_at IS NOT NULL",
]

#: Each entry is the list of statements of one migration, in order (a callable is a
#: step written in Python, awaited with the connection (a ``rows.Db``) inside the
#: migration).
MIGRATIONS: list[list] = [_V1, _V2, _V_DESK, _V_TRIAGE, _V_CONTEXT, _V_CHAIN, _V_COUNTS,
                        _V_PROMPTS, _V_VECTORS, _V_SEND_AFTER,
                        _V_ATTACHED, _V_EMBED_PROGRESS, _V_STYLE_NOTES, _V_QUALITY,
                        _V_REPLY_NONCE]

#: The schema version this code writes and understands.
LATEST = len(MIGRATIONS)
