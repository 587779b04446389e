"""Another configuration of a pipeline, for ``draftgate eval --with FILE.yaml``: a pipeline
file like those in ``pipelines/`` (another prompt, model, triage or context options),
read with the deployment's ``models:`` and accounts and checked as strictly, never run."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from .checker import Checker
from .files import load_yaml
from .load import PipelineConfig, Settings, parse_pipeline
from .mailbox import Accounts


def load_variant(settings: Settings, file: str | os.PathLike) -> PipelineConfig:
    """The pipeline in ``file`` (paths in it relative to the deployment's folder, as in
    any pipeline file). Raises ConfigError listing every problem."""
    path = Path(file)
    if not path.is_file():
        raise ConfigError(f"--with: {file}: no such file; give a pipeline file (the format "
                          f"of pipelines/*.yaml) with the configuration to compare")
    errors: list[str] = []
    ck = Checker(str(file), errors)
    accounts = Accounts(settings.imap_accounts)
    accounts.names = set(settings.imap_accounts)
    p = parse_pipeline(ck, load_yaml(path, ck), settings, settings.base_dir,
                       (accounts, settings.microsoft_accounts))
    if errors or p is None:
        raise ConfigError(errors or [f"{file}: not a pipeline file"])
    return p
