"""The KV-block pool of one instance: vLLM's `KVCacheManager` reduced to block counts.

A request holds `SimRequest.num_blocks` blocks of `block_size` tokens of its
own, plus `num_ref_blocks` shared prefix-cache blocks (`optimizer.sim.kv_cache`);
the pool counts the free ones (cached blocks nobody references count as free).
Every block computation of the simulator goes through here (`blocks_for` is
also the reference engine's): a request that is to hold `n` tokens needs
`ceil(n / block_size)` blocks. The schedulers ask `extra_blocks`, then `grow`
when the pool has them; a preempted or finished request `release`s its blocks.
The fast decode path allocates for its decodes in aggregate (decrementing
`num_free`) and materialises a decode's count on the request when it leaves
that path.

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
    """Free-block count of one instance (the blocks themselves are not modelled)."""

    __slots__ = ("block_size", "cache", "num_blocks", "num_free", "state_blocks")

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        cache: PrefixCache | None = None,
        state_blocks: int = 0,
    ) -> None:
        if num_blocks < 0 or block_size <= 0 or state_blocks < 0:
            raise ValueError(f"KV pool: need num_blocks >= 0, block_size > 0, state_blocks >= 0, "
                             f"got {num_blocks}, {block_size}, {state_blocks}")  # fmt: skip
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.state_blocks = state_blocks  # a sequence's fixed (Gated DeltaNet) state
        self.num_free = num_blocks
        self.cache = cache  # evicted from when new blocks are taken

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_held(self, num_tokens: int) -> int:
        """Blocks a running sequence of `num_tokens` (>= 1) tokens holds: its KV and its
        fixed state."""
        return -(-num_tokens // self.block_size) + self.state_blocks

    def extra_blocks(self, r: SimRequest, num_tokens: int) -> int:
        """Blocks `r` needs beyond those it holds (its own, and shared prefix-cache blocks it
        references) to hold `num_tokens` tokens and its state (may be <= 0)."""
        return self.blocks_held(num_tokens) - r.num_blocks - r.num_ref_blocks

    def grow(self, r: SimRequest, need: int) -> None:
        """Give `r` `need` more blocks (the caller checked `need <= num_free`)."""
        self.num_free -= need
        r.num_blocks += need
        if self.cache is not None:
            self.cache.evict(self.num_free)

    def release(self, r: SimRequest) -> None:
        """Free everything `r` holds (preempted, finished, or its KV handed off)."""
        self.num_free += r.num_blocks
        r.num_blocks = 0
