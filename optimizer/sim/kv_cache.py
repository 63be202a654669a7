"""The per-instance prefix cache (block accounting is `optimizer.sim.kv_blocks`).

Prefix caching saves prefill compute only: a hit's blocks are still counted as
allocated to the request (vLLM shares them by reference count; modelling that
sharing is future work).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class PrefixCache:
    """LRU set of prefix-block content hashes seen on one instance.

    `capacity` is in hash blocks (the instance's KV capacity in tokens divided
    by the trace's hash block size). A request's hit is its longest leading run
    of hashes already present; `cached_tokens` turns that into whole KV blocks,
    leaving at least one prompt token to compute (vLLM always runs the last one).
    """

    __slots__ = (
        "_lru",
        "block_tokens",
        "capacity",
        "kv_block_size",
        "num_hit_tokens",
        "num_lookup_tokens",
    )

    def __init__(self, capacity: int, block_tokens: int, kv_block_size: int) -> None:
        if capacity <= 0 or block_tokens <= 0:
            raise ValueError(
                f"prefix cache needs positive capacity/block size, got {capacity}, {block_tokens}"
            )
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity
        self.block_tokens = block_tokens
        self.kv_block_size = kv_block_size
        self.num_hit_tokens = 0
        self.num_lookup_tokens = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def cached_tokens(self, hashes: list[int], num_prompt: int, num_tokens: int) -> int:
        """Leading tokens whose KV can be reused (no LRU update).

        Hashes cover the prompt only; at least one of the `num_tokens` known
        tokens is always left to compute (the step that samples needs it).
        """
        lru = self._lru
        hits = 0
        for h in hashes:
            if h not in lru:
                break
            hits += 1
        tokens = min(hits * self.block_tokens, num_prompt, num_tokens - 1)
        return tokens - tokens % self.kv_block_size

    def insert(self, hashes: list[int]) -> None:
        """Mark a request's blocks most recently used, evicting the least recent."""
        lru = self._lru
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity:
            lru.popitem(last=False)


def hashes_as_lists(prefix_hashes: tuple[np.ndarray, ...] | None) -> list[list[int]] | None:
    """Python int lists for the hot loop (numpy scalars hash slowly)."""
    if prefix_hashes is None:
        return None
    return [h.tolist() for h in prefix_hashes]
