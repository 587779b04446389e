"""Shared test helpers (moved from test_gmail_auth.py, which other tests imported)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from bot.gmail import auth

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is in tests/support)


def _run_flow(fake, secrets, token, *options: str):
    env = dict(os.environ, OAUTHLIB_INSECURE_TRANSPORT="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot", *options, "auth", "gmail", "--client-secrets",
         str(secrets), "--token", str(token), "--no-browser", "--port", "0",
         "--scopes", "readonly", "send", "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        cwd=token.parent)
    try:
        url = None
        for line in proc.stdout:
            if line.startswith(fake.url + "auth"):
                url = line.strip()
                break
        assert url, proc.stderr.read()
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
        assert query["scope"] == [f"{auth.SCOPE_READONLY} {auth.SCOPE_SEND}"]
        redirect = query["redirect_uri"][0] + "?" + urllib.parse.urlencode(
            {"code": "the-code", "state": query["state"][0], "scope": query["scope"][0]})
        with urllib.request.urlopen(redirect, timeout=10) as resp:
            assert resp.status == 200
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


