"""The per-instance prefix cache, as vLLM v1's block pool keeps it (block counts are
`optimizer.sim.kv_blocks`). The instance's `KVBlockPool` owns it: blocks are acquired,
registered, released and evicted through the pool's methods, which keep its free count;
the scheduler only looks up (`lookup`, `count_lookup`).

The trace names a request's prompt blocks by content hash (`hash_ids`, one per
`block_tokens` tokens). A hash block is `blocks_per_hash` KV blocks. Modelled
as deployed:

- blocks are cached as they are computed: when a prompt chunk completes, its
  request registers the full hash blocks it now holds (`register`), which from
  then on are shared, not its own;
- a request admitted with nothing computed (new, or resumed after preemption)
  reuses the longest leading run of cached hash blocks (`lookup`), leaving at
  least one token to compute, and references them: a block another running
  request holds costs nothing more; a block nobody holds is revived from the
  free pool;
- a finished or preempted request drops its references; a hash block nobody
  references stays cached but evictable, and counts as free. The cache's
  capacity is thus the pool's free and evictable blocks, never the blocks
  running requests hold;
- new blocks come from blocks with nothing cached first, then by evicting the
  least recently released cached blocks; a request's blocks are released last
  block first, so its tail is evicted before its head (vLLM frees them in
  reverse order to the free queue's tail).

Granularity: only whole hash blocks are cached and hit (vLLM hashes every full
16-token block, so with 512-token trace hashes a request whose prompt ends mid
hash block recomputes that partial block, and a fully cached prompt recomputes
its last hash block). With 16-token hashes this is vLLM's accounting exactly.
A block computed twice at once (two requests with the same new prefix) is kept
once: the later request switches to the cached copy.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from optimizer.sim.request import SimRequest


class PrefixCache:
    """Cached hash blocks of one instance: referenced ones (`ref`: hash -> running
    requests holding it) and evictable ones (`lru`, least recently released first)."""

    __slots__ = (
        "block_tokens",
        "blocks_per_hash",
        "lru",
        "num_hit_tokens",
        "num_lookup_tokens",
        "ref",
    )

    def __init__(self, block_tokens: int, kv_block_size: int) -> None:
        if block_tokens <= 0 or kv_block_size <= 0 or block_tokens % kv_block_size:
            raise ValueError(
                f"prefix cache: the trace's hash blocks ({block_tokens} tokens) must be whole "
                f"KV blocks of {kv_block_size} tokens"
            )
        self.block_tokens = block_tokens
        self.blocks_per_hash = block_tokens // kv_block_size
        self.ref: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.num_hit_tokens = 0
        self.num_lookup_tokens = 0

    def __len__(self) -> int:
        return len(self.ref) + len(self.lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.ref or block_hash in self.lru

    @property
    def evictable_blocks(self) -> int:
        return len(self.lru) * self.blocks_per_hash

    @property
    def in_use_blocks(self) -> int:
        return len(self.ref) * self.blocks_per_hash

    def lookup(self, hashes: list[int], num_prompt: int, num_tokens: int) -> tuple[int, int]:
        """(hash blocks to reuse, KV blocks reviving them takes from the free pool): the
        leading cached run of whole prompt hash blocks, leaving at least one of the
        `num_tokens` known tokens to compute."""
        ref, lru = self.ref, self.lru
        most = min(num_prompt, num_tokens - 1) // self.block_tokens
        hits = revive = 0
        for h in hashes:
            if hits == most:
                break
            if h in ref:
                hits += 1
            elif h in lru:
                hits += 1
                revive += 1
            else:
                break
        return hits, revive * self.blocks_per_hash

    def count_lookup(self, num_prompt: int, num_hit: int) -> None:
        """A request's first admission looked up its `num_prompt` prompt tokens and found
        `num_hit` of them cached (the hit ratio's counts)."""
        self.num_lookup_tokens += num_prompt
        self.num_hit_tokens += num_hit

    def acquire(self, r: SimRequest, hashes: list[int]) -> int:
        """`r` references `hashes` (all cached); returns the KV blocks revived from the free
        pool (the pool, `KVBlockPool.acquire_prefix`, takes them off its free count)."""
        ref, lru = self.ref, self.lru
        revived = 0
        for h in hashes:
            count = ref.get(h)
            if count is None:
                del lru[h]
                ref[h] = 1
                revived += 1
            else:
                ref[h] = count + 1
        r.refs = list(hashes)
        r.num_ref_blocks = len(hashes) * self.blocks_per_hash
        return revived * self.blocks_per_hash

    def register(self, r: SimRequest, hashes: list[int]) -> int:
        """Cache the full hash blocks of `r`'s prompt computed so far; returns the KV blocks
        this frees from the pool (a block already cached by another request is given up
        for the cached copy, which may itself be revived: negative)."""
        refs = r.refs
        if refs is None:
            refs = r.refs = []
        full = min(min(r.num_computed, r.num_prompt) // self.block_tokens, len(hashes))
        bph = self.blocks_per_hash
        freed = 0
        ref, lru = self.ref, self.lru
        for j in range(len(refs), full):
            h = hashes[j]
            count = ref.get(h)
            if count is not None:  # computed twice at once: keep the cached copy
                ref[h] = count + 1
                freed += bph
            elif h in lru:
                del lru[h]
                ref[h] = 1
            else:
                ref[h] = 1
            refs.append(h)
            r.num_blocks -= bph
            r.num_ref_blocks += bph
        return freed

    def release(self, refs: list[int]) -> int:
        """Drop references (a request finished, was preempted or handed off its KV); returns
        the KV blocks that become free (and evictable)."""
        ref, lru = self.ref, self.lru
        freed = 0
        for h in reversed(refs):  # the tail is evicted first
            count = ref[h] - 1
            if count:
                ref[h] = count
            else:
                del ref[h]
                lru[h] = None
                freed += 1
        return freed * self.blocks_per_hash

    def evict(self, num_free: int) -> None:
        """Evict least recently released blocks until the evictable ones fit in `num_free`
        (new blocks were taken from the free pool)."""
        lru = self.lru
        bph = self.blocks_per_hash
        while len(lru) * bph > num_free:
            lru.popitem(last=False)


def hashes_as_lists(prefix_hashes: tuple[np.ndarray, ...] | None) -> list[list[int]] | None:
    """Python int lists for the hot loop (numpy scalars hash slowly)."""
    if prefix_hashes is None:
        return None
    return [h.tolist() for h in prefix_hashes]
