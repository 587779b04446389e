"""A PipelineConfig built by hand from the YAML mappings a pipeline file would hold,
parsed as the loader parses them (:mod:`bot.config.options`); ConfigError on any problem."""

from __future__ import annotations

from pathlib import Path

from bot.config.load import Checker, PipelineConfig
from bot.config.options import ApprovalOptions, Context, parse_drafter, parse_filters, parse_stage
from bot.errors import ConfigError


def pipeline(*, source: dict, sender: dict, drafter: dict | None = None,
             filters: dict | None = None, file: str = "pipelines/support.yaml",
             gmail_accounts=(), base_dir: Path = Path("."), **kw) -> PipelineConfig:
    ck = Checker(file)
    ctx = Context("draftgate.yaml", gmail_accounts, kw.get("interval"), kw.get("cron"),
                  source.get("account"))
    p = PipelineConfig(
        file=file, source=parse_stage(ck, source, "source", ctx),
        sender=parse_stage(ck, sender, "sender", ctx),
        drafter=parse_drafter(ck, drafter or {}), filters=parse_filters(ck, filters or {}),
        approval=ApprovalOptions(), base_dir=base_dir,
        **{"name": "support", "schedule": "5m", "interval": 300.0, "cron": None,
           "recipe": "v1", **kw})
    if ck.errors:
        raise ConfigError(ck.errors)
    return p
