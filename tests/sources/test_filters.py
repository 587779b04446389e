"""Pipeline filters: each rule, its default, and the reason a human reads."""

from __future__ import annotations

import pytest

from bot.config.load import Checker
from bot.config.options import FilterOptions, parse_filters
from bot.models import Message
from bot.sources.filters import skip_reason
from tests.support.configs import write_raw

OWN = ["support@shop.example"]
A_PIPELINE = ("name: a\nsource: {type: maildir, path: inbox}\n"
              "sender: {type: outbox, path: out, from: s@shop.example}\n")


def _msg(**kw) -> Message:
    base = dict(from_addr="alice@customer.example", reply_to="alice@customer.example",
                subject="Where is my order #1234?", body="Hi", size=400)
    base.update(kw)
    return Message(**base)


def _filters(raw: dict) -> FilterOptions:
    return parse_filters(Checker("pipelines/p.yaml"), raw)


# (case id, message fields, filters, expected reason or None)
CASES = [
    ("plain mail is drafted", {}, {"skip_senders": ["noreply@*"], "skip_mailing_lists": True,
                                   "max_body": "200kB", "skip_subjects": ["^\\[JIRA\\]"]}, None),
    ("noreply glob", {"from_addr": "noreply@shop.example", "reply_to": "noreply@shop.example"},
     {"skip_senders": ["noreply@*"]},
     "sender noreply@shop.example matches filters.skip_senders 'noreply@*'"),
    ("domain glob, any case", {"from_addr": "News@Mailer.Example", "reply_to": "News@Mailer.Example"},
     {"skip_senders": ["*@mailer.example"]},
     "sender news@mailer.example matches filters.skip_senders '*@mailer.example'"),
    ("glob does not match a lookalike", {"from_addr": "noreply-fan@x.example"},
     {"skip_senders": ["noreply@*"]}, None),
    ("List-Unsubscribe", {"headers": {"List-Unsubscribe": "<https://x/u>"}},
     {"skip_mailing_lists": True}, "mailing list (List-Unsubscribe header)"),
    ("List-Id", {"headers": {"List-Id": "<deals.x>"}},
     {"skip_mailing_lists": True}, "mailing list (List-Id header)"),
    ("Precedence bulk", {"headers": {"Precedence": "Bulk"}},
     {"skip_mailing_lists": True}, "mailing list (Precedence: bulk)"),
    ("lists allowed when off", {"headers": {"List-Unsubscribe": "<https://x/u>"}},
     {"skip_mailing_lists": False}, None),
    ("lists allowed by default", {"headers": {"List-Unsubscribe": "<https://x/u>"}}, {}, None),
    ("own address, by default", {"from_addr": "Support@Shop.example"}, {},
     "sent from our own address Support@Shop.example"),
    ("own address from filters.own_addresses", {"from_addr": "sales@shop.example"},
     {"own_addresses": ["sales@shop.example"]}, "sent from our own address sales@shop.example"),
    ("own address allowed when skip_own false", {"from_addr": "support@shop.example"},
     {"skip_own": False}, None),
    ("max_body exceeded", {"size": 300_001}, {"max_body": "200kB"},
     "body of 300001 bytes exceeds filters.max_body (200kB)"),
    ("max_body exactly at limit", {"size": 200_000}, {"max_body": "200kB"}, None),
    ("max_body as bare bytes", {"size": 2000}, {"max_body": 1000},
     "body of 2000 bytes exceeds filters.max_body (1kB)"),
    ("subject regex, any case", {"subject": "[jira] PROJ-1 updated"},
     {"skip_subjects": ["^\\[JIRA\\]"]}, "subject matches filters.skip_subjects '^\\\\[JIRA\\\\]'"),
    ("subject regex searched not matched whole", {"subject": "Re: invoice paid, thanks"},
     {"skip_subjects": ["invoice paid"]}, "subject matches filters.skip_subjects 'invoice paid'"),
    ("Auto-Submitted by default", {"headers": {"Auto-Submitted": "auto-replied"}}, {},
     "automatic message (Auto-Submitted: auto-replied)"),
    ("Auto-Submitted: no is a human", {"headers": {"Auto-Submitted": "no"}}, {}, None),
    ("X-Autoreply", {"headers": {"X-Autoreply": "yes"}}, {}, "automatic reply (X-Autoreply header)"),
    ("auto replies allowed when off", {"headers": {"X-Autoreply": "yes"}},
     {"skip_auto_replies": False}, None),
    ("slots are never filtered", {"kind": "slot", "from_addr": "", "reply_to": "", "size": 10**9},
     {"max_body": "1kB", "skip_senders": ["*"]}, None),
]


@pytest.mark.parametrize("fields,filters,expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_skip_reason(fields, filters, expected):
    assert skip_reason(_msg(**fields), _filters(filters), own_addresses=OWN) == expected


def test_own_address_wins_over_other_reasons():
    """The most important reason (a reply loop) is the one recorded."""
    m = _msg(from_addr="support@shop.example", headers={"List-Id": "x"})
    assert skip_reason(m, _filters({"skip_mailing_lists": True}), own_addresses=OWN).startswith("sent from our own")


@pytest.mark.parametrize("filters,expected", [
    ({"skip_subjects": ["(unclosed"]}, "pipelines/p.yaml: filters.skip_subjects[0]: not a valid regular expression"),
    ({"max_body": "lots"}, "pipelines/p.yaml: filters.max_body: expected a size like 200kB"),
    ({"skip_mailing_lists": "yes"}, "pipelines/p.yaml: filters.skip_mailing_lists: expected true or false"),
    ({"skip_senders": [3.5]}, "pipelines/p.yaml: filters.skip_senders[0]: expected a string"),
])
def test_check_options_names_file_and_path(filters, expected):
    ck = Checker("pipelines/p.yaml")
    parse_filters(ck, filters)
    assert len(ck.errors) == 1 and ck.errors[0].startswith(expected), ck.errors


def test_check_options_accepts_a_full_valid_set():
    ck = Checker("pipelines/p.yaml")
    parse_filters(ck, {"skip_senders": "noreply@*", "skip_mailing_lists": True, "skip_own": False,
                       "own_addresses": ["a@b.example"], "max_body": "200kB",
                       "skip_subjects": ["^x", "y$"], "skip_auto_replies": True})
    assert ck.errors == []


@pytest.mark.parametrize("key, fields, reason", [
    ("skip_own", {"from_addr": "support@shop.example"},
     "sent from our own address support@shop.example"),
    ("skip_auto_replies", {"headers": {"Auto-Submitted": "auto-replied"}},
     "automatic message (Auto-Submitted: auto-replied)"),
])
def test_a_switch_written_without_a_value_keeps_its_loop_protection(tmp_path, key, fields, reason):
    """`skip_own:` with nothing after it is null in YAML; it used to turn the protection
    off (filters.get(key, True) returned None)."""
    from bot.config.load import load_settings

    cfg = write_raw(tmp_path, {"a.yaml": A_PIPELINE + f"filters:\n  {key}:\n"},
                    "store: sqlite:///s.db\n")
    [p] = load_settings(cfg).pipelines
    assert p.filters == FilterOptions()
    assert skip_reason(_msg(**fields), p.filters, own_addresses=OWN) == reason


@pytest.mark.parametrize("size", [0, "0kB", -5])
def test_a_max_body_of_nothing_is_refused(tmp_path, capsys, size):
    from bot.__main__ import main

    cfg = write_raw(tmp_path, {"a.yaml": A_PIPELINE + f"filters: {{max_body: {size}}}\n"},
                    "store: sqlite:///s.db\n")
    assert main(["validate", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "pipelines/a.yaml: filters.max_body: expected a size of at least 1 byte like 200kB" in err
