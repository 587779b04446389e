"""Every benchmark and evaluation script in scripts/ still starts: its imports of
``bot`` hold and it answers ``--help`` (a script that broke with a rename would
otherwise be found only when someone needs its figures)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "scripts").iterdir()
                 if p.is_file() and not p.name.startswith("_")
                 and p.read_text(errors="replace").startswith("#!/usr/bin/env python"))


def test_the_python_scripts_are_found():
    names = {p.name for p in SCRIPTS}
    assert {"bench_engine", "bench_store", "bench_telegram", "eval_retrieval",
            "eval_grounding", "chaos"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_answers_help(script):
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: {script.name}"), done.stdout[:500]
