"""Whole requests of AIConfigurator's forward-pass-metrics runs (observations/aic-fpm-b300):
each run folder's `request_workload.csv` lists what was sent (`workload_label`,
`request_index`, `prompt_tokens`, `max_tokens`), and the collection's `collect.log` one
line per finished request (`request_ok index=... elapsed_seconds=...`, end-to-end
seconds of a non-streaming request). `segment_requests` pairs them for one segment of the
run, in sending order: "real" is a closed loop of 32 clients, "context" prompts of
128/1,024/4,096 tokens with one output token, one at a time.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from optimizer.validation.compare import ValidationError

_REQUEST_OK = re.compile(r"request_ok index=(\d+) .*?elapsed_seconds=([\d.]+)")


@dataclass(frozen=True, slots=True)
class MeasuredRequest:
    index: int
    prompt_tokens: int
    output_tokens: int
    e2e_s: float


def _log_of(folder: Path) -> str:
    for parent in folder.parents:
        path = parent / "collect.log"
        if path.is_file():
            return path.read_text(encoding="utf-8", errors="replace")
    raise ValidationError(f"{folder}: no collect.log in any folder above it")


def _elapsed(folder: Path) -> dict[int, float]:
    """Request index -> end-to-end seconds, from the block of `collect.log` after this
    run's own command line (each run's command names its folder)."""
    log = _log_of(folder)
    start = log.find(f"/{folder.name} ")
    if start < 0:
        raise ValidationError(f"{folder}: its command is not in collect.log")
    end = log.find("+ bash ", start + 1)
    out: dict[int, float] = {}
    for m in _REQUEST_OK.finditer(log, start, end if end >= 0 else len(log)):
        out.setdefault(int(m.group(1)), float(m.group(2)))  # a line may be logged twice
    return out


def segment_requests(folder: str | Path, label: str = "real") -> list[MeasuredRequest]:
    """The run's requests labelled `label` in sending order, each with its measured
    end-to-end time (ValidationError naming the file when a request's row or time is
    missing)."""
    folder = Path(folder)
    path = folder / "request_workload.csv"
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r.get("workload_label") == label]
        sent = [(int(r["request_index"]), int(r["prompt_tokens"]), int(r["max_tokens"]))
                for r in rows]  # fmt: skip
    except (OSError, KeyError, ValueError) as exc:
        raise ValidationError(
            f"{path}: expected request_index, prompt_tokens and max_tokens: {exc}"
        ) from exc
    if not sent:
        raise ValidationError(f"{path}: no requests labelled {label!r}")
    elapsed = _elapsed(folder)
    missing = [i for i, _, _ in sent if i not in elapsed]
    if missing:
        raise ValidationError(
            f"{folder}: collect.log has no time for {len(missing)} of the {len(sent)} "
            f"{label!r} requests (first: index {missing[0]})"
        )
    return [MeasuredRequest(i, p, o, elapsed[i]) for i, p, o in sent]
