"""REST read-path load benchmark: p50/p99 per GET endpoint at 50 clients (target p99 <= 50 ms).

1. Seeds a scratch database the way users fill one: three projects with two keys
   and an admin key each; the real traces in shared/data/traces (else generated
   ones) plus generated ones, ingested per project by the upload path's
   `ingest_trace`; finished tuning jobs with recommendations (fake outcomes, no
   search run), failed and cancelled jobs; schedules (not due during the run);
   profile runs imported from shared/data/profiles (AIConfigurator H100, 130k
   samples; Vidur); latency models with megabyte payloads.
2. Starts `servetune serve` (uvicorn, the product's default settings; SQLite with
   its embedded worker, or PostgreSQL with `--database postgresql`), a new one for
   each sweep.
3. For every GET route of the app, `--clients` keep-alive connections from a
   separate load process (a raw asyncio HTTP/1.1 client, light on the CPU) send
   `--duration` s of requests spread over keys and ids of several projects: the
   detail routes over every stored id, the 404s over other projects' ids, unknown
   keys (401), and the latest recommendation both as a repeated poll and as a first
   hit (distinct filters, never asked before in the sweep). Every database read is
   kept in memory only while the database is unchanged (api.reads), and an answer
   repeated for the same path, query and project is sent before routing
   (api.fastpath): in these phases each distinct read is computed once. The first-hit
   phase sends each of its 5,388 requests at most once (it ends early when all were
   sent; they are 2,694 distinct reads: the second key of a project asking for the
   same filters gets the first key's answer), so every one of its requests is one
   that no answer kept in memory could serve. Each sweep runs on a new server,
   warmed up with one request per endpoint (first hits: with filters outside their
   list), so nothing kept by an earlier sweep serves it. Then one mixed phase over
   all of them at once, and the same mix twice more while another process commits
   a worker's write to one job every `--churn-ms` ms (default 10): its lease
   heartbeat (`lease_expires_at`: no kept read depends on it), then its progress
   (the reads of `jobs` are computed again). The sweep is
   run `--repeats` times; the table shows the medians of p50/p99 and PASS/MISS
   against p99 <= 50 ms.

The last column is the server's CPU time per request (the `servetune serve` process, all
its threads, from /proc on Linux; PostgreSQL's processes not counted): on a shared,
noisy machine it moves far less than req/s and p99, so compare changes with it.

Usage: .venv/bin/python benchmarks/bench_api.py [--database sqlite|postgresql|URL]
       [--duration 3] [--repeats 3] [--clients 50] [--uploads 10] [--mix-only]
`--uploads N` also checks N parallel uploads of distinct 100k-row traces (each stored
once, re-uploads store nothing). PostgreSQL (SERVETUNE_TEST_POSTGRES_URL, default
postgresql+psycopg://postgres@127.0.0.1:5432/test): a scratch database is created
and dropped.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_seed import PROJECTS, Seeded, seed, write_trace
from bench_common import REPO, SERVETUNE
from http_load import Phase, encode_get, load_process

sys.path.insert(0, str(REPO))
ADMIN_URL = os.environ.get(
    "SERVETUNE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
TARGET_P99_MS = 50.0
FIRST_HIT = "/v1/recommendations/latest (first hit)"  # each request sent once per sweep


@contextmanager
def serving(url: str):
    """A `servetune serve` on `url`, ready: (its pid, base URL, port)."""
    proc, base, port = start_server(url)
    try:
        yield proc.pid, base, port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# Values no seeded recommendation has, per filter of the latest recommendation.
NO_MATCH = {
    "trace_id": "2147483647", "stream": "warm-up", "model": "warm-up", "gpu": "warm-up",
    "num_gpus": "4096", "slo_ttft_ms": "1e9", "slo_tpot_ms": "1e9",
}  # fmt: skip


def warm_up(base: str, requests: dict[str, list[Request]]) -> None:
    """One request per endpoint on a new server (its first request of each route imports
    and builds what that route needs). For the first hits, one per set of filters they
    use, with values that match nothing: each query shape is compiled once, as on a
    server that has run a while, and no first hit's answer is computed."""
    with httpx.Client(base_url=base, timeout=30) as c:
        for label, reqs in requests.items():
            warm = [reqs[0]]
            if label == FIRST_HIT:
                shapes = {tuple(p.split("=")[0] for p in path.partition("?")[2].split("&") if p)
                          for path, _, _ in reqs}  # fmt: skip
                key = reqs[0][1]
                warm = [
                    ("/v1/recommendations/latest?" + "&".join(f"{n}={NO_MATCH[n]}" for n in shape),
                     key, 404)
                    for shape in sorted(shapes)
                ]  # fmt: skip
            for path, key, _ in warm:
                c.get(path, headers={"Authorization": f"Bearer {key}"} if key else {})


def start_server(url: str) -> tuple[subprocess.Popen, str, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SERVETUNE_DATABASE_URL": url, "PYTHONPATH": str(REPO)}
    cmd = [SERVETUNE, "serve", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                return proc, base, port
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not become ready")


# --- the plan: (label, [(path, key, expected status)]) per GET route ----------------------

Request = tuple[str, str | None, int]


def plan(seeded: Seeded) -> dict[str, list[Request]]:
    rng = random.Random(1)
    own = [(p, k) for p in PROJECTS for k in seeded.keys[p]]

    def each(resource: dict[str, list[int]], fmt: str, status: int = 200) -> list[Request]:
        return [(fmt.format(i), k, status) for p, k in own for i in resource[p]]

    def foreign(resource: dict[str, list[int]], fmt: str) -> list[Request]:
        return [
            (fmt.format(i), k, 404) for p, k in own for q in PROJECTS if q != p for i in resource[q]
        ]

    any_key = [k for _, k in own]
    first_hits = [
        (f"/v1/recommendations/latest?{q}", k, 200)
        for p, k in own for q in sorted(seeded.filters[p])
    ]  # fmt: skip
    rng.shuffle(first_hits)
    polls = [
        ("/v1/recommendations/latest?model=llama-3.1-8b&gpu=h100&num_gpus=8", k, 200)
        for k in any_key
    ]
    out: dict[str, list[Request]] = {
        "/healthz": [("/healthz", None, 200)],
        "/readyz": [("/readyz", None, 200)],
        "/metrics": [("/metrics", None, 200)],
        "/openapi.json": [("/openapi.json", None, 200)],
        "/docs": [("/docs", None, 200)],
        "/docs/oauth2-redirect": [("/docs/oauth2-redirect", None, 200)],
        "/redoc": [("/redoc", None, 200)],
        "/v1/traces": [("/v1/traces", k, 200) for k in any_key]
        + [("/v1/traces?stream=prod-chat", k, 200) for k in any_key],
        "/v1/traces (401 unknown key)": [("/v1/traces", f"st_bogus{i}", 401) for i in range(50)],
        "/v1/traces/{trace_id}": each(seeded.traces, "/v1/traces/{}"),
        "/v1/traces/{trace_id} (404 other project)": foreign(seeded.traces, "/v1/traces/{}"),
        "/v1/traces/{trace_id}/stats": each(seeded.traces, "/v1/traces/{}/stats"),
        "/v1/tuning-jobs": [("/v1/tuning-jobs", k, 200) for k in any_key]
        + [("/v1/tuning-jobs?status=succeeded&limit=20", k, 200) for k in any_key],
        "/v1/tuning-jobs/{job_id}": each(seeded.jobs, "/v1/tuning-jobs/{}"),
        "/v1/tuning-jobs/{job_id} (404 other project)": foreign(seeded.jobs, "/v1/tuning-jobs/{}"),
        "/v1/tuning-jobs/{job_id}/result": [
            (path, k, 200 if s == 200 else 409)
            for path, k, s in each(seeded.jobs, "/v1/tuning-jobs/{}/result")
        ],
        FIRST_HIT: first_hits,
        "/v1/recommendations/latest (repeat poll)": polls,
        "/v1/schedules": [("/v1/schedules", k, 200) for k in any_key],
        "/v1/schedules/{schedule_id}": each(seeded.schedules, "/v1/schedules/{}"),
        "/v1/profiles": [("/v1/profiles", k, 200) for k in any_key],
        "/v1/profiles/{run_id}": [
            (f"/v1/profiles/{i}", k, 200) for i in seeded.profiles for k in any_key
        ],
        "/v1/latency-models": [("/v1/latency-models", k, 200) for k in any_key],
        "/v1/latency-models/{model_id}": [
            (f"/v1/latency-models/{i}", k, 200) for i in seeded.latency_models for k in any_key
        ],
        "/v1/keys": [
            (path, key, 200)
            for p, key in seeded.admins.items()
            for path in ("/v1/keys", f"/v1/keys?project={p}")
        ],
        "/ui/jobs/{job_id}": [(f"/ui/jobs/{i}", None, 200) for i in seeded.jobs["alpha"]],
    }
    return out


def check_coverage(labels: list[str]) -> list[str]:
    """GET routes of the app that the plan does not drive."""
    from api.main import create_app
    from api.settings import Settings

    def walk(routes):
        for route in routes:
            included = getattr(route, "original_router", None)  # an included APIRouter
            yield from walk(included.routes) if included is not None else (route,)

    app = create_app(Settings(database_url="sqlite://"))
    routes = {r.path for r in walk(app.routes) if "GET" in (getattr(r, "methods", None) or ())}
    covered = {label.split(" (")[0] for label in labels}
    return sorted(routes - covered)


def fix_statuses(base: str, requests: dict[str, list[Request]]) -> None:
    """Job results: 200 when the job succeeded, else 409 (asked once, before the load)."""
    with httpx.Client(base_url=base, timeout=30) as c:
        fixed = []
        for path, key, _ in requests["/v1/tuning-jobs/{job_id}/result"]:
            r = c.get(path, headers={"Authorization": f"Bearer {key}"})
            fixed.append((path, key, r.status_code))
        requests["/v1/tuning-jobs/{job_id}/result"] = fixed


@dataclass
class Stats:
    """Per sweep: p50 and p99 in ms, requests per second."""

    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)

    cpu_us: list[float] = field(default_factory=list)  # server CPU per request (Linux)

    def add(self, latencies: list[float], wall: float, cpu_s: float | None = None) -> None:
        # None answered in the phase (every client stuck behind others): infinitely slow.
        self.p50.append(float(np.percentile(latencies, 50)) if latencies else math.inf)
        self.p99.append(float(np.percentile(latencies, 99)) if latencies else math.inf)
        self.rate.append(len(latencies) / wall)
        if cpu_s is not None and latencies:
            self.cpu_us.append(cpu_s / len(latencies) * 1e6)


@dataclass
class Row:
    alone: Stats = field(default_factory=Stats)  # 50 clients on this endpoint only
    mixed: Stats = field(default_factory=Stats)  # 50 clients over every endpoint at once
    errors: int = 0


MIXED = "all endpoints at once"
CHURN = "all at once, a job heartbeat committed every 10 ms"  # (--churn-ms)
PROGRESS = "all at once, a job's progress committed every 10 ms"
# What each churn row's writer commits to one job, a new value each time.
WRITES = {CHURN: "heartbeat", PROGRESS: "progress"}


def commits(url: str, interval: float, what: str) -> None:
    """Commit a worker's write to one job every `interval` s until killed: its lease
    heartbeat (`lease_expires_at`, which no answer shows: the kept reads stand) or its
    progress (shown by the job's answers: the reads of `jobs` are computed again)."""
    from datetime import UTC, datetime, timedelta

    from optimizer.search import TuneProgress
    from storage.codec import to_json
    from storage.db import make_engine
    from storage.models import JobRow

    jobs = JobRow.__table__
    engine = make_engine(url)
    first = sa.select(sa.func.min(jobs.c.id)).scalar_subquery()
    n = 0
    while True:
        n += 1
        if what == "heartbeat":
            values = {"lease_expires_at": datetime.now(UTC) + timedelta(seconds=30)}
        else:
            values = {"progress": to_json(TuneProgress(n, 10**9))}
        with engine.begin() as conn:
            conn.execute(sa.update(jobs).where(jobs.c.id == first).values(**values))
        time.sleep(interval)


@contextmanager
def committing(url: str, interval_ms: float, what: str):
    writer = multiprocessing.get_context("spawn").Process(
        target=commits, args=(url, interval_ms / 1e3, what), daemon=True
    )
    writer.start()
    try:
        time.sleep(0.5)
        yield
    finally:
        writer.kill()
        writer.join()


def sweep(requests: dict[str, list[Request]], args, pool) -> dict[str, Row]:
    """`args.repeats` sweeps, each on a new server (warmed up): nothing a sweep's server
    keeps in memory comes from an earlier sweep."""
    labels = list(requests)
    alone = [
        Phase([(i, encode_get(p, k), s) for p, k, s in requests[label]], once=label == FIRST_HIT)
        for i, label in enumerate(labels)
    ]
    # Every endpoint equally often, each cycling through its own requests.
    rounds = min(max(len(phase.requests) for phase in alone), 5000)
    order = list(range(len(alone)))
    mixed = []
    for k in range(rounds):
        random.Random(k).shuffle(order)
        mixed += [alone[i].requests[k % len(alone[i].requests)] for i in order]
    churns = list(WRITES) if args.churn_ms else []
    rows = {label: Row() for label in [*labels, MIXED, *churns]}
    for r in range(args.repeats):
        with serving(args.url) as (pid, base, port):
            warm_up(base, requests)
            load = os.getloadavg()[0]
            rows_of_sweep(rows, labels, pool, (pid, port), alone, mixed, args)
        print(
            f"  sweep {r + 1}/{args.repeats}: 1-min load average {load:.2f} before, "
            f"{os.getloadavg()[0]:.2f} after",
            flush=True,
        )
    return rows


def rows_of_sweep(
    rows: dict[str, Row],
    labels: list[str],
    pool: ProcessPoolExecutor,
    server: tuple[int, int],
    alone: list[Phase],
    mixed: list[tuple[int, bytes, int]],
    args: argparse.Namespace,
) -> None:
    """One sweep's phases on the server (pid, port), added to `rows`."""
    pid, port = server
    phases = [*([] if args.mix_only else alone), Phase(mixed)]
    got = pool.submit(load_process, port, phases, args.clients, args.duration, pid)
    *each, (mix_latencies, mix_errors, mix_wall, mix_cpu) = got.result()
    for label, (latencies, errors, wall, cpu) in zip(labels, each, strict=not args.mix_only):
        (values,) = latencies.values()
        rows[label].alone.add(values, wall, cpu)
        rows[label].errors += sum(errors.values())
    for i, label in enumerate(labels):
        rows[label].mixed.add(mix_latencies[i], mix_wall)
        rows[label].errors += mix_errors[i]
    rows[MIXED].mixed.add([v for vs in mix_latencies.values() for v in vs], mix_wall, mix_cpu)
    for label, what in WRITES.items() if args.churn_ms else ():
        with committing(args.url, args.churn_ms, what):
            got = pool.submit(load_process, port, [Phase(mixed)], args.clients, args.duration, pid)
            ((churn_latencies, churn_errors, churn_wall, churn_cpu),) = got.result()
        values = [v for vs in churn_latencies.values() for v in vs]
        rows[label].mixed.add(values, churn_wall, churn_cpu)
        rows[label].errors += sum(churn_errors.values())


def _verdict(p99: float | None) -> str:
    return "" if p99 is None else ("PASS" if p99 <= TARGET_P99_MS else "MISS")


def report(rows: dict[str, Row], args) -> None:
    """Medians over the sweeps; PASS when p99 <= the target (and no unexpected status)."""
    width = max(len(label) for label in rows)
    med = statistics.median
    print(
        f"\n{args.clients} clients, medians of {args.repeats} sweeps of {args.duration:g} s; "
        f"target p99 <= {TARGET_P99_MS:.0f} ms\n"
        f"{'':<{width}}  {'alone: 50 clients on it':^30}  {'in the mix: all endpoints':^30}\n"
        f"{'GET endpoint':<{width}}  {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7}      "
        f"{'req/s':>7} {'p50 ms':>7} {'p99 ms':>7}      errors  server CPU us/req"
    )
    passed = total = 0
    for label, row in rows.items():
        cells = []
        for stats in (row.alone, row.mixed):
            if not stats.p99:
                cells.append(f"{'':>7} {'':>7} {'':>7} {'':4}")
                continue
            p99 = med(stats.p99)
            verdict = _verdict(p99) if row.errors == 0 else "MISS"
            passed += verdict == "PASS"
            total += 1
            cells.append(f"{med(stats.rate):>7,.0f} {med(stats.p50):>7.1f} {p99:>7.1f} {verdict:4}")
        cpu = row.alone.cpu_us or row.mixed.cpu_us
        cpu_cell = f"{med(cpu):>17,.0f}" if cpu else f"{'':>17}"
        print(f"{label:<{width}}  {cells[0]}  {cells[1]}  {row.errors:>6}  {cpu_cell}")
    print(
        f"{passed}/{total} PASS\n(server CPU: the `servetune serve` process, all its threads, "
        "per request answered, alone on the endpoint; for the mixes, over the mix. "
        "PostgreSQL's own processes are not counted.)"
    )


def uploads(base: str, key: str, url: str, count: int, rows: int) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    with tempfile.TemporaryDirectory() as tmp:
        files = [write_trace(Path(tmp) / f"t{i}.csv", rows, 1000 + i) for i in range(count)]

        def send(path: Path) -> tuple[int, float]:
            t = time.perf_counter()
            with path.open("rb") as fh:
                r = httpx.post(
                    base + "/v1/traces", headers=headers, files={"file": fh},
                    data={"stream": "bulk"}, timeout=600,
                )  # fmt: skip
            return r.status_code, time.perf_counter() - t

        t0 = time.perf_counter()
        with ThreadPoolExecutor(count) as pool:
            first = list(pool.map(send, files))
        wall = time.perf_counter() - t0
        with ThreadPoolExecutor(count) as pool:
            again = list(pool.map(send, files))
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        traces = conn.execute(sa.text("SELECT count(*) FROM traces WHERE stream='bulk'")).scalar()
    engine.dispose()
    print(
        f"uploads: {count} x {rows:,} rows in parallel: statuses {sorted(s for s, _ in first)}, "
        f"wall {wall:.1f} s (slowest {max(t for _, t in first):.1f} s); re-upload statuses "
        f"{sorted({s for s, _ in again})}; stored traces {traces} (expected {count})"
    )


@contextmanager
def scratch_database(which: str, workdir: Path):
    if which == "sqlite":
        yield f"sqlite:///{workdir / 'servetune.db'}"
        return
    admin_url = ADMIN_URL if which == "postgresql" else which
    name = f"st_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--database", default="sqlite", help="sqlite, postgresql or an admin URL")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per endpoint phase")
    ap.add_argument("--repeats", type=int, default=3, help="sweeps; the table shows medians")
    ap.add_argument("--only", default="", help="only endpoints whose label contains this")
    ap.add_argument("--mix-only", action="store_true", help="only the phases of all at once")
    ap.add_argument("--uploads", type=int, default=0, help="then N parallel 100k-row uploads")
    ap.add_argument(
        "--churn-ms", type=float, default=10.0,
        help="also the mix while another process commits every N ms (0: not)",
    )  # fmt: skip
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, scratch_database(args.database, Path(tmp)) as url:
        t = time.perf_counter()
        seeded = seed(url, Path(tmp))
        print(
            f"seeded {sa.make_url(url).get_backend_name()} in {time.perf_counter() - t:.0f} s: "
            f"{sum(map(len, seeded.traces.values()))} traces, "
            f"{sum(map(len, seeded.jobs.values()))} jobs, {len(seeded.profiles)} profile runs",
            flush=True,
        )
        requests = plan(seeded)
        empty = [label for label, reqs in requests.items() if not reqs]  # no shared data
        requests = {label: reqs for label, reqs in requests.items() if reqs}
        missing = check_coverage(list(requests))
        no_data = f" (no data for {empty})" if empty else ""
        print(f"GET routes not driven: {missing or 'none'}{no_data}")
        if args.only:
            requests = {k: v for k, v in requests.items() if args.only in k}
        args.url = url
        if "/v1/tuning-jobs/{job_id}/result" in requests:
            with serving(url) as (_, base, _port):
                fix_statuses(base, requests)
        print(f"{os.cpu_count()} CPUs; server: `servetune serve`, a new one per sweep", flush=True)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            rows = sweep(requests, args, pool)
        report(rows, args)
        if args.uploads:
            with serving(url) as (_, base, _port):
                uploads(base, seeded.keys["alpha"][0], url, args.uploads, 100_000)


if __name__ == "__main__":
    main()
