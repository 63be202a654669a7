"""Plausibility checks on an ingested trace: figures that real traffic hardly shows.

A file can parse cleanly and still be wrong: millisecond stamps read as microseconds
make 500 requests of 139 s arrive in 0.139 s. Nothing here refuses a trace (bad input
is refused by `parse_trace` with its own errors); each check returns a `TraceWarning`
that ingest stores with the trace and the CLI and REST show.

The checks, and why their bounds are where they are:
- request rate (`RATE_HIGH`, `BURST_HIGH`, `SPAN_ZERO`, `RATE_LOW`), from
  `MIN_RATE_REQUESTS` requests on (a rate over fewer says little: a handful sent
  together in a test). Real traces in the shared data (DOMAIN.md §7): Azure code 2.57
  req/s over the hour, its busiest second 72 req/s; Azure conv 5.53 and 19; Mooncake's
  synthetic trace 3.91 and 14. `MAX_RATE` (1,000 req/s) is 180x the busiest mean and 14x
  the busiest second among them; at Azure code's mean prompt (2,048 tokens) an 8B model
  needs 2 x 8e9 x 2,048 = 33 TFLOP per prefill, so 1,000 req/s takes 33 H200 at their
  989 TFLOP/s bf16 peak (DOMAIN.md §3) before a single decode. Stamps read in a unit
  1,000x too fine multiply the rate by 1,000: each real trace above lands at 2,567-5,530
  req/s. The mean rate is judged, and the busiest second when the mean passes (a batch
  sent at once); a trace whose requests all share one arrival time has no rate at all.
- `MIN_RATE` (0.01 req/s, under 864 requests a day) over a span of more than
  `LOW_RATE_SPAN_S` (a day): stamps read in a unit 1,000x too coarse divide the real
  traces' rates to 0.0026-0.0055 req/s and stretch their hour to 40 days, while real
  traces that do span days carry a service's traffic (Azure's 2024 traces: millions of
  requests in a week, DOMAIN.md §7, over 1.6 req/s).
- When the arrival column is a number (s, ms or us), a rate warning says what the trace
  would be under the other units whose reading is plausible (else the neighbouring
  unit), and how the unit was chosen: `--arrival-unit` (generic) or the format's own.
- lengths (`LENGTH_OVER_CONTEXT`): prompt + output beyond `MAX_CONTEXT_TOKENS`, the
  longest context of any model preset (Llama 4 Scout, `optimizer.moe_presets`; its
  config.json max_position_embeddings 10,485,760). Mooncake's longest request is
  191,386 tokens. Such a length fits no model: a token column mapped to the wrong field
  (a timestamp, a byte count). A length beyond one deployment's limit (max_model_len,
  its KV capacity) is for `tune` and `simulate`, which refuse those requests themselves.
  Zero and negative lengths never get here: parsing refuses them.
"""

from __future__ import annotations

import numpy as np

from optimizer.records import (
    TraceColumns,
    TraceFormat,
    TraceStats,
    TraceWarning,
    TraceWarningCode,
)
from optimizer.traces.formats import ColumnMapping, TimeUnit

MAX_RATE = 1_000.0  # req/s: the mean, and the busiest second
MIN_RATE = 0.01  # req/s, over a span of more than LOW_RATE_SPAN_S
LOW_RATE_SPAN_S = 86_400.0
MIN_RATE_REQUESTS = 20
MAX_CONTEXT_TOKENS = 10_485_760  # Llama 4 Scout's max_position_embeddings
MAX_CONTEXT_MODEL = "Llama 4 Scout"

_SECONDS_PER = {TimeUnit.US: 1e-6, TimeUnit.MS: 1e-3, TimeUnit.S: 1.0}
_UNIT_NAMES = {TimeUnit.US: "microseconds", TimeUnit.MS: "milliseconds", TimeUnit.S: "seconds"}
_UNIT_ADVICE = "check --arrival-unit (REST field arrival_unit)"


def check_plausibility(
    columns: TraceColumns,
    stats: TraceStats,
    *,
    format: TraceFormat,
    mapping: ColumnMapping,
    rows: np.ndarray | None = None,
) -> tuple[TraceWarning, ...]:
    """What in a parsed trace real traffic hardly shows, as warnings (never an error).

    `mapping` names the file's columns and the arrival unit they were read in, `format`
    the format that chose it; `rows` holds each request's 1-based file data row in stored
    (arrival) order, so a warning can name it (None: requests are named by position).
    """
    found = [*_rate_warnings(columns, stats, format, mapping, rows)]
    found += _length_warnings(columns, mapping, rows)
    return tuple(found)


def _rate_warnings(
    columns: TraceColumns,
    stats: TraceStats,
    format: TraceFormat,
    mapping: ColumnMapping,
    rows: np.ndarray | None,
) -> list[TraceWarning]:
    n, span, rate = stats.num_requests, stats.duration_s, stats.mean_rate
    if n < MIN_RATE_REQUESTS:
        return []
    found: list[TraceWarning] = []
    column = mapping.arrival
    if span == 0:
        found.append(
            TraceWarning(
                TraceWarningCode.SPAN_ZERO,
                float(n),
                float(MIN_RATE_REQUESTS),
                f"all {n:,} requests arrive at the same instant (column {column!r} holds one "
                "value): the trace replays them as one burst; expected arrival times spread "
                f"over the trace; check the column {column!r}",
            )
        )
        return found
    what = f"{n:,} requests in {_duration(span)} ({_rate(rate)} req/s"
    if rate > MAX_RATE:
        hint = _unit_hint(span, n, format, mapping, coarser=True)
        found.append(
            TraceWarning(
                TraceWarningCode.RATE_HIGH,
                rate,
                MAX_RATE,
                f"{what}; plausible up to {MAX_RATE:,.0f} req/s for one fleet): {hint}",
            )
        )
    elif stats.peak_rate_1s > MAX_RATE:
        found.append(_burst(columns, stats, column, rows))
    if rate < MIN_RATE and span > LOW_RATE_SPAN_S:
        hint = _unit_hint(span, n, format, mapping, coarser=False)
        found.append(
            TraceWarning(
                TraceWarningCode.RATE_LOW,
                rate,
                MIN_RATE,
                f"{what}; plausible from {MIN_RATE:g} req/s over more than a day): {hint}",
            )
        )
    return found


def _burst(
    columns: TraceColumns, stats: TraceStats, column: str, rows: np.ndarray | None
) -> TraceWarning:
    """The busiest second, where it starts (its first request's row) and how full it is."""
    arrival = np.asarray(columns.arrival_s, dtype=np.float64)  # sorted by parse
    ends = np.searchsorted(arrival, arrival + 1.0, side="left")
    first = int(np.argmax(ends - np.arange(arrival.shape[0])))
    count = int(ends[first] - first)
    return TraceWarning(
        TraceWarningCode.BURST_HIGH,
        stats.peak_rate_1s,
        MAX_RATE,
        f"{count:,} requests within one second, from {_duration(float(arrival[first]))} into "
        f"the trace ({_where(rows, first)}; the mean is {_rate(stats.mean_rate)} req/s; "
        f"plausible up to {MAX_RATE:,.0f} req/s for one fleet): a batch sent at once, or "
        f"stamps coarser than they look; check the column {column!r} there",
    )


def _unit_hint(
    span: float, n: int, format: TraceFormat, mapping: ColumnMapping, *, coarser: bool
) -> str:
    """What the trace would be under the other numeric units whose reading is plausible
    (the neighbouring unit when none is), and where the unit came from."""
    unit = mapping.time_unit
    if unit not in _SECONDS_PER:
        return f"check the dates in column {mapping.arrival!r}"
    order = list(_SECONDS_PER)  # finest first
    here = order.index(unit)
    others = order[here + 1 :] if coarser else order[:here][::-1]
    readings = []
    for other in others:
        other_span = span * _SECONDS_PER[other] / _SECONDS_PER[unit]
        readings.append((other, other_span, n / other_span))
    plausible = [r for r in readings if _plausible(r[2], r[1])]
    shown = plausible or readings[:1]
    ifs = "; ".join(
        f"if the stamps in {mapping.arrival!r} are {_UNIT_NAMES[other]}, not "
        f"{_UNIT_NAMES[unit]}, that is {_duration(other_span)} at {_rate(other_rate)} req/s"
        for other, other_span, other_rate in shown
    )
    if format is TraceFormat.GENERIC:
        advice = _UNIT_ADVICE
    else:
        advice = (
            f"format {format.value} reads {mapping.arrival!r} in {unit.value}; for other "
            f"units import it as format generic and {_UNIT_ADVICE}"
        )
    return f"{ifs}; {advice}" if ifs else advice


def _plausible(rate: float, span: float) -> bool:
    return rate <= MAX_RATE and not (rate < MIN_RATE and span > LOW_RATE_SPAN_S)


def _length_warnings(
    columns: TraceColumns, mapping: ColumnMapping, rows: np.ndarray | None
) -> list[TraceWarning]:
    total = np.asarray(columns.input_tokens, dtype=np.int64) + np.asarray(
        columns.output_tokens, dtype=np.int64
    )
    if total.shape[0] == 0:
        return []
    longest = int(np.argmax(total))
    over = int((total > MAX_CONTEXT_TOKENS).sum())
    if not over:
        return []
    prompt, output = int(columns.input_tokens[longest]), int(columns.output_tokens[longest])
    return [
        TraceWarning(
            TraceWarningCode.LENGTH_OVER_CONTEXT,
            float(total[longest]),
            float(MAX_CONTEXT_TOKENS),
            f"{over:,} request(s) longer than any known model's context ({MAX_CONTEXT_TOKENS:,} "
            f"tokens, {MAX_CONTEXT_MODEL}); the longest, {_where(rows, longest)}, has "
            f"{prompt:,} + {output:,} tokens ({mapping.input_tokens!r} + "
            f"{mapping.output_tokens!r}); check that these columns count tokens",
        )
    ]


def _where(rows: np.ndarray | None, index: int) -> str:
    if rows is None:
        return f"request {index + 1:,} by arrival"
    return f"row {int(rows[index]):,}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 7_200:
        return f"{seconds:,.0f} s"
    if seconds < 2 * 86_400:
        return f"{seconds / 3_600:.1f} h"
    return f"{seconds / 86_400:,.1f} days"


def _rate(rate: float) -> str:
    return f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"
