"""Profile grids and the sweep that measures them.

`ProfileGrid` lists the parameter points to measure; `default_cpu_grid()` suits
the tiny shape on a 2-core CPU (about 95 s), `default_gpu_grid()` a 7–8B
model on one H100/H200 (about 15 minutes), `quick_grid()` a smoke test of a
few seconds. `load_grid(path, base)` reads a JSON or YAML file whose keys
override `base`. `run_sweep(shape, grid, device)` returns the measurements as
`KernelSample`s; it never touches the database.

Attention lengths in a grid are totals of keys attended (`decode_kv_lens`,
`verify_kv_lens`) except prefill, given as cached context before the chunk
(`prefill_context_lens`, 0 = first chunk); a stored prefill sample has
kv_len = context + chunk.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from optimizer.dims import RankDims, check_tp
from optimizer.records import KernelSample, OpKind
from optimizer.shapes import ModelShape

if TYPE_CHECKING:
    from profiler.cases import Case

# (done, total, label of the case just finished)
ProgressFn = Callable[[int, int, str], None]

_ALL_OPS = tuple(OpKind)
COLD_CAP_MB = 256.0  # > any GPU's L2 and this CPU's L3
# imported only (measured by AIConfigurator or Vidur): GEMMs by shape and the collectives
NOT_PROFILED = (OpKind.GEMM, OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER)


@dataclass(frozen=True, slots=True)
class ProfileGrid:
    """Parameter points of a sweep; every tuple holds positive ints unless noted."""

    num_tokens: tuple[int, ...] = (
        *(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512),
        *(768, 1024, 1536, 2048),
    )
    tp_degrees: tuple[int, ...] = (1, 2, 4)
    lm_head_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    prefill_batch_sizes: tuple[int, ...] = (1, 2)
    prefill_chunk_lens: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    prefill_context_lens: tuple[int, ...] = (0, 128, 512, 2048)  # >= 0
    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_kv_lens: tuple[int, ...] = (16, 64, 128, 256, 512, 1024, 2048)
    verify_batch_sizes: tuple[int, ...] = (1, 4, 16)
    verify_k_values: tuple[int, ...] = (1, 2, 3, 5, 7)
    verify_kv_lens: tuple[int, ...] = (128, 512, 2048)
    mixed_chunk_lens: tuple[int, ...] = (0, 16, 64, 128, 256, 512)  # >= 0
    mixed_num_decodes: tuple[int, ...] = (0, 1, 4, 16, 32)  # >= 0
    mixed_decode_kv_lens: tuple[int, ...] = (128, 512, 1024)
    ops: tuple[OpKind, ...] = tuple(op for op in _ALL_OPS if op not in NOT_PROFILED)
    warmup: int = 2
    repeats: int = 21
    min_repeats: int = 5
    max_case_s: float = 0.2  # stop repeating a case after this much time (>= min_repeats)
    num_threads: int = 1  # CPU only: torch.set_num_threads during the sweep
    # Measure every case in this many passes over the whole grid, splitting the repeats;
    # keep the least disturbed pass (lowest median). On a shared machine a burst of
    # other work then inflates one pass of a case, not its figure.
    passes: int = 1
    # Skip attention and mixed cases whose KV cache (keys + values, one rank) exceeds this.
    max_kv_cache_gb: float = 1.0
    # Each case cycles through copies of its weights / KV caches totalling this many MB,
    # so they come from memory as in a forward (profiler.cases); None: the shape's
    # weight bytes per rank (a forward's reuse distance), capped at COLD_CAP_MB; 0: off.
    cold_cache_mb: float | None = None

    def __post_init__(self) -> None:
        zero_ok = {"prefill_context_lens", "mixed_chunk_lens", "mixed_num_decodes"}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "ops":
                bad = [op for op in value if op in NOT_PROFILED]
                if bad:
                    raise ValueError(f"grid ops: {bad} are imported, not profiled")
            elif isinstance(value, tuple):
                low = 0 if f.name in zero_ok else 1
                if any(not _is_int(v) or v < low for v in value):
                    raise ValueError(f"grid {f.name}: expected integers >= {low}, got {value}")
        for name in ("warmup", "repeats", "min_repeats", "num_threads", "passes"):
            value = getattr(self, name)
            if not _is_int(value) or value < (0 if name == "warmup" else 1):
                raise ValueError(f"grid {name}: expected a positive integer, got {value!r}")
        if self.min_repeats > self.repeats:
            raise ValueError(f"grid min_repeats {self.min_repeats} > repeats {self.repeats}")
        for name in ("max_case_s", "max_kv_cache_gb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"grid {name} must be a number > 0, got {value!r}")
        cold = self.cold_cache_mb
        if cold is not None and (
            isinstance(cold, bool) or not isinstance(cold, int | float) or not 0 <= cold < 1e6
        ):
            raise ValueError(f"grid cold_cache_mb must be null or a number >= 0, got {cold!r}")

    def cold_bytes(self, shape: ModelShape, tp: int) -> int:
        """Bytes a case's weights / KV caches rotate over (see `cold_cache_mb`)."""
        if self.cold_cache_mb is not None:
            return int(self.cold_cache_mb * 1e6)
        return int(min(shape.weight_bytes(tp), COLD_CAP_MB * 1e6))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def default_cpu_grid() -> ProfileGrid:
    """The tiny shape on this project's 2-core CPU: ~1,100 cases in 5 passes, ~95 s.

    Token counts reach 8192, vLLM's default token budget per step, and so cover
    the cache regimes a step goes through: on this CPU elementwise ops leave the
    2 MB L2 between 512 and 1024 tokens and run at L3 speed beyond, so a grid
    stopping at 2048 leaves only a few points past the bend. LM-head rows are
    denser than the base grid's so its 20% hold-out has more than a handful of
    rows and its small-row kernel switches are sampled. Five passes rather than
    three: the large memory-bound cases share this machine's L3 with other
    tenants, and a single disturbed case (one 6144-token embedding measured 1.7x
    its neighbours in all of three passes) moved an extrapolation median by 5
    points; with five the worst per-op median fell from ~9% to ~7% for +23 s.
    """
    tokens = (*ProfileGrid().num_tokens, 3072, 4096, 6144, 8192)
    rows = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256)
    return ProfileGrid(num_tokens=tokens, lm_head_rows=rows, passes=5)


def quick_grid() -> ProfileGrid:
    """A smoke test: every op at one or two points, a few seconds on CPU."""
    return ProfileGrid(
        num_tokens=(4, 32),
        tp_degrees=(1, 2),
        lm_head_rows=(2,),
        prefill_batch_sizes=(1,),
        prefill_chunk_lens=(16,),
        prefill_context_lens=(0, 32),
        decode_batch_sizes=(2,),
        decode_kv_lens=(64,),
        verify_batch_sizes=(2,),
        verify_k_values=(3,),
        verify_kv_lens=(64,),
        mixed_chunk_lens=(16,),
        mixed_num_decodes=(0, 2),
        mixed_decode_kv_lens=(64,),
        warmup=1,
        repeats=3,
        min_repeats=3,
        max_case_s=0.05,
    )


def default_gpu_grid() -> ProfileGrid:
    """A 7–8B model (bf16) on one H100/H200: ~2,700 cases, within ~15 minutes.

    Sized by a roofline estimate (about 3 minutes of kernel time at vendor peaks
    plus per-case allocation), leaving room for real kernel efficiency; the KV
    cap keeps every case inside an 80 GB part.
    """
    tokens = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
    tokens += (1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
    return ProfileGrid(
        num_tokens=tokens,
        tp_degrees=(1, 2, 4, 8),
        lm_head_rows=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
        prefill_batch_sizes=(1, 2, 4, 8),
        prefill_chunk_lens=(16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192),
        prefill_context_lens=(0, 512, 2048, 8192, 16384),
        decode_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        decode_kv_lens=(128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768),
        verify_batch_sizes=(1, 4, 16, 64, 256),
        verify_k_values=(1, 2, 3, 4, 5, 7),
        verify_kv_lens=(512, 2048, 8192),
        mixed_chunk_lens=(0, 128, 512, 2048),
        mixed_num_decodes=(0, 8, 32, 64),
        mixed_decode_kv_lens=(512, 2048),
        warmup=5,
        repeats=50,
        min_repeats=10,
        max_case_s=1.0,
        max_kv_cache_gb=40.0,
    )


def load_grid(path: str | Path, base: ProfileGrid | None = None) -> ProfileGrid:
    """Read a JSON/YAML mapping of ProfileGrid fields; unspecified fields come from `base`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            raise ValueError(f"unsupported extension {path.suffix!r}; use .json, .yaml or .yml")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read a profile grid: {exc}") from exc
    except Exception as exc:
        raise ValueError(f"{path}: cannot parse a profile grid: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of grid fields, got {type(data).__name__}")
    known = {f.name: f for f in fields(ProfileGrid)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{path}: unknown grid keys {unknown}; expected some of {sorted(known)}")
    values: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, list):
            if key == "ops":
                try:
                    value = tuple(OpKind(v) for v in value)
                except ValueError as exc:
                    raise ValueError(f"{path}: grid ops: {exc}") from exc
            else:
                value = tuple(value)
        elif isinstance(getattr(ProfileGrid(), key), tuple):
            raise ValueError(f"{path}: grid {key}: expected a list, got {value!r}")
        values[key] = value
    try:
        return replace(base or ProfileGrid(), **values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _kv_gb(dims: RankDims, num_tokens: int) -> float:
    """GB of keys + values one layer of one rank holds for `num_tokens` cached tokens."""
    per_token = 2 * dims.kv_heads * dims.head_dim * dims.dtype_bytes
    return num_tokens * per_token / 1e9


def plan_cases(shape: ModelShape, grid: ProfileGrid) -> list[Case]:
    """Every case of `grid` for `shape`, grouped by op; checks TP degrees first."""
    from profiler.cases import ATTENTION_OPS, TOKEN_OPS, TP_INDEPENDENT_OPS, Case

    for tp in grid.tp_degrees:
        check_tp(shape, tp)
    wanted = set(grid.ops)
    cases: list[Case] = []
    for op in TOKEN_OPS:
        if op in wanted:
            tps = (1,) if op in TP_INDEPENDENT_OPS else grid.tp_degrees
            cases += [Case(op, tp=tp, num_tokens=t) for tp in tps for t in grid.num_tokens]
    if OpKind.LM_HEAD in wanted:
        cases += [
            Case(OpKind.LM_HEAD, tp=tp, num_tokens=m)
            for tp in grid.tp_degrees
            for m in grid.lm_head_rows
        ]
    attention: dict[OpKind, list[tuple[int, int, int]]] = {
        OpKind.PREFILL_ATTN: [
            (b, q, ctx + q)
            for b in grid.prefill_batch_sizes
            for q in grid.prefill_chunk_lens
            for ctx in grid.prefill_context_lens
        ],
        OpKind.DECODE_ATTN: [
            (b, 1, kv) for b in grid.decode_batch_sizes for kv in grid.decode_kv_lens
        ],
        OpKind.VERIFY_ATTN: [
            (b, k + 1, kv)
            for b in grid.verify_batch_sizes
            for k in grid.verify_k_values
            for kv in grid.verify_kv_lens
            if kv >= k + 1
        ],
    }
    for op in ATTENTION_OPS:
        if op in wanted:
            cases += [
                Case(op, tp=tp, batch_size=b, q_len=q, kv_len=kv)
                for tp in grid.tp_degrees
                for b, q, kv in attention[op]
                if _kv_gb(RankDims.of(shape, tp), b * kv) <= grid.max_kv_cache_gb
            ]
    if OpKind.MIXED_ITERATION in wanted:
        points = {
            (chunk, n, kv if n else 0)
            for chunk in grid.mixed_chunk_lens
            for n in grid.mixed_num_decodes
            for kv in grid.mixed_decode_kv_lens
            if (chunk or n)
            and shape.num_layers * _kv_gb(RankDims.of(shape, 1), n * kv) <= grid.max_kv_cache_gb
        }
        cases += [
            Case(OpKind.MIXED_ITERATION, batch_size=n, q_len=chunk, kv_len=kv)
            for chunk, n, kv in sorted(points)
        ]
    return cases


def run_sweep(
    shape: ModelShape,
    grid: ProfileGrid,
    device: str | object = "cpu",
    progress: ProgressFn | None = None,
) -> list[KernelSample]:
    """Measure every case of `grid` for `shape` on `device` (a string or torch.device).

    On CPU the sweep runs with `grid.num_threads` torch threads, for operators
    and mixed iterations alike, after `timing.keep_host_memory()` (this process
    then keeps freed memory for reuse, like a caching allocator). With
    `grid.passes > 1` the grid is measured that many times, each pass taking its
    share of the repeats, and a case keeps the statistics of its pass with the
    lowest median. Progress is reported once per case (scaled over the passes).
    A case that runs out of GPU memory is skipped with a warning instead of
    losing the run.
    """
    import torch

    from profiler.cases import build_call, case_sample
    from profiler.device import parse_device
    from profiler.kernels import torch_dtype
    from profiler.mixed import build_forward, mixed_sample
    from profiler.timing import Timing, TimingConfig, fixed_threads, keep_host_memory, time_call

    dev = parse_device(device) if isinstance(device, str) else device
    if dev.type == "cpu":
        keep_host_memory()  # outputs reuse freed pages, as with a caching allocator
    dtype = torch_dtype(shape.dtype)
    cases = plan_cases(shape, grid)
    p = grid.passes
    timing = TimingConfig(
        grid.warmup,
        -(-grid.repeats // p),
        min(-(-grid.min_repeats // p), -(-grid.repeats // p)),
        grid.max_case_s / p,
    )
    threads = grid.num_threads if dev.type == "cpu" else torch.get_num_threads()
    best: dict[int, Timing] = {}
    skipped: set[int] = set()
    reported = 0
    with fixed_threads(threads):
        for step in range(p * len(cases)):
            i = step % len(cases)
            case = cases[i]
            if i not in skipped:
                try:
                    if case.op is OpKind.MIXED_ITERATION:
                        call = build_forward(shape, case.q_len, case.batch_size, case.kv_len, dev)
                    else:
                        call = build_call(case, shape, dev, dtype, grid.cold_bytes(shape, case.tp))
                    result = time_call(call, dev, timing)
                    del call
                    if i not in best or result.median_ms < best[i].median_ms:
                        best[i] = result
                except torch.cuda.OutOfMemoryError:
                    warnings.warn(f"{case.label}: out of GPU memory, skipped", stacklevel=2)
                    skipped.add(i)
                    best.pop(i, None)
                    torch.cuda.empty_cache()
            done = (step + 1) // p
            while progress is not None and reported < done:
                reported += 1
                progress(reported, len(cases), case.label)
    samples = []
    for i, case in enumerate(cases):
        if i in best:
            if case.op is OpKind.MIXED_ITERATION:
                samples.append(
                    mixed_sample(shape, case.q_len, case.batch_size, case.kv_len, best[i])
                )
            else:
                samples.append(case_sample(case, shape, best[i]))
    return samples
