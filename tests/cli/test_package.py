"""The wheel is complete: built, installed into a fresh venv outside the checkout, it
answers --version and runs the demo from an empty folder with its own data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bot.cli.common import version
from tests._proc import ROOT

pytestmark = pytest.mark.slow
#: What a wheel is built from (a copy, so no build/ folder of the checkout is reused).
SOURCES = ["bot", "demo", "pipelines", "prompts", "pyproject.toml", "setup.py", "MANIFEST.in",
           "README.md", "draftgate.demo.yaml", "draftgate.example.yaml"]


def _run(*cmd: str | Path, cwd: Path) -> str:
    # No PYTHONPATH and no checkout on the path: only the venv's own files are found.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{cmd}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_installed_in_a_fresh_venv_runs_the_demo_from_an_empty_folder(tmp_path):
    """--version and `draftgate demo` work from an empty folder outside the checkout,
    with the package, its demo inbox and templates all from the wheel."""
    src = tmp_path / "src"
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(
            ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                         if (ROOT / name).is_dir() else {}))
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", tmp_path / "dist", src, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("draftgate-*.whl"))

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
         "--no-index", wheel, cwd=tmp_path)
    # The dependencies (not draftgate) come from the test environment's site-packages:
    # a path in a .pth file, whose own .pth files (draftgate's editable hook) stay unread.
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                     cwd=tmp_path).strip())
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(python, "-c", "import bot; print(bot.__file__)", cwd=empty).startswith(str(site))
    assert _run(venv / "bin" / "draftgate", "--version", cwd=empty).strip() == f"draftgate {version()}"
    out = _run(venv / "bin" / "draftgate", "demo", cwd=empty)
    copied = empty / "draftgate-demo"
    assert f"copied the demo and the example pipelines to {copied}" in out
    assert "sent 5" in out, out
    assert len(list((copied / "var" / "demo" / "outbox").glob("*.eml"))) == 5
    assert (copied / "pipelines" / "examples" / "support.yaml").is_file()
    assert (copied / "prompts" / "support.md").is_file()
    # Run again in the same folder: the copy is reused, nothing is sent twice.
    again = _run(venv / "bin" / "draftgate", "demo", cwd=empty)
    assert "copied" not in again and "sent 0" in again
    assert len(list((copied / "var" / "demo" / "outbox").glob("*.eml"))) == 5
