"""The googleapiclient service of one account, made cheap to use from many threads."""

from __future__ import annotations

import threading
from typing import Any

import httplib2


class CachedResource:
    """A googleapiclient Resource whose sub-resources (``users()``, ``messages()``...)
    are built once: building one parses the discovery methods again, about 4 ms of
    CPU per call, which under the GIL is what limits concurrent fetches."""

    _SUBS = {"users", "messages", "history", "drafts", "labels", "threads"}

    def __init__(self, resource: Any) -> None:  # a googleapiclient Resource (untyped)
        self._resource = resource
        self._subs: dict[str, CachedResource] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str):
        attr = getattr(self._resource, name)
        if name not in self._SUBS:
            return attr

        def sub():
            with self._lock:
                if name not in self._subs:
                    self._subs[name] = CachedResource(attr())
                return self._subs[name]

        return sub


def unused_http() -> httplib2.Http:
    # build() wants an http; every request gets its own through requestBuilder, so
    # this one never opens a connection.
    return httplib2.Http()
