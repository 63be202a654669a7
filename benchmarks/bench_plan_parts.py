"""A plan made in one process against the same plan as a job on a pool of `servetune
worker` processes sharing PostgreSQL (its capacity searches and fleet replays as
`plan_part` jobs).

Prints the median wall time of each over `--repeats` plans (roofline latency, a given
unit, a synthetic trace whose middle third runs at 3x the rate), the speed-up of the
pool over one process, and which worker ran each part. The pool's time includes
queueing and the workers' polling; its plan is checked equal to the in-process one.
On a machine with fewer cores than workers the speed-up says little.

    python benchmarks/bench_plan_parts.py [--requests 20000] [--workers 1 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import sqlalchemy as sa
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from api.services.ingest import ingest_trace  # noqa: E402
from api.services.planning import load_plan_trace, make_plan  # noqa: E402
from optimizer.config import ServingConfig  # noqa: E402
from optimizer.plan import FleetPlan, PlanRequest  # noqa: E402
from storage.db import make_engine, session_scope, upgrade_database  # noqa: E402
from storage.jobs import enqueue_job, get_job, job_parts  # noqa: E402
from storage.plans import plan_text_of_job  # noqa: E402

SERVER = os.environ.get(
    "SERVETUNE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
UNIT = ServingConfig.from_dict(
    yaml.safe_load((REPO / "examples" / "colocated-h100.yaml").read_text())
)


def _trace(path: Path, n: int, rate: float) -> Path:
    rng = np.random.default_rng(1)
    gaps = rng.exponential(1 / rate, size=n)
    gaps[n // 3 : 2 * n // 3] /= 3
    arrival = np.cumsum(gaps) - gaps[0]
    rows = ["arrival_s,input_tokens,output_tokens"]
    rows += [f"{a:.4f},{600 + i % 400},{40 + i % 160}" for i, a in enumerate(arrival)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _pool_plan(url: str, request: PlanRequest, env: dict[str, str], workers: int):
    """(wall s, the plan, each part's worker) of one plan job on `workers` processes."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from api.cli import main; main()",
                "worker",
                "--no-schedules",
                "--poll-s",
                "0.2",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    engine = make_engine(url)
    try:
        time.sleep(3.0)  # the workers start (imports) before the clock does
        start = time.perf_counter()
        with session_scope(engine) as s:
            jid = enqueue_job(s, project="default", params=request).id
        while True:
            with session_scope(engine) as s:
                job = get_job(s, jid)
            if job.status.finished:
                break
            time.sleep(0.05)
        wall = time.perf_counter() - start
        if job.error:
            raise SystemExit(f"the plan job failed: {job.error}")
        with session_scope(engine) as s:
            stored = plan_text_of_job(s, jid)
            workers_of = [p.worker for p in job_parts(s, jid)]
        assert stored is not None
        return wall, FleetPlan.from_dict(json.loads(stored.outcome)), workers_of
    finally:
        engine.dispose()
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--window-s", type=float, default=300.0)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    name = f"bench_parts_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = SERVER.rsplit("/", 1)[0] + f"/{name}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SERVETUNE_DATABASE_URL": url}
    try:
        upgrade_database(url)
        with tempfile.TemporaryDirectory() as tmp:
            path = _trace(Path(tmp) / "trace.csv", args.requests, args.rate)
            engine = make_engine(url)
            with session_scope(engine) as s:
                tid = ingest_trace(s, path).trace.id
            engine.dispose()
        request = PlanRequest(
            model="llama-3.1-8b",
            gpu="h100",
            slo_ttft_ms=1000,
            slo_tpot_ms=50,
            trace_id=tid,
            window_s=args.window_s,
            cold_start_s=30,
            gpu_budget=64,
            unit=UNIT,
        )
        trace = load_plan_trace(url, tid)
        walls, plan = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            plan = make_plan(request, trace, database_url=url)
            walls.append(time.perf_counter() - start)
        here = statistics.median(walls)
        print(
            f"{args.requests:,} requests, {len(plan.windows)} windows of {args.window_s:g} s, "
            f"{len(plan.bucketing.buckets)} length-mix bucket(s): "
            f"{len(plan.bucketing.buckets) + len(plan.fleets)} parts"
        )
        print(f"in one process: median {here:.2f} s over {args.repeats}")
        for n in args.workers:
            runs = [_pool_plan(url, request, env, n) for _ in range(args.repeats)]
            wall = statistics.median(r[0] for r in runs)
            same = all(r[1].to_dict() == plan.to_dict() for r in runs)
            ran = [len(set(r[2])) for r in runs]
            print(
                f"pool of {n} worker(s): median {wall:.2f} s ({here / wall:.2f}x one process); "
                f"plan equal to the in-process one: {same}; workers running parts per plan: {ran}"
            )
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
