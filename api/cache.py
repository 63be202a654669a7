"""A small in-process TTL cache with single-flight loading, one instance per app.

Used on the hot read path so most requests never touch the database or a thread:

- API-key lookups (`Settings.key_cache_s`, default 2 s): a key revoked through
  this process's API is dropped from its cache at once; revoked elsewhere (the
  CLI, another API process) it keeps working for at most that long.
- the encoded JSON of the latest recommendation per (project, filter)
  (`Settings.response_cache_s`, default 1 s): a new recommendation written by a
  worker, in any process, is served within that delay. Misses (404) are never
  cached, so the first recommendation of a deployment shows up at once.

Concurrent misses on one key share a single load (run in the thread pool), so
an expiry under load costs one database query, not one per waiting client.
A TTL of 0 disables caching. Reads and writes happen on the event loop;
`discard_where` may also be called from a thread. Entries are bounded by `max_entries` (the oldest
insertion is evicted first).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


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

    async def get_or_load(self, key: K, load: Callable[[], V | None]) -> V | None:
        """The cached value, else `load()` run once in the thread pool for all concurrent
        callers. A None result is not cached; an exception reaches every waiter. A caller
        that goes away (client disconnect) does not cancel the load for the others."""
        value = self.get(key)
        if value is not None:
            return value
        task = self._loading.get(key)
        if task is None:
            task = asyncio.ensure_future(run_in_threadpool(load))
            self._loading[key] = task
            task.add_done_callback(lambda done: self._loaded(key, done))
        return await asyncio.shield(task)

    def _loaded(self, key: K, task: asyncio.Future[V | None]) -> None:
        self._loading.pop(key, None)
        if not task.cancelled() and task.exception() is None:
            value = task.result()
            if value is not None:
                self.put(key, value)
