"""Timing of one operator call: warm-up, repeats, median / p10 / p90 in milliseconds.

On CUDA each repeat is bracketed by CUDA events on the current stream and the
device is synchronised once before and once after the repeats. Before each
repeat a short device-side sleep (`torch.cuda._sleep`) keeps the GPU busy while
the host queues the start event, the call and the end event, so the interval
holds the call's kernels back to back: a small kernel (a decode GEMM runs for
~10 us on an H200) is otherwise timed with the host's launch latency in it, as
the GPU idles between the start event and the kernel. CUDA graphs, which
serving engines use for decode, remove that latency too. On CPU each repeat is
timed with `time.perf_counter`; callers fix the thread count with
`fixed_threads` so runs are comparable, and `keep_host_memory` so a freed
output's pages are reused rather than faulted in afresh on the next call. Both
paths share `time_call`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class TimingConfig:
    """How hard to time one call.

    `max_seconds` caps the repeats of slow calls: after `min_repeats`, timing
    stops once that much wall time has been spent on repeats.
    """

    warmup: int = 2
    repeats: int = 15
    min_repeats: int = 3
    max_seconds: float = 0.25

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.min_repeats < 1 or self.repeats < self.min_repeats:
            raise ValueError(
                f"need 1 <= min_repeats <= repeats, got min_repeats={self.min_repeats}, "
                f"repeats={self.repeats}"
            )
        if not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")


@dataclass(frozen=True, slots=True)
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    num_repeats: int


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of ascending values, q in [0, 100]."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(times_ms: Sequence[float]) -> Timing:
    """Median, p10 and p90 of repeated timings (so p10 <= median <= p90)."""
    values = sorted(float(v) for v in times_ms)
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"timings must be finite and >= 0, got {values}")
    return Timing(
        median_ms=percentile(values, 50),
        p10_ms=percentile(values, 10),
        p90_ms=percentile(values, 90),
        num_repeats=len(values),
    )


@contextmanager
def fixed_threads(num_threads: int) -> Iterator[int]:
    """Run the block with `torch.set_num_threads(num_threads)`, restoring the old count."""
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    old = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield num_threads
    finally:
        torch.set_num_threads(old)


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc mallopt parameters (malloc.h)


def keep_host_memory() -> bool:
    """Make this process's allocator keep freed memory for reuse, as PyTorch's CUDA
    caching allocator (or the tcmalloc vLLM's CPU backend recommends) does.

    glibc's default serves large blocks with fresh mmap pages and returns freed
    heap tops to the OS, so an operator writing a multi-megabyte output pays for
    page faults on every call, and whether it does depends on what ran before
    (the dynamic mmap threshold): on this project's CPU an 8192-token MLP GEMM
    measured 43 or 58 ms from one sweep to the next. With mmap off and trimming
    off every call reuses warm pages. Process-wide and one-way; returns False
    (and changes nothing) where the C library is not glibc.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**30))


def time_call(fn: Callable[[], object], device: torch.device, config: TimingConfig) -> Timing:
    """Time `fn()` on `device` (CUDA events there, perf_counter on CPU)."""
    if device.type == "cuda":
        return _time_cuda(fn, device, config)
    return _time_cpu(fn, config)


def _time_cpu(fn: Callable[[], object], config: TimingConfig) -> Timing:
    with torch.inference_mode():
        for _ in range(config.warmup):
            fn()
        times: list[float] = []
        deadline = time.perf_counter() + config.max_seconds
        for i in range(config.repeats):
            start = time.perf_counter()
            fn()
            end = time.perf_counter()
            times.append((end - start) * 1e3)
            if i + 1 >= config.min_repeats and end >= deadline:
                break
    return summarize(times)


_SLEEP_CYCLES = 200_000  # ~0.1 ms at boost clock: longer than the host needs to queue one call


def _time_cuda(fn: Callable[[], object], device: torch.device, config: TimingConfig) -> Timing:
    with torch.inference_mode(), torch.cuda.device(device):
        for _ in range(config.warmup):
            fn()
        torch.cuda.synchronize(device)
        pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        deadline = time.perf_counter() + config.max_seconds
        for i in range(config.repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(_SLEEP_CYCLES)  # the host queues the call while the GPU sleeps
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
            # Host time: the launch queue is bounded, so a slow kernel stalls the host too.
            if i + 1 >= config.min_repeats and time.perf_counter() >= deadline:
                break
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in pairs]
    return summarize(times)
