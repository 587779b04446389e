"""One Gmail account: credentials, the API service, and the two ways to call it.

* ``read(...)``: idempotent calls (list, get, history, profile). Bounded retries with
  backoff on 5xx and connection errors; 429 and quota 403 wait for Retry-After when it
  is short, a rate limit without Retry-After (429, ``rateLimitExceeded``,
  ``userRateLimitExceeded``) backs off exponentially within ``read_attempts``, else
  :class:`RateLimited` is raised so the run records why. A ``cancel`` event stops the
  retries of a call whose result is no longer wanted.
* ``write_once(...)``: messages.send and drafts.create. Issued exactly once: no
  googleapiclient retry (``num_retries=0``) and a transport of our own
  (:class:`~.transport.SingleShotHttp`) instead of httplib2's, which silently re-sends
  the POST when the connection drops before the answer. Failures are classified
  as certainly-not-sent (:class:`NotSent`) or maybe-sent (:class:`MaybeSent`).

googleapiclient is synchronous and httplib2 is not thread-safe, so every call runs in
this client's own small thread pool (never on the event loop), and every thread gets its
own ``Http`` through ``requestBuilder``. The pool is per account so a slow Gmail never
starves other pipelines or the default executor.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import os
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import httplib2

from .. import redact
from ..config.gmail import GmailAccount
from ..errors import AuthError
from ..service import metrics
from . import auth
from .batch import (
    MAX_PARTS,
    WrongResource,
    as_asked,
    batch_uri,
    build_requests,
    run_batch,
    status_of,
)
from .errors import (
    BACKOFF_REASONS,
    QUOTA_REASONS,
    Cancelled,
    GmailError,
    MaybeSent,
    NotFound,
    NotSent,
    RateLimited,
    error_info,
    reason,
)
from .resource import CachedResource, unused_http
from .transport import ConnectFailed, SingleShotHttp

log = logging.getLogger("draftgate.gmail")

DEFAULT_ENDPOINT = "https://gmail.googleapis.com/"
def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


class GmailClient:
    """Credentials and service for one configured account (``gmail.accounts.NAME``)."""

    def __init__(self, name: str, account: GmailAccount, *, base_dir: Path | str = ".",
                 timeout: float = 30.0, workers: int = 8, read_attempts: int = 3,
                 backoff: float = 0.5, max_wait: float = 20.0,
                 config_file: str | Path | None = None):
        self.name = name
        token_file = Path(os.path.expanduser(account.token_file))
        self.token_file = (Path(base_dir) / token_file).absolute()
        self.config_file = config_file  # named in the re-authorise command
        self.api_endpoint = account.api_endpoint or DEFAULT_ENDPOINT
        # Reads go through Gmail's batch endpoint, which belongs to the API endpoint
        # (googleapiclient would take Google's from the discovery document).
        self.batch_endpoint = account.batch_endpoint or batch_uri(self.api_endpoint)
        self.address = account.address
        # Optional per-account knobs (tests shorten them; the defaults suit Gmail).
        self.timeout = float(_or(account.timeout, timeout))
        self.read_attempts = max(1, int(_or(account.read_attempts, read_attempts)))
        self.backoff = float(_or(account.backoff, backoff))
        # Longest Retry-After slept through inside one call; a longer one fails the
        # run with the reason and the source waits it out across ticks.
        self.max_wait = float(_or(account.max_wait, max_wait))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"gmail-{name}")
        self._creds = None
        self._saved_token: str | None = None
        self._loaded_stamp: tuple[int, int, int] | None = None  # token file as loaded
        self._service = None
        self._lock = threading.Lock()  # credentials refresh, token file, service build
        self._local = threading.local()
        self._count_lock = threading.Lock()
        self.calls = 0  # HTTP requests made to the Gmail API (retries included)
        self._closed = False
        self._https: list[httplib2.Http] = []  # closed at close(): no leaked sockets

    # -- async entry points ---------------------------------------------------------------
    async def run(self, fn: Callable, *args) -> Any:
        """Run ``fn(*args)`` in this account's thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def aread(self, make: Callable[[Any], Any], what: str) -> dict:
        return await self.run(self.read, make, what)

    async def awrite_once(self, make: Callable[[Any], Any], what: str) -> dict:
        return await self.run(self.write_once, make, what)

    def close(self) -> None:
        """Wait for calls in flight, then close every connection (blocking)."""
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            https, self._https = self._https, []
        for conn in https:
            conn.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def _new_http(self, cls=httplib2.Http) -> httplib2.Http:
        http = cls(timeout=self.timeout)
        with self._lock:
            self._https.append(http)
        return http

    # -- credentials and service -----------------------------------------------------------
    def _auth_error(self, what: str = "token expired or revoked") -> AuthError:
        return auth.auth_error(self.name, self.token_file, what, self.config_file)

    def credentials(self):
        """Fresh credentials (refreshed and saved 0600 in place when expired)."""
        import google_auth_httplib2
        from google.auth.exceptions import RefreshError, TransportError

        with self._lock:
            stamp = self._file_stamp()
            # Read again when the file changed on disk: `draftgate auth gmail` after a
            # revoked token takes effect without a restart.
            if self._creds is None or (stamp is not None and stamp != self._loaded_stamp):
                self._creds = auth.load_credentials(self.token_file, self.name, self.config_file)
                self._saved_token = self._creds.token
                self._loaded_stamp = stamp
            creds = self._creds
            if creds.valid:
                return creds
            if not creds.refresh_token:
                raise self._auth_error("access token expired and the file has no refresh token")
            try:
                http = httplib2.Http(timeout=self.timeout)
                try:
                    creds.refresh(google_auth_httplib2.Request(http))
                finally:
                    http.close()
            except RefreshError:
                raise self._auth_error() from None
            except (TransportError, OSError, httplib2.HttpLib2Error) as exc:
                raise GmailError(f"Gmail account {self.name!r}: cannot refresh the access "
                                 f"token: {type(exc).__name__}") from None
            self._save_locked()
            return creds

    def _save_locked(self) -> None:
        if self._creds is not None and self._creds.token != self._saved_token:
            redact.register(self._creds.token, f"gmail {self.name} token")  # a new one
            auth.write_token(self.token_file, self._creds.to_json())
            self._saved_token = self._creds.token
            self._loaded_stamp = self._file_stamp()
            log.info("gmail %s: access token refreshed; token file updated", self.name)

    def _save_if_refreshed(self) -> None:
        # AuthorizedHttp refreshes on its own after a 401; keep the file in step.
        if self._creds is not None and self._creds.token != self._saved_token:
            with self._lock:
                self._save_locked()

    def _authorized(self, http: SingleShotHttp):
        import google_auth_httplib2

        return google_auth_httplib2.AuthorizedHttp(self.credentials(), http=http)

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.token_file)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _thread_http(self):
        import google_auth_httplib2

        creds = self.credentials()
        http = getattr(self._local, "http", None)
        if http is None or http.credentials is not creds:  # new, or the file was reloaded
            if http is not None:
                http.http.close()
            http = self._local.http = google_auth_httplib2.AuthorizedHttp(
                creds, http=self._new_http())
        return http

    def _drop_thread_http(self) -> None:
        http = getattr(self._local, "http", None)
        self._local.http = None
        if http is not None:
            http.http.close()

    def _request_builder(self, http, *args, **kwargs):
        from googleapiclient.http import HttpRequest

        # One Http per thread: httplib2 connections must not be shared across threads.
        return HttpRequest(self._thread_http(), *args, **kwargs)

    def service(self):
        """The gmail v1 service, built once from the discovery document shipped with
        googleapiclient (no network)."""
        creds = self.credentials()
        with self._lock:
            if self._service is None:
                import google_auth_httplib2
                from googleapiclient.discovery import build

                self._service = CachedResource(build(
                    "gmail", "v1", static_discovery=True,
                    client_options={"api_endpoint": self.api_endpoint},
                    http=google_auth_httplib2.AuthorizedHttp(creds, http=unused_http()),
                    requestBuilder=self._request_builder))
            return self._service

    def _count(self, n: int = 1) -> None:
        with self._count_lock:
            self.calls += n

    # -- calls -------------------------------------------------------------------------------
    def read(self, make: Callable[[Any], Any], what: str,
             cancel: threading.Event | None = None) -> dict:
        """Execute an idempotent request built by ``make(service)``, with bounded retries.
        Once ``cancel`` is set no further attempt starts (:class:`Cancelled`)."""
        from google.auth.exceptions import RefreshError
        from googleapiclient.errors import HttpError

        def pause(seconds: float) -> None:
            if cancel is None:
                time.sleep(seconds)
            else:
                cancel.wait(seconds)

        last = ""
        for attempt in range(1, self.read_attempts + 1):
            if self._closed:
                raise GmailError(f"Gmail account {self.name!r}: client closed")
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"Gmail {what}: not {'retried' if last else 'started'}; "
                                f"the tick is ending")
            request = make(self.service())
            metrics.gmail_call(self.name, getattr(request, "methodId", None))
            self._count()
            wait = self.backoff * (2 ** (attempt - 1)) * (0.5 + random.random() / 2)
            try:
                return request.execute(num_retries=0)
            except HttpError as exc:
                last = self._http_error(exc, what, attempt, wait, pause)
                continue
            except RefreshError:
                raise self._auth_error() from None
            except (OSError, http.client.HTTPException, httplib2.HttpLib2Error) as exc:
                last = f"Gmail unreachable on {what}: {type(exc).__name__}: {exc}"
                self._drop_thread_http()  # its connection may be broken
                if attempt < self.read_attempts:
                    log.warning("%s; retry %d of %d", last, attempt, self.read_attempts - 1)
                    pause(wait)
                    continue
                raise GmailError(f"{last} (after {attempt} attempts)") from None
            finally:
                self._save_if_refreshed()
        raise GmailError(last or f"Gmail {what} failed")  # not reached

    def _http_error(self, exc: Any, what: str, attempt: int, wait: float,
                    pause: Callable[[float], None]) -> str:
        """Act on an HTTP error answer to a read: raise, or wait and return the reason
        (the caller tries again)."""
        status, message, reasons, retry_after = error_info(exc)
        if status == 401:
            raise self._auth_error() from None
        if status == 429 or (status == 403 and reasons & QUOTA_REASONS):
            kind = "rate limit" if status == 429 else "quota exceeded"
            last = f"Gmail {status} ({kind}) on {what}"
            if retry_after is not None and retry_after <= self.max_wait \
                    and attempt < self.read_attempts:
                log.warning("gmail %s: %s %d on %s; waiting %.1fs (Retry-After)",
                            self.name, kind, status, what, retry_after)
                pause(retry_after)
                return last
            if retry_after is None and attempt < self.read_attempts and \
                    (status == 429 or reasons & BACKOFF_REASONS):
                # No Retry-After: back off exponentially, as Gmail asks.
                delay = min(wait, self.max_wait)
                log.warning("gmail %s: %s %d on %s; backing off %.2fs, retry %d of %d",
                            self.name, kind, status, what, delay, attempt,
                            self.read_attempts - 1)
                pause(delay)
                return last
            after = f"; Gmail asks to retry after {retry_after:g}s" \
                if retry_after is not None else ""
            raise RateLimited(f"Gmail {status} ({kind}) on {what}{after}: {message}",
                              status, retry_after) from None
        if status == 404:
            raise NotFound(f"Gmail 404 on {what}: {message}", 404) from None
        if status >= 500:
            last = f"Gmail {status} on {what}: {message}"
            if attempt < self.read_attempts:
                log.warning("%s; retry %d of %d", last, attempt, self.read_attempts - 1)
                pause(wait)
                return last
            raise GmailError(f"{last} (after {attempt} attempts)", status) from None
        raise GmailError(f"Gmail {status} on {what}: {message}", status) from None

    def get_many(self, kind: str, ids: list[str], cancel: threading.Event | None = None,
                 **params: Any) -> dict[str, dict]:
        """``users.<kind>.get`` (``messages`` or ``threads``) of every id in ``ids``,
        through Gmail's batch endpoint, at most :data:`~.batch.MAX_PARTS` calls per
        request, with the care of :meth:`read` part by part: a part answered 429 or 5xx,
        or missing from an answer cut off mid-body, goes again alone (with the others
        that failed) after a backoff, within ``read_attempts``; a 404 drops only that
        id (absent from the result); 401 and other 4xx fail the call. Each part counts
        as one call (its quota). Returns id -> resource."""
        found: dict[str, dict] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), MAX_PARTS):
            found.update(self._get_batch(kind, unique[start:start + MAX_PARTS], cancel, params))
        return found

    def _get_batch(self, kind: str, ids: list[str], cancel: threading.Event | None,
                   params: dict[str, Any]) -> dict[str, dict]:
        what, found = f"{kind}.get", {}  # type: str, dict[str, dict]
        for attempt in range(1, self.read_attempts + 1):
            if self._closed or (cancel is not None and cancel.is_set()):
                raise Cancelled(f"Gmail {what}: not (re)tried; the tick is ending") \
                    if not self._closed else GmailError(f"Gmail account {self.name!r}: closed")
            requests = build_requests(self.service(), kind, ids, params)
            self._count(len(ids))  # each part is a call against the quota
            for request in requests.values():
                metrics.gmail_call(self.name, request.methodId)
            try:
                done, failure = run_batch(self.batch_endpoint, requests, self._thread_http())
            finally:
                self._save_if_refreshed()
            outcomes = {gid: as_asked(done.get(str(n)), gid, what) for n, gid in enumerate(ids)}
            found.update({gid: o.resource or {} for gid, o in outcomes.items()
                          if o and not o.error})
            failed = [o.error for o in outcomes.values() if o and o.error] + [failure]
            waits = [self._part_failed(exc, what, attempt == self.read_attempts)
                     for exc in failed if exc is not None]
            retry = [gid for gid, o in outcomes.items() if o is None or (
                o.error is not None and status_of(o.error) != 404)]
            if not retry:
                return found
            wait = max([self.backoff * 2 ** (attempt - 1) * random.uniform(0.5, 1)] +
                       [w for w, _ in waits])
            last = next((r for _, r in waits if r), f"Gmail {what}: parts missing")
            if attempt < self.read_attempts:
                log.warning("%s; %d of %d part(s) go again in %.2fs (retry %d of %d)", last,
                            len(retry), len(ids), wait, attempt, self.read_attempts - 1)
                cancel.wait(wait) if cancel is not None else time.sleep(wait)
            ids = retry
        raise GmailError(f"{last} (after {self.read_attempts} attempts)")

    def _part_failed(self, exc: BaseException, what: str, final: bool) -> tuple[float, str]:
        """(seconds to wait, reason) for a batch part (or the whole batch) that failed
        and may go again; raises what must not: 401, other 4xx, a rate limit whose
        Retry-After is over ``max_wait`` or that is on the ``final`` attempt."""
        from google.auth.exceptions import RefreshError
        from googleapiclient.errors import HttpError

        if isinstance(exc, RefreshError):
            raise self._auth_error() from None
        if isinstance(exc, WrongResource):  # answered, but not with what was asked for
            return 0.0, str(exc)
        if not isinstance(exc, HttpError):  # transport, or an answer cut off mid-body
            self._drop_thread_http()  # its connection may be broken
            return 0.0, f"Gmail batch {what} cut short: {reason(exc)}"
        status, message, reasons, retry_after = error_info(exc)
        if status == 401:
            raise self._auth_error() from None
        if status == 429 or (status == 403 and reasons & QUOTA_REASONS):
            kind = "rate limit" if status == 429 else "quota exceeded"
            short = retry_after is not None and retry_after <= self.max_wait
            if not final and (short or retry_after is None and (
                    status == 429 or reasons & BACKOFF_REASONS)):
                return min(retry_after or 0.0, self.max_wait), f"Gmail {status} ({kind}) on {what}"
            after = f"; Gmail asks to retry after {retry_after:g}s" if retry_after else ""
            raise RateLimited(f"Gmail {status} ({kind}) on {what}{after}: {message}",
                              status, retry_after) from None
        if status == 404:
            return 0.0, ""  # that id is dropped
        if status >= 500:
            return 0.0, f"Gmail {status} on {what}: {message}"
        raise GmailError(f"Gmail {status} on {what}: {message}", status) from None

    def write_once(self, make: Callable[[Any], Any], what: str) -> dict:
        """Execute a non-idempotent request exactly once. Raises NotSent (certainly not
        delivered), MaybeSent (unknown) or AuthError.

        Whatever fails before the request itself is handed to the transport (building
        the service, refreshing an expired token, building the request) provably sent
        nothing and is NotSent (AuthError for a dead token); only a failure after that
        can be MaybeSent."""
        # A fresh single-shot transport for this one call: no shared connection that
        # might be stale, no transport-level resend, and no googleapiclient retry.
        single = SingleShotHttp(timeout=self.timeout)  # follows no redirect either
        try:
            return self._write_once(make, what, single)
        finally:
            single.close()
            self._save_if_refreshed()

    def _write_once(self, make, what: str, single: SingleShotHttp) -> dict:
        from google.auth.exceptions import RefreshError, TransportError
        from googleapiclient.errors import HttpError

        try:
            request = make(self.service())
            metrics.gmail_call(self.name, getattr(request, "methodId", None))
            single.target = str(request.uri)
            request.http = self._authorized(single)
        except AuthError:
            raise
        except RefreshError:
            raise self._auth_error() from None
        except Exception as exc:
            raise NotSent(f"{reason(exc)}; nothing was sent") from None
        self._count()
        try:
            return request.execute(num_retries=0)
        except HttpError as exc:
            status, message, reasons, retry_after = error_info(exc)
            if status == 401:
                raise self._auth_error() from None
            if status >= 500:
                raise MaybeSent(f"Gmail {status} on {what}: {message}", status) from None
            if status == 429 or (status == 403 and reasons & QUOTA_REASONS):
                after = f"; retry after {retry_after:g}s" if retry_after is not None else ""
                raise NotSent(f"Gmail {status} (rate limit) on {what}{after}: {message}",
                              status) from None
            raise NotSent(f"Gmail {status} on {what}: {message}", status) from None
        except RefreshError:
            # Refreshed before the request, or after a 401: nothing was accepted.
            raise self._auth_error() from None
        except TransportError as exc:
            # google-auth raises it only around a token refresh, which happens before
            # the request or after a 401 answer: nothing was accepted.
            raise NotSent(f"Gmail account {self.name!r}: cannot refresh the access token "
                          f"({type(exc).__name__}); nothing was sent") from None
        except ConnectFailed as exc:
            if not single.issued:  # the token refresh before the request
                raise NotSent(f"Gmail account {self.name!r}: cannot refresh the access "
                              f"token ({exc}); nothing was sent") from None
            raise NotSent(f"Gmail unreachable on {what}: {exc}") from None
        except Exception as exc:
            if not single.issued:
                raise NotSent(f"{reason(exc)} before {what} was issued; nothing was "
                              f"sent") from None
            if isinstance(exc, (OSError, http.client.HTTPException, httplib2.HttpLib2Error)):
                kind = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) else \
                    f"connection lost ({type(exc).__name__})"
            else:
                kind = f"failed ({type(exc).__name__})"
            raise MaybeSent(f"Gmail {what}: {kind} before an answer; it may have been "
                            f"delivered") from None
