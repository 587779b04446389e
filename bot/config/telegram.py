"""The ``telegram:`` section of draftgate.yaml: its typed settings and their checks
(part of :mod:`bot.config.load`, which loads the whole file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .checker import Checker, parse_duration


@dataclass(frozen=True)
class TelegramWebhook:
    """``telegram.webhook``: where Telegram posts updates when ``receive: webhook``."""

    url: str | None = None
    secret_env: str | None = None  # the variable's name, never the secret
    listen: str = "127.0.0.1"
    port: int = 8443
    path: str = "telegram"


@dataclass
class TelegramConfig:
    token_env: str = "TELEGRAM_BOT_TOKEN"
    base_url: str = "https://api.telegram.org/bot"
    base_file_url: str = "https://api.telegram.org/file/bot"
    operators: list[int] = field(default_factory=list)
    approvals_chat: int | None = None
    ops_chat: int | None = None
    receive: str = "polling"  # polling | webhook | off
    webhook: TelegramWebhook = TelegramWebhook()
    poll_timeout: float = 30.0
    digest: str | None = None  # cron of the daily summary to the ops chat; None: none
    timezone: str = "UTC"  # IANA zone of the digest's cron


def parse_telegram(ck: Checker, t: dict) -> TelegramConfig:
    ck.unknown(t, {"token", "token_env", "base_url", "base_file_url", "operators", "approvals_chat",
                   "ops_chat", "receive", "webhook", "poll_timeout", "digest", "timezone"}, "telegram")
    cfg = TelegramConfig()
    cfg.token_env = ck.env_name(t, "token_env", "telegram", default=cfg.token_env)
    if "token" in t:
        ck.error("telegram.token", "never put the token in YAML; set token_env to the name "
                                   "of an environment variable that holds it")
    cfg.base_url = ck.url(t, "base_url", "telegram", default=cfg.base_url, credentials_ok=True)
    cfg.base_file_url = ck.url(t, "base_file_url", "telegram", default=cfg.base_file_url,
                               credentials_ok=True)
    ops = ck.get(t, "operators", "telegram", list)
    for i, op in enumerate(ops or []):
        if isinstance(op, bool) or not isinstance(op, int):
            ck.error(f"telegram.operators[{i}]", f"expected a numeric Telegram user id, got {op!r}"
                                                 " (usernames can change; ids cannot)")
        else:
            cfg.operators.append(op)
    if ops is not None and not ops:
        ck.error("telegram.operators", "expected at least one numeric user id")
    cfg.approvals_chat = ck.get(t, "approvals_chat", "telegram", int, default=None)
    cfg.ops_chat = ck.get(t, "ops_chat", "telegram", int, default=cfg.approvals_chat)
    cfg.receive = ck.get(t, "receive", "telegram", str, default="polling",
                         choices=("polling", "webhook", "off"))
    cfg.webhook = _webhook(ck, t.get("webhook"))
    cfg.poll_timeout = ck.convert(t, "poll_timeout", "telegram", parse_duration, default=30.0)
    if cfg.poll_timeout is not None and cfg.poll_timeout <= 0:
        ck.error("telegram.poll_timeout", "expected a duration above 0, like 30s")
    cfg.timezone = ck.timezone(t, "timezone", "telegram")
    cfg.digest = ck.get(t, "digest", "telegram", str, default=None)
    if cfg.digest is not None:
        from ..scheduler import validate_cron

        if problem := validate_cron(cfg.digest):
            ck.error("telegram.digest", f"expected a cron expression like '0 8 * * *' (every "
                                        f"day at 08:00 UTC): {problem}")
            cfg.digest = None
    return cfg


def _webhook(ck: Checker, raw: Any) -> TelegramWebhook:
    """``telegram.webhook``, checked without reading the secret. Whether url and
    secret_env are there is checked by ``build.check_all``, after ``run
    --telegram-receive`` may have turned webhooks on."""
    path = "telegram.webhook"
    wh = ck.mapping(raw, path)
    d = TelegramWebhook()
    ck.unknown(wh, set(TelegramWebhook.__dataclass_fields__), path)
    url = ck.url(wh, "url", path, default=None)
    secret_env = ck.env_name(wh, "secret_env", path, default=None)
    listen = ck.get(wh, "listen", path, str, default=d.listen)
    port = ck.get(wh, "port", path, int, default=d.port)
    if port is not None and not 1 <= port <= 65535:
        ck.error(f"{path}.port", f"expected a port from 1 to 65535, got {port}")
    return TelegramWebhook(url, secret_env, listen, port,
                           ck.get(wh, "path", path, str, default=d.path))


def chat_id(value: Any) -> int | None:
    """A Telegram chat id as the approval channel reads it (a number, or a string of
    digits); None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None
