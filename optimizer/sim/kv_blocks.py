"""The KV-block pool of one instance: vLLM's `KVCacheManager` reduced to block counts.

A request holds `SimRequest.num_blocks` blocks of `block_size` tokens of its
own, plus `num_ref_blocks` shared prefix-cache blocks (`optimizer.sim.kv_cache`);
the pool counts the free ones (cached blocks nobody references count as free).
Every block computation of the simulator goes through here (`blocks_for` is
also the reference engine's): a request that is to hold `n` tokens needs
`ceil(n / block_size)` blocks.

The pool is the only writer of the block counts, its own and its requests' (as vLLM's
`KVCacheManager` is the only one that touches blocks); the schedulers read `num_free`
and ask for named operations:

- `extra_blocks`, `can_allocate`, then `grow` when the pool has them; a preempted or
  finished request `release`s its own blocks and `release_refs` its prefix-cache ones;
- the fast decode path takes blocks for its decodes in aggregate (`allocate`) and,
  when a decode leaves that path, `settle`s the count on the request;
- the prefix cache the pool owns takes (`acquire_prefix`), caches (`register_prefix`)
  and evicts blocks only through the pool;
- a PD prefill instance keeps a finished prompt's KV until the decode instance pulls
  it (`hold_for_pull`, then `release_pulled`).

A Gated DeltaNet model's sequence also holds a fixed recurrent state in pages of the
same pool (vLLM's hybrid KV-cache manager: its MambaManager gives a running request one
page per layer group, whatever its length): `state_blocks` more blocks of its own from
its first token to its release (0 for other models), counted in `num_blocks`.
"""

from __future__ import annotations

from optimizer.sim.kv_cache import PrefixCache
from optimizer.sim.request import SimRequest


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` tokens (ceil division)."""
    return -(-num_tokens // block_size)


class KVBlockPool:
    """Free-block count of one instance (the blocks themselves are not modelled).

    `num_free` is read by the schedulers and written only by the methods below."""

    __slots__ = (
        "block_size",
        "cache",
        "handoff",
        "handoff_blocks",
        "num_blocks",
        "num_free",
        "state_blocks",
    )

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        cache: PrefixCache | None = None,
        state_blocks: int = 0,
    ) -> None:
        if num_blocks < 0 or block_size <= 0 or state_blocks < 0:
            raise ValueError(
                f"KV pool: need num_blocks >= 0, block_size > 0, state_blocks >= 0, "
                f"got {num_blocks}, {block_size}, {state_blocks}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.state_blocks = state_blocks  # a sequence's fixed (Gated DeltaNet) state
        self.num_free = num_blocks
        self.cache = cache  # evicted from when new blocks are taken
        # PD prefill: rid -> (own blocks, prefix-cache references) kept until pulled
        self.handoff: dict[int, tuple[int, list[int] | None]] = {}
        self.handoff_blocks = 0

    # ------------------------------------------------------------------ queries

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def can_allocate(self, num: int, reserve: int = 0) -> bool:
        """Whether `num` blocks can be taken while `reserve` stay free."""
        return num <= self.num_free - reserve

    def blocks_held(self, num_tokens: int) -> int:
        """Blocks a running sequence of `num_tokens` (>= 1) tokens holds: its KV and its
        fixed state."""
        return -(-num_tokens // self.block_size) + self.state_blocks

    def extra_blocks(self, r: SimRequest, num_tokens: int) -> int:
        """Blocks `r` needs beyond those it holds (its own, and shared prefix-cache blocks it
        references) to hold `num_tokens` tokens and its state (may be <= 0)."""
        return self.blocks_held(num_tokens) - r.num_blocks - r.num_ref_blocks

    # ------------------------------------------------------------------ own blocks

    def allocate(self, num: int) -> None:
        """Take `num` blocks not yet counted on any request (the fast path's decode set,
        in aggregate; the caller checked `can_allocate`)."""
        self.num_free -= num
        if self.cache is not None:
            self.cache.evict(self.num_free)

    def grow(self, r: SimRequest, need: int) -> None:
        """Give `r` `need` more blocks (the caller checked `need <= num_free`)."""
        self.num_free -= need
        r.num_blocks += need
        if self.cache is not None:
            self.cache.evict(self.num_free)

    def settle(self, r: SimRequest, num_tokens: int) -> None:
        """`r` leaves the fast path's decode set holding `num_tokens` tokens: the blocks
        `allocate` took for it in aggregate become its own count."""
        r.num_blocks = self.blocks_held(num_tokens) - r.num_ref_blocks

    def release(self, r: SimRequest) -> None:
        """Free everything `r` holds (preempted, finished, or its KV handed off)."""
        self.num_free += r.num_blocks
        r.num_blocks = 0

    # ------------------------------------------------------------------ prefix cache

    def acquire_prefix(self, r: SimRequest, hashes: list[int]) -> None:
        """`r` references the cached hash blocks `hashes` (those nobody held are revived
        from the free blocks)."""
        self.num_free -= self.cache.acquire(r, hashes)

    def register_prefix(self, r: SimRequest, hashes: list[int]) -> None:
        """A prompt chunk of `r` completed: cache the hash blocks of `hashes` it now holds
        in full (they become shared), then evict what no longer fits in the free blocks."""
        cache = self.cache
        self.num_free += cache.register(r, hashes)
        cache.evict(self.num_free)

    def release_refs(self, r: SimRequest) -> None:
        """`r` no longer references its prefix-cache blocks (they stay cached, evictable
        when nobody else holds them)."""
        if r.refs:
            self.num_free += self.cache.release(r.refs)
        r.refs = None
        r.num_ref_blocks = 0

    # ------------------------------------------------------------------ PD handoff

    def hold_for_pull(self, r: SimRequest) -> None:
        """PD prefill: `r`'s prompt is computed; its blocks (own and referenced) stay taken
        until a decode instance pulls its KV (`release_pulled`), and `r` holds none here
        (the decode instance counts its own)."""
        self.handoff[r.rid] = (r.num_blocks, r.refs or None)
        self.handoff_blocks += r.num_blocks
        r.refs = None
        r.num_ref_blocks = 0
        r.num_blocks = 0

    def release_pulled(self, rid: int) -> None:
        """PD prefill: request `rid`'s KV was pulled; free what `hold_for_pull` kept."""
        blocks, refs = self.handoff.pop(rid)
        self.handoff_blocks -= blocks
        self.num_free += blocks
        if refs and self.cache is not None:
            self.num_free += self.cache.release(refs)
