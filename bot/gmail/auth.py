"""OAuth for Gmail accounts: the token file, the scopes the pipelines need, and the
``draftgate auth gmail`` command.

The token file is what google-auth's ``Credentials.to_json()`` writes (access token,
refresh token, client id/secret, token_uri, scopes, expiry). It is a secret: it is
written with mode 0600 through a temporary file and an atomic rename, both when the
installed-app flow creates it and when a refresh updates it in place, and its
contents are never logged.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import redact
from ..errors import AuthError, ConfigError

SCOPE_READONLY = "https://www.googleapis.com/auth/gmail.readonly"
SCOPE_SEND = "https://www.googleapis.com/auth/gmail.send"
SCOPE_COMPOSE = "https://www.googleapis.com/auth/gmail.compose"
SCOPE_MODIFY = "https://www.googleapis.com/auth/gmail.modify"
SCOPE_FULL = "https://mail.google.com/"
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"

# What each scope is good for, as far as draftgate's calls go (from gmail.v1.json):
# modify allows every call we make; compose covers drafts.* and getProfile.
_COVERS = {
    SCOPE_FULL: {SCOPE_READONLY, SCOPE_SEND, SCOPE_COMPOSE, SCOPE_MODIFY},
    SCOPE_MODIFY: {SCOPE_READONLY, SCOPE_SEND, SCOPE_COMPOSE},
    SCOPE_COMPOSE: {SCOPE_SEND},
}


def auth_command(account: str, token_file: str | os.PathLike | None = None,
                 config_file: str | os.PathLike | None = None) -> str:
    """The exact command that (re)authorises ``account``: with ``-c`` naming the
    deployment file (its pipelines decide the scopes) and the token file as the running
    draftgate resolved it, so it works from any directory."""
    token = str(token_file or f"secrets/{account}-token.json")
    config = f" -c {shlex.quote(str(config_file))}" if config_file else ""
    return (f"draftgate auth gmail --account {account}{config} --client-secrets "
            f"client_secret.json --token {shlex.quote(token)}")


def auth_error(account: str, token_file: str | os.PathLike | None,
               what: str = "token expired or revoked",
               config_file: str | os.PathLike | None = None) -> AuthError:
    """The one message a user sees for a dead token: what happened and what to run."""
    command = auth_command(account, token_file, config_file)
    return AuthError(f"Gmail account {account!r}: {what}; run `{command}`")


def required_scopes(settings: Any, account: str) -> list[str]:
    """The smallest set of OAuth scopes the configured pipelines need for ``account``:
    gmail.readonly for a source (and for the ``rfc822msgid:`` check after an unknown
    send), gmail.send for ``gmail_reply``, gmail.compose for ``gmail_draft``, and
    gmail.modify (which covers the others we use) only when a sender marks the original
    read or labels it."""
    need: set[str] = set()
    for p in getattr(settings, "pipelines", []):
        source, sender = p.source, p.sender
        if getattr(source, "type", None) == "gmail" and source.account == account:
            need.add(SCOPE_READONLY)
        stype = getattr(sender, "type", None)
        if stype in ("gmail_reply", "gmail_draft") and sender.account == account:
            if sender.mark_read or sender.label:
                need.add(SCOPE_MODIFY)
            if stype == "gmail_reply":
                need.update({SCOPE_SEND, SCOPE_READONLY})
            else:
                need.add(SCOPE_COMPOSE)
    if SCOPE_MODIFY in need:
        need -= _COVERS[SCOPE_MODIFY]
    if SCOPE_COMPOSE in need:
        need.discard(SCOPE_SEND)
    return sorted(need)


def missing_scopes(granted: list[str] | set[str], required: list[str]) -> list[str]:
    """Required scopes that the granted ones do not cover."""
    have = set(granted)
    for scope in list(have):
        have |= _COVERS.get(scope, set())
    return [s for s in required if s not in have]


# -- token file ---------------------------------------------------------------------------


def write_token(path: str | os.PathLike, data: str) -> None:
    """Write ``data`` to ``path`` with mode 0600, atomically: a reader sees the old or the
    new token, never half of one, and the secret never exists with wider permissions."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def token_path_problem(path: str | os.PathLike) -> str | None:
    """Why ``write_token(path, ...)`` would fail, or None: the path is a folder, or
    its folder is not one, or cannot be created or written in. Probed with a real
    temporary file (permission bits alone do not tell, e.g. for root or a read-only
    mount), which is removed at once; no folder is created."""
    path = Path(path)
    if path.is_dir():
        return f"is a folder; name the token file, e.g. {path / 'token.json'}"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the nearest folder that exists: write_token creates the rest
    if not folder.is_dir():
        return f"{folder} is not a folder, so the token file cannot be created under it"
    try:
        fd, probe = tempfile.mkstemp(prefix=".draftgate-probe.", dir=folder)
    except OSError as exc:
        return f"cannot write in {folder} ({exc.strerror or exc}); choose a folder you can write to"
    os.close(fd)
    os.unlink(probe)
    return None


def load_credentials(path: str | os.PathLike, account: str,
                     config_file: str | os.PathLike | None = None):
    """google.oauth2 Credentials from a token file written by ``draftgate auth gmail``.
    Raises AuthError (naming the command to run) when it is missing or unusable."""
    from google.oauth2.credentials import Credentials

    path = Path(path)
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise auth_error(account, path, f"token file {path} not found", config_file) from None
    except (OSError, ValueError) as exc:
        raise auth_error(account, path, f"token file {path} is unreadable "
                                        f"({type(exc).__name__})", config_file) from None
    redact.register_oauth(info, f"gmail {account}")  # hidden in every log line and error
    if not isinstance(info, dict) or not (info.get("token") or info.get("refresh_token")):
        raise auth_error(account, path, f"token file {path} holds no token", config_file)
    expiry = info.get("expiry")
    if expiry:
        try:
            expiry = datetime.strptime(expiry.rstrip("Z").split(".")[0], "%Y-%m-%dT%H:%M:%S")
        except ValueError:
            expiry = None
    scopes = info.get("scopes")
    if isinstance(scopes, str):
        scopes = scopes.split()
    # Built directly rather than with from_authorized_user_info, which always replaces
    # token_uri with Google's: the file's own token_uri is kept (tests, private setups).
    return Credentials(
        token=info.get("token"), refresh_token=info.get("refresh_token"),
        token_uri=info.get("token_uri") or GOOGLE_TOKEN_URI,
        client_id=info.get("client_id"), client_secret=info.get("client_secret"),
        scopes=scopes, expiry=expiry, universe_domain=info.get("universe_domain"),
        account=info.get("account", ""),
    )


def granted_scopes(path: str | os.PathLike) -> list[str]:
    """Scopes recorded in the token file (what the user granted at consent)."""
    try:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    scopes = info.get("scopes") or []
    return scopes.split() if isinstance(scopes, str) else list(scopes)


# -- CLI ------------------------------------------------------------------------------------


def add_cli(subparsers, parents=()):
    """Register ``auth gmail`` (and the ``parents``' options) on the CLI's subparsers;
    returns the ``auth`` kinds, for the other providers' ``auth`` commands."""
    auth = subparsers.add_parser("auth", help="authorise access to a mail account",
                                 description="Authorise draftgate to use a mail account.")
    kinds = auth.add_subparsers(dest="auth_kind", metavar="KIND", required=True)
    g = kinds.add_parser(
        "gmail", parents=list(parents),
        help="run Google's installed-app OAuth flow and write a token file",
        description="Run Google's installed-app OAuth flow for one Gmail account and write "
                    "the token file (mode 0600) that gmail.accounts.NAME.token_file names. "
                    "Recommended: draftgate auth gmail -c draftgate.yaml --account NAME "
                    "--client-secrets client_secret.json, which asks for the scopes that "
                    "account's pipelines need and writes token_file where draftgate looks "
                    "for it (relative to the deployment file's folder), from any directory.")
    g.add_argument("--client-secrets", required=True, metavar="FILE",
                   help="OAuth client JSON (type 'Desktop app') downloaded from Google Cloud")
    g.add_argument("--token", metavar="FILE",
                   help="token file to write (default: the account's token_file, resolved "
                        "against the deployment file's folder; a path given here is relative "
                        "to the current directory)")
    g.add_argument("--account", metavar="NAME",
                   help="gmail.accounts entry; its pipelines decide the scopes requested")
    g.add_argument("--no-browser", action="store_true",
                   help="print the URL instead of opening a browser. Google still sends the "
                        "browser back to http://localhost:PORT, which must reach this machine: "
                        "on a headless server first run `ssh -L PORT:localhost:PORT server` "
                        "on the computer whose browser opens the URL")
    g.add_argument("--port", type=int, default=8080,
                   help="local port for Google's redirect (default 8080; 0 picks a free one)")
    g.add_argument("--scopes", nargs="+", metavar="SCOPE",
                   help="scopes to request instead of the ones the pipelines need "
                        "(short names readonly, send, compose, modify are accepted)")
    g.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for the browser to come back (default 600)")
    g.add_argument("-c", "--config", default=None, metavar="FILE",
                   help="deployment file, to find the account's token_file and the scopes "
                        "its pipelines need (default: draftgate.yaml; required with "
                        "--account unless --scopes and --token are given)")
    g.set_defaults(func=run_cli)
    return kinds


_SHORT = {"readonly": SCOPE_READONLY, "send": SCOPE_SEND, "compose": SCOPE_COMPOSE,
          "modify": SCOPE_MODIFY, "full": SCOPE_FULL}


def _scopes_for(args, out) -> tuple[list[str], str | None]:
    if args.scopes:
        return [_SHORT.get(s, s) for s in args.scopes], args.token
    token = args.token
    config = getattr(args, "config", None) or "draftgate.yaml"
    if args.account:
        # The account's pipelines decide the scopes: never guess them when the
        # deployment file cannot be read (a token without gmail.modify or
        # gmail.compose would fail later, at the first send).
        from ..config.load import load_settings

        try:
            settings = load_settings(config)
        except ConfigError as exc:
            raise ConfigError([
                f"--account {args.account}: cannot load the deployment file {config}, "
                f"which decides the scopes to request; pass -c FILE (or name them with "
                f"--scopes and the token file with --token)", *exc.errors]) from None
        acc = settings.gmail_accounts.get(args.account)
        if acc is None:
            raise ConfigError(f"{config}: gmail.accounts: no account {args.account!r}; "
                              f"known: {', '.join(sorted(settings.gmail_accounts)) or 'none'}")
        if token is None:
            token = str(settings.resolve(acc.token_file))
        scopes = required_scopes(settings, args.account)
        if scopes:
            return scopes, token
        print(f"no pipeline uses account {args.account!r}; requesting read and send", file=out)
    return [SCOPE_READONLY, SCOPE_SEND], token


def run_cli(args, out=None) -> int:
    """``draftgate auth gmail``: run the installed-app flow, write the token file 0600."""
    out = out or sys.stdout
    try:
        scopes, token = _scopes_for(args, out)
    except ConfigError as exc:
        return fail(f"error: {exc}")
    if not token:
        return fail("error: --token FILE is required (or --account NAME with a config that "
                    "names its token_file)")
    # Before the browser: a consent given for a token that cannot be saved is wasted.
    problem = token_path_problem(token)
    if problem:
        return fail(f"error: --token {token}: {problem}")
    flow = _flow(args.client_secrets, scopes)
    if isinstance(flow, int):
        return flow
    # oauthlib logs the token request's body (with the client secret) at DEBUG.
    redact.register_oauth(flow.client_config, "OAuth client")
    print("Requesting scopes: " + ", ".join(s.rsplit("/", 1)[-1] for s in scopes), file=out)
    prompt = ("Open this URL in a browser and approve access:\n{url}\n"
              if args.no_browser else "Your browser should open; if it does not, visit:\n{url}\n")
    # Google's consent screen lets the user untick scopes; oauthlib would then raise
    # "Scope has changed". Accept the partial grant and say exactly what is missing.
    os.environ.setdefault("OAUTHLIB_RELAX_TOKEN_SCOPE", "1")
    try:
        creds = flow.run_local_server(
            port=args.port, open_browser=not args.no_browser,
            authorization_prompt_message=prompt, timeout_seconds=args.timeout,
            success_message="draftgate is authorised; you can close this tab.")
    except Exception as exc:  # oauthlib/requests errors: show the kind, never a token
        return fail(f"error: authorisation failed: {type(exc).__name__}: "
                    f"{redact.scrub(str(exc))}", 1)
    if creds is None or not getattr(creds, "refresh_token", None):
        return fail("error: Google returned no refresh token; remove draftgate's access at "
                    "https://myaccount.google.com/permissions and run this command again", 1)
    granted = getattr(creds, "granted_scopes", None) or scopes
    if isinstance(granted, str):
        granted = granted.split()
    data = json.loads(creds.to_json())
    data["scopes"] = list(granted)  # what was granted, so doctor can compare
    try:
        write_token(token, json.dumps(data))
    except OSError as exc:  # checked before the flow; the folder changed since
        return fail(f"error: the token could not be written to {token}: "
                    f"{exc.strerror or exc}; nothing was saved. Fix the folder and run this "
                    f"command again", 1)
    return report_grant(token, missing_scopes(granted, scopes), out,
                        "run this command again and leave every requested permission ticked")


def _flow(client_secrets: str, scopes: list[str]):
    """The installed-app flow for the OAuth client file, or the exit code (explained)."""
    from google_auth_oauthlib.flow import InstalledAppFlow

    download = ("download the OAuth client (Desktop app) JSON from Google Cloud Console > "
                "APIs & Services > Credentials")
    try:
        return InstalledAppFlow.from_client_secrets_file(client_secrets, scopes=scopes)
    except FileNotFoundError:
        return fail(f"error: client secrets file {client_secrets} not found; {download}")
    except IsADirectoryError:
        return fail(f"error: --client-secrets {client_secrets} is a folder; name the JSON "
                    f"file in it (client_secret_....json)")
    except OSError as exc:
        return fail(f"error: cannot read the client secrets file {client_secrets}: "
                    f"{exc.strerror or exc}")
    except (ValueError, AttributeError, TypeError, KeyError) as exc:
        # JSON that is not {"installed": {...}} reaches the library's own code as an
        # AttributeError or TypeError; the message is the same as for its ValueErrors.
        detail = str(exc) if isinstance(exc, ValueError) else "expected {\"installed\": " \
            "{\"client_id\": ..., \"client_secret\": ..., ...}}"
        return fail(f"error: {client_secrets} is not an OAuth client secrets file: {detail}; "
                    f"{download}")


def report_grant(token: str, missing: list[str], out: Any, hint: str) -> int:
    """The end of an ``auth`` command (Google's or Microsoft's): say where the token was
    written; exit 1 naming the ``missing`` scopes (``hint``: what to do), else 0."""
    print(f"Token written to {token} (mode 0600).", file=out)
    if missing:
        return fail("error: access was granted without " + ", ".join(missing) + "; " + hint, 1)
    return 0


def fail(message: str, code: int = 2) -> int:
    """An ``auth`` command's error: ``message`` on stderr, and its exit ``code``."""
    print(message, file=sys.stderr)
    return code
