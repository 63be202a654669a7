"""Import `vllm bench serve --save-result --save-detailed` JSON as observations (DOMAIN.md §7).

Per-request arrays: `input_lens`, `output_lens`, `ttfts` (seconds) are
required; `latencies` (seconds) is used when present, else each latency is
TTFT plus the sum of its `itls`; `start_times` (seconds, any origin) give the
arrivals; without them a burst run (`request_rate` inf) has every request at 0,
and a run at a finite rate (no `max_concurrency`) gets the schedule its client
drew, regenerated from its seed (`optimizer.bench_serve.client_send_times`,
the pre-0.9 client's order: these files predate `start_times`). Failed requests (a
non-empty `errors` entry, or 0 output tokens) are dropped and counted.
Summary fields (`duration`, `request_rate`, `mean_ttft_ms`, `p99_ttft_ms`,
`mean_tpot_ms`, `request_goodput`, `spec_decode_acceptance_length`, ...) are
kept when present. Every problem raises `ObservationFormatError` naming the
key (and the request index).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optimizer.bench_serve import client_send_times
from optimizer.validation.compare import RequestOutcomes
from optimizer.workload import Workload

MAX_FILE_BYTES = 512 * 1024**2
SUMMARY_KEYS = (
    "duration",
    "completed",
    "request_rate",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "spec_decode_acceptance_length",
)


class ObservationFormatError(ValueError):
    """A benchmark-result file that cannot be read as observations."""


@dataclass(frozen=True, slots=True)
class Observation:
    """Measured per-request outcomes of a deployment serving a workload."""

    name: str
    workload: Workload
    outcomes: RequestOutcomes
    summary: dict[str, float]  # reported summary fields present in the file
    num_failed: int
    backend: str = ""
    model_id: str = ""
    arrivals: str = "recorded"  # "burst" (rate inf), or "regenerated" from the client's seed


def _fail(where: str, message: str) -> ObservationFormatError:
    return ObservationFormatError(f"{where}: {message}")


def _numbers(data: dict, key: str, where: str, n: int | None) -> np.ndarray:
    if key not in data:
        raise _fail(where, f"missing key {key!r} (save the result with --save-detailed)")
    values = data[key]
    if not isinstance(values, list):
        raise _fail(where, f"{key!r} must be a list, got {type(values).__name__}")
    if n is not None and len(values) != n:
        raise _fail(where, f"{key!r} has {len(values)} entries, input_lens has {n}")
    for i, v in enumerate(values):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise _fail(where, f"{key}[{i}] = {v!r} is not a finite number")
    return np.asarray(values, dtype=np.float64)


def _itl_sums(data: dict, where: str, n: int) -> np.ndarray:
    if "itls" not in data:
        raise _fail(where, "needs 'latencies' or 'itls' to know when requests finished")
    itls = data["itls"]
    if not isinstance(itls, list) or len(itls) != n:
        raise _fail(where, f"'itls' must be a list of {n} lists")
    sums = np.zeros(n)
    for i, gaps in enumerate(itls):
        if not isinstance(gaps, list):
            raise _fail(where, f"itls[{i}] must be a list of seconds")
        for g in gaps:
            if not isinstance(g, (int, float)) or isinstance(g, bool) or not g >= 0:
                raise _fail(where, f"itls[{i}] holds {g!r}, not a non-negative number")
        sums[i] = float(sum(gaps))
    return sums


def _arrivals(data: dict, where: str, n: int) -> tuple[np.ndarray, str]:
    """Arrival times and how they were known: "recorded", "burst", or "regenerated"."""
    if "start_times" in data:
        start = _numbers(data, "start_times", where, n)
        return start - start.min(), "recorded"
    rate = data.get("request_rate")
    if rate in ("inf", "Infinity") or (isinstance(rate, float) and math.isinf(rate)):
        return np.zeros(n), "burst"
    if data.get("max_concurrency") is not None:
        raise _fail(
            where,
            f"no 'start_times', request_rate={rate!r} and max_concurrency="
            f"{data['max_concurrency']!r}: when each request was sent depends on the run",
        )
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
        raise _fail(where, f"request_rate: expected a positive number or inf, got {rate!r}")
    burst = data.get("burstiness", 1.0)
    if burst is None:
        burst = 1.0
    if not isinstance(burst, (int, float)) or isinstance(burst, bool) or not burst > 0:
        raise _fail(where, f"burstiness: expected a positive number, got {burst!r}")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise _fail(where, f"seed: expected a non-negative integer, got {seed!r}")
    # A client that saves no start_times predates vLLM ~0.9: it sent the first request
    # at 0 and each next one after a fresh gamma gap from numpy's generator seeded with
    # --seed (0 unless the file says): the schedule is regenerated exactly so.
    sends = client_send_times(n, float(rate), float(burst), seed, "cumulative")
    assert sends is not None
    return sends, "regenerated"


def parse_vllm_result(data: object, *, name: str = "vllm-bench", where: str = "") -> Observation:
    """Observations from a decoded `vllm bench serve` result."""
    where = where or name
    if not isinstance(data, dict):
        raise _fail(where, f"expected a JSON object, got {type(data).__name__}")
    inp = _numbers(data, "input_lens", where, None)
    n = inp.size
    if n == 0:
        raise _fail(where, "'input_lens' is empty: no requests")
    out = _numbers(data, "output_lens", where, n)
    ttft = _numbers(data, "ttfts", where, n)
    if "latencies" in data:
        latency = _numbers(data, "latencies", where, n)
    else:
        latency = ttft + _itl_sums(data, where, n)
    arrival, arrivals = _arrivals(data, where, n)
    errors = data.get("errors")
    failed = out <= 0
    if errors is not None:
        if not isinstance(errors, list) or len(errors) != n:
            raise _fail(where, f"'errors' must be a list of {n} strings")
        failed |= np.array([bool(e) for e in errors])
    ok = ~failed
    if not ok.any():
        raise _fail(where, f"all {n} requests failed: nothing to compare")
    for key, arr in (("input_lens", inp), ("output_lens", out)):
        bad = np.flatnonzero(ok & ((arr != np.round(arr)) | (arr <= 0)))
        if bad.size:
            i = int(bad[0])
            raise _fail(where, f"{key}[{i}] = {float(arr[i]):g}: expected a positive integer")
    bad = np.flatnonzero(ok & ((ttft <= 0) | (latency < ttft)))
    if bad.size:
        i = int(bad[0])
        t, e = float(ttft[i]), float(latency[i])
        raise _fail(
            where,
            f"request {i}: ttft {t:g} s and latency {e:g} s are inconsistent "
            "(need 0 < ttft <= latency)",
        )
    order = np.argsort(arrival[ok], kind="stable")
    pick = np.flatnonzero(ok)[order]
    arrival = arrival[pick] - arrival[pick].min()
    workload = Workload(
        arrival_s=arrival,
        input_tokens=inp[pick].astype(np.int64),
        output_tokens=out[pick].astype(np.int64),
        name=name,
    )
    outcomes = RequestOutcomes(
        arrival, workload.input_tokens, workload.output_tokens, ttft[pick], latency[pick]
    )
    summary = {
        k: float(data[k])
        for k in SUMMARY_KEYS
        if isinstance(data.get(k), (int, float)) and not isinstance(data.get(k), bool)
    }
    return Observation(
        name=name,
        workload=workload,
        outcomes=outcomes,
        summary=summary,
        num_failed=int(failed.sum()),
        backend=str(data.get("backend", "")),
        model_id=str(data.get("model_id", "")),
        arrivals=arrivals,
    )


def load_vllm_result(path: str | Path, *, name: str | None = None) -> Observation:
    """Read a `vllm bench serve --save-result --save-detailed` JSON file."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ObservationFormatError(f"{path}: cannot read: {exc}") from exc
    if size > MAX_FILE_BYTES:
        raise ObservationFormatError(f"{path}: {size} bytes is over the {MAX_FILE_BYTES} limit")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ObservationFormatError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ObservationFormatError(
            f"{path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    return parse_vllm_result(data, name=name or path.stem, where=str(path))
