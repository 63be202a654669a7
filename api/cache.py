"""A small in-process TTL cache with single-flight loading, one instance per app.

Used on the hot read path for API-key lookups (`Settings.key_cache_s`, default
2 s), so most requests never touch the database or a thread: a key revoked through
this process's API is dropped from its cache at once; revoked elsewhere (the CLI,
another API process) it keeps working for at most that long.

Concurrent misses on one key share a single load (run in the thread pool, or by
the app's `api.reads.Reader`), so an expiry under load costs one database query,
not one per waiting client.
A TTL of 0 disables caching. Reads and writes happen on the event loop;
`discard_where` may also be called from a thread. Entries are bounded by `max_entries` (the oldest
insertion is evicted first).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from starlette.concurrency import run_in_threadpool

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
Runner = Callable[[Callable[..., Any]], Awaitable[Any]]


class TtlCache(Generic[K, V]):
    def __init__(
        self,
        ttl_s: float,
        *,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s < 0 or max_entries < 1:
            raise ValueError(f"ttl_s must be >= 0 and max_entries >= 1, got {ttl_s}, {max_entries}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, asyncio.Future[V | None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if self._clock() >= expires:
            self._entries.pop(key, None)
            return None
        return value

    def put(self, key: K, value: V) -> None:
        if self.ttl_s <= 0:
            return
        self._entries.pop(key, None)
        while len(self._entries) >= self.max_entries:
            self._entries.pop(next(iter(self._entries)), None)
        self._entries[key] = (self._clock() + self.ttl_s, value)

    def discard_where(self, predicate: Callable[[V], bool]) -> int:
        """Drop every entry whose value matches; return how many were dropped. Safe to call
        from a thread-pool route (a snapshot is iterated; pops are atomic)."""
        stale = [k for k, (_, v) in list(self._entries.items()) if predicate(v)]
        for k in stale:
            self._entries.pop(k, None)
        return len(stale)

    def clear(self) -> None:
        self._entries.clear()

    async def get_or_load(
        self, key: K, load: Callable[..., V | None], *, run: Runner = run_in_threadpool
    ) -> V | None:
        """The cached value, else `await run(load)` once for all concurrent callers (by
        default `load()` in the thread pool; `run=reader.run` reads with the app's `Reader`,
        which passes `load` a session). A None result is not cached; an exception reaches
        every waiter. If the caller running the load goes away (client disconnect), a
        waiting caller loads instead.

        The first caller runs the load itself rather than in a task of its own: under load
        every extra task step waits one more turn of a busy event loop (measured: three
        times the latency of a request that does not wait)."""
        while True:
            value = self.get(key)
            if value is not None:
                return value
            pending = self._loading.get(key)
            if pending is None:
                return await self._load(key, load, run)
            try:
                return await asyncio.shield(pending)
            except _LoaderGone:
                continue  # take over the load

    async def _load(self, key: K, load: Callable[..., V | None], run: Runner) -> V | None:
        pending: asyncio.Future[V | None] = asyncio.get_running_loop().create_future()
        self._loading[key] = pending
        try:
            value = await run(load)
        except BaseException as exc:
            gone = isinstance(exc, asyncio.CancelledError)
            pending.set_exception(_LoaderGone() if gone else exc)
            pending.exception()  # retrieved: no "never retrieved" log when nobody waited
            raise
        else:
            if value is not None:
                self.put(key, value)
            pending.set_result(value)
            return value
        finally:
            self._loading.pop(key, None)


class _LoaderGone(Exception):
    """The caller running a load was cancelled before it finished."""
