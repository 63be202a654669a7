"""Synthetic traces from a sample: days of traffic made from an hour's requests.

`synthesize` keeps what a short sample tells about requests and takes the rate over
time from a `RateCurve`:

- **Lengths.** Each synthetic request takes the (prompt, output) token pair of one
  sample request drawn uniformly with replacement, so the pairs' joint distribution
  (and the correlation of prompt and output lengths) is the sample's; every pair in the
  result is a pair of the sample. Nothing else is carried over: prefix hashes would
  make requests a week apart share a prompt because they copy one sample request (an
  hour's sample drawn a million times would read as a prefix-cache hit ratio near 1),
  session ids would join unrelated requests into sessions, and acceptance lengths
  belong to the sampled engine and draft. A synthetic trace has lengths and arrivals
  only.
- **Arrivals.** A non-homogeneous Poisson process of rate
  lambda(t) = c * curve(t) on [0, days * 24 h), with c chosen so that the expected count
  is mean_rate * span (the curve's mean over the span is scaled to `mean_rate`), made by
  time rescaling: the points S_1 < S_2 < ... of a unit-rate Poisson process (cumulative
  sums of standard exponential gaps) below Lambda(span) are mapped to
  t_i = Lambda^-1(S_i), Lambda(t) the integral of lambda. The curve is linear between
  its points, so Lambda is a quadratic on each segment and its inverse exact (no
  rejection, no grid): with d = S - Lambda(t_k), rate r_k at the segment's start and
  slope a, t = t_k + 2d / (r_k + sqrt(r_k^2 + 2 a d)). Gaps are drawn and mapped in
  blocks of `_BLOCK` with numpy (no Python step per request); memory is the result's
  three columns plus one block.
- **Clock.** t = 0 is midnight of day 0 (Monday 00:00 on an `hour_of_week` curve). The
  first request arrives after it (at about 1 / rate), not at 0: the hour of day stays
  readable from `arrival_s`.
- **Seed.** One seed makes both streams: `SeedSequence(seed).spawn(2)` gives the
  arrivals' and the lengths' generators, so equal inputs give identical columns.

`diurnal` (`DIURNAL`) is a stylised day, not fitted to any trace: 24 hourly points of
1 + a cos(2 pi (h - 14) / 24), peak at 14:00, trough at 02:00, with a = 0.6 so that
peak / trough = 1.6 / 0.4 = 4, inside the 3-10x swing between night and the daily
peak that issue 44 quotes for real services. The points' mean is exactly 1 (a cosine
sampled at 24 even steps sums to 0), so the curve's mean over whole days is its
scale's. It has no weekend: a one-hour sample says nothing about a week's shape, and
no figure here could be checked. Give a weekly shape (weekends, a Monday rush) as an
`hour_of_week` curve file.

A curve file (`parse_rate_curve`, `format_rate_curve` writes one) is UTF-8 CSV:
- blank lines and lines whose first non-blank character is `#` are skipped;
- the header names two columns: the axis (`hour_of_day`, `hour_of_week` or `hour`,
  `optimizer.records.RateCurveAxis`) and `relative_rate`;
- then one point a line: hours (a decimal number; `hour_of_day` in [0, 24),
  `hour_of_week` in [0, 168) with 0 = Monday 00:00, `hour` >= 0 from the trace's
  start), strictly increasing, and a relative rate (a number >= 0; only ratios count);
- between 1 and `MAX_CURVE_POINTS` points, not all zero. A periodic curve wraps (the
  last point joins the first one period later; one point is a constant); an `hour`
  curve must start at 0 and reach the trace's end (checked against `--days`).
Errors (`RateCurveError`) name the file, the 1-based line and what was expected.

Refused (`SynthesisError`, before anything is drawn): days not in (0, `MAX_DAYS`],
a mean rate not > 0, a seed < 0, a sample of fewer than `MIN_SAMPLE_REQUESTS`
requests, an `hour` curve that does not cover the span, a curve that is zero over the
whole span, more expected requests than `max_requests`.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path

import numpy as np

from optimizer.plain import to_plain
from optimizer.records import RateCurve, RateCurveAxis, SyntheticOrigin, TraceColumns

# A month: any billing period a plan is priced over, and past it a daily or weekly
# curve only repeats itself (a longer span is the same weeks again, only slower to make)
MAX_DAYS = 31.0
# Fewer sample requests than this resample to a length mix that is mostly chance
MIN_SAMPLE_REQUESTS = 10
MAX_CURVE_POINTS = 100_000  # a month by the minute is 44,640
MAX_CURVE_BYTES = 10 * 1024 * 1024
DIURNAL_PEAK_HOUR = 14
DIURNAL_TROUGH_HOUR = 2
DIURNAL_PEAK_TO_TROUGH = 4.0
# The generator's version: part of a synthetic trace's identity (`origin_digest`), so a
# change to how rows are drawn never returns a trace drawn the old way
SYNTHESIS_VERSION = 1

PERIOD_H = {RateCurveAxis.HOUR_OF_DAY: 24.0, RateCurveAxis.HOUR_OF_WEEK: 168.0}
_RATE_COLUMN = "relative_rate"
_BLOCK = 1 << 20  # unit-process points drawn and mapped at a time


class RateCurveError(ValueError):
    """A rate curve (file or value) that cannot be used: where, what, what was expected."""


class SynthesisError(ValueError):
    """A synthesis request that cannot be met: what, and what was expected."""


def _diurnal() -> RateCurve:
    r = DIURNAL_PEAK_TO_TROUGH
    amplitude = (r - 1.0) / (r + 1.0)
    hours = tuple(float(h) for h in range(24))
    rates = tuple(
        1.0 + amplitude * math.cos(2.0 * math.pi * (h - DIURNAL_PEAK_HOUR) / 24.0) for h in hours
    )
    return RateCurve("diurnal", RateCurveAxis.HOUR_OF_DAY, hours, rates)


DIURNAL = _diurnal()


# ----------------------------------------------------------------------------- curves


def check_rate_curve(curve: RateCurve, where: str = "rate curve") -> None:
    """Raise `RateCurveError` unless `curve`'s points are usable (see the module doc)."""
    hours, rates = curve.hours, curve.relative_rates
    if not 1 <= len(hours) <= MAX_CURVE_POINTS:
        raise RateCurveError(f"{where}: {len(hours):,} points; expected 1 to {MAX_CURVE_POINTS:,}")
    if len(rates) != len(hours):
        raise RateCurveError(f"{where}: {len(hours)} hours but {len(rates)} relative rates")
    period = PERIOD_H.get(curve.axis)
    for i, (h, r) in enumerate(zip(hours, rates, strict=True)):
        _check_point(h, r, curve.axis, period, f"{where}: point {i + 1}")
        if i and not h > hours[i - 1]:
            raise RateCurveError(
                f"{where}: point {i + 1} at hour {h:g} does not come after hour "
                f"{hours[i - 1]:g}; expected strictly increasing hours"
            )
    if not any(r > 0 for r in rates):
        raise RateCurveError(f"{where}: every relative rate is 0; expected some above 0")


def _check_point(h: float, r: float, axis: RateCurveAxis, period: float | None, where: str) -> None:
    if not math.isfinite(h) or h < 0 or (period is not None and h >= period):
        expected = f"0 <= hour < {period:g}" if period is not None else "a finite hour >= 0"
        raise RateCurveError(f"{where}: {axis.value} {h!r}; expected {expected}")
    if not math.isfinite(r) or r < 0:
        raise RateCurveError(f"{where}: relative_rate {r!r}; expected a finite number >= 0")


def _number(text: str, where: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise RateCurveError(f"{where}: {column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise RateCurveError(f"{where}: {column} {text!r}; expected a finite number")
    return value


def parse_rate_curve(text: str, source: str) -> RateCurve:
    """The curve a curve file's `text` holds (`source`: its name, for errors and the
    curve's name)."""
    axes = [a.value for a in RateCurveAxis]
    header: RateCurveAxis | None = None
    hours: list[float] = []
    rates: list[float] = []
    for number, fields in _records(text, source):
        where = f"{source}: line {number}"
        if header is None:
            names = [f.strip() for f in fields]
            if len(names) != 2 or names[1] != _RATE_COLUMN or names[0] not in axes:
                raise RateCurveError(
                    f"{where}: header {','.join(names)!r}; expected two columns, one of "
                    f"{', '.join(axes)} then {_RATE_COLUMN}"
                )
            header = RateCurveAxis(names[0])
            continue
        if len(fields) != 2:
            raise RateCurveError(
                f"{where}: {len(fields)} fields; expected 2 ({header.value},{_RATE_COLUMN})"
            )
        if len(hours) == MAX_CURVE_POINTS:
            raise RateCurveError(f"{where}: more than {MAX_CURVE_POINTS:,} points")
        h = _number(fields[0].strip(), where, header.value)
        r = _number(fields[1].strip(), where, _RATE_COLUMN)
        _check_point(h, r, header, PERIOD_H.get(header), where)
        if hours and not h > hours[-1]:
            raise RateCurveError(
                f"{where}: hour {h:g} is not after the previous point's hour "
                f"{hours[-1]:g}; expected strictly increasing hours"
            )
        hours.append(h)
        rates.append(r)
    if header is None:
        raise RateCurveError(
            f"{source}: no header; expected a line '<{' | '.join(axes)}>,"
            f"{_RATE_COLUMN}' and then one point a line"
        )
    if not hours:
        raise RateCurveError(f"{source}: a header and no points; expected at least one point")
    curve = RateCurve(Path(source).name, header, tuple(hours), tuple(rates))
    check_rate_curve(curve, source)
    return curve


def _records(text: str, source: str):
    """(1-based line number, fields) of each line that is neither blank nor a comment."""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            fields = next(csv.reader([line]))
        except csv.Error as exc:
            raise RateCurveError(f"{source}: line {number}: {exc}") from None
        yield number, fields


def read_rate_curve(path: str | Path) -> RateCurve:
    """The curve in the file at `path` (`RateCurveError` naming the file when it is
    missing, too large, not UTF-8 or malformed)."""
    path = Path(path)
    if not path.is_file():
        raise RateCurveError(f"{path}: no such file; expected a rate curve CSV or 'diurnal'")
    size = path.stat().st_size
    if size > MAX_CURVE_BYTES:
        raise RateCurveError(
            f"{path}: {size:,} bytes; expected a curve file of at most {MAX_CURVE_BYTES:,}"
        )
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise RateCurveError(f"{path}: not UTF-8 (byte {exc.start})") from None
    return parse_rate_curve(text, str(path))


def format_rate_curve(curve: RateCurve) -> str:
    """`curve` as a curve file (`parse_rate_curve` reads it back equal, bar the name)."""
    lines = [f"{curve.axis.value},{_RATE_COLUMN}"]
    lines += [f"{h!r},{r!r}" for h, r in zip(curve.hours, curve.relative_rates, strict=True)]
    return "\n".join(lines) + "\n"


def relative_rate_at(curve: RateCurve, hours: np.ndarray) -> np.ndarray:
    """The curve's relative rate at `hours` (from the trace's start), interpolated."""
    h = np.asarray(hours, dtype=np.float64)
    xs = np.asarray(curve.hours, dtype=np.float64)
    ys = np.asarray(curve.relative_rates, dtype=np.float64)
    period = PERIOD_H.get(curve.axis)
    if period is None:
        return np.interp(h, xs, ys)
    # One period closed on both sides: the last point joins the first a period later.
    xs = np.concatenate(([xs[-1] - period], xs, [xs[0] + period]))
    ys = np.concatenate(([ys[-1]], ys, [ys[0]]))
    return np.interp(np.mod(h, period), xs, ys)


def rate_knots(curve: RateCurve, span_h: float) -> tuple[np.ndarray, np.ndarray]:
    """(hours, relative rates) of the curve's corners on [0, span_h], both ends included:
    the curve is linear between consecutive knots."""
    points = np.asarray(curve.hours, dtype=np.float64)
    period = PERIOD_H.get(curve.axis)
    if period is not None:
        repeats = np.arange(math.ceil(span_h / period) + 1, dtype=np.float64) * period
        points = (points[None, :] + repeats[:, None]).ravel()
    inside = points[(points > 0) & (points < span_h)]
    knots = np.concatenate(([0.0], inside, [span_h]))
    return knots, relative_rate_at(curve, knots)


# ----------------------------------------------------------------------------- synthesis


def check_request(
    *,
    num_sample: int,
    curve: RateCurve,
    days: float,
    mean_rate: float,
    seed: int,
    max_requests: int | None = None,
) -> None:
    """Raise `SynthesisError` (or `RateCurveError`) for a request `synthesize` refuses,
    before anything is drawn."""
    if not (math.isfinite(days) and 0 < days <= MAX_DAYS):
        raise SynthesisError(f"--days {days!r}; expected a number of days in (0, {MAX_DAYS:g}]")
    if not (math.isfinite(mean_rate) and mean_rate > 0):
        raise SynthesisError(f"--mean-rate {mean_rate!r}; expected requests/s > 0")
    if seed < 0:
        raise SynthesisError(f"--seed {seed}; expected an integer >= 0")
    if num_sample < MIN_SAMPLE_REQUESTS:
        raise SynthesisError(
            f"the sample has {num_sample} requests; expected at least {MIN_SAMPLE_REQUESTS} "
            "to resample lengths from"
        )
    check_rate_curve(curve, f"rate curve {curve.name!r}")
    span_h = days * 24.0
    if curve.axis is RateCurveAxis.HOUR and (curve.hours[0] != 0 or curve.hours[-1] < span_h):
        raise SynthesisError(
            f"rate curve {curve.name!r} runs from hour {curve.hours[0]:g} to "
            f"{curve.hours[-1]:g}; a {days:g}-day trace needs hours from 0 to at least "
            f"{span_h:g} (or a periodic hour_of_day / hour_of_week curve)"
        )
    _, rates = rate_knots(curve, span_h)
    if not np.any(rates > 0):
        raise SynthesisError(
            f"rate curve {curve.name!r} is 0 over the whole {days:g} days; expected some "
            "hours above 0"
        )
    expected = mean_rate * span_h * 3600.0
    if max_requests is not None and expected > max_requests:
        raise SynthesisError(
            f"{mean_rate:g} req/s over {days:g} days is {expected:,.0f} requests; expected "
            f"at most {max_requests:,} (the trace row limit)"
        )


def arrival_times(
    curve: RateCurve, *, span_s: float, mean_rate: float, rng: np.random.Generator
) -> np.ndarray:
    """Sorted arrival times (s) on [0, span_s): a Poisson process whose rate follows
    `curve`, scaled so that mean_rate * span_s requests are expected (module doc)."""
    knots_h, rel = rate_knots(curve, span_s / 3600.0)
    knots = knots_h * 3600.0
    widths = np.diff(knots)
    rel_area = np.concatenate(([0.0], np.cumsum((rel[1:] + rel[:-1]) * 0.5 * widths)))
    scale = mean_rate * span_s / rel_area[-1]
    rate = rel * scale  # req/s at the knots
    cum = rel_area * scale  # expected arrivals before each knot
    slope = np.diff(rate) / widths  # req/s per s on each segment
    total = float(cum[-1])
    last = len(knots) - 2
    blocks: list[np.ndarray] = []
    offset = 0.0
    while True:
        s = np.cumsum(rng.standard_exponential(_BLOCK))
        s += offset
        done = s[-1] >= total
        if done:
            s = s[: int(np.searchsorted(s, total, side="left"))]
        offset = float(s[-1]) if s.size else offset
        blocks.append(_invert(s, knots, rate, cum, slope, widths, last))
        if done:
            break
    times = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    # Segments meet exactly; within one, rounding could reorder two points an ulp apart.
    np.maximum.accumulate(times, out=times)
    return times


def _invert(
    s: np.ndarray,
    knots: np.ndarray,
    rate: np.ndarray,
    cum: np.ndarray,
    slope: np.ndarray,
    widths: np.ndarray,
    last: int,
) -> np.ndarray:
    """Lambda^-1(s): the times at which the expected arrival count reaches `s`."""
    k = np.searchsorted(cum, s, side="right") - 1
    np.clip(k, 0, last, out=k)
    d = s - cum[k]
    r0 = rate[k]
    root = r0 * r0 + 2.0 * slope[k] * d
    np.maximum(root, 0.0, out=root)
    np.sqrt(root, out=root)
    root += r0
    step = np.divide(2.0 * d, root, out=np.zeros_like(d), where=root > 0)
    np.clip(step, 0.0, widths[k], out=step)
    step += knots[k]
    return step


def synthesize(
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    *,
    curve: RateCurve,
    days: float,
    mean_rate: float,
    seed: int,
    max_requests: int | None = None,
) -> TraceColumns:
    """A synthetic trace: the sample's (prompt, output) pairs resampled under `curve`
    over `days` days at `mean_rate` req/s on average (module doc)."""
    inp = np.asarray(input_tokens, dtype=np.int64)
    out = np.asarray(output_tokens, dtype=np.int64)
    if inp.shape != out.shape or inp.ndim != 1:
        raise SynthesisError(f"sample columns of shapes {inp.shape} and {out.shape}")
    check_request(
        num_sample=int(inp.shape[0]),
        curve=curve,
        days=days,
        mean_rate=mean_rate,
        seed=seed,
        max_requests=max_requests,
    )
    arrivals_seed, lengths_seed = np.random.SeedSequence(seed).spawn(2)
    span_s = days * 86400.0
    arrival = arrival_times(
        curve, span_s=span_s, mean_rate=mean_rate, rng=np.random.default_rng(arrivals_seed)
    )
    n = int(arrival.shape[0])
    if n == 0:
        raise SynthesisError(
            f"no request arrived in {days:g} days at {mean_rate:g} req/s; expected a higher "
            "--mean-rate or more --days"
        )
    pick = np.random.default_rng(lengths_seed).integers(0, inp.shape[0], size=n)
    return TraceColumns(arrival_s=arrival, input_tokens=inp[pick], output_tokens=out[pick])


def origin_digest(origin: SyntheticOrigin) -> str:
    """A synthetic trace's content hash: what its rows depend on (the sample's content,
    the curve's points, days, mean rate, seed, the generator's version), not names."""
    plain = to_plain(origin)
    assert isinstance(plain, dict)
    identity = {
        "version": SYNTHESIS_VERSION,
        "from_content_hash": origin.from_content_hash,
        "curve": {k: v for k, v in plain["rate_curve"].items() if k != "name"},
        "days": origin.days,
        "mean_rate": origin.mean_rate,
        "seed": origin.seed,
    }
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"servetune synthesize {text}".encode()).hexdigest()


def default_name(origin: SyntheticOrigin) -> str:
    """`synthetic-week-from-3`, `synthetic-day-from-3`, `synthetic-2.5-days-from-3`."""
    span = {1.0: "day", 7.0: "week"}.get(float(origin.days), f"{origin.days:g}-days")
    return f"synthetic-{span}-from-{origin.from_trace_id}"
