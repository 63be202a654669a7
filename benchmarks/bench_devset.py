"""servetune against every measured vLLM set in ../shared/data, each run priced as the
engine generation that ran it (`optimizer.engines`). Usage:

    .venv/bin/python benchmarks/bench_devset.py [--database URL] [--only SECTION] [--fit]
        [--aic-package | --tables shared|package|both]

Sections (`--only steps|closed-loop|offline|online`; all by default):

- steps: per-step timings of vLLM 0.20.1 (V1, async scheduling) serving Qwen3-32B on
  B300 at TP 1/2/4/8 (observations/aic-fpm-b300), each step priced with the B300 tables
  as the simulator prices it (a step after an idle gap with its CPU work in line): median
  |error| per step type (prefill-only, decode-only, mixed) and TP degree; target <= 5%
  for each step type. The MoE runs of that folder: benchmarks/bench_moe_steps.py.
- closed-loop: the 93 development runs (observations/aic-silicon-dev: vLLM 0.12.0, V1
  with synchronous scheduling, Qwen3-32B on H100, aiperf closed loops), each through the
  path users run: `servetune simulate --workload W --config C --json` in a subprocess,
  under the protocol the runs were made with (`optimizer.validation.devset`): 10 x C
  measured requests after 2 x C warm-ups drained first, a server with
  `--max-num-batched-tokens` C + isl + 1,500 and `--max-num-seqs` C (inferred from the
  peer's config generator, not recorded in the rows). Mean TTFT and TPOT against
  measured, medians per TP degree and prompt length, and per half (the V1-synchronous
  overhead is fitted on the training half); targets TTFT <= 15%, TPOT <= 5%, no run
  refused. Where measured TTFT falls against the replay and the same deployment with
  its clients out of step (`ClosedLoopWorkload.out_of_step`). `--closed-loop-csv FILE`
  runs this section on another
  sample of AIConfigurator's schema (either its development-set columns or its current
  ones: gemm/moe/kvcache quant modes, attention DP, MoE TP/EP; `optimizer.validation.
  devset`): each vLLM row through the CLI, the share representable, each refusal by
  reason, medians per model, GPU, precision, TP and length (the GPUs' tables imported).
- offline: 754 offline batch runs of a V0-era vLLM (LLM-Inference-Bench), priced as V0;
  makespan median |error| per GPU on the half the V0 overhead was not fitted on.
- online: four `vllm bench serve` runs of vLLM 0.8.3 (V1, synchronous) serving
  Llama-3.3-70B on 8 x A100 40 GB, replayed back to back with their warm prefix cache.

`--fit` also prints the constants `optimizer/engines.py` holds, fitted as they were: the
async generation's on the per-step timings (benchmarks/step_fit.py), the synchronous V1
overhead on the development runs' training half, V0's on the offline batches' training
half. The database (a temporary SQLite one unless given) gets the AIConfigurator A100,
H100 and B300 tables imported and fitted once (with `--only steps`, the B300 ones alone).

B300 tables: the shared copy's (profiles/aiconfigurator/b300_sxm) by default;
`--aic-package` imports the installed aiconfigurator-core's instead (`servetune profile
import --aiconfigurator --gpu b300`); `--tables both` runs the steps section on each (the
package's in a database of its own) and ends with their per-step-type figures side by
side.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import yaml
from bench_common import AICONFIGURATOR, SERVETUNE, SHARED, prepare_database
from scipy.optimize import nnls
from step_fit import DENSE as FPM

from optimizer.engines import NO_OVERHEAD, EngineRelease
from optimizer.latency.base import StepLoad, TableReach
from optimizer.shapes import DEFAULT_PRECISION
from optimizer.sim import simulate
from optimizer.validation.devset import (
    GENERATOR_BUDGET_MARGIN,
    GPU_OF_SYSTEM,
    MEASURED_PER_CLIENT,
    WARMUPS_PER_CLIENT,
    ClosedLoopRun,
    Deployment,
    DevSetError,
    closed_loop_deployment,
    closed_loop_runs_of,
    deployment,
    read_closed_loop,
    runs_of,
)
from optimizer.validation.forward_passes import (
    StepPhase,
    price_step_s,
    read_forward_pass_metrics,
)

OBS = SHARED / "observations"
CLOSED_LOOP = OBS / "aic-silicon-dev" / "qwen3_32b_h100_vllm.csv"
OFFLINE = OBS / "llm-inference-bench" / "vllm_nvidia.csv"
ONLINE = OBS / "vllm-bench" / "surajssd-llm-k8s-a100"
STEPS_RELEASE = EngineRelease("vllm", "0.20.1")


def _median_abs(errs: list[float]) -> float:
    return statistics.median(abs(e) for e in errs) if errs else float("nan")


def _line(label: str, errs: list[float], target: float | None = None) -> str:
    mark = ""
    if target is not None:
        mark = "  ok" if _median_abs(errs) <= target else "  MISS"
    return (f"  {label:34s} n={len(errs):5d}  median |error| {_median_abs(errs):6.1%}  "
            f"(signed {statistics.median(errs):+6.1%}){mark}")  # fmt: skip


# ----------------------------------------------------------------------------- steps


def steps_section(url: str, fit: bool, tables: str = "shared") -> dict[str, list[float]]:
    """Per step type (and "mixed, one chunk"), the signed errors of every TP degree."""
    from api.services.tuning import stored_latency

    print(f"\n== per-step timings: vLLM 0.20.1 (V1, async scheduling), Qwen3-32B, B300 "
          f"({tables} tables) ==")  # fmt: skip
    source = stored_latency(url, "qwen3-32b").source
    reach = TableReach(8192, 256, 8192, 32768)
    by_phase: dict[StepPhase, list[float]] = defaultdict(list)
    single: list[float] = []
    for tp in (1, 2, 4, 8):
        table = source.for_instance("b300", tp, reach, DEFAULT_PRECISION, engine=STEPS_RELEASE)
        steps = read_forward_pass_metrics(FPM / f"tp{tp}_ep1_past4096" / "fpm_metrics_detail.csv")
        per: dict[StepPhase, list[float]] = defaultdict(list)
        for s in steps:
            err = price_step_s(table, s) / s.latency_s - 1.0
            per[s.phase].append(err)
            by_phase[s.phase].append(err)
            if s.phase is StepPhase.MIXED and len(s.load.prefill_q) == 1:
                single.append(err)
        print(f" TP{tp}: " + ", ".join(
            f"{p.value} {_median_abs(e):.1%} ({statistics.median(e):+.1%}, n={len(e)})"
            for p, e in per.items()
        ))  # fmt: skip
    print(f" all TP degrees (priced as {STEPS_RELEASE.label}):")
    for phase in StepPhase:
        print(_line(f"{phase.value} steps", by_phase[phase], 0.05))
    # A record holds each step's sums: a step of several prefill chunks is priced as equal
    # chunks over the mean cached prefix; with one chunk the reconstruction is exact.
    print(_line("mixed steps of one prefill chunk", single, 0.05))
    if fit:  # the async generation's constants, fitted as engines.py holds them
        from step_fit import describe, fit_b300, fit_v1_async

        fitted = describe(fit_v1_async(fit_b300(tables=tables)))
        print(f" fitted (V1 async, B300, {tables} tables): {fitted}")
    return {p.value: by_phase[p] for p in StepPhase} | {"mixed, one chunk": single}


def steps_side_by_side(errors: dict[str, dict[str, list[float]]]) -> None:
    """Per step type, each B300 table source's median |error| (signed median), n."""
    print("\n per step type, all TP degrees: median |error| (signed median) per B300 tables")
    print(f"   {'step type':18s}" + "".join(f"{src + ' tables':>28s}" for src in errors))
    for kind in next(iter(errors.values())):
        cells = [e[kind] for e in errors.values()]
        print(f"   {kind:18s}" + "".join(
            f"{_median_abs(c):11.1%} ({statistics.median(c):+6.1%}) n={len(c):5d}" if c
            else f"{'-':>28s}" for c in cells
        ))  # fmt: skip


# ----------------------------------------------------------------------------- closed loop


def _in_train(run: ClosedLoopRun) -> bool:
    key = f"{run.precision}|{run.tp}|{run.isl}|{run.osl}|{run.concurrency}"
    return hashlib.sha256(key.encode()).digest()[0] % 2 == 0


def _simulate_cli(run: ClosedLoopRun, workdir: Path, env: dict[str, str]) -> dict | str:
    """`servetune simulate --workload --config --json` for one run (a string: why not)."""
    try:
        config, spec = closed_loop_deployment(run)
    except DevSetError as exc:
        return str(exc)
    cfg, wl = workdir / "config.yaml", workdir / "workload.yaml"
    cfg.write_text(yaml.safe_dump(config.to_dict()), encoding="utf-8")
    wl.write_text(yaml.safe_dump(spec.to_plain()), encoding="utf-8")
    done = subprocess.run(
        [SERVETUNE, "simulate", "--workload", str(wl), "--config", str(cfg), "--json"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return (done.stderr or done.stdout).strip().splitlines()[-1]
    return json.loads(done.stdout)


FLOOR_MARGIN = 1.1  # a priced step this far above the measured TPOT is not pricing noise


@functools.cache
def _latency(url: str, model: str):
    """The stored latency source `simulate` prices `model` with."""
    from api.services.tuning import stored_latency

    return stored_latency(url, model).source


def _run_table(url: str, run: ClosedLoopRun):
    """`run`'s deployment (its replica and its benchmark) and the stored table that prices
    its steps, as the simulator prices them."""
    config, spec = closed_loop_deployment(run)
    inst = config.replica
    table = _latency(url, run.model).for_instance(
        inst.accelerator, inst.tp, precision=config.shape.precision,
        engine=config.engine_release, layout=inst.layout,
    )  # fmt: skip
    return inst, spec, table


def decode_floor_s(url: str, run: ClosedLoopRun) -> float:
    """The priced time of one decode-only step of `run`'s full batch at its mean context
    (prompt, chat template and half the output), on one DP rank: a lower bound on its
    TPOT, which every prefill interleaved with the decodes only raises."""
    inst, spec, table = _run_table(url, run)
    b = max(run.concurrency // inst.dp, 1)
    kv = run.isl + spec.chat_template_tokens + run.osl // 2
    load = StepLoad(num_tokens=b, num_logits=b, num_decode_seqs=b, decode_kv_tokens=b * kv)
    return table.step_time_s(load)


def lone_prefill_s(url: str, run: ClosedLoopRun) -> float:
    """The priced step of one of `run`'s prompts (chat template included) alone on the
    engine: the unit in which `lone_prefill_table` reads TTFT."""
    _, spec, table = _run_table(url, run)
    n = run.isl + spec.chat_template_tokens
    return table.idle_step_time_s(StepLoad(num_tokens=n, num_logits=1, prefill_q=(n,),
                                           prefill_kv=(n,)))  # fmt: skip


def out_of_step_ttft_s(url: str, run: ClosedLoopRun, cycle_s: float) -> float:
    """Mean TTFT of `run`'s deployment with its clients out of step: no warm-ups, each
    client's first send at an independent uniform phase of one request cycle (`cycle_s`,
    the replay's mean end-to-end latency; `ClosedLoopWorkload.out_of_step`)."""
    config, spec = closed_loop_deployment(run)
    res = simulate(spec.build().out_of_step(cycle_s), config, _latency(url, run.model), seed=0)
    return float(np.nanmean(res.ttft_s))


def phase_table(rows: list[tuple[ClosedLoopRun, float, float | None]]) -> None:
    """Where each bf16 run's measured mean TTFT falls against the replay (lock-step: the
    client's burst, as `simulate` replays it) and the same deployment with its clients out
    of step, by prompt length."""
    by_isl: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for run, lockstep, out_of_step in rows:
        if not run.precision and out_of_step is not None:
            by_isl[run.isl].append((lockstep / run.ttft_s - 1.0, out_of_step / run.ttft_s - 1.0))
    print(" measured mean TTFT against the replay (lock-step) and the clients out of step "
          "(independent phases), bf16 runs:")  # fmt: skip
    for isl, errs in sorted(by_isl.items()):
        lock, oos = [a for a, _ in errs], [b for _, b in errs]
        between = sum(b <= 0 <= a for a, b in errs)
        above = sum(a < 0 for a in lock)
        print(f"   ISL {isl:,}: n={len(errs)}; replay median error {statistics.median(lock):+.1%}"
              f" (|{_median_abs(lock):.1%}|), out of step {statistics.median(oos):+.1%}; "
              f"measured between the two {between}, above both {above}, below both "
              f"{sum(b > 0 for b in oos)}")  # fmt: skip


def lone_prefill_table(url: str, rows: list[tuple[ClosedLoopRun, float, float | None]]) -> None:
    """Mean TTFT in lone prefills (`lone_prefill_s`) by clients and prompt length, median
    over TP degrees and output lengths: measured, the lock-step replay's and the
    out-of-step replay's (docs/closed-loop.md)."""
    cells: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for run, sim_ttft, out_of_step in rows:
        if run.precision:
            continue  # the three FP8 rows: one each, at their own lengths
        p = lone_prefill_s(url, run)
        cells["measured", run.isl, run.concurrency].append(run.ttft_s / p)
        cells["lock-step replay", run.isl, run.concurrency].append(sim_ttft / p)
        if out_of_step is not None:
            cells["out-of-step replay", run.isl, run.concurrency].append(out_of_step / p)
    clients = sorted({c for _, _, c in cells})
    print(" mean TTFT in lone prefills (one prompt's priced step on an idle engine), median "
          "over TP degrees and output lengths:")  # fmt: skip
    print(f"   {'clients':28s}" + "".join(f"{c:>7d}" for c in clients))
    for what in ("measured", "lock-step replay", "out-of-step replay"):
        for isl in sorted({i for w, i, _ in cells if w == what}):
            values = [cells.get((what, isl, c)) for c in clients]
            row = "".join(f"{statistics.median(v):7.1f}" if v else "      -" for v in values)
            print(f"   {what + f' {isl:,}':28s}{row}")


def closed_loop_section(url: str, env: dict[str, str], fit: bool, path: Path = CLOSED_LOOP) -> None:
    if path == CLOSED_LOOP:
        print("\n== closed-loop runs: vLLM 0.12.0 (V1, synchronous), Qwen3-32B, H100, aiperf ==")
    else:
        print(f"\n== closed-loop runs of {path} (each priced as its vLLM release) ==")
    sample = read_closed_loop(path)
    runs = sample.runs
    if sample.left_out:
        print(f" left out: {len(sample.left_out)} rows of other backends")
    print(
        f" protocol as run: {MEASURED_PER_CLIENT} x C measured requests after "
        f"{WARMUPS_PER_CLIENT} x C warm-ups (drained first); server budget C + isl + "
        f"{GENERATOR_BUDGET_MARGIN:,} tokens and C sequences (inferred from the peer's config "
        f"generator, not recorded in the rows)"
    )
    rows, refused = [], []
    replays: list[tuple[ClosedLoopRun, float, float | None]] = []  # lock-step, out-of-step TTFT
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            out = _simulate_cli(run, Path(tmp), env)
            if isinstance(out, str):
                refused.append(f"{run.model} on {run.gpu}: {out.removeprefix(run.key + ': ')}")
                continue
            ttft = out["ttft_s"]["mean"] / run.ttft_s - 1.0
            tpot = out["tpot_s"]["mean"] / run.tpot_s - 1.0
            rows.append((run, ttft, tpot, out["ttft_s"]["p50"]))
            low = None
            if path == CLOSED_LOOP:
                low = out_of_step_ttft_s(url, run, out["e2e_s"]["mean"])
            replays.append((run, out["ttft_s"]["mean"], low))
    print(
        f" {len(rows)} of {len(runs)} runs simulated through the CLI "
        f"({len(rows) / max(len(runs), 1):.0%} representable); refused: {len(refused)}"
    )
    for reason, count in Counter(refused).most_common():
        print(f"   {count:4d} x {reason}")  # fmt: skip
    print(" mean TTFT / TPOT against measured (targets 15% / 5%):")
    print(_line("TTFT, all", [r[1] for r in rows], 0.15))
    print(_line("TPOT, all", [r[2] for r in rows], 0.05))
    halves = (("training half", True), ("held-out half", False)) if path == CLOSED_LOOP else ()
    for label, pick in halves:
        half = [r for r in rows if _in_train(r[0]) is pick]
        print(_line(f"TTFT, {label}", [r[1] for r in half]))
        print(_line(f"TPOT, {label}", [r[2] for r in half]))
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    several = len({(r.model, r.gpu) for r in runs}) > 1
    for run, ttft, tpot, _ in rows:
        where = f"{run.model.rsplit('/', 1)[-1]} {run.gpu} " if several else ""
        groups[f"{where}{run.precision or 'bf16'} TP{run.tp} ISL {run.isl}"].append((ttft, tpot))
    print(" per precision, TP degree and prompt length (median |error| TTFT / TPOT):")
    for key in sorted(groups):
        e = groups[key]
        print(f"   {key:24s} n={len(e):3d}  TTFT {_median_abs([a for a, _ in e]):6.1%}  "
              f"TPOT {_median_abs([b for _, b in e]):6.1%}")  # fmt: skip
    if path == CLOSED_LOOP:
        phase_table(replays)
        lone_prefill_table(url, replays)
    below = [(r, f) for r, *_ in rows if (f := decode_floor_s(url, r)) > FLOOR_MARGIN * r.tpot_s]
    print(
        f" runs whose batch's priced decode-only step (no prefill: a floor) exceeds their "
        f"measured TPOT by over {FLOOR_MARGIN - 1:.0%}: {len(below)}"
    )
    for run, floor in below:
        print(f"   {run.key}: measured {run.tpot_s * 1e3:.1f} ms, decode step {floor * 1e3:.1f} ms")
    if fit and path == CLOSED_LOOP:
        _fit_sync_overhead(url, [r for r in runs if _in_train(r)])


def _fit_sync_overhead(url: str, train: list[ClosedLoopRun]) -> None:
    """V1 synchronous overhead: the (base, per sequence) of a grid that minimises the
    median |TPOT error| of the training half (each candidate replays the runs: a closed
    loop's steps change with what a step costs, so no linear shortcut holds)."""
    from api.services.tuning import stored_latency
    from optimizer.engines import EngineOverhead

    best = None
    for base_ms in (0.5, 1.0, 1.5, 2.0):
        for per_seq_us in (0.0, 20.0, 40.0, 60.0):
            overhead = EngineOverhead(base_s=base_ms * 1e-3, per_seq_s=per_seq_us * 1e-6)
            errs = []
            latency = {m: stored_latency(url, m, overhead=overhead).source
                       for m in {r.model for r in train}}  # fmt: skip
            for run in train:
                config, spec = closed_loop_deployment(run)
                res = simulate(spec.workload(), config, latency[run.model], seed=0)
                errs.append(float(np.nanmean(res.tpot_s)) / run.tpot_s - 1.0)
            score = _median_abs(errs)
            if best is None or score < best[0]:
                best = (score, base_ms, per_seq_us)
    assert best is not None
    print(f" fitted (V1 synchronous, {len(train)} training runs): {best[1]:.1f} ms/step + "
          f"{best[2]:.0f} us/sequence (training median |TPOT error| {best[0]:.1%})")  # fmt: skip


# ----------------------------------------------------------------------------- offline


class _Count:
    """A 'latency' that prices a step at one of its counters: a batch released at once runs
    the same steps whatever they cost, so its makespan is then that counter summed."""

    is_estimate = True

    def __init__(self, what: str) -> None:
        self.what = what

    def step_time_s(self, load: StepLoad) -> float:
        if self.what == "steps":
            return 1.0
        if self.what == "seqs":
            return float(load.num_decode_seqs + len(load.prefill_q))
        return float(load.num_tokens)

    def for_instance(self, accelerator, tp, reach=None, precision=None, engine=None, layout=None):
        return self


def offline_section(url: str, fit: bool) -> None:
    from api.services.tuning import stored_latency

    print("\n== offline batches: a V0-era vLLM (LLM-Inference-Bench), priced as V0 ==")
    rows: dict[str, list[float]] = defaultdict(list)
    skipped: dict[str, int] = defaultdict(int)
    a, b = [], []
    for run in runs_of(OFFLINE):
        dep = deployment(run)
        if isinstance(dep, str):
            skipped[dep.split(":")[0]] += 1
            continue
        assert isinstance(dep, Deployment)
        in_train = (
            hashlib.sha256(f"{run.gpu}|{run.tp}|{run.model}|{run.input_tokens}".encode()).digest()[
                0
            ]
            % 2
            == 0
        )
        try:
            if in_train and fit:  # makespan = kernels + overhead . (steps, seqs, tokens)
                plain = stored_latency(url, run.model, overhead=NO_OVERHEAD).source
                ops = np.nanmax(simulate(dep.workload, dep.config, plain, seed=0).e2e_s)
                counts = [np.nanmax(simulate(dep.workload, dep.config, _Count(w), seed=0).e2e_s)
                          for w in ("steps", "seqs", "tokens")]  # fmt: skip
                a.append(np.array(counts) / run.latency_s)
                b.append(1.0 - ops / run.latency_s)
            if not in_train:
                latency = stored_latency(url, run.model).source
                res = simulate(dep.workload, dep.config, latency, seed=0)
                rows[run.gpu].append(float(np.nanmax(res.e2e_s)) / run.latency_s - 1.0)
        except ValueError as exc:
            skipped[f"{run.key}: {exc}"] += 1
    print(f" left out: {dict(skipped)}")
    for gpu, errs in sorted(rows.items()):
        print(_line(f"{gpu} batch makespan, held-out half", errs, 0.10))
    if fit and a:
        (base, per_seq, per_token), _ = nnls(np.array(a), np.array(b))
        print(f" fitted (V0, {len(a)} training runs, batch makespans): {base * 1e3:.2f} ms/step "
              f"+ {per_seq * 1e6:.1f} us/sequence + {per_token * 1e6:.2f} us/token")  # fmt: skip


# ----------------------------------------------------------------------------- online


def online_section(url: str) -> None:
    from api.services.tuning import stored_latency
    from optimizer.config import InstanceConfig, ServingConfig
    from optimizer.validation.observations import load_vllm_result
    from optimizer.workload import Workload

    print("\n== online runs: vLLM 0.8.3 (V1, synchronous), Llama-3.3-70B TP8, 8 x A100 40 GB ==")
    files = sorted(ONLINE.glob("*_qps_*.json"))
    runs = [load_vllm_result(f) for f in files]
    arrival, inp, out, hashes, run_of = [], [], [], [], []
    start = 0.0
    for k, obs in enumerate(runs):  # back to back on one engine: each finds the earlier's
        w = obs.workload  # prompts in its prefix cache (the same 200 prompts, seed 0)
        for i, n in enumerate(w.input_tokens.tolist()):
            hashes.append(np.arange(n // 16, dtype=np.int64) + i * 1_000_000)
        arrival.append(w.arrival_s + start)
        inp.append(w.input_tokens)
        out.append(w.output_tokens)
        run_of.append(np.full(len(w.input_tokens), k))
        start += float(w.arrival_s.max()) + 60.0
    workload = Workload(
        np.concatenate(arrival), np.concatenate(inp), np.concatenate(out),
        prefix_hashes=tuple(hashes), prefix_block_tokens=16, name="4 runs back to back",
    )  # fmt: skip
    owner = np.concatenate(run_of)
    model = "meta-llama/Llama-3.3-70B-Instruct"
    inst = InstanceConfig(accelerator="a100-40gb", tp=8, max_num_batched_tokens=8192,
                          max_num_seqs=256)  # fmt: skip
    config = ServingConfig.colocated(model, inst, enable_prefix_caching=True,
                                     engine_version="0.8.3")  # fmt: skip
    res = simulate(workload, config, stored_latency(url, model).source, seed=0)
    ttft_errs, tpot_errs = [], []
    for k, (f, obs) in enumerate(zip(files, runs, strict=True)):
        mine = owner == k
        m_ttft, m_tpot = float(np.mean(obs.outcomes.ttft_s)), float(np.nanmean(obs.outcomes.tpot_s))
        ttft, tpot = float(np.nanmean(res.ttft_s[mine])), float(np.nanmean(res.tpot_s[mine]))
        ttft_errs.append(ttft / m_ttft - 1.0)
        tpot_errs.append(tpot / m_tpot - 1.0)
        print(f"   {f.stem.rsplit('_', 1)[-1]:>4s}: TTFT {ttft * 1e3:6.0f} ms (measured "
              f"{m_ttft * 1e3:4.0f}, {ttft_errs[-1]:+.0%}), TPOT {tpot * 1e3:5.1f} ms "
              f"(measured {m_tpot * 1e3:4.1f}, {tpot_errs[-1]:+.0%})")  # fmt: skip
    print(f"  priced as {config.engine_release.label}: median |error| TTFT "
          f"{_median_abs(ttft_errs):.1%}, TPOT {_median_abs(tpot_errs):.1%}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", default=None, help="a database with fitted models")
    parser.add_argument("--only", choices=("steps", "closed-loop", "offline", "online"))
    parser.add_argument("--fit", action="store_true", help="also print the fitted constants")
    parser.add_argument("--tables", default="shared", choices=("shared", "package", "both"),
                        help="the B300 tables: the shared copy's, the installed package's, or "
                        "each for the steps section, side by side")  # fmt: skip
    parser.add_argument("--aic-package", dest="tables", action="store_const", const="package",
                        help="the installed aiconfigurator-core's B300 tables "
                        "(--tables package)")  # fmt: skip
    parser.add_argument("--closed-loop-csv", type=Path, default=CLOSED_LOOP,
                        help="a sample file of AIConfigurator's schema for the closed-loop "
                        "section (default: the development set)")  # fmt: skip
    args = parser.parse_args()
    if not OBS.is_dir():
        print(f"measured data not found: {OBS}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        gpus = {"b300"} if args.only == "steps" else {"h100", "a100", "b300"}
        if args.only in (None, "closed-loop") and args.closed_loop_csv != CLOSED_LOOP:
            systems = {r.gpu for r in closed_loop_runs_of(args.closed_loop_csv)}
            gpus |= {GPU_OF_SYSTEM[s] for s in systems if s in GPU_OF_SYSTEM}
            gpus = {g for g in gpus if (AICONFIGURATOR / f"{g}_sxm").is_dir()}  # else roofline
        package_gpus = ("b300",) if args.tables == "package" else ()
        shared_gpus = tuple(sorted(gpus - set(package_gpus)))
        url, env = prepare_database(args.database, Path(tmp), shared_gpus, package_gpus)
        env = {**env, **{k: v for k, v in os.environ.items() if k.startswith("SERVETUNE_")}}
        env["SERVETUNE_DATABASE_URL"] = url
        if args.only in (None, "steps"):
            first = "package" if args.tables == "package" else "shared"
            errors = {first: steps_section(url, args.fit, first)}
            if args.tables == "both":
                (Path(tmp) / "package").mkdir()
                other, _ = prepare_database(None, Path(tmp) / "package", (), ("b300",))
                errors["package"] = steps_section(other, args.fit, "package")
                steps_side_by_side(errors)
        if args.only in (None, "closed-loop"):
            closed_loop_section(url, env, args.fit, args.closed_loop_csv)
        if args.only in (None, "offline"):
            offline_section(url, args.fit)
        if args.only in (None, "online"):
            online_section(url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
