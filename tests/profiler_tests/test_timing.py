"""Timing statistics and the CPU/CUDA timing loops (no speed assertions)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from profiler.timing import Timing, TimingConfig, fixed_threads, percentile, summarize, time_call


def test_summarize_golden_case() -> None:
    # Sorted 1..5: positions (n-1)·q = 0.4, 2, 3.6 -> 1.4, 3, 4.6 (linear interpolation).
    assert summarize([5.0, 1.0, 3.0, 2.0, 4.0]) == Timing(
        median_ms=3.0, p10_ms=1.4, p90_ms=pytest.approx(4.6), num_repeats=5
    )
    assert summarize([2.0]) == Timing(2.0, 2.0, 2.0, 1)
    assert percentile([1.0, 3.0], 50) == 2.0


def test_summarize_rejects_bad_timings() -> None:
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    with pytest.raises(ValueError, match="finite"):
        summarize([1.0, float("nan")])


@pytest.mark.parametrize("values", [[0.3, 0.1, 7.0, 0.2], [1.0] * 4, [9.0, 0.0, 4.0]])
def test_percentiles_are_ordered(values: list[float]) -> None:
    t = summarize(values)
    assert min(values) <= t.p10_ms <= t.median_ms <= t.p90_ms <= max(values)


def test_timing_config_validation() -> None:
    with pytest.raises(ValueError, match="min_repeats"):
        TimingConfig(repeats=2, min_repeats=3)
    with pytest.raises(ValueError, match="warmup"):
        TimingConfig(warmup=-1)
    with pytest.raises(ValueError, match="max_seconds"):
        TimingConfig(max_seconds=0)


def test_cpu_timing_counts_warmup_and_repeats() -> None:
    calls = []
    t = time_call(lambda: calls.append(1), torch.device("cpu"), TimingConfig(2, 7, 3, 60.0))
    assert t.num_repeats == 7 and len(calls) == 9
    assert 0 <= t.p10_ms <= t.median_ms <= t.p90_ms


def test_cpu_timing_stops_after_budget_but_not_before_min_repeats() -> None:
    calls = []
    cfg = TimingConfig(warmup=0, repeats=100, min_repeats=4, max_seconds=1e-9)
    t = time_call(lambda: calls.append(1), torch.device("cpu"), cfg)
    assert t.num_repeats == 4 and len(calls) == 4


def test_fixed_threads_restores() -> None:
    before = torch.get_num_threads()
    with fixed_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="num_threads"), fixed_threads(0):
        pass


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timing_with_events() -> None:
    dev = torch.device("cuda", 0)
    a = torch.randn(1024, 1024, device=dev)
    t = time_call(lambda: a @ a, dev, TimingConfig(2, 10, 3, 5.0))
    assert t.num_repeats == 10
    assert 0 < t.p10_ms <= t.median_ms <= t.p90_ms


_KEEP = """
import ctypes
from profiler.timing import keep_host_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p

def kept_after_free():
    p = libc.malloc(40_000_000)  # 40 MB: above glibc's largest mmap threshold
    libc.free(ctypes.c_void_p(p))
    return libc.mallinfo2().fordblks  # free bytes the heap keeps for reuse

before = kept_after_free()
print(before, keep_host_memory(), kept_after_free())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc allocator tuning is Linux-only")
def test_keep_host_memory_keeps_freed_blocks_for_reuse() -> None:
    # A fresh process: the setting is process-wide and one-way.
    out = subprocess.run(
        [sys.executable, "-c", _KEEP], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    before, applied, after = int(out[0]), out[1] == "True", int(out[2])
    assert applied
    assert before < 10_000_000  # glibc's default: the block was mmap'd and handed back
    assert after >= 40_000_000  # now it stays in the heap, its pages warm for the next call
