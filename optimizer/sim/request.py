"""Per-request simulator state.

A request has a prompt of `num_prompt` tokens and produces `num_output` tokens.
Following vLLM v1 there is no separate prefill/decode phase: the request's
known tokens are `num_prompt + num_generated`, and `num_computed` (tokens whose
KV is in the cache) catches up with them within each step's token budget. When
it catches up, the step samples the next token. A decode step is simply a
request one token behind.

On a prefill instance of a disaggregated deployment `stop_at` is 1: the request
hands off after computing its prompt (the token it samples there goes nowhere, as
with vLLM's PD proxy). It then waits on a decode instance (`remote`) until that
instance admits it and pulls its KV; once the KV lands it recomputes its last
prompt token there, and that step delivers the first token.

While a non-speculative request decodes on the fast path, its progress is
implicit (see `optimizer.sim.schedule_fast`): after joining the decode set at step `join_step`
with `join_computed` tokens cached and `join_generated` emitted, at step S it
has `join_computed + S - join_step` tokens cached.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class SimRequest:
    rid: int
    arrival_s: float
    num_prompt: int
    num_output: int
    stop_at: int
    num_computed: int = 0
    num_generated: int = 0
    num_blocks: int = 0  # its own KV blocks (explicit state; implicit on the fast decode path)
    join_step: int = -1  # fast decode path: step of joining, -1 when not in the decode set
    join_computed: int = 0
    join_generated: int = 0
    finish_step: int = -1
    last_token_s: float = 0.0
    remote: bool = False  # on a decode instance, its KV still on the prefill instance
    source: int = -1  # the prefill instance holding its KV (PD)
    log_alpha: float = 0.0  # speculative acceptance: log(alpha) per drafted token
    instance: int = -1  # index of the instance it was routed to (current role)
    refs: list[int] | None = None  # prefix cache: the leading hash blocks it references
    num_ref_blocks: int = 0  # KV blocks those references cover (shared, not its own)
    # Preempted and not yet caught up: its KV is computed again as a prompt, to the last
    # token, whose step samples its next token (and records the whole gap as one ITL).
    recomputing: bool = False

    @property
    def num_tokens(self) -> int:
        return self.num_prompt + self.num_generated
