"""The development set: servetune's predictions against 754 measured vLLM batch runs
(LLM-Inference-Bench; optimizer/validation/devset.py). Usage:

    .venv/bin/python benchmarks/bench_devset.py [--database URL]

Prices every run with the AIConfigurator A100 and H100 tables fitted into a database
(imported and fitted once unless `--database` has them; GH200 is priced with the H100
model: the same GPU with faster memory), first with no engine overhead. A batch
released at once runs the same steps whatever they cost, so its makespan is

    ops time + base x steps + per_seq x (sequences summed over steps)
             + per_token x (tokens summed over steps)

and the overhead (`optimizer.latency.overhead.EngineOverhead`) is fitted by
non-negative least squares on relative error, on half the (GPU, TP, model, length)
groups; errors are reported on the other half: median absolute error of the batch
latency per GPU type (target <= 10%) and of the 9 TTFT rows (<= 15%), and per
GPU x model x TP. Prints the fitted overhead for `optimizer/latency/overhead.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_common import SHARED, prepare_database
from scipy.optimize import nnls

from optimizer.latency.base import StepLoad
from optimizer.latency.overhead import NO_OVERHEAD
from optimizer.sim import simulate
from optimizer.validation.devset import BatchRun, Deployment, abs_error, deployment, runs_of

DEVSET = SHARED / "observations" / "llm-inference-bench" / "vllm_nvidia.csv"


class _Count:
    """A 'latency' that prices a step at one of its counters: the makespan is then that
    counter summed over the run's steps."""

    is_estimate = True

    def __init__(self, what: str) -> None:
        self.what = what

    def step_time_s(self, load: StepLoad) -> float:
        if self.what == "steps":
            return 1.0
        if self.what == "seqs":
            return float(load.num_decode_seqs + len(load.prefill_q))
        return float(load.num_tokens)

    def for_instance(self, accelerator, tp, reach=None, precision=None):
        return self


@dataclass(frozen=True, slots=True)
class Row:
    run: BatchRun
    ops_s: float  # makespan with no engine overhead
    counts: tuple[float, float, float]  # steps, sequence-steps, token-steps
    ttft_ops_s: float | None
    ttft_counts: tuple[float, float, float] | None

    def predict(self, coef: np.ndarray) -> float:
        return self.ops_s + float(np.dot(coef, self.counts))

    def predict_ttft(self, coef: np.ndarray) -> float | None:
        if self.ttft_ops_s is None or self.ttft_counts is None:
            return None
        return self.ttft_ops_s + float(np.dot(coef, self.ttft_counts))


def _makespan(dep_workload, config, latency) -> float:
    res = simulate(dep_workload, config, latency, seed=0)
    if res.num_rejected:
        raise ValueError(f"{res.num_rejected} requests rejected")
    return float(np.nanmax(res.e2e_s))


def _counts(workload, config) -> tuple[float, float, float]:
    return tuple(_makespan(workload, config, _Count(w)) for w in ("steps", "seqs", "tokens"))


def _in_train(run: BatchRun) -> bool:
    key = f"{run.gpu}|{run.tp}|{run.model}|{run.input_tokens}"
    return hashlib.sha256(key.encode()).digest()[0] % 2 == 0


def _fit(rows: list[Row], terms: tuple[bool, bool, bool] = (True, True, True)) -> np.ndarray:
    """Overhead coefficients minimising relative squared error, all >= 0 (`terms`:
    which of base, per sequence, per token are free; the others stay 0)."""
    a = np.array([np.asarray(r.counts) / r.run.latency_s for r in rows])
    b = np.array([(r.run.latency_s - r.ops_s) / r.run.latency_s for r in rows])
    ttft = [r for r in rows if r.ttft_counts is not None]
    if ttft:
        a = np.vstack([a, [np.asarray(r.ttft_counts) / r.run.ttft_s for r in ttft]])
        b = np.concatenate([b, [(r.run.ttft_s - r.ttft_ops_s) / r.run.ttft_s for r in ttft]])
    keep = np.array(terms)
    coef = np.zeros(3)
    coef[keep], _ = nnls(a[:, keep], b)
    return coef


def _report(rows: list[Row], coef: np.ndarray, title: str) -> None:
    by_gpu: dict[str, list[float]] = defaultdict(list)
    by_key: dict[str, list[float]] = defaultdict(list)
    ttft = []
    for r in rows:
        err = abs_error(r.predict(coef), r.run.latency_s)
        by_gpu[r.run.gpu].append(err)
        by_key[r.run.key].append(err)
        t = r.predict_ttft(coef)
        if t is not None and r.run.ttft_s:
            ttft.append((r.run.key, t, r.run.ttft_s, t / r.run.ttft_s - 1.0))
    print(f"\n{title}")
    for gpu, errs in sorted(by_gpu.items()):
        med = statistics.median(errs)
        mark = "ok" if med <= 0.10 else "MISS"
        print(f"  {gpu:6s} {len(errs):4d} runs: median |error| {med:6.1%}  p90 "
              f"{np.percentile(errs, 90):6.1%}  (target <= 10%: {mark})")  # fmt: skip
    if ttft:
        med = statistics.median(abs(e) for *_, e in ttft)
        mark = "ok" if med <= 0.15 else "MISS"
        print(f"  TTFT rows ({len(ttft)}): median |error| {med:.1%} (target <= 15%: {mark})")
        for key, p, m, e in ttft:
            print(f"    {key:45s} predicted {p:6.3f} s measured {m:6.3f} s ({e:+.1%})")
    print("  per GPU x TP x model (median |error|, runs):")
    for key, errs in sorted(by_key.items()):
        print(f"    {key:45s} {statistics.median(errs):6.1%}  {len(errs):3d}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", default=None, help="a database with fitted A100/H100")
    args = parser.parse_args()
    if not DEVSET.exists():
        print(f"development set not found: {DEVSET}", file=sys.stderr)
        return 1
    from api.services.tuning import stored_latency

    runs = runs_of(DEVSET)
    with tempfile.TemporaryDirectory() as tmp:
        url, _ = prepare_database(args.database, Path(tmp), gpus=("h100", "a100"))
        rows: list[Row] = []
        skipped: dict[str, int] = defaultdict(int)
        for run in runs:
            dep = deployment(run)
            if isinstance(dep, str):
                skipped[dep.split(":")[0]] += 1
                continue
            assert isinstance(dep, Deployment)
            latency = stored_latency(url, run.model, overhead=NO_OVERHEAD).source
            try:
                ops = _makespan(dep.workload, dep.config, latency)
                counts = _counts(dep.workload, dep.config)
                t_ops = t_counts = None
                if run.ttft_s is not None:
                    t_ops = _makespan(dep.ttft_workload, dep.config, latency)
                    t_counts = _counts(dep.ttft_workload, dep.config)
            except ValueError as exc:
                skipped[f"{run.key}: {exc}"] += 1
                continue
            rows.append(Row(run, ops, counts, t_ops, t_counts))
    print(f"{len(rows)} of {len(runs)} runs replayed; left out: {dict(skipped)}")
    train = [r for r in rows if _in_train(r.run)]
    test = [r for r in rows if not _in_train(r.run)]
    zero = np.zeros(3)
    _report(test, zero, f"held-out half ({len(test)} runs), no engine overhead")
    for name, terms in (("base + per sequence", (True, True, False)),
                        ("base + per sequence + per token", (True, True, True))):  # fmt: skip
        coef = _fit(train, terms)
        print(f"\n{name}, fitted on {len(train)} runs: base {coef[0] * 1e3:.3f} ms/step, "
              f"{coef[1] * 1e6:.2f} us per sequence, {coef[2] * 1e9:.2f} ns per token")  # fmt: skip
        _report(test, coef, f"held-out half ({len(test)} runs), {name}")
    _report([r for r in train if r.ttft_counts is not None], coef,
            "the training half's TTFT rows (fitted on; for the 9-row total)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
