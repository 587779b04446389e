"""A short chaos soak in the suite (scripts/chaos runs long ones): real `draftgate run`
processes SIGKILLed and restarted while mail arrives, the fake model and Gmail fail at
random and simulated operators tap every button and replay what failed.

What an operator would notice if it broke: a customer answered twice, a mail that
nothing shows any more, a reply nobody approved, a stranger's tap that counted, or the
bot dying by itself.

Kills also cut sends in flight: a send cut off by SIGKILL must be checked and finished
(sent, failed, or unknown with the operator told) within 30 s of the kill.
"""

from __future__ import annotations

import pytest

from tests._chaos import ChaosOptions, run_chaos
from tests._pg import new_schema_name, require_pg_dsn, with_schema

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _options(tmp_path, **kw) -> ChaosOptions:
    return ChaosOptions(mails=20, seconds=40, seed=7, kill_every=8, kill_sends=True,
                        max_crash_recovery=30, drain=120, workdir=tmp_path,
                        say=print, **kw)


def _check(report) -> None:
    print("\n".join(report.lines()))
    assert report.failures == [], "\n".join(report.lines())
    # The soak did what it says: mail came, hosts were killed, faults were injected,
    # operators acted, and every mail was answered at most once.
    assert report.mails == 20 and report.kills >= 1 and report.faults
    assert report.taps >= 20 and report.replies_max <= 1
    assert report.send_posts >= report.sends_accepted > 0


async def test_chaos_sqlite_one_host(tmp_path):
    _check(await run_chaos(_options(tmp_path)))


@pytest.mark.postgres
async def test_chaos_postgres_two_hosts(tmp_path):
    dsn = await require_pg_dsn()  # skips without a server; fails under DRAFTGATE_REQUIRE_PG=1
    url = with_schema(dsn, new_schema_name("dg_chaos"))  # the soak adds a suffix, drops it
    _check(await run_chaos(_options(tmp_path, store=url, hosts=2)))
