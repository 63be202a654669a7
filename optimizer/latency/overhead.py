"""The engine's own time per step, beside the GPU kernels.

Each vLLM step spends CPU time the operator tables never see: the scheduler walks the
running and waiting queues, the model runner builds the input tensors (token ids,
positions, block tables, attention metadata) for every sequence and token, the sampler
and the output processor handle every sequence's new token (detokenisation, stop
checks). Part of it is fixed per step, part grows with the sequences in the batch and
part with the tokens. With a CPU-bound engine and asynchronous GPU launches it only
shows where the CPU is the critical path, which is why it is modelled as additive:

    overhead(step) = base_s + per_seq_s x sequences + per_token_s x tokens

`DEFAULT_ENGINE_OVERHEAD` applies to every latency model that has no whole-step
measurements of its own (the imported GPU tables). It was fitted by
`benchmarks/bench_devset.py` (non-negative least squares on relative error, kernel
time from the AIConfigurator tables held fixed) on one half of the development set,
754 measured vLLM batch runs on A100, H100 and GH200 (LLM-Inference-Bench, a
V0-era engine with chunked prefill off): 1.32 ms per step, 76 us per sequence,
2.93 us per scheduled token. On the other half the batch latency's median error
is 6.5% (A100), 9.4% (GH200), 5.7% (H100); with no overhead it was 26-32%.

Read the terms as what the engine adds beyond the tables' kernels, not only CPU
time: the per-token term is mostly the prefill path's cost beyond the tabulated
GEMMs and attention (it is fitted on the runs' prefill-only TTFT rows; 2.9 us is
about a tenth of an 8B model's prefill per token on an H100 and 1-2% of a 70B's).
The fit was checked on an engine of another generation it never saw:
`benchmarks/bench_online.py` replays four measured online runs of vLLM 0.8.3 (V1)
serving Llama-3.3-70B on 8 A100s at 1, 4, 16 and unlimited requests/s, where it
brings mean TPOT within -3% to +12% (without it: -11% to -18%).
A model fitted on its own whole-step measurements (the CPU profiler's mixed
iterations) keeps its own constant instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.latency.base import StepLoad


@dataclass(frozen=True, slots=True)
class EngineOverhead:
    """Per-step engine time in seconds: base + per sequence + per scheduled token."""

    base_s: float = 0.0
    per_seq_s: float = 0.0
    per_token_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("base_s", "per_seq_s", "per_token_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"EngineOverhead.{name} must be a finite number >= 0, got {value!r}"
                )

    @classmethod
    def constant(cls, seconds: float) -> EngineOverhead:
        return cls(base_s=float(seconds))

    def step_s(self, num_seqs: float, num_tokens: float) -> float:
        return self.base_s + self.per_seq_s * num_seqs + self.per_token_s * num_tokens

    def load_s(self, load: StepLoad) -> float:
        """The overhead of one step (its sequences: prefill chunks plus decodes)."""
        return self.step_s(load.num_decode_seqs + len(load.prefill_q), load.num_tokens)

    def describe(self) -> str:
        parts = [f"{self.base_s * 1e3:.3f} ms/step"]
        if self.per_seq_s:
            parts.append(f"{self.per_seq_s * 1e6:.2f} us/sequence")
        if self.per_token_s:
            parts.append(f"{self.per_token_s * 1e9:.2f} ns/token")
        return " + ".join(parts)


NO_OVERHEAD = EngineOverhead()

# Fitted by benchmarks/bench_devset.py on the development set's training half.
DEFAULT_ENGINE_OVERHEAD = EngineOverhead(base_s=1.32e-3, per_seq_s=76e-6, per_token_s=2.93e-6)
