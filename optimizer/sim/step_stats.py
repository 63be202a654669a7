"""What an instance's steps add up to, kept in memory that does not grow with steps.

`StepStats` takes one instance's steps as they end (`add`; `add_run` for k decode-only
steps at once) and keeps only aggregates: step count, busy seconds, the phase
breakdown, the peak KV use, the steps' ITL samples (into the run's `LogHistogram`:
a step's duration weighted by the sequences that decoded in it) and a time series of
batch size and KV use in `SERIES_BINS` bins from t = 0, whose width doubles (pairs
merge) when a step starts past the last bin. Steps are buffered and absorbed in bulk
with numpy: single steps in small typed arrays (every `CHUNK_STEPS` steps), decode runs
in preallocated numpy columns of `RUN_BUFFER_STEPS` rows (a run costs a few slice
copies, not a pass of its own), so a step costs what an append costs.

Measurement starts at `from_s` (steps ending at or before it count only in the step
count, the peak KV and the series), as a benchmark's warm-up is left out. After the
run `summary()` freezes the figures into a `StepSummary`, plain picklable data.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from optimizer.sim.histogram import LogHistogram

CHUNK_STEPS = 4096
RUN_BUFFER_STEPS = 1 << 16
SERIES_BINS = 1024
_FIRST_BIN_S = 2.0**-10  # a power of two: merged bins stay exact multiples


@dataclass(frozen=True, slots=True)
class StepSummary:
    """One instance's steps after the run (phase figures in instance seconds, not GPU
    seconds; `series_*`: per bin of `bin_s` seconds from t = 0 by step start, the busy
    seconds and the duration-weighted sums of sequences and KV blocks in use)."""

    num_steps: int  # all steps, measured or not
    busy_s: float  # measured steps
    prefill_only_s: float
    decode_only_s: float
    mixed_s: float
    num_prefill_only_steps: int
    num_decode_only_steps: int
    num_mixed_steps: int
    decode_tokens_in_mixed_steps: int
    prefill_stall_token_s: float
    itl_spike_tokens: int
    peak_kv_used_blocks: int
    bin_s: float
    series_busy_s: np.ndarray
    series_seqs_s: np.ndarray
    series_kv_s: np.ndarray

    @property
    def num_measured_steps(self) -> int:
        return self.num_prefill_only_steps + self.num_decode_only_steps + self.num_mixed_steps

    def series(
        self, horizon_s: float, kv_blocks: int, points: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bin starts, batch size, KV utilisation) in `points` equal bins over
        [0, horizon_s]: duration-weighted means, each bin of the kept series spread
        evenly over its time span (steps starting past the horizon count in the last)."""
        edges = np.linspace(0.0, horizon_s, points + 1)
        fine = np.arange(self.series_busy_s.size + 1) * self.bin_s

        def rebin(mass: np.ndarray) -> np.ndarray:
            cum = np.concatenate([np.zeros(1), np.cumsum(mass)])
            out = np.diff(np.interp(edges, fine, cum))
            out[-1] += cum[-1] - np.interp(edges[-1], fine, cum)
            return out

        w = rebin(self.series_busy_s)
        seqs, kv = rebin(self.series_seqs_s), rebin(self.series_kv_s)
        with np.errstate(invalid="ignore", divide="ignore"):
            batch = np.where(w > 0, seqs / w, 0.0)
            util = np.where(w > 0, kv / w / max(kv_blocks, 1), 0.0)
        return edges[:-1], batch, util


class StepStats:
    """One instance's steps, streamed into aggregates (see the module docstring).

    `decode_price(n, kv_tokens)` is the seconds of a decode-only step of n sequences
    attending to kv_tokens: a mixed step is compared with it (prefill stall, ITL
    spikes); None leaves those two figures at 0."""

    __slots__ = (
        "bin_s", "busy_s", "dec_s", "decode_price", "dur", "end", "from_s", "itl", "kv_q1",
        "kv_used", "mixed_s", "n_dec", "n_seqs", "num_decode", "num_mixed", "num_mixed_tokens",
        "num_prefill", "num_spike_tokens", "num_steps", "peak_kv", "pre_s", "run_dur",
        "run_end", "run_fill", "run_n", "run_used", "series_busy", "series_kv", "series_seqs",
        "stall_token_s",
    )  # fmt: skip

    def __init__(
        self,
        itl: LogHistogram,
        decode_price: Callable[[int, int], float] | None = None,
        from_s: float = -math.inf,
    ) -> None:
        self.itl = itl
        self.decode_price = decode_price
        self.from_s = from_s
        self.end = array("d")
        self.dur = array("d")
        self.n_dec = array("q")
        self.n_seqs = array("q")
        self.kv_used = array("q")
        self.kv_q1 = array("q")
        self.run_end = np.empty(RUN_BUFFER_STEPS)
        self.run_dur = np.empty(RUN_BUFFER_STEPS)
        self.run_n = np.empty(RUN_BUFFER_STEPS, dtype=np.int64)
        self.run_used = np.empty(RUN_BUFFER_STEPS, dtype=np.int64)
        self.run_fill = 0
        self.num_steps = 0
        self.busy_s = self.pre_s = self.dec_s = self.mixed_s = self.stall_token_s = 0.0
        self.num_prefill = self.num_decode = self.num_mixed = 0
        self.num_mixed_tokens = self.num_spike_tokens = 0
        self.peak_kv = 0
        self.bin_s = _FIRST_BIN_S
        self.series_busy = np.zeros(SERIES_BINS)
        self.series_seqs = np.zeros(SERIES_BINS)
        self.series_kv = np.zeros(SERIES_BINS)

    def add(
        self, end: float, dur: float, n_dec: int, n_seqs: int, kv_used: int, kv_q1: int
    ) -> None:
        """A step ended at `end` after `dur` s: `n_dec` of its `n_seqs` sequences decoded,
        `kv_used` blocks were in use after it, its decodes attended to `kv_q1` KV tokens."""
        self.end.append(end)
        self.dur.append(dur)
        self.n_dec.append(n_dec)
        self.n_seqs.append(n_seqs)
        self.kv_used.append(kv_used)
        self.kv_q1.append(kv_q1)
        if len(self.end) >= CHUNK_STEPS:
            self.flush()

    def add_run(
        self, ends: np.ndarray, durs: np.ndarray, n_dec: int, used0: int, need: np.ndarray
    ) -> None:
        """k decode-only steps of the same `n_dec` sequences, which ended at `ends` after
        `durs` (arrays of k): the first held `used0` KV blocks after it, the i-th (i >= 1)
        `used0 + need[i - 1]` (`need`: at least k - 1 block counts)."""
        k = ends.shape[0]
        if durs.shape != (k,) or need.shape[0] < k - 1:
            raise ValueError(
                f"StepStats.add_run: {k} step ends but {durs.shape[0]} durations and "
                f"{need.shape[0]} block counts (expected {k} and >= {k - 1})"
            )
        a = self.run_fill
        if a + k > RUN_BUFFER_STEPS:
            self.flush()
            a = 0
            if k > RUN_BUFFER_STEPS:  # too long to buffer: absorbed at once
                used = np.empty(k, dtype=np.int64)
                used[0] = used0
                np.add(need[: k - 1], used0, out=used[1:])
                dec = np.full(k, n_dec, dtype=np.int64)
                self._absorb(ends, durs, dec, dec, used, np.zeros(k, dtype=np.int64))
                return
        b = a + k
        self.run_end[a:b] = ends
        self.run_dur[a:b] = durs
        self.run_n[a:b] = n_dec
        self.run_used[a] = used0
        np.add(need[: k - 1], used0, out=self.run_used[a + 1 : b])
        self.run_fill = b

    def measure_from(self, t: float) -> None:
        """Count in the measured figures only the steps that end after `t` from now on."""
        self.flush()
        self.from_s = t

    def flush(self) -> None:
        """Absorb the buffered steps into the aggregates."""
        if self.end:
            cols = [np.array(c) for c in (self.end, self.dur, self.n_dec, self.n_seqs,
                                          self.kv_used, self.kv_q1)]  # fmt: skip
            for c in (self.end, self.dur, self.n_dec, self.n_seqs, self.kv_used, self.kv_q1):
                del c[:]
            self._absorb(*cols)
        k = self.run_fill
        if k:
            self.run_fill = 0
            dec = self.run_n[:k]  # decode-only: kv_q1 matters only for mixed steps
            no_kv = np.zeros(k, dtype=np.int64)
            self._absorb(self.run_end[:k], self.run_dur[:k], dec, dec, self.run_used[:k], no_kv)

    def _absorb(
        self,
        end: np.ndarray,
        dur: np.ndarray,
        n_dec: np.ndarray,
        n_seqs: np.ndarray,
        kv_used: np.ndarray,
        kv_q1: np.ndarray,
    ) -> None:
        if end.size == 0:
            return
        self.num_steps += int(end.size)
        self.peak_kv = max(self.peak_kv, int(kv_used.max()))
        self._add_series(end - dur, dur, n_seqs, kv_used)
        measured = end > self.from_s
        if not measured.all():
            dur, n_dec = dur[measured], n_dec[measured]
            n_seqs, kv_q1 = n_seqs[measured], kv_q1[measured]
        if dur.size == 0:
            return
        decoding = n_dec > 0
        self.itl.add_many(dur[decoding], n_dec[decoding])  # each decode waited the step
        pre, dec = ~decoding, n_seqs == n_dec
        mix = decoding & ~dec
        self.busy_s += float(dur.sum())
        self.pre_s += float(dur[pre].sum())
        self.dec_s += float(dur[dec].sum())
        self.num_prefill += int(pre.sum())
        self.num_decode += int(dec.sum())
        mixed = np.flatnonzero(mix)
        if mixed.size == 0:
            return
        self.mixed_s += float(dur[mixed].sum())
        self.num_mixed += int(mixed.size)
        self.num_mixed_tokens += int(n_dec[mixed].sum())
        price = self.decode_price
        if price is None:
            return
        for i in mixed.tolist():
            d, n = float(dur[i]), int(n_dec[i])
            base = price(n, int(kv_q1[i]))
            if d > base:
                self.stall_token_s += (d - base) * n
            if d > 2.0 * base:
                self.num_spike_tokens += n

    def _add_series(self, start: np.ndarray, dur: np.ndarray, n_seqs: np.ndarray,
                    kv_used: np.ndarray) -> None:  # fmt: skip
        last = float(start.max())
        while last >= self.bin_s * SERIES_BINS:  # double the bins' width: merge pairs
            for s in (self.series_busy, self.series_seqs, self.series_kv):
                merged = s.reshape(-1, 2).sum(axis=1)
                s[: SERIES_BINS // 2] = merged
                s[SERIES_BINS // 2 :] = 0.0
            self.bin_s *= 2.0
        b = np.clip((start / self.bin_s).astype(np.int64), 0, SERIES_BINS - 1)
        self.series_busy += np.bincount(b, weights=dur, minlength=SERIES_BINS)
        self.series_seqs += np.bincount(b, weights=dur * n_seqs, minlength=SERIES_BINS)
        self.series_kv += np.bincount(b, weights=dur * kv_used, minlength=SERIES_BINS)

    def summary(self) -> StepSummary:
        """The figures so far, frozen (absorbs the buffered steps first)."""
        self.flush()
        return StepSummary(
            num_steps=self.num_steps,
            busy_s=self.busy_s,
            prefill_only_s=self.pre_s,
            decode_only_s=self.dec_s,
            mixed_s=self.mixed_s,
            num_prefill_only_steps=self.num_prefill,
            num_decode_only_steps=self.num_decode,
            num_mixed_steps=self.num_mixed,
            decode_tokens_in_mixed_steps=self.num_mixed_tokens,
            prefill_stall_token_s=self.stall_token_s,
            itl_spike_tokens=self.num_spike_tokens,
            peak_kv_used_blocks=self.peak_kv,
            bin_s=self.bin_s,
            series_busy_s=self.series_busy.copy(),
            series_seqs_s=self.series_seqs.copy(),
            series_kv_s=self.series_kv.copy(),
        )
