"""Makes a benchmark script run inside the project's .venv, whatever python started it.

``./scripts/bench_store`` starts with the system python3 (its shebang); this re-runs
it with ``.venv/bin/python``, creating the environment first (scripts/_env) if needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ensure() -> None:
    venv = ROOT / ".venv"
    if Path(sys.prefix).resolve() == venv.resolve():
        return
    python = venv / "bin" / "python"
    stamp = venv / ".draftgate-installed"
    if not stamp.exists():
        subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/_env"'], check=True)
    os.execv(str(python), [str(python), sys.argv[0], *sys.argv[1:]])
