"""The compiled fast path: a step's latency from precomputed tables.

For one (model shape in one precision, accelerator, TP degree) every operator
prediction is tabulated once on quantised grids:

- token-parallel work (all layers' GEMMs, elementwise ops, all-reduces) and
  the LM head by token count: exactly up to 7 tokens (a MoE's experts cost far more at 8
  tokens than at 1), beyond that rounded *up* to a multiple of 8;
- prefill attention of one chunk by (q, kv) and decode attention by
  (number of sequences, mean KV length), on log2 grids with `points_per_octave`
  points, interpolated bilinearly in log2 coordinates.

Tables are made monotone (running maximum along each axis: more work never
costs less). Beyond a grid's end a table continues linearly in the size (the physics of
every operator there: compute- or bandwidth-bound). Pricing one step is a few
list lookups and multiplications (microseconds, no numpy, no scikit-learn);
`step_times_s` prices arrays of steps with numpy (millions per second).

A run compiles only what it can reach (`TableReach`: the most tokens in a step,
sequences decoding, tokens in a chunk, KV length of a request): `TableGrid.covering`
picks a grid up to the next power of two of each bound (so a few tiers serve every
run), a prefix of the full grid. Every table point inside it, the running maxima
included, equals the full grid's, so a run's steps cost exactly what they cost on
the full grid. A step's kernels last at least the host's launches outside CUDA graphs
(`HostFloor`, `optimizer.latency.launches`). `optimizer.latency.table_bytes` stores a
compiled table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from optimizer.engines import NO_OVERHEAD, EngineOverhead
from optimizer.latency.base import StepLoad, TableReach
from optimizer.latency.compose import Pricing
from optimizer.latency.launches import NO_HOST_FLOOR, HostFloor
from optimizer.shapes import DEFAULT_PRECISION

TOKEN_STEP = 8
# Token-table index of n tokens: n itself below TOKEN_STEP, then one entry per TOKEN_STEP
# (entry SMALL_TOKENS + k holds k x TOKEN_STEP tokens).
SMALL_TOKENS = TOKEN_STEP - 1


def token_index(n: int) -> int:
    return n if n < TOKEN_STEP else SMALL_TOKENS + (n + TOKEN_STEP - 1) // TOKEN_STEP


@dataclass(frozen=True, slots=True)
class TableGrid:
    max_tokens: int = 32768  # token-count table end (multiple of TOKEN_STEP)
    points_per_octave: int = 8
    max_log2_batch: int = 12  # decode sequences up to 4096
    max_log2_q: int = 15  # prefill chunk up to 32768
    max_log2_kv: int = 20  # KV length up to 1M tokens
    max_verify_q: int = 8  # decode_q (K+1) tabulated up to this; beyond, scaled linearly

    @classmethod
    def covering(cls, reach: TableReach) -> TableGrid:
        """The smallest tier of the full grid that holds `reach` (capped at the full grid;
        beyond it tables extrapolate, as on the full grid)."""
        full = cls()
        tokens = 1 << max(11, math.ceil(math.log2(max(reach.max_tokens, 1))))
        return cls(
            max_tokens=min(full.max_tokens, tokens),
            points_per_octave=full.points_per_octave,
            max_log2_batch=_log2_levels(reach.max_batch, 6, full.max_log2_batch),
            max_log2_q=_log2_levels(reach.max_q, 11, full.max_log2_q),
            max_log2_kv=_log2_levels(reach.max_kv, 12, full.max_log2_kv),
            max_verify_q=full.max_verify_q,
        )

    def covers(self, reach: TableReach) -> bool:
        return self == TableGrid.covering(reach).union(self)

    def union(self, other: TableGrid) -> TableGrid:
        return TableGrid(*(max(getattr(self, f.name), getattr(other, f.name))
                           for f in fields(self)))  # fmt: skip

    @property
    def tier(self) -> str:
        """A short name of the grid, for cache keys."""
        return (
            f"t{self.max_tokens}-b{self.max_log2_batch}-q{self.max_log2_q}"
            f"-kv{self.max_log2_kv}-p{self.points_per_octave}-v{self.max_verify_q}"
        )


def _log2_levels(value: int, floor: int, cap: int) -> int:
    """Octaves of a log grid whose last point lies strictly beyond `value`: every value up
    to it interpolates between the same two points as on the full grid."""
    return min(cap, max(floor, math.ceil(math.log2(max(value, 1))) + 1))


def _log_grid(max_log2: int, ppo: int) -> np.ndarray:
    return np.exp2(np.arange(max_log2 * ppo + 1) / ppo)


@dataclass(frozen=True, slots=True)
class CompiledStepLatency:
    """A `StepLatency` for one (shape, accelerator, TP): tables only, picklable."""

    shape_name: str
    accelerator: str
    tp: int
    is_estimate: bool
    label: str  # e.g. "learned (aiconfigurator)" or "roofline estimate"
    estimated_ops: tuple[str, ...]  # operators priced by the roofline inside a learned model
    overhead: EngineOverhead  # the engine's own time per step that the GPU waits for
    ppo: int
    dense_ms: list[float]  # index `token_index(T)`
    lm_head_ms: list[float]
    prefill_ms: list[float]  # flat [iq * n_kv + ikv]
    decode_ms: list[list[float]]  # per decode_q (index q - 1), flat [ib * n_kv + ikv]
    n_kv: int
    n_q: int
    n_b: int
    grid: TableGrid = TableGrid()
    precision: str = DEFAULT_PRECISION.label  # the shape's weight and KV formats (Precision)
    # Async scheduling: the engine's CPU work per step, overlapped with the GPU's; a step
    # lasts at least this long (zero: a synchronous engine, all of it in `overhead`).
    hidden: EngineOverhead = NO_OVERHEAD
    engine: str = ""  # how it was priced, e.g. "vLLM 0.20, V1 with async scheduling"
    layout: str = ""  # the MoE layout it was priced for (`ExpertLayout.key`; "" dense)
    host: HostFloor = NO_HOST_FLOOR  # the host's launches outside CUDA graphs bound kernels
    # The one-token forward outside MoE blocks, s (`Pricing.forward_outside_experts_ms`):
    # `overhead` holds the engine's per-sequence share of it resolved (`EngineOverhead`).
    forward_s: float = 0.0

    # -- scalar path ---------------------------------------------------------------
    def _tokens(self, table: list[float], n: int) -> float:
        j = token_index(n)
        last = len(table) - 1
        if j <= last:
            return table[j]
        span = min(512, last - TOKEN_STEP)
        slope = (table[last] - table[last - span]) / (span * TOKEN_STEP)
        return table[last] + slope * (n - (last - SMALL_TOKENS) * TOKEN_STEP)

    def _bilinear(self, table: list[float], x: float, n_x: int, y: float) -> float:
        return _interpolate(table, x, n_x, y, self.ppo, self.n_kv)

    def kernel_time_s(self, load: StepLoad) -> float:
        """The step's kernels alone (no engine overhead), seconds: at least the host's
        launches of a forward outside CUDA graphs (`host`)."""
        # Part of the simulator's hottest call: tables and sizes are read into locals
        # once, the common in-range token lookups are inlined (`_tokens`: the tail).
        dense = self.dense_ms
        n = load.num_tokens
        j = n if n < TOKEN_STEP else SMALL_TOKENS + (n + TOKEN_STEP - 1) // TOKEN_STEP
        ms = dense[j] if j < len(dense) else self._tokens(dense, n)
        m = load.num_logits
        if m > 0:
            head = self.lm_head_ms
            j = m if m < TOKEN_STEP else SMALL_TOKENS + (m + TOKEN_STEP - 1) // TOKEN_STEP
            ms += head[j] if j < len(head) else self._tokens(head, m)
        prefill_q = load.prefill_q
        if prefill_q:
            ppo, n_kv, n_q, table = self.ppo, self.n_kv, self.n_q, self.prefill_ms
            for q, kv in zip(prefill_q, load.prefill_kv, strict=True):
                ms += _interpolate(table, q, n_q, kv if kv > q else q, ppo, n_kv)
        b = load.num_decode_seqs
        if b > 0:
            decode = self.decode_ms
            dq = load.decode_q
            qd = dq if dq < len(decode) else len(decode)
            extra = dq / qd
            ms += extra * _interpolate(
                decode[qd - 1], b, self.n_b, load.decode_kv_tokens / b, self.ppo, self.n_kv
            )
        host = self.host
        if host.graph_tokens:
            floor = host.floor_s(n, bool(prefill_q))
            return floor if floor > ms * 1e-3 else ms * 1e-3
        return ms * 1e-3

    def step_time_s(self, load: StepLoad) -> float:
        """The step's wall time: its kernels plus the engine's exposed overhead, and at
        least the engine's hidden CPU work (async scheduling)."""
        t = self.kernel_time_s(load)
        o = self.overhead
        seqs = load.num_decode_seqs + len(load.prefill_q)
        n = load.num_tokens
        t += o.base_s + o.per_seq_s * seqs + o.per_token_s * n
        h = self.hidden
        if h.base_s or h.per_seq_s or h.per_token_s:
            cpu = h.base_s + h.per_seq_s * seqs + h.per_token_s * n
            return cpu if cpu > t else t
        return t

    def idle_step_time_s(self, load: StepLoad) -> float:
        """A step that starts on an idle engine: with nothing running, async scheduling has
        no step to overlap its CPU work with, so kernels, exposed overhead and CPU work add
        up (a synchronous engine's `hidden` is zero: the same as `step_time_s`)."""
        seqs, n = load.num_decode_seqs + len(load.prefill_q), load.num_tokens
        cpu = self.hidden.step_s(seqs, n)
        return self.kernel_time_s(load) + self.overhead.step_s(seqs, n) + cpu

    def with_engine_s(self, gpu_s: float, load: StepLoad) -> float:
        """A step of `load` whose kernels take `gpu_s`, with the engine's time: the exposed
        overhead adds to the GPU's, the hidden CPU work (async scheduling) bounds it below
        (what `step_time_s` inlines)."""
        seqs, n = load.num_decode_seqs + len(load.prefill_q), load.num_tokens
        return max(gpu_s + self.overhead.step_s(seqs, n), self.hidden.step_s(seqs, n))

    def pricer(self, idle: bool = False) -> Callable[[StepLoad], float]:
        """`step_time_s` (with `idle`: `idle_step_time_s`) as one function closed over the
        tables and constants: the simulator calls it once per step, so it reads no
        attribute and calls nothing in the common case (the decode lookup inlined). The
        same arithmetic in the same order as the methods: the same floats (a test checks
        every branch)."""
        dense, head, tail = self.dense_ms, self.lm_head_ms, self._tokens
        n_dense, n_head = len(dense), len(head)
        prefill, ppo, n_kv, n_q = self.prefill_ms, self.ppo, self.n_kv, self.n_q
        decode, n_b = self.decode_ms, self.n_b
        n_decode = len(decode)
        b_last, kv_last = n_b - 1, n_kv - 1
        b_end, kv_end = 2.0 ** ((n_b - 1) / ppo), 2.0 ** ((n_kv - 1) / ppo)
        host = self.host
        graph_tokens, piecewise_s, eager_s = host.graph_tokens, host.piecewise_s, host.eager_s
        o, h = self.overhead, self.hidden
        base_s, seq_s, token_s = o.base_s, o.per_seq_s, o.per_token_s
        cpu_base_s, cpu_seq_s, cpu_token_s = h.base_s, h.per_seq_s, h.per_token_s
        hidden = bool(cpu_base_s or cpu_seq_s or cpu_token_s)
        log2 = _log2
        one_token = decode[0]
        # Decode-only steps of b one-token decodes (most steps): the parts of their price
        # that depend on b alone, computed once per b as the general branch computes them.
        by_batch: dict[int, tuple[float, float, int, int, float, float, float, float]] = {}

        def batch_parts(b: int) -> tuple[float, float, int, int, float, float, float, float]:
            parts = self._batch_parts(b)
            by_batch[b] = parts
            return parts

        def price(load: StepLoad) -> float:
            n = load.num_tokens
            b = load.num_decode_seqs
            prefill_q = load.prefill_q
            if b == n and not prefill_q and load.decode_q == 1 and load.num_logits == b and b:
                parts = by_batch.get(b)
                if parts is None:
                    parts = batch_parts(b)
                ms, scale, row0, row1, fu, floor, exposed, cpu = parts
                y = load.decode_kv_tokens / b
                v = log2(y) * ppo if y > 1.0 else 0.0
                if v >= kv_last:
                    scale *= y / kv_end
                    v = n_kv - 1.000001
                k = int(v)
                fv = v - k
                r0, r1 = row0 + k, row1 + k
                lo = one_token[r0] + fv * (one_token[r0 + 1] - one_token[r0])
                hi = one_token[r1] + fv * (one_token[r1 + 1] - one_token[r1])
                t = (ms + scale * (lo + fu * (hi - lo))) * 1e-3
                if floor > t:
                    t = floor
                if idle:
                    t += exposed
                    return t + cpu
                t += exposed
                if hidden:
                    return cpu if cpu > t else t
                return t
            j = n if n < TOKEN_STEP else SMALL_TOKENS + (n + TOKEN_STEP - 1) // TOKEN_STEP
            ms = dense[j] if j < n_dense else tail(dense, n)
            m = load.num_logits
            if m > 0:
                j = m if m < TOKEN_STEP else SMALL_TOKENS + (m + TOKEN_STEP - 1) // TOKEN_STEP
                ms += head[j] if j < n_head else tail(head, m)
            if prefill_q:
                for q, kv in zip(prefill_q, load.prefill_kv, strict=True):
                    ms += _interpolate(prefill, q, n_q, kv if kv > q else q, ppo, n_kv)
            if b > 0:  # _interpolate(decode[qd - 1], b, n_b, kv / b, ppo, n_kv), inlined
                dq = load.decode_q
                qd = dq if dq < n_decode else n_decode
                table = decode[qd - 1]
                y = load.decode_kv_tokens / b
                scale = 1.0
                u = log2(b) * ppo if b > 1.0 else 0.0
                if u >= b_last:
                    scale *= b / b_end
                    u = n_b - 1.000001
                v = log2(y) * ppo if y > 1.0 else 0.0
                if v >= kv_last:
                    scale *= y / kv_end
                    v = n_kv - 1.000001
                i, k = int(u), int(v)
                fu, fv = u - i, v - k
                r0, r1 = i * n_kv + k, (i + 1) * n_kv + k
                lo = table[r0] + fv * (table[r0 + 1] - table[r0])
                hi = table[r1] + fv * (table[r1 + 1] - table[r1])
                ms += dq / qd * (scale * (lo + fu * (hi - lo)))
            t = ms * 1e-3
            if graph_tokens:  # HostFloor.floor_s
                floor = eager_s if n > graph_tokens else piecewise_s if prefill_q else 0.0
                if floor > t:
                    t = floor
            seqs = b + len(prefill_q)
            if idle:
                t += base_s + seq_s * seqs + token_s * n
                return t + (cpu_base_s + cpu_seq_s * seqs + cpu_token_s * n)
            t += base_s + seq_s * seqs + token_s * n
            if hidden:
                cpu = cpu_base_s + cpu_seq_s * seqs + cpu_token_s * n
                return cpu if cpu > t else t
            return t

        return price

    def _batch_parts(self, b: int) -> tuple[float, float, int, int, float, float, float, float]:
        """The parts of a decode-only step's price that depend only on its `b` one-token
        decodes: (token-table ms, size scale, decode-table rows of the batch's two grid
        points, their interpolation weight, the host floor, exposed overhead, CPU work)."""
        dense, head = self.dense_ms, self.lm_head_ms
        ppo, n_kv, n_b = self.ppo, self.n_kv, self.n_b
        j = b if b < TOKEN_STEP else SMALL_TOKENS + (b + TOKEN_STEP - 1) // TOKEN_STEP
        ms = dense[j] if j < len(dense) else self._tokens(dense, b)
        ms += head[j] if j < len(head) else self._tokens(head, b)
        scale = 1.0
        u = _log2(b) * ppo if b > 1.0 else 0.0
        if u >= n_b - 1:
            scale *= b / 2.0 ** ((n_b - 1) / ppo)
            u = n_b - 1.000001
        i = int(u)
        host = self.host
        graph_tokens = host.graph_tokens
        floor = (host.eager_s if b > graph_tokens else 0.0) if graph_tokens else -math.inf
        o, h = self.overhead, self.hidden
        exposed = o.base_s + o.per_seq_s * b + o.per_token_s * b
        cpu = h.base_s + h.per_seq_s * b + h.per_token_s * b
        return (ms, scale, i * n_kv, (i + 1) * n_kv, u - i, floor, exposed, cpu)

    def run_pricer(self) -> Callable[[int, int, int], np.ndarray]:
        """(b, kv0, k) -> the steady prices, in seconds, of k decode-only steps of b
        one-token decodes attending to kv0, kv0 + b, ..., kv0 + (k - 1) b KV tokens (a
        decode stretch: each step adds one token per sequence). `pricer()`'s decode-only
        branch over arrays: the same floats (log2 per step with `math.log2`, every other
        operation elementwise in the same order)."""
        ppo, n_kv = self.ppo, self.n_kv
        kv_last, kv_end = n_kv - 1, 2.0 ** ((n_kv - 1) / ppo)
        h = self.hidden
        hidden = bool(h.base_s or h.per_seq_s or h.per_token_s)
        table = np.asarray(self.decode_ms[0])
        by_batch: dict[int, tuple[float, float, int, int, float, float, float, float]] = {}

        def price_run(b: int, kv0: int, k: int) -> np.ndarray:
            parts = by_batch.get(b)
            if parts is None:
                parts = by_batch[b] = self._batch_parts(b)
            ms, scale, row0, row1, fu, floor, exposed, cpu = parts
            y = (kv0 + b * np.arange(k, dtype=np.int64)) / b
            v = np.fromiter(map(_log2, y.tolist()), np.float64, k) * ppo
            # y grows along the run: only a prefix can be <= 1, only a suffix past the grid
            if y[0] <= 1.0:
                v[y <= 1.0] = 0.0
            scales: float | np.ndarray = scale
            if v[-1] >= kv_last:
                over = v >= kv_last
                scales = np.full(k, scale)
                scales[over] = scale * (y[over] / kv_end)
                v[over] = n_kv - 1.000001
            kk = v.astype(np.int64)
            fv = v - kk
            r0, r1 = row0 + kk, row1 + kk
            lo = table[r0] + fv * (table[r0 + 1] - table[r0])
            hi = table[r1] + fv * (table[r1 + 1] - table[r1])
            t = (ms + scales * (lo + fu * (hi - lo))) * 1e-3
            if floor > -math.inf:
                np.maximum(t, floor, out=t)
            t += exposed
            if hidden:
                t = np.maximum(t, cpu)
            return t

        return price_run

    # -- batch path ------------------------------------------------------------------
    def _tokens_np(self, table: np.ndarray, n: np.ndarray) -> np.ndarray:
        j = np.where(n < TOKEN_STEP, n, SMALL_TOKENS + (n + TOKEN_STEP - 1) // TOKEN_STEP)
        last = table.shape[0] - 1
        span = min(512, last - TOKEN_STEP)
        slope = (table[last] - table[last - span]) / (span * TOKEN_STEP)
        inside = table[np.minimum(j, last)]
        tail = table[last] + slope * (n - (last - SMALL_TOKENS) * TOKEN_STEP)
        return np.where(j <= last, inside, tail)

    def _bilinear_np(self, table: np.ndarray, x: np.ndarray, n_x: int, y: np.ndarray):
        ppo, n_y = self.ppo, self.n_kv
        u = np.log2(np.maximum(x, 1.0)) * ppo
        v = np.log2(np.maximum(y, 1.0)) * ppo
        scale = np.where(u >= n_x - 1, x / 2.0 ** ((n_x - 1) / ppo), 1.0)
        scale = scale * np.where(v >= n_y - 1, y / 2.0 ** ((n_y - 1) / ppo), 1.0)
        u = np.minimum(u, n_x - 1.000001)
        v = np.minimum(v, n_y - 1.000001)
        i, j = u.astype(np.int64), v.astype(np.int64)
        fu, fv = u - i, v - j
        r0, r1 = i * n_y + j, (i + 1) * n_y + j
        lo = table[r0] + fv * (table[r0 + 1] - table[r0])
        hi = table[r1] + fv * (table[r1 + 1] - table[r1])
        return scale * (lo + fu * (hi - lo))

    def step_times_s(
        self,
        num_tokens: np.ndarray,
        num_logits: np.ndarray,
        num_decode_seqs: np.ndarray,
        decode_kv_tokens: np.ndarray,
        prefill_q: np.ndarray,
        prefill_kv: np.ndarray,
        decode_q: int = 1,
    ) -> np.ndarray:
        """Vectorised `step_time_s` for steps with at most one prefill chunk each
        (prefill_q = 0: none); all arguments are equal-length integer arrays."""
        tok = np.asarray(num_tokens, dtype=np.int64)
        logits = np.asarray(num_logits, dtype=np.int64)
        b = np.asarray(num_decode_seqs, dtype=np.float64)
        q = np.asarray(prefill_q, dtype=np.float64)
        kv = np.maximum(np.asarray(prefill_kv, dtype=np.float64), q)
        ms = self._tokens_np(np.asarray(self.dense_ms), tok)
        ms += np.where(logits > 0, self._tokens_np(np.asarray(self.lm_head_ms), logits), 0.0)
        pre = self._bilinear_np(np.asarray(self.prefill_ms), q, self.n_q, kv)
        ms += np.where(q > 0, pre, 0.0)
        qd = min(decode_q, len(self.decode_ms))
        kv_mean = np.asarray(decode_kv_tokens, dtype=np.float64) / np.maximum(b, 1.0)
        dec = self._bilinear_np(np.asarray(self.decode_ms[qd - 1]), b, self.n_b, kv_mean)
        ms += np.where(b > 0, dec * (decode_q / qd), 0.0)
        kernels = ms * 1e-3
        host = self.host
        if host.graph_tokens:
            piecewise = np.where(q > 0, host.piecewise_s, 0.0)
            floor = np.where(tok > host.graph_tokens, host.eager_s, piecewise)
            kernels = np.maximum(kernels, floor)
        seqs = b + (q > 0)
        t = self.overhead.step_s(seqs, tok.astype(np.float64)) + kernels
        return np.maximum(t, self.hidden.step_s(seqs, tok.astype(np.float64)))


_log2 = math.log2


def _interpolate(table: list[float], x: float, n_x: int, y: float, ppo: int, n_y: int) -> float:
    """Bilinear interpolation of a flat `n_x` x `n_y` log2 grid with `ppo` points per
    octave at (x, y); beyond the grid's last point, linear in the size."""
    scale = 1.0
    u = _log2(x) * ppo if x > 1.0 else 0.0
    if u >= n_x - 1:
        scale *= x / 2.0 ** ((n_x - 1) / ppo)
        u = n_x - 1.000001
    v = _log2(y) * ppo if y > 1.0 else 0.0
    if v >= n_y - 1:
        scale *= y / 2.0 ** ((n_y - 1) / ppo)
        v = n_y - 1.000001
    i, j = int(u), int(v)
    fu, fv = u - i, v - j
    r0, r1 = i * n_y + j, (i + 1) * n_y + j
    lo = table[r0] + fv * (table[r0 + 1] - table[r0])
    hi = table[r1] + fv * (table[r1 + 1] - table[r1])
    return scale * (lo + fu * (hi - lo))


def _monotone(values: np.ndarray, rows: int | None = None) -> list[float]:
    """More work never costs less: running maximum along each table axis (a kernel
    for a smaller problem could always pad to the larger one)."""
    if rows is None:
        return np.maximum.accumulate(values).tolist()
    grid = values.reshape(rows, -1)
    grid = np.maximum.accumulate(np.maximum.accumulate(grid, axis=0), axis=1)
    return grid.ravel().tolist()


def compile_step_latency(
    pricing: Pricing,
    overhead: EngineOverhead,
    *,
    label: str,
    is_estimate: bool,
    grid: TableGrid | None = None,
    hidden: EngineOverhead | None = None,
    engine: str = "",
    host: HostFloor = NO_HOST_FLOOR,
) -> CompiledStepLatency:
    """Tabulate `pricing` for one shape, accelerator and TP degree (calls the models once).
    `overhead` adds to every step (its `per_seq_forward` resolved on this shape's one-token
    forward); `hidden` (async scheduling) is the CPU work a step lasts at least; `host`
    the host's launches a step's kernels last at least; `engine` names the release it
    was priced as."""
    grid = grid or TableGrid()
    if grid.max_tokens % TOKEN_STEP or grid.max_tokens < 2 * TOKEN_STEP:
        raise ValueError(f"TableGrid.max_tokens must be a multiple of {TOKEN_STEP}, >= 16")
    hidden = EngineOverhead() if hidden is None else hidden
    for name, value in (("overhead", overhead), ("hidden", hidden)):
        if not isinstance(value, EngineOverhead):
            raise ValueError(f"{name} must be an EngineOverhead, got {value!r}")
    ppo = grid.points_per_octave
    small = np.maximum(np.arange(SMALL_TOKENS + 1), 1)  # 1 (for 0), 1, 2, ..., 7
    tokens = np.concatenate([small, np.arange(TOKEN_STEP, grid.max_tokens + 1, TOKEN_STEP)])
    q_axis = _log_grid(grid.max_log2_q, ppo)
    b_axis = _log_grid(grid.max_log2_batch, ppo)
    kv_axis = _log_grid(grid.max_log2_kv, ppo)
    qq, kk = np.meshgrid(q_axis, kv_axis, indexing="ij")
    prefill = pricing.prefill_attn_ms(qq.ravel(), np.maximum(kk, qq).ravel())
    bb, kvb = np.meshgrid(b_axis, kv_axis, indexing="ij")
    b_flat, kv_flat = bb.ravel(), kvb.ravel()
    decode_one = pricing.decode_attn_ms(b_flat, kv_flat, 1)
    n_b = b_axis.shape[0]
    decode = [_monotone(decode_one, n_b)] + [
        _monotone(decode_one * pricing.verify_ratio(b_flat, kv_flat, q), n_b)
        for q in range(2, grid.max_verify_q + 1)
    ]
    shape, acc = pricing.shape, pricing.roofline.accelerator
    forward_s = pricing.forward_outside_experts_ms() * 1e-3
    return CompiledStepLatency(
        shape_name=shape.name,
        accelerator=acc.name,
        tp=pricing.tp,
        is_estimate=is_estimate,
        label=label,
        estimated_ops=() if is_estimate else pricing.estimated_ops(),
        overhead=overhead.resolved(forward_s),
        ppo=ppo,
        dense_ms=_monotone(pricing.dense_ms(tokens)),
        lm_head_ms=_monotone(pricing.lm_head_ms(tokens)),
        prefill_ms=_monotone(prefill, q_axis.shape[0]),
        decode_ms=decode,
        n_kv=kv_axis.shape[0],
        n_q=q_axis.shape[0],
        n_b=n_b,
        grid=grid,
        precision=shape.precision.label,
        hidden=hidden,
        engine=engine,
        layout=pricing.layout.key,
        host=host,
        forward_s=forward_s,
    )
