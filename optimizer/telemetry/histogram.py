"""Cumulative Prometheus histograms: their window deltas, quantiles and samples.

A histogram is what `prometheus_client` exposes: for each upper bound `le` (the last
one +Inf) the number of observations <= it, plus their `_sum` and `_count`. Quantiles
are read as Prometheus's `histogram_quantile` reads them: find the bucket holding rank
q x count and interpolate linearly between its lower and upper bound (the first
bucket's lower bound is 0; a rank in the +Inf bucket returns the largest finite bound).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from optimizer.telemetry.errors import BucketMismatchError, CounterResetError, TelemetryError

# The +Inf bucket has no upper bound; when sampling from it, values are drawn up to the
# largest finite bound times this factor (or up to a bound the caller knows, such as the
# model's max_model_len for token counts).
INF_BUCKET_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class Histogram:
    """`upper_bounds` ascending, the last +Inf; `cumulative[i]` observations <= bound i;
    `sum` of the observed values (their unit: seconds or tokens, as the metric's name says)."""

    upper_bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float
    count: float

    def __post_init__(self) -> None:
        b = self.upper_bounds
        if not b or b[-1] != math.inf:
            raise TelemetryError(f"histogram buckets {b}: expected the last le to be +Inf")
        if len(self.cumulative) != len(b):
            raise TelemetryError("histogram: one cumulative count per bucket expected")
        if any(x >= y for x, y in itertools.pairwise(b)):
            raise TelemetryError(f"histogram buckets {b}: expected strictly ascending le")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: the finite bounds (+Inf is implied: JSON has no infinity)."""
        return {
            "le": list(self.upper_bounds[:-1]),
            "cumulative": list(self.cumulative),
            "sum": self.sum,
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Histogram:
        try:
            bounds = (*(float(b) for b in data["le"]), math.inf)  # type: ignore[attr-defined]
            cumulative = tuple(float(c) for c in data["cumulative"])  # type: ignore[attr-defined]
            return cls(bounds, cumulative, float(data["sum"]), float(data["count"]))  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as exc:
            raise TelemetryError(
                f"stored histogram: expected le, cumulative, sum, count ({exc})"
            ) from None

    @property
    def bucket_counts(self) -> np.ndarray:
        """Observations per bucket (not cumulative), bucket i being (bound i-1, bound i]."""
        return np.diff(np.asarray(self.cumulative, dtype=np.float64), prepend=0.0)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else math.nan

    def minus(self, before: Histogram, name: str) -> Histogram:
        """The observations made between `before` and this (a later scrape's) histogram."""
        if before.upper_bounds != self.upper_bounds:
            raise BucketMismatchError(
                f"{name}: the bucket boundaries differ between the scrapes (BEFORE le="
                f"{_bounds(before)}, AFTER le={_bounds(self)}); expected both scrapes from "
                "one vLLM version and configuration"
            )
        for bound, was, now in zip(
            self.upper_bounds, before.cumulative, self.cumulative, strict=True
        ):
            if now < was:
                raise CounterResetError(
                    f'counter reset between the scrapes: {name}_bucket{{le="{_le(bound)}"}} '
                    f"fell from {was:g} to {now:g}; take both scrapes from one server process"
                )
        if self.count < before.count:
            raise CounterResetError(
                f"counter reset between the scrapes: {name}_count fell from {before.count:g} "
                f"to {self.count:g}; take both scrapes from one server process"
            )
        cumulative = tuple(n - w for n, w in zip(self.cumulative, before.cumulative, strict=True))
        return Histogram(
            self.upper_bounds, cumulative, self.sum - before.sum, self.count - before.count
        )

    def quantile(self, q: float) -> float:
        """The q-quantile (0 < q < 1) by linear interpolation inside its bucket; NaN when
        empty."""
        total = self.cumulative[-1]
        if total <= 0:
            return math.nan
        rank = q * total
        cum = np.asarray(self.cumulative, dtype=np.float64)
        i = int(np.searchsorted(cum, rank, side="left"))
        if i == len(cum) - 1:  # in the +Inf bucket: the largest finite bound
            return self.upper_bounds[-2] if len(cum) > 1 else math.nan
        lower = 0.0 if i == 0 else self.upper_bounds[i - 1]
        below = 0.0 if i == 0 else float(cum[i - 1])
        in_bucket = float(cum[i]) - below
        return lower + (self.upper_bounds[i] - lower) * (rank - below) / in_bucket

    def sample(
        self, rng: np.random.Generator, n: int, *, inf_upper: float | None = None
    ) -> np.ndarray:
        """`n` values drawn from the buckets' shares. Inside a bucket (lower, upper] a value
        follows a lognormal fitted to the whole histogram (`lognormal_fit`), conditioned on
        the bucket: F^-1(F(lower) + (F(upper) - F(lower)) x u^k), u uniform (a bucket the
        lognormal gives no mass, or a histogram with one non-empty bucket, is filled
        linearly: lower + (upper - lower) x u^k). k = 1 keeps that shape; one k common to
        all buckets is then chosen (by bisection, within [1/16, 16]) so that the values'
        mean equals the exact `sum / count`. The +Inf bucket spans up to `inf_upper`, else
        the largest finite bound x INF_BUCKET_FACTOR."""
        counts = self.bucket_counts
        if counts.sum() <= 0:
            raise TelemetryError("cannot sample an empty histogram")
        finite = self.upper_bounds[:-1]
        largest = finite[-1] if finite else 1.0
        top = inf_upper if inf_upper is not None else largest * INF_BUCKET_FACTOR
        uppers = np.asarray((*finite, max(top, largest)), dtype=np.float64)
        lowers = np.concatenate(([0.0], uppers[:-1]))
        idx = rng.choice(len(counts), size=n, p=counts / counts.sum())
        low, span, u = lowers[idx], uppers[idx] - lowers[idx], rng.random(n)
        fit = self.lognormal_fit()
        shaped = np.zeros(n, dtype=bool)
        if fit is not None:
            from scipy.stats import lognorm

            dist = lognorm(s=fit[1], scale=math.exp(fit[0]))
            f_low, f_high = dist.cdf(low), dist.cdf(low + span)
            shaped = (f_high - f_low) > 1e-9

        def values(k: float) -> np.ndarray:
            out = low + span * u**k
            if shaped.any():
                q = f_low[shaped] + (f_high[shaped] - f_low[shaped]) * u[shaped] ** k
                inside = dist.ppf(q)
                out[shaped] = np.clip(inside, low[shaped], (low + span)[shaped])
            return out

        target = self.mean
        lo, hi = math.log(1 / 16), math.log(16)  # log k; the mean falls as k grows
        if not math.isfinite(target) or not values(math.exp(hi)).mean() <= target:
            return values(math.exp(hi)) if math.isfinite(target) else values(1.0)
        if values(math.exp(lo)).mean() <= target:
            return values(math.exp(lo))
        for _ in range(40):
            mid = (lo + hi) / 2
            if values(math.exp(mid)).mean() > target:
                lo = mid
            else:
                hi = mid
        return values(math.exp((lo + hi) / 2))

    def lognormal_fit(self) -> tuple[float, float] | None:
        """(mu, sigma) of the lognormal whose CDF best matches the cumulative shares at the
        finite bounds (least squares); None with fewer than two non-empty buckets."""
        counts = self.bucket_counts
        total = counts.sum()
        if total <= 0 or np.count_nonzero(counts) < 2 or len(self.upper_bounds) < 3:
            return None
        from scipy.optimize import minimize
        from scipy.stats import norm

        bounds = np.log(np.asarray(self.upper_bounds[:-1], dtype=np.float64))
        shares = np.asarray(self.cumulative[:-1], dtype=np.float64) / total
        mids = bounds[np.searchsorted(shares, 0.5)] if shares[-1] >= 0.5 else bounds[-1]

        def loss(x: np.ndarray) -> float:
            return float(np.sum((norm.cdf((bounds - x[0]) / math.exp(x[1])) - shares) ** 2))

        x0 = np.array([mids, 0.0])  # sigma 1; the simplex spans half a unit of each
        simplex = np.vstack([x0, x0 + np.array([0.5, 0.0]), x0 + np.array([0.0, -0.5])])
        options = {"xatol": 1e-4, "fatol": 1e-12, "initial_simplex": simplex}
        res = minimize(loss, x0, method="Nelder-Mead", options=options)
        mu, sigma = float(res.x[0]), math.exp(float(res.x[1]))
        return (mu, sigma) if math.isfinite(mu) and 1e-3 < sigma < 20 else None

    @classmethod
    def of(
        cls, values: np.ndarray, upper_bounds: tuple[float, ...], weights: np.ndarray | None = None
    ) -> Histogram:
        """Bin `values` (NaNs dropped) into these buckets as `prometheus_client` does: a
        value v counts in every bucket with le >= v."""
        v = np.asarray(values, dtype=np.float64)
        w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
        keep = ~np.isnan(v) & (w > 0)
        v, w = v[keep], w[keep]
        idx = np.searchsorted(np.asarray(upper_bounds), v, side="left")
        per_bucket = np.bincount(idx, weights=w, minlength=len(upper_bounds))
        cumulative = tuple(float(c) for c in np.cumsum(per_bucket))
        return cls(upper_bounds, cumulative, float(np.dot(v, w)), float(w.sum()))


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else f"{bound:g}"


def _bounds(h: Histogram) -> str:
    return "[" + ",".join(_le(b) for b in h.upper_bounds) + "]"
