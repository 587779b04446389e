"""The fixture the Microsoft tests share: ``fake``, the fake Graph and identity platform
(tests/fakes/microsoft.py) serving from ``tmp_path / "fake"``."""

from __future__ import annotations

import pytest

from tests.fakes.microsoft import FakeGraph


@pytest.fixture
def fake(tmp_path):
    (tmp_path / "fake").mkdir()
    f = FakeGraph(tmp_path / "fake").start()
    yield f
    f.stop()
