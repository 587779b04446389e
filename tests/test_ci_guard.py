"""In CI nothing that needs PostgreSQL or Dovecot can pass by skipping.

``CI=true`` (GitHub Actions, GitLab CI and most CI services set it) makes a missing
``DRAFTGATE_TEST_PG_DSN`` or Dovecot a failure, as ``DRAFTGATE_REQUIRE_PG=1`` does:
a CI job that forgot the database would otherwise be green with the PostgreSQL
tests skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests._proc import ROOT

pytestmark = pytest.mark.slow

PG_TEST = "tests/store/test_store_contract.py::TestStoreContract::test_items_seen_before_are_not_queued_again[postgres]"


def _pytest(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("CI", "DRAFTGATE_REQUIRE_PG", "DRAFTGATE_TEST_PG_DSN")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs", *args],
        cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=300)


def test_ci_true_fails_a_postgres_test_without_a_server_instead_of_skipping():
    outside = _pytest({}, PG_TEST)
    assert outside.returncode == 0 and "1 skipped" in outside.stdout, outside.stdout
    ci = _pytest({"CI": "true"}, PG_TEST)
    assert ci.returncode == 1 and "1 error" in ci.stdout and "skipped" not in ci.stdout, \
        ci.stdout
    assert "CI=true but PostgreSQL tests need DRAFTGATE_TEST_PG_DSN" in ci.stdout


def test_ci_true_fails_the_imap_tests_without_dovecot_instead_of_skipping(tmp_path):
    """Dovecot out of reach (PATH without it, and its helper path checked as well):
    under CI=true the IMAP test fails, naming the install line."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import shutil\n"
        "from tests import _dovecot\n\n"
        "def test_probe(monkeypatch):\n"
        "    monkeypatch.setattr(shutil, 'which', lambda name: None)\n"
        "    monkeypatch.setattr(_dovecot.os.path, 'exists', lambda p: False)\n"
        "    _dovecot.require_dovecot()\n")
    outside = _pytest({}, str(probe), "--rootdir", str(ROOT))
    assert outside.returncode == 0 and "1 skipped" in outside.stdout, outside.stdout
    ci = _pytest({"CI": "true"}, str(probe), "--rootdir", str(ROOT))
    assert ci.returncode == 1 and "CI=true but the IMAP tests need a real Dovecot" in ci.stdout, \
        ci.stdout
