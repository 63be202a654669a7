"""`LogHistogram`: a mergeable log-bucket histogram of weighted non-negative values.

Bucket k holds the values in [g^(k-s), g^(k-s+1)) for a ratio g = (1 + a) / (1 - a)
with a = `RELATIVE_ERROR`, and reports them as 2 g^(k-s+1) / (1 + g), which is
within a relative a of every value in the bucket. Zeros (ITL gaps of tokens that
arrived together) are counted exactly in a bucket of their own.

Guarantee: a percentile is the nearest-rank one on the weighted samples (the rule
of `optimizer.sim.metrics.Percentiles.of`), reported within a relative
`RELATIVE_ERROR` of the exact figure: buckets keep the values' order, so the
sample of that rank lies in the bucket the histogram reports (with integer
weights the ranks are exact; float weights only up to their summation order).
The weighted mean, the minimum and the maximum (the 0- and 1-quantiles) are
exact, and every reported percentile lies between the minimum and the maximum.

Values from `MIN_VALUE` to `MAX_VALUE` seconds are bucketed; smaller positive ones
count in the lowest bucket (an absolute error below `MIN_VALUE`), larger ones,
negative ones and NaN are refused.
"""

from __future__ import annotations

import math

import numpy as np

RELATIVE_ERROR = 0.005
MIN_VALUE = 1e-9
MAX_VALUE = 1e7

_GAMMA = (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR)
_INV_LOG_GAMMA = 1.0 / math.log(_GAMMA)
_SHIFT = -math.floor(math.log(MIN_VALUE) * _INV_LOG_GAMMA)  # bucket of MIN_VALUE: 0
_NUM_BUCKETS = int(math.log(MAX_VALUE) * _INV_LOG_GAMMA + _SHIFT) + 1


def _bucket_values() -> np.ndarray:
    upper = _GAMMA ** (np.arange(_NUM_BUCKETS) - _SHIFT + 1.0)
    return 2.0 * upper / (1.0 + _GAMMA)


_REPRESENTATIVES = _bucket_values()


class LogHistogram:
    """Weighted non-negative values (seconds) in log buckets; see the module docstring
    for what its figures guarantee. Mergeable and picklable."""

    __slots__ = ("counts", "max", "min", "total", "weighted_sum", "zeros")

    def __init__(self) -> None:
        self.counts = np.zeros(_NUM_BUCKETS)  # weight per bucket
        self.zeros = 0.0  # weight of the values equal to 0
        self.total = 0.0  # all the weight
        self.weighted_sum = 0.0  # sum of value x weight (the exact mean's numerator)
        self.min = math.inf
        self.max = -math.inf

    def __getstate__(self) -> tuple:
        return (self.counts, self.zeros, self.total, self.weighted_sum, self.min, self.max)

    def __setstate__(self, state: tuple) -> None:
        self.counts, self.zeros, self.total, self.weighted_sum, self.min, self.max = state

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LogHistogram):
            return NotImplemented
        return self.__getstate__()[1:] == other.__getstate__()[1:] and bool(
            np.array_equal(self.counts, other.counts)
        )

    __hash__ = None  # mutable

    # ------------------------------------------------------------------ adding

    def add(self, value: float, weight: float = 1.0) -> None:
        """Count `value` (>= 0) with `weight` (>= 0; a weight of 0 counts nothing)."""
        if not weight > 0.0:
            if weight != 0.0:
                raise ValueError(f"LogHistogram.add: weight must be >= 0, got {weight!r}")
            if not value >= 0.0:
                raise ValueError(f"LogHistogram.add: value must be >= 0 and not NaN, got {value!r}")
            return
        if not value > 0.0:
            if value != 0.0:
                raise ValueError(f"LogHistogram.add: value must be >= 0 and not NaN, got {value!r}")
            self.zeros += weight
        elif value > MAX_VALUE:
            raise ValueError(f"LogHistogram.add: value {value!r} is above {MAX_VALUE:g}")
        else:
            k = int(math.log(value) * _INV_LOG_GAMMA + _SHIFT)
            self.counts[k if k > 0 else 0] += weight
            self.weighted_sum += value * weight
        self.total += weight
        if value > self.max:
            self.max = value
        if value < self.min:
            self.min = value

    def add_many(self, values: np.ndarray, weights: np.ndarray | float = 1.0) -> None:
        """Count each of `values` (>= 0) with its weight (an array of the same length, or
        one weight for all)."""
        v = np.asarray(values, dtype=np.float64).ravel()
        w = np.broadcast_to(np.asarray(weights, dtype=np.float64), v.shape)
        if v.size == 0:
            return
        if not (v >= 0.0).all():
            bad = v[~(v >= 0.0)][0]
            raise ValueError(f"LogHistogram.add_many: values must be >= 0 and not NaN, got {bad!r}")
        if not (w >= 0.0).all():
            bad = w[~(w >= 0.0)][0]
            raise ValueError(f"LogHistogram.add_many: weights must be >= 0, got {bad!r}")
        top = float(v.max())
        if top > MAX_VALUE:
            raise ValueError(f"LogHistogram.add_many: value {top!r} is above {MAX_VALUE:g}")
        counted = w > 0.0
        if not counted.all():
            v, w = v[counted], w[counted]
            if v.size == 0:
                return
            top = float(v.max())
        low = float(v.min())
        pos = v > 0.0
        if not pos.all():
            self.zeros += float(w[~pos].sum())
            v, wp = v[pos], w[pos]
        else:
            wp = w
        if v.size:
            k = (np.log(v) * _INV_LOG_GAMMA + _SHIFT).astype(np.int64)
            np.maximum(k, 0, out=k)
            self.counts += np.bincount(k, weights=wp, minlength=_NUM_BUCKETS)
            self.weighted_sum += float(np.dot(v, wp))
        self.total += float(w.sum())
        self.max = max(self.max, top)
        self.min = min(self.min, low)

    def merge(self, other: LogHistogram) -> None:
        """Add all of `other`'s values to this histogram."""
        self.counts += other.counts
        self.zeros += other.zeros
        self.total += other.total
        self.weighted_sum += other.weighted_sum
        self.max = max(self.max, other.max)
        self.min = min(self.min, other.min)

    # ------------------------------------------------------------------ figures

    @property
    def mean(self) -> float:
        """The exact weighted mean (NaN when empty)."""
        return self.weighted_sum / self.total if self.total > 0 else math.nan

    def representatives(self) -> tuple[np.ndarray, np.ndarray]:
        """The non-empty buckets as (value, weight) pairs in increasing value: the zero
        bucket as 0, the others as their representative values (clipped to [min, max])."""
        nonzero = np.flatnonzero(self.counts > 0)
        values = np.clip(_REPRESENTATIVES[nonzero], self.min, self.max)
        weights = self.counts[nonzero]
        if self.zeros > 0:
            values = np.concatenate([np.zeros(1), values])
            weights = np.concatenate([np.full(1, self.zeros), weights])
        return values, weights

    def percentile(self, q: float) -> float:
        """The nearest-rank `q`-quantile (q in [0, 1]) of the weighted values, within
        `RELATIVE_ERROR` of the exact one; NaN when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"LogHistogram.percentile: q must be in [0, 1], got {q!r}")
        values, weights = self.representatives()
        if values.size == 0 or self.total <= 0:
            return math.nan
        if q == 0.0 or q == 1.0:  # the first and the last rank: exact
            return self.min if q == 0.0 else self.max
        cw = np.cumsum(weights)
        i = min(int(np.searchsorted(cw, q * cw[-1], side="left")), values.size - 1)
        return float(values[i])
