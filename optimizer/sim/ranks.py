"""The data-parallel ranks of one MoE instance, as vLLM runs them (`--data-parallel-size`).

Each rank is a scheduler of its own (`BaseScheduler`: its own waiting queue, running
set, token budget, batch limit and KV cache of `RolePlan.kv_blocks` blocks), and the
ranks of an instance step in lockstep: the MoE layers exchange every rank's tokens
(all-to-all with expert parallelism, all-gather otherwise), so no rank starts its next
forward before all have finished this one, and a rank with nothing to run joins with a
dummy step (vLLM's DPEngineCoreProc `execute_dummy_batch`) while any rank has work.
A group step therefore lasts the longest of its ranks' priced steps (each rank priced
on its own tokens); the dummy steps are taken as never the longest (one token against
a real batch), so they are not priced, and they are not logged as steps. When no rank
has work the group is idle, and an arrival at any rank starts them all again (vLLM's
DP coordinator wakes the paused wave).

Arrivals: the instance's API server sends each request to the rank with the lowest
`4 x waiting + running` (vLLM's DPLBAsyncMPClient; ties to the lowest rank). vLLM
reads the ranks' counts from stats published every 100 ms and counts its own
assignments in between; the simulator reads them exactly (an approximation on the
side of better balance). Requests whose KV is on its way (disaggregated decode) count
as waiting, as vLLM keeps them in WAITING_FOR_REMOTE_KVS.
"""

from __future__ import annotations

from optimizer.sim.scheduler import BaseScheduler

WAITING_WEIGHT = 4  # vLLM's DP load balancer: score = waiting x 4 + running


class RankGroup:
    """The `dp` rank schedulers of one instance; `stepping`: the ranks whose step is in
    flight (the others run dummy steps, or the group is idle)."""

    __slots__ = ("ranks", "stepping")

    def __init__(self, ranks: list[BaseScheduler]) -> None:
        if len(ranks) < 2:
            raise ValueError(f"a rank group needs at least 2 ranks, got {len(ranks)}")
        self.ranks = ranks
        self.stepping: list[BaseScheduler] = []
        for r in ranks:
            r.group = self

    @property
    def outstanding(self) -> int:
        """Prompt + output tokens of the instance's requests (for the fleet's router)."""
        return sum(r.outstanding for r in self.ranks)

    def pick(self) -> BaseScheduler:
        """The rank a new request goes to: the lowest 4 x waiting + running."""
        best = self.ranks[0]
        best_score = -1
        for r in self.ranks:
            waiting = len(r.waiting) + len(r.ready) + len(r.in_flight)
            score = WAITING_WEIGHT * waiting + r.num_admitted
            if best_score < 0 or score < best_score:
                best, best_score = r, score
        return best
