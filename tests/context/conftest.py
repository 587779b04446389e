"""Fixtures the context tests share: a fake LLM server and deployments closed at the end."""

from __future__ import annotations

import pytest

from tests.support.context_world import Deployment
from tests.support.fixtures import fake_llm as fake  # noqa: F401


@pytest.fixture
async def deployments(tmp_path):
    """``await deployments(...)`` opens a :class:`Deployment` in ``tmp_path``; every one
    made is closed after the test."""
    made: list[Deployment] = []

    async def make(*args, **kw) -> Deployment:
        d = await Deployment(tmp_path, *args, **kw).open()
        made.append(d)
        return d

    yield make
    for d in made:
        await d.close()
