"""``draftgate auth microsoft``: the device-code sign-in for a microsoft.accounts entry."""

from __future__ import annotations

import sys

from ..errors import AuthError, ConfigError
from ..gmail.auth import fail, report_grant


def add_cli(kinds, parents=()) -> None:
    """Register ``auth microsoft`` on the ``auth`` command's kinds."""
    m = kinds.add_parser(
        "microsoft", parents=list(parents),
        help="sign in to a Microsoft 365 / Outlook.com account (device code) and write its "
             "token file",
        description="Sign in to one microsoft.accounts entry with the device-code flow: it "
                    "prints a URL and a code to enter there from any browser (so it works "
                    "on a headless server), then writes the account's token_file (MSAL's "
                    "token cache, mode 0600), which draftgate refreshes in place. The scopes "
                    "are the ones the account's pipelines need: Mail.Read to read, "
                    "Mail.ReadWrite for microsoft_draft, Mail.ReadWrite and Mail.Send for "
                    "microsoft_reply (offline_access is always asked for).")
    m.add_argument("--account", required=True, metavar="NAME",
                   help="microsoft.accounts entry to sign in")
    m.add_argument("-c", "--config", default=None, metavar="FILE",
                   help="deployment file (default: draftgate.yaml)")
    m.add_argument("--token", metavar="FILE",
                   help="token file to write (default: the account's token_file)")
    m.set_defaults(func=run_cli)


def run_cli(args, out=None) -> int:
    from ..config.load import load_settings
    from ..microsoft.auth import device_flow, missing_scopes, required_scopes

    out = out or sys.stdout
    config = args.config or "draftgate.yaml"
    try:
        settings = load_settings(config)
    except ConfigError as exc:
        return fail(f"error: {exc}")
    account = settings.microsoft_accounts.get(args.account)
    if account is None:
        return fail(f"error: {config}: microsoft.accounts: no account {args.account!r}; known: "
                    f"{', '.join(sorted(settings.microsoft_accounts)) or 'none'}")
    token = args.token or str(settings.resolve(account.token_file))
    scopes = required_scopes(settings, args.account)
    print("Requesting scopes: " + ", ".join([*scopes, "offline_access"]), file=out)
    try:
        granted = device_flow(account, token, scopes, out)
    except AuthError as exc:
        return fail(f"error: {exc}", 1)
    except (ValueError, OSError) as exc:  # MSAL: the authority unreachable or refused
        from .. import redact

        return fail(f"error: the sign-in service at {account.authority} could not be used: "
                    f"{redact.scrub(str(exc))[:300]}", 1)
    return report_grant(token, missing_scopes(granted, scopes), out,
                        "ask an administrator to consent, or run this command again")
