"""The demo deployment (demo/ and pipelines/demo.yaml of the repository) run once."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def demo_deployment(tmp_path: Path, store: str = "sqlite:///state.db") -> Path:
    """A copy of the demo in ``tmp_path`` on ``store``; returns its config path."""
    shutil.copytree(ROOT / "demo", tmp_path / "demo")
    (tmp_path / "pipelines").mkdir()
    shutil.copy(ROOT / "pipelines" / "demo.yaml", tmp_path / "pipelines" / "demo.yaml")
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text(f"store: {store}\npipelines: pipelines/*.yaml\n")
    return cfg


async def flow_demo(cfg: Path) -> None:
    """One tick of the demo pipeline with every draft approved on the console."""
    from bot.approvals.console import ConsoleChannel
    from bot.config.load import load_settings
    from bot.store import create_store
    from tests.support.desk import started

    settings = load_settings(cfg)
    async with create_store(settings.store) as store:
        engine = (await started(settings, store, {"console": ConsoleChannel(
            auto_approve=True, out=io.StringIO())})).engine
        await engine.tick("demo")
        await engine.stop()
