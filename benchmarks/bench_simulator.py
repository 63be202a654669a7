"""Simulator speed on the path users run: a stored fitted latency model, through the catalog.

    .venv/bin/python benchmarks/bench_simulator.py [--repeats 5] [--database URL]
        [--vidur PATH [--vidur-python PY]]

1. The event loop alone, in this process: the whole Azure conv trace (19,366
   requests) in three deployments (one colocated H100 replica with chunked
   prefill; the same with EAGLE speculation; 2 prefill + 2 decode instances),
   priced by `api.services.latency.resolve_latency` on a database holding the
   AIConfigurator H100 tables, imported and fitted (a temporary SQLite file unless
   `--database` names one that has them). Median wall time of the repeats, steps/s at
   the median and at the best repeat (on a shared machine the best is the steadier).
2. Whole processes: `servetune simulate` of the Azure code trace on one H100 as a
   subprocess, first with no compiled table in the database, then again (the
   tables come from the database). Targets: first <= 5 s, then <= 1.5 s, with a
   busy process beside it (`--busy`: a CPU-bound Python loop on the other core).
   Run as an installed package runs, with bytecode caches (the environment's
   PYTHONDONTWRITEBYTECODE is dropped for these processes).
3. With `--vidur PATH` (a checkout of microsoft/vidur with its requirements
   installed, run by `--vidur-python`, default PATH/.venv/bin/python; Vidur's
   Llama-2-70B A100 attention.csv lives in ../shared/data/profiles/vidur if the
   checkout lacks it): the same case in both simulators. Vidur's processed Azure
   code trace (`data/processed_traces/splitwise_code.csv`) clipped as Vidur's trace
   replay clips it (prompt + output <= 4,096, cut from the prompt) is written once
   and read by both; Llama-2-70B TP2 on an A100, chunks of 512 tokens, 128
   sequences, 3,328 KV blocks each. Vidur runs with its metrics on (request, batch
   and memory metrics, as servetune keeps per-request latencies and per-step
   records; no plots) and off, never with its Chrome trace; it runs once to train
   and cache its predictors, then each repeat runs both Vidur variants and
   servetune (its process, then its event loop in this process). servetune's A100
   prices are the roofline (no fitted A100 model) with the KV pool set to the same
   block count. The iteration counts must agree within 1% (else it fails, printing
   both); it prints whole-process times, iterations per second of each event loop
   and the ratios as medians of the paired repeats (target: whole process >= 5x
   Vidur's, event loop >= 20x as the goal).

Everything prints medians of repeated runs; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from bench_common import AICONFIGURATOR_H100, SERVETUNE, SHARED, TRACES, prepare_database, run

VIDUR_BLOCKS = 3328  # Vidur's own KV accounting of Llama-2-70B TP2 on an 80 GB A100
VIDUR_MAX_TOKENS = 4096  # Vidur's trace replay clips prompt + output to this (its default)


def _clear_tables(url: str) -> None:
    import sqlalchemy as sa

    from storage.db import make_engine

    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM latency_tables"))
    engine.dispose()


def bench_event_loop(url: str, repeats: int) -> None:
    from api.services.latency import resolve_latency
    from optimizer.config import InstanceConfig, ServingConfig, SpecMethod, SpeculationConfig
    from optimizer.sim import SLO, simulate
    from optimizer.traces import parse_trace
    from optimizer.workload import Workload
    from storage.db import make_engine, session_scope

    trace = Workload.from_columns(
        parse_trace(TRACES / "AzureLLMInferenceTrace_conv.csv").columns, name="azure-conv"
    )
    engine = make_engine(url)
    with session_scope(engine) as s:
        resolved = resolve_latency(s, "llama-3.1-8b")
    engine.dispose()
    model = "llama-3.1-8b"
    inst = InstanceConfig(accelerator="h100", max_num_batched_tokens=2048, max_num_seqs=256)
    eagle = SpeculationConfig(method=SpecMethod.EAGLE, num_speculative_tokens=3)
    scenarios = {
        "colocated": ServingConfig.colocated(model, inst),
        "speculative": ServingConfig.colocated(model, inst, speculation=eagle),
        "disagg-2p2d": ServingConfig.disaggregated(model, inst, inst, num_prefill=2, num_decode=2),
    }
    print(f"\n1. event loop alone: {len(trace):,} requests, {trace.total_output_tokens:,} output "
          f"tokens; latency: {resolved.label}")  # fmt: skip
    print(f"{'scenario':14} {'wall s':>8} {'steps/s':>10} {'best':>10} {'steps':>9} "
          f"{'TTFT p99 s':>10} {'TPOT p50 ms':>11}")  # fmt: skip
    slo = SLO(ttft_s=2.0, tpot_s=0.1)
    for name, cfg in scenarios.items():
        simulate(trace.head(200), cfg, resolved.source, slo=slo)  # compile outside the timing
        walls = []
        for _ in range(repeats):
            start = time.perf_counter()
            res = simulate(trace, cfg, resolved.source, seed=0, slo=slo)
            walls.append(time.perf_counter() - start)
        wall = statistics.median(walls)
        steps = res.phases.num_steps
        print(f"{name:14} {wall:8.2f} {steps / wall:10,.0f} {steps / min(walls):10,.0f} "
              f"{steps:9,} {res.ttft.p99:10.3f} {res.tpot.p50 * 1e3:11.2f}")  # fmt: skip


@contextmanager
def busy_beside(enabled: bool):
    """A CPU-bound process running beside the measured ones (the targets' condition)."""
    if not enabled:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def bench_process(
    url: str, env: dict[str, str], repeats: int, workdir: Path, *, busy: bool
) -> None:
    # As an installed package runs: bytecode cached (this sandbox sets PYTHONDONTWRITEBYTECODE,
    # which would recompile every module of ours on every start).
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    config = workdir / "h100.yaml"
    config.write_text(
        "model: llama-3.1-8b\nmode: colocated\nnum_replicas: 1\nreplica:\n"
        "  accelerator: h100\n  max_num_batched_tokens: 2048\n  max_num_seqs: 256\n"
    )
    cmd = [SERVETUNE, "simulate", "--trace", str(TRACES / "AzureLLMInferenceTrace_code.csv"),
           "--config", str(config)]  # fmt: skip
    run(cmd, env)  # writes the bytecode caches once
    firsts, seconds = [], []
    with busy_beside(busy):
        for _ in range(repeats):
            _clear_tables(url)
            firsts.append(run(cmd, env)[0])
            seconds.append(run(cmd, env)[0])
    first, second = statistics.median(firsts), statistics.median(seconds)
    beside = "a busy process beside it" if busy else "nothing beside it (--busy: a busy process)"
    print("\n2. whole `servetune simulate` process, Azure code trace (8,819 requests), one H100, "
          f"{beside}")  # fmt: skip
    print(f"first (tables compiled)      {first:6.2f} s  median of {repeats}  "
          f"{'ok' if first <= 5 else 'MISS'} (<= 5 s)")  # fmt: skip
    print(f"again (tables from the db)   {second:6.2f} s  median of {repeats}  "
          f"{'ok' if second <= 1.5 else 'MISS'} (<= 1.5 s)")  # fmt: skip


# Runs Vidur's own simulator and reports its event loop's time and iterations (batches),
# counted by wrapping its BatchEndEvent handler; nothing of Vidur is changed or copied.
VIDUR_DRIVER = """
import sys, time
from vidur.config import SimulationConfig
from vidur.events.batch_end_event import BatchEndEvent
from vidur.simulator import Simulator
from vidur.utils.random import set_seeds
count = [0]
handle = BatchEndEvent.handle_event
def counted(self, *args, **kw):
    count[0] += 1
    return handle(self, *args, **kw)
BatchEndEvent.handle_event = counted
sys.argv = ["vidur", *sys.argv[1:]]
config = SimulationConfig.create_from_cli_args()
set_seeds(config.seed)
simulator = Simulator(config)
start = time.perf_counter()
simulator.run()
print(f"VIDUR_LOOP {time.perf_counter() - start:.4f} {count[0]}")
"""

# What each side records. servetune always keeps per-request latencies and per-step
# records (its result); Vidur's metrics "on" keep the same kind (its request, batch and
# memory metrics, written as CSV at the end), "off" keep nothing. Neither side draws
# plots or writes event traces (Vidur's Chrome trace is on by default: turned off).
VIDUR_METRICS = {
    "on": ["--metrics_config_write_metrics", "--no-metrics_config_store_plots"],
    "off": ["--no-metrics_config_write_metrics"],
}
ITERATIONS_TOLERANCE = 0.01  # the two counts of one case may differ by this share at most


def _vidur_cmd(py: str, trace: Path, metrics: str, out: Path) -> list[str]:
    return [
        py, "-c", VIDUR_DRIVER, "--replica_config_device", "a100",
        "--replica_config_model_name", "meta-llama/Llama-2-70b-hf",
        "--cluster_config_num_replicas", "1", "--replica_config_tensor_parallel_size", "2",
        "--replica_config_num_pipeline_stages", "1",
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(trace),
        "--trace_request_generator_config_max_tokens", str(VIDUR_MAX_TOKENS),
        "--replica_scheduler_config_type", "sarathi",
        "--sarathi_scheduler_config_batch_size_cap", "128",
        "--sarathi_scheduler_config_chunk_size", "512",
        "--sarathi_scheduler_config_num_blocks", str(VIDUR_BLOCKS),
        "--no-metrics_config_enable_chrome_trace",
        *VIDUR_METRICS[metrics], "--metrics_config_output_dir", str(out),
    ]  # fmt: skip


def clip_like_vidur(source: Path, dest: Path, max_tokens: int) -> tuple[int, int]:
    """`source` (Vidur's processed trace) as Vidur's trace replay reads it, written to `dest`
    for both simulators: token counts at least 1, and a prompt + output above `max_tokens`
    cut from the prompt (Vidur's `TraceReplayRequestGenerator`; scale factors 1). Returns
    (rows, rows clipped)."""
    with source.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    clipped = 0
    with dest.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        for i, row in enumerate(rows):
            prompt = max(int(float(row["num_prefill_tokens"])), 1)
            output = max(int(float(row["num_decode_tokens"])), 1)
            over = max(prompt + output - max_tokens, 0)
            if prompt - over < 1:
                raise SystemExit(
                    f"{source} row {i + 2}: {output} output tokens exceed "
                    f"{max_tokens}; Vidur would refuse this trace"
                )
            clipped += over > 0
            out.writerow([row["arrived_at"], prompt - over, output])
    return len(rows), clipped


def _check_iterations(label: str, vidur: int, ours: int) -> None:
    """The same case runs the same iterations on both sides; anything else is not a
    comparison (fail loudly, printing both)."""
    if abs(vidur - ours) > ITERATIONS_TOLERANCE * max(vidur, ours):
        raise SystemExit(
            f"not the same case: Vidur ({label}) ran {vidur:,} iterations, servetune "
            f"{ours:,} ({abs(vidur - ours) / max(vidur, ours):.1%} apart, more than "
            f"{ITERATIONS_TOLERANCE:.0%})"
        )


def bench_vidur(vidur: Path, py: str, env: dict[str, str], repeats: int, workdir: Path) -> None:
    from optimizer.config import InstanceConfig, ServingConfig
    from optimizer.hardware import get_accelerator
    from optimizer.latency import LatencyCatalog
    from optimizer.memory import activation_reserve_bytes
    from optimizer.shapes import get_shape
    from optimizer.sim import simulate
    from optimizer.traces import parse_trace
    from optimizer.workload import Workload

    attention = vidur / "data/profiling/compute/a100/meta-llama/Llama-2-70b-hf/attention.csv"
    if not attention.exists():  # too large for some snapshots of the repository
        shutil.copy(SHARED / "profiles/vidur/compute/a100/meta-llama/Llama-2-70b-hf/attention.csv",
                    attention)  # fmt: skip
    source = vidur / "data" / "processed_traces" / "splitwise_code.csv"
    trace = workdir / "splitwise_code_clipped.csv"
    num_rows, num_clipped = clip_like_vidur(source, trace, VIDUR_MAX_TOKENS)
    venv = {**os.environ, "WANDB_MODE": "disabled"}
    cmds = {m: _vidur_cmd(py, trace, m, workdir / f"vidur-{m}") for m in VIDUR_METRICS}
    print(
        f"\n3. against Vidur: Azure code (Vidur's processed trace, {num_rows:,} requests, "
        f"{num_clipped:,} of them clipped to {VIDUR_MAX_TOKENS:,} prompt + output tokens as "
        "Vidur's trace replay clips them; both sides read the clipped rows), Llama-2-70B "
        f"TP2, A100, chunk 512, 128 seqs, {VIDUR_BLOCKS:,} KV blocks"
    )
    # servetune: the same trace, deployment and KV blocks (gpu_memory_utilization solved).
    shape = get_shape("llama-2-70b")
    probe = InstanceConfig(accelerator="a100", tp=2, max_num_batched_tokens=512, max_num_seqs=128)
    per_block = shape.kv_bytes_per_token(2) * probe.block_size
    used = shape.weight_bytes(2) + activation_reserve_bytes(shape, probe)
    util = (used + (VIDUR_BLOCKS + 0.5) * per_block) / get_accelerator("a100").hbm_bytes
    inst = InstanceConfig(accelerator="a100", tp=2, max_num_batched_tokens=512, max_num_seqs=128,
                          gpu_memory_utilization=round(util, 6))  # fmt: skip
    config = ServingConfig.colocated("llama-2-70b", inst, max_model_len=VIDUR_MAX_TOKENS)
    assert config.roles()[0].kv_blocks == VIDUR_BLOCKS, config.roles()[0].kv_blocks
    path = workdir / "a100-70b.yaml"
    import yaml

    path.write_text(yaml.safe_dump(config.to_dict()))
    ours_cmd = [SERVETUNE, "simulate", "--trace", str(trace), "--config", str(path), "--json"]
    for cmd in cmds.values():
        run(cmd, venv, cwd=vidur)  # the first trains and caches Vidur's predictors
    run(ours_cmd, env)  # compiles and stores the A100 table
    workload = Workload.from_columns(parse_trace(trace).columns)
    assert len(workload) == num_rows
    catalog = LatencyCatalog(shape)
    simulate(workload.head(100), config, catalog)
    walls: dict[str, list[float]] = {m: [] for m in (*VIDUR_METRICS, "servetune")}
    loops: dict[str, list[float]] = {m: [] for m in (*VIDUR_METRICS, "servetune")}
    iters: dict[str, list[int]] = {m: [] for m in (*VIDUR_METRICS, "servetune")}
    for _ in range(repeats):  # interleaved: each repeat's runs share the machine's state
        for m, cmd in cmds.items():
            wall, out = run(cmd, venv, cwd=vidur)
            loop, count = re.search(r"VIDUR_LOOP ([\d.]+) (\d+)", out).groups()
            walls[m].append(wall)
            loops[m].append(float(loop))
            iters[m].append(int(count))
        wall, out = run(ours_cmd, env)
        data = json.loads(out[out.index("{") :])
        if data["num_rejected"] or data["num_requests"] != num_rows:
            raise SystemExit(
                f"servetune simulate ran {data['num_requests']:,} requests, "
                f"rejected {data['num_rejected']:,}; expected {num_rows:,}, none"
            )
        walls["servetune"].append(wall)
        start = time.perf_counter()
        res = simulate(workload, config, catalog)
        loops["servetune"].append(time.perf_counter() - start)
        iters["servetune"].append(res.phases.num_steps)
        if data["phases"]["num_steps"] != res.phases.num_steps:
            raise SystemExit("servetune simulate and the in-process loop ran different steps")
    ours = iters["servetune"][0]
    assert len(set(iters["servetune"])) == 1, iters["servetune"]  # deterministic
    print(
        f"{'':28} {'whole process s':>16} {'event loop s':>13} {'iterations':>11} "
        f"{'iterations/s':>13}"
    )
    for m in (*VIDUR_METRICS, "servetune"):
        name = f"Vidur, metrics {m}" if m in VIDUR_METRICS else "servetune"
        n, loop = statistics.median(iters[m]), statistics.median(loops[m])
        print(
            f"{name:28} {statistics.median(walls[m]):16.2f} {loop:13.2f} {n:11,.0f} "
            f"{n / loop:13,.0f}"
        )
    for m in VIDUR_METRICS:
        for n in iters[m]:
            _check_iterations(f"metrics {m}", n, ours)
    print(
        f"iterations: Vidur {statistics.median(iters['on']):,.0f}, servetune {ours:,} "
        f"(agree within {ITERATIONS_TOLERANCE:.0%})"
    )
    for m in VIDUR_METRICS:
        # Per repeat: servetune's iterations/s over Vidur's, and Vidur's wall over ours.
        loop_x = [
            (ours / sl) / (vi / vl)
            for sl, vi, vl in zip(loops["servetune"], iters[m], loops[m], strict=True)
        ]
        proc_x = [vw / sw for vw, sw in zip(walls[m], walls["servetune"], strict=True)]
        lx, px = statistics.median(loop_x), statistics.median(proc_x)
        print(
            f"Vidur's metrics {m:3}: event loop {lx:5.1f}x Vidur's iterations/s "
            f"({min(loop_x):.1f}-{max(loop_x):.1f}), whole process {px:4.1f}x "
            f"({min(proc_x):.1f}-{max(proc_x):.1f}); medians of {repeats} paired runs"
        )
    print(
        "targets: whole process >= 5x Vidur's; event loop >= 20x as the goal (metrics on: "
        "both sides record per-request latencies and per-step records)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--database", default=None, help="a database with a fitted H100 model")
    parser.add_argument("--vidur", type=Path, default=None, help="a microsoft/vidur checkout")
    parser.add_argument("--vidur-python", default=None)
    parser.add_argument(
        "--busy", action="store_true", help="time the processes with a CPU-bound one beside"
    )
    parser.add_argument("--skip", nargs="*", default=(), choices=("loop", "process"))
    args = parser.parse_args()
    if not TRACES.exists() or not AICONFIGURATOR_H100.exists():
        print(f"shared data not found under {SHARED}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        url, env = prepare_database(args.database, workdir)
        if "loop" not in args.skip:
            bench_event_loop(url, args.repeats)
        if "process" not in args.skip:
            bench_process(url, env, args.repeats, workdir, busy=args.busy)
        if args.vidur is not None:
            py = args.vidur_python or str(args.vidur / ".venv" / "bin" / "python")
            bench_vidur(args.vidur.resolve(), py, env, args.repeats, workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
