"""Ships the demo and the examples inside the package (pyproject.toml has the rest).

The demo deployment, its inbox and template, the example pipelines and the prompts
live at the top of the checkout, where ./scripts/demo, the tests and the README use
them. A wheel copies them into ``bot/_bundled/``, so that `pip install .` (or pipx)
then `draftgate demo` works in any folder (bot.cli.demo copies them out of there).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUNDLED = ["draftgate.demo.yaml", "draftgate.example.yaml", "pipelines", "demo", "prompts"]


class BuildWithBundle(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads them from the checkout
            return
        target = Path(self.build_lib) / "bot" / "_bundled"
        for name in BUNDLED:
            source = Path(name)
            if source.is_dir():
                shutil.copytree(source, target / name, dirs_exist_ok=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)


setup(cmdclass={"build_py": BuildWithBundle})
