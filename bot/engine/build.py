"""Turns validated settings into stage objects.

Each stage type lives in its own module and exposes ``create(...)``, which builds the
object from the options the loader parsed (:mod:`bot.config.options`) without doing any I/O.
A drafter checks its model's options there too (raising ConfigError naming file and
path); ``check_all`` builds everything once so ``draftgate validate`` reports those.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys

from ..config.load import PipelineConfig, Settings
from ..config.options import WebhookSenderOptions
from ..errors import ConfigError
from ..service import metrics
from ..stages import Drafter, Sender, Source, Triager

_SOURCES = {"maildir": "bot.sources.maildir", "schedule": "bot.sources.schedule",
            "gmail": "bot.sources.gmail", "imap": "bot.sources.imap",
            "microsoft": "bot.sources.microsoft"}
_SENDERS = {"outbox": "bot.senders.outbox", "webhook": "bot.senders.webhook",
            "gmail_reply": "bot.senders.gmail", "gmail_draft": "bot.senders.gmail",
            "smtp_reply": "bot.senders.smtp", "imap_draft": "bot.senders.smtp",
            "microsoft_reply": "bot.senders.microsoft",
            "microsoft_draft": "bot.senders.microsoft"}
_DRAFTERS = {"template": "bot.drafters.template", "openai": "bot.drafters.openai",
             "anthropic": "bot.drafters.anthropic"}


def build_source(pipeline: PipelineConfig, settings: Settings) -> Source:
    assert pipeline.source is not None, "the loader reported the missing or wrong source:"
    return importlib.import_module(_SOURCES[pipeline.source.type]).create(pipeline, settings)


def build_sender(pipeline: PipelineConfig, settings: Settings) -> Sender:
    assert pipeline.sender is not None, "the loader reported the missing or wrong sender:"
    return importlib.import_module(_SENDERS[pipeline.sender.type]).create(pipeline, settings)


def build_model(pipeline: PipelineConfig, settings: Settings, name: str) -> Drafter:
    """The drafter of ``models.<name>`` checked for ``pipeline`` (its lease): the
    pipeline's drafter, or the client its triage asks."""
    model = settings.models[name]
    return importlib.import_module(_DRAFTERS[model.provider]).create(model, pipeline, settings)


async def import_models(pipeline: PipelineConfig, settings: Settings) -> None:
    """Import the modules of the pipeline's drafter and triage models in a worker
    thread: their SDKs take seconds to import (anthropic ~5 s), which on the event
    loop would stall Telegram taps, /status and health. A module that fails to import
    is left to :func:`build_model`, which raises it as it always has."""
    names = {pipeline.drafter.model, *([pipeline.triage.model] if pipeline.triage else [])}
    for name in names:
        model = settings.models.get(name)
        module = _DRAFTERS.get(model.provider) if model is not None else None
        if module is not None and module not in sys.modules:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(importlib.import_module, module)


def build_drafter(pipeline: PipelineConfig, settings: Settings) -> Drafter:
    return metrics.watch_drafter(build_model(pipeline, settings, pipeline.drafter.model),
                                 pipeline.name, pipeline.drafter.model)


def build_triager(pipeline: PipelineConfig, settings: Settings) -> Triager | None:
    """The pipeline's triage (``None`` without ``triage:``): its model's LLM client,
    checked against the pipeline's lease like a drafter's."""
    if pipeline.triage is None:
        return None
    from ..drafters.llm import LLMDrafter
    from ..drafters.triage import Triager as _Triager

    llm = build_model(pipeline, settings, pipeline.triage.model)
    assert isinstance(llm, LLMDrafter), "the loader refuses triage with the template model"
    return _Triager(llm, pipeline.triage.rules)


def check_all(settings: Settings) -> list[str]:
    """Build every stage; return every ConfigError message."""
    errors: list[str] = _check_telegram(settings)
    for p in settings.pipelines:
        # A stage that is missing or wrong was reported by the loader (which `validate`
        # lets run on, so one pass lists every problem): nothing to build.
        known = (p.source is not None, p.drafter.model in settings.models, p.sender is not None,
                 p.triage is not None)
        for build, ok in zip((build_source, build_drafter, build_sender, build_triager), known,
                             strict=True):
            if not ok:
                continue
            try:
                build(p, settings)
            except ConfigError as exc:
                errors.extend(exc.errors)
    return errors


def _check_telegram(settings: Settings) -> list[str]:
    """What the Telegram channel refuses at start that the loader cannot know (``run
    --telegram-receive webhook`` changes ``receive``), checked without the token."""
    t = settings.telegram
    if t is None or t.receive != "webhook":
        return []
    hints = {"url": "the public https:// URL Telegram posts updates to",
             "secret_env": "the environment variable holding the secret checked on every update"}
    return [f"{settings.file}: telegram.webhook.{key}: missing; required when telegram.receive "
            f"is webhook ({hint})" for key, hint in hints.items() if not getattr(t.webhook, key)]


def missing_env(settings: Settings, pipelines: list[PipelineConfig] | None = None) -> list[str]:
    """The environment variables that ``run`` will read (model API keys, webhook
    secrets, the Telegram token) and that are not set here, one message each naming
    the variable and the key that names it. Never reads a value into a message."""
    import os

    pipelines = settings.pipelines if pipelines is None else pipelines
    out: list[str] = []
    by_model: dict[str, list[str]] = {}
    for p in pipelines:
        by_model.setdefault(p.drafter.model, []).append(p.name)
        if p.triage is not None and p.triage.model != p.drafter.model:
            by_model.setdefault(p.triage.model, []).append(p.name)
        secret_env = p.sender.secret_env if isinstance(p.sender, WebhookSenderOptions) else None
        if secret_env and not os.environ.get(secret_env, "").strip():
            out.append(f"{p.file}: sender.secret_env: environment variable "
                       f"{secret_env} is not set; export it with the webhook's token")
    out += _missing_imap_env(settings, pipelines)
    out += _missing_microsoft_tokens(settings, pipelines)
    for name, users in by_model.items():
        p = next(q for q in pipelines if q.name == users[0])
        try:  # the drafter's model or the triage's: built the same way
            opts = getattr(build_model(p, settings, name), "opts", None)
        except ConfigError:
            continue  # reported by check_all
        var = getattr(opts, "api_key_env", None)
        if var and not os.environ.get(var, ""):
            out.append(f"{settings.file}: models.{name}.api_key_env: environment variable {var} "
                       f"is not set (used by {', '.join(users)}); export it with the "
                       f"{settings.models[name].provider} API key")
    t = settings.telegram
    if t is not None:
        for key, var, what in (("token_env", t.token_env, "the bot token from @BotFather"),
                               ("webhook.secret_env", t.webhook.secret_env,
                                "the webhook secret")):
            if key.startswith("webhook") and t.receive != "webhook":
                continue
            if var and not os.environ.get(str(var), ""):
                out.append(f"{settings.file}: telegram.{key}: environment variable {var} is "
                           f"not set; export it with {what}")
    return out


def _missing_imap_env(settings: Settings, pipelines: list[PipelineConfig]) -> list[str]:
    """The IMAP/SMTP password variables of the accounts ``pipelines`` use, not set here."""
    import os

    used = {getattr(stage, "account", None) for p in pipelines for stage in (p.source, p.sender)
            if stage is not None and stage.type in ("imap", "smtp_reply", "imap_draft")}
    out = []
    for name in sorted(n for n in used if n in settings.imap_accounts):
        a = settings.imap_accounts[name]
        for key, var in (("password_env", a.password_env),
                         ("smtp.password_env", a.smtp.password_env if a.smtp else "")):
            if var and not os.environ.get(var, ""):
                out.append(f"{settings.file}: imap.accounts.{name}.{key}: environment variable "
                           f"{var} is not set; export it with the account's (app) password")
    return out


def _missing_microsoft_tokens(settings: Settings, pipelines: list[PipelineConfig]) -> list[str]:
    """The token files of the Microsoft accounts ``pipelines`` use that do not exist."""
    used = {getattr(stage, "account", None) for p in pipelines for stage in (p.source, p.sender)
            if stage is not None and stage.type.startswith("microsoft")}
    out = []
    for name in sorted(n for n in used if n in settings.microsoft_accounts):
        path = settings.resolve(settings.microsoft_accounts[name].token_file)
        if not path.exists():
            out.append(f"{settings.file}: microsoft.accounts.{name}.token_file: {path} not found; "
                       f"run `draftgate auth microsoft -c {settings.file} --account {name}`")
    return out


def register_secrets(settings: Settings) -> None:
    """Give :mod:`bot.redact` every secret value this deployment can use, before
    anything runs: the Telegram token and webhook secret, each model's API key and
    the credentials in its base_url, each webhook sender's secret, and each Gmail
    account's OAuth tokens and client secret. Unset variables and unreadable token
    files are skipped (the stages report them when they need them)."""
    import json
    import os
    from urllib.parse import urlsplit

    from .. import redact

    def env(var: object) -> None:
        if var:
            redact.register(os.environ.get(str(var), ""), str(var))

    t = settings.telegram
    if t is not None:
        env(t.token_env)
        env(t.webhook.secret_env)
    for model in settings.models.values():  # unused ones too: their keys are in the env
        env(model.api_key_env)
        with contextlib.suppress(ValueError):
            url = urlsplit(model.base_url or "")
            redact.register(url.password, f"models.{model.name}.base_url password")
            if url.password is None:  # then the user part is a token (https://TOKEN@proxy)
                redact.register(url.username, f"models.{model.name}.base_url user")
    for p in settings.pipelines:
        if isinstance(p.sender, WebhookSenderOptions):
            env(p.sender.secret_env)
    for imap in settings.imap_accounts.values():
        env(imap.password_env)
        env(imap.smtp.password_env if imap.smtp else None)
    # The store URL's password is not registered: it shows only inside that URL, which
    # scrub() hides anyway, and a weak one ("postgres") would garble every line.
    for name, account in settings.gmail_accounts.items():
        try:
            path = settings.resolve(os.path.expanduser(account.token_file))
            info = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError):
            continue
        redact.register_oauth(info, f"gmail {name}")
    from ..microsoft.auth import register_file

    for name, ms in settings.microsoft_accounts.items():
        register_file(settings.resolve(os.path.expanduser(ms.token_file)), f"microsoft {name}")
