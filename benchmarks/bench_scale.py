"""A week of production traffic, replayed on the path users run: `servetune simulate` and
`servetune plan` as subprocesses, on a synthesized week of Azure conversation requests.

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--repeats 1] [--database URL]
        [--slo-ttft-ms 2000] [--slo-tpot-ms 100] [--timeout-s 1800] [--max-rss-mb 8192]
        [--skip-plan] [--static-replicas N]

1. A database (a temporary SQLite file unless `--database` names one) holding the
   AIConfigurator H100 tables, imported and fitted (`bench_common.prepare_database`), so
   every step is priced by measured kernels. The Azure conversation sample
   (../shared/data/traces/azure2023, 19,366 requests) is imported with
   `servetune traces import`, then `servetune traces synthesize --from ID --days 7
   --rate-curve diurnal --seed 0` makes the weeks:
   - 1 M: `--mean-rate 1.65` (996,910 requests), the same seven diurnal days at a tenth
     of the rate (so the same shape, each window a tenth as busy);
   - 10 M: `--mean-rate 16.5` (9,981,660 requests), the issue's week.
   `--quick` makes and runs the 1 M week only.
2. `servetune plan --trace ID --model llama-3.1-8b --gpu h100 --unit UNIT --json` on the
   1 M week (UNIT: one H100 TP1 replica, 2,048 batched tokens, 256 sequences, so the plan
   does not screen units), with `--jobs 1` and `--jobs 2`: wall, peak RSS, the GPU-hours
   ordering it prints and, per fleet, the windows holding the attainment target.
   Targets: <= 60 s; >= 95% of the windows with requests.
3. `servetune simulate --trace ID --config FLEET --slo-ttft-ms --slo-tpot-ms --json` on
   two fleets of that replica behind round-robin:
   - static: the plan's static fleet (its peak units, read from the plan's JSON), or
     `--static-replicas N`. For the 10 M week it is the 1 M count times the ratio of the
     two weeks' request counts, rounded up: an estimate (a plan on the 10 M week is not
     run: it replays three fleets), high where the 1 M fleet is one barely busy unit;
   - 256 x TP1: lightly loaded, where stepping every token costs most.
   Per fleet: requests, wall, peak RSS (the child's own, from `os.wait4`), requests/s,
   steps/s (the `phases.num_steps` of the JSON output; the simulator reports no event
   count, so events/s are not printed). Targets for the 10 M week: <= 5 min and
   <= 2 GB each (PASS/FAIL printed); the 1 M week prints its figures against nothing.
4. When `servetune simulate --help` offers `--jobs`, each fleet runs again with
   `--jobs 2` and the speed-up (serial wall / parallel wall) is printed; otherwise a
   line says it is not available. `--serial-up-to N`: a week of more than N requests
   runs its fleets with `--jobs 2` only (judged against the targets there).

Each figure is the median of `--repeats` runs (RSS: the largest). A run past
`--timeout-s`, or whose RSS passes `--max-rss-mb` (the machine is shared: a run that
would swallow it is stopped), is printed as stopped (a FAIL). How long it takes: the trace
steps are seconds (1 M) to about a minute (10 M); each simulate or plan run takes what it
prints. Measured on this 2-core machine (shared with other work, one run each):
- the 1 M week's plan: 146 s at --jobs 1, 161 s at --jobs 2, 292 MB. The week peaks at
  about 4 req/s against one unit's 18.6 req/s, so every fleet is one unit and the plan is
  one replay of one replica, which no process count splits;
- 1 M, static 1 x TP1: 183 s / 271 MB (74 M steps); 256 x TP1: 133 s / 802 MB (211 M
  steps), 126 s at --jobs 2;
- 10 M at --jobs 2 (`--serial-up-to 2000000`): static 11 x TP1 1,149 s / 2,264 MB;
  256 x TP1 1,029 s / 2,251 MB. Both over the 5 min and 2 GB targets (see the issue's closing note).
Left out: PostgreSQL (the trace's load from it is measured by hand, not here), the
reactive and scheduled fleets on their own (the plan replays them), `--jobs` above 2,
and a quiet machine: it runs beside whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_common import SERVETUNE, TRACES, prepare_database, run

SAMPLE = TRACES / "AzureLLMInferenceTrace_conv.csv"
DAYS = 7
SEED = 0
WEEKS = {"1M": 1.65, "10M": 16.5}  # mean req/s over the week
LIGHT_REPLICAS = 256
TARGET_WALL_S = 300.0  # per fleet on the 10 M week
TARGET_RSS_MB = 2048.0
TARGET_PLAN_S = 60.0
WEEK_REQUESTS: dict[str, int] = {}  # filled as the weeks are made
TARGET_WINDOW_SHARE = 0.95  # windows (with requests) where each fleet holds the target
UNIT_YAML = """model: llama-3.1-8b
mode: colocated
num_replicas: {replicas}
routing: round_robin
replica:
  accelerator: h100
  max_num_batched_tokens: 2048
  max_num_seqs: 256
"""


@dataclass(frozen=True, slots=True)
class Measured:
    """One subprocess: its wall seconds, its own peak RSS (MB), its stdout, and why it
    was stopped before its end (None: it ran to its end)."""

    wall_s: float
    rss_mb: float
    stdout: str
    stopped: str | None


def _rss_now_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    found = re.search(r"VmRSS:\s+(\d+) kB", status)
    return 0.0 if found is None else int(found.group(1)) / 1024.0


def measure(
    cmd: list[str], env: dict[str, str], workdir: Path, timeout_s: float, max_rss_mb: float
) -> Measured:
    """Run `cmd` to its end, timing it and reading its peak RSS from `os.wait4` (this
    child's alone; RUSAGE_CHILDREN would be the largest of all). It is stopped past
    `timeout_s` or once its RSS passes `max_rss_mb` (the machine is shared)."""
    out_path, err_path = workdir / "out.txt", workdir / "err.txt"
    with out_path.open("w") as out, err_path.open("w") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        deadline = start + timeout_s
        stopped = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            rss = _rss_now_mb(proc.pid)
            if time.perf_counter() > deadline:
                stopped = f"stopped at the {timeout_s:,.0f} s timeout"
            elif rss > max_rss_mb:
                stopped = f"stopped at {rss:,.0f} MB RSS (over --max-rss-mb)"
            if stopped is not None:
                stopped += f" after {time.perf_counter() - start:,.0f} s"
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if proc.returncode != 0 and stopped is None:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({proc.returncode}):\n"
                         f"{err_path.read_text()[-2000:]}")  # fmt: skip
    return Measured(wall, usage.ru_maxrss / 1024.0, out_path.read_text(), stopped)


def repeat(
    cmd: list[str], env: dict[str, str], workdir: Path, args
) -> tuple[Measured, float, float]:
    """`args.repeats` runs: the last, the median wall and the largest peak RSS (a
    stopped run ends the repeats)."""
    runs = []
    for _ in range(args.repeats):
        runs.append(measure(cmd, env, workdir, args.timeout_s, args.max_rss_mb))
        if runs[-1].stopped:
            break
    return runs[-1], statistics.median(r.wall_s for r in runs), max(r.rss_mb for r in runs)


def stored_id(out: str) -> int:
    found = re.search(r"stored as trace (\d+)", out)
    if found is None:
        raise SystemExit(f"no trace id in the CLI's output:\n{out[-1000:]}")
    return int(found.group(1))


def make_weeks(env: dict[str, str], names: list[str]) -> dict[str, tuple[int, int]]:
    """Each week's stored trace id and request count (the sample imported first)."""
    _, out = run([SERVETUNE, "traces", "import", str(SAMPLE)], env)
    sample = stored_id(out)
    weeks = {}
    for name in names:
        wall, out = run([SERVETUNE, "traces", "synthesize", "--from", str(sample),
                         "--days", str(DAYS), "--mean-rate", str(WEEKS[name]),
                         "--rate-curve", "diurnal", "--seed", str(SEED)], env)  # fmt: skip
        trace = stored_id(out)
        requests = int(re.search(r"requests\s*│\s*([\d,]+)", out).group(1).replace(",", ""))
        weeks[name] = (trace, requests)
        made = "already stored" if "already stored" in out else f"synthesized in {wall:.1f} s"
        print(f"{name} week: trace {trace}, {requests:,} requests, mean {WEEKS[name]} req/s "
              f"({made})", flush=True)  # fmt: skip
    return weeks


def verdict(ok: bool) -> str:
    return "PASS" if ok else "*** FAIL ***"


def against_targets(wall_s: float, rss_mb: float) -> str:
    """A 10 M fleet's run against the issue's limits."""
    ok = wall_s <= TARGET_WALL_S and rss_mb <= TARGET_RSS_MB
    return f"  {verdict(ok)} (<= {TARGET_WALL_S / 60:.0f} min, <= {TARGET_RSS_MB / 1024:.0f} GB)"


def bench_plan(env, workdir, trace: int, args) -> int | None:
    """Plan the 1 M week, in one process and with `--jobs 2`; the static fleet's peak
    units (None if the plan was stopped)."""
    unit = workdir / "unit.yaml"
    unit.write_text(UNIT_YAML.format(replicas=1))
    cmd = [SERVETUNE, "plan", "--trace", str(trace), "--model", "llama-3.1-8b", "--gpu", "h100",
           "--slo-ttft-ms", str(args.slo_ttft_ms), "--slo-tpot-ms", str(args.slo_tpot_ms),
           "--unit", str(unit), "--json"]  # fmt: skip
    plan = None
    for jobs in (1, 2):
        last, wall, rss = repeat([*cmd, "--jobs", str(jobs)], env, workdir, args)
        ok = wall <= TARGET_PLAN_S and last.stopped is None
        print(f"\nplan on the 1M week, --jobs {jobs}: wall {wall:,.1f} s, peak RSS {rss:,.0f} MB"
              f"  {verdict(ok)} (<= {TARGET_PLAN_S:.0f} s)")  # fmt: skip
        if last.stopped:
            print(f"  {last.stopped}")
            continue
        plan = json.loads(last.stdout)
    if plan is None:
        return None
    print(f"  lower bound {plan['lower_bound']['gpu_hours']:,.1f} GPU-hours")
    windows = sum(1 for w in plan["windows"] if w["stop"] > w["first"])
    for fleet in plan["fleets"]:
        peak = max(fleet["schedule"]["counts"])
        held = fleet["windows_meeting_target"]
        share = held / windows if windows else 1.0
        print(f"  {fleet['kind']:9} {fleet['gpu_hours']:9,.1f} GPU-hours  peak {peak} units  "
              f"attainment {fleet['attainment']:.1%}  windows holding the target {held}/"
              f"{windows} ({share:.1%}) {verdict(share >= TARGET_WINDOW_SHARE)} "
              f"(>= {TARGET_WINDOW_SHARE:.0%})")  # fmt: skip
        if "stands for it" in fleet["note"]:
            print(f"  {'':9} (not replayed: {fleet['note'].rsplit('; ', 1)[-1]})")
    print(f"  {plan['ordering']}")
    static = next(f for f in plan["fleets"] if f["kind"] == "static")
    return max(static["schedule"]["counts"])


def jobs_available(env: dict[str, str]) -> bool:
    _, out = run([SERVETUNE, "simulate", "--help"], env)
    return "--jobs" in out


def bench_fleet(env, workdir, week: str, trace: int, replicas: int, label: str, args) -> None:
    config = workdir / f"fleet-{replicas}.yaml"
    config.write_text(UNIT_YAML.format(replicas=replicas))
    cmd = [SERVETUNE, "simulate", "--trace", str(trace), "--config", str(config),
           "--slo-ttft-ms", str(args.slo_ttft_ms), "--slo-tpot-ms", str(args.slo_tpot_ms),
           "--json"]  # fmt: skip
    name = f"{week} {label} ({replicas} x TP1)"
    requests = WEEK_REQUESTS[week]
    if args.serial_up_to is not None and requests > args.serial_up_to and args.jobs_ok:
        print(f"{name:28} one process: not run ({requests:,} requests > --serial-up-to)")
        run_parallel(cmd, env, workdir, args, None, week)
        return
    last, wall, rss = repeat(cmd, env, workdir, args)
    if last.stopped:
        print(f"{name:28} {last.stopped}, peak RSS {rss:,.0f} MB so far  {verdict(False)}",
              flush=True)  # fmt: skip
        return
    result = json.loads(last.stdout)
    requests, steps = result["num_requests"], result["phases"]["num_steps"]
    line = (f"{name:28} {requests:>11,} {wall:9,.1f} {rss:9,.0f} {requests / wall:10,.0f} "
            f"{steps / wall:11,.0f} {steps:13,} {result['slo_attainment']:8.1%}")  # fmt: skip
    if week == "10M":
        line += against_targets(wall, rss)
    print(line, flush=True)
    if args.jobs_ok:
        run_parallel(cmd, env, workdir, args, wall, week)


def run_parallel(cmd, env, workdir, args, serial_wall: float | None, week: str) -> None:
    """The fleet again with `--jobs 2`: its wall and RSS (against the targets on the 10 M
    week), and the speed-up over the serial wall when that ran."""
    par, wall, rss = repeat([*cmd, "--jobs", "2"], env, workdir, args)
    if par.stopped:
        print(f"{'':28} --jobs 2 {par.stopped}  {verdict(False)}")
        return
    line = f"{'':28} --jobs 2: wall {wall:,.1f} s, peak RSS {rss:,.0f} MB"
    if serial_wall is not None:
        line += f", speed-up {serial_wall / wall:.2f}x"
    if week == "10M":
        line += against_targets(wall, rss)
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the 1 M week only")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--database", help="database URL (default: a temporary SQLite file)")
    ap.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=100.0)
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    ap.add_argument("--max-rss-mb", type=float, default=8192.0,
                    help="stop a run whose RSS passes this (the machine is shared)")  # fmt: skip
    ap.add_argument("--skip-plan", action="store_true", help="no `servetune plan` run")
    ap.add_argument("--serial-up-to", type=int, metavar="REQUESTS",
                    help="a bigger week runs its fleets with --jobs 2 only")  # fmt: skip
    ap.add_argument("--static-replicas", type=int, metavar="N",
                    help="the static fleet on the 1 M week (default: the plan's)")  # fmt: skip
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        workdir = Path(tmp)
        _, env = prepare_database(args.database, workdir)
        weeks = make_weeks(env, ["1M"] if args.quick else ["1M", "10M"])
        WEEK_REQUESTS.update({name: n for name, (_, n) in weeks.items()})
        static = None if args.skip_plan else bench_plan(env, workdir, weeks["1M"][0], args)
        if args.static_replicas is not None:
            static = args.static_replicas
        args.jobs_ok = jobs_available(env)
        print(f"\nsimulate, llama-3.1-8b on H100 TP1 behind round-robin, SLO TTFT "
              f"{args.slo_ttft_ms:g} ms / TPOT {args.slo_tpot_ms:g} ms; median of "
              f"{args.repeats}")  # fmt: skip
        if not args.jobs_ok:
            print("`servetune simulate --jobs` is not available in this build: no parallel runs")
        print(f"{'fleet':28} {'requests':>11} {'wall s':>9} {'RSS MB':>9} {'req/s':>10} "
              f"{'steps/s':>11} {'steps':>13} {'attained':>8}")  # fmt: skip
        for week, (trace, requests) in weeks.items():
            if static is None:
                print(f"{week} static: no size (no plan figure and no --static-replicas)")
            else:
                scaled = math.ceil(static * requests / weeks["1M"][1])
                bench_fleet(env, workdir, week, trace, scaled, "static", args)
            bench_fleet(env, workdir, week, trace, LIGHT_REPLICAS, "light", args)


if __name__ == "__main__":
    main()
