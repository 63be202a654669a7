"""REST read-path load benchmark: p50/p99 of every GET route at 50 clients.

Targets, at 50 clients, for every GET route alone and in the mix of all of them:
p99 <= 100 ms on SQLite, p99 <= 150 ms on PostgreSQL. The table says PASS or MISS
against the target of the database it ran on (a phase that got any unexpected
status is a MISS).

What it measures:
1. Seeds a scratch database the way users fill one (api_seed.py: three projects with
   keys, real and generated traces, finished, failed and cancelled jobs with their
   recommendations, schedules, imported profile runs, latency models).
2. Starts `servetune serve` as users run it (uvicorn, the product's defaults; SQLite
   with its embedded worker, or PostgreSQL with `--database postgresql`: a scratch
   database is created and dropped), a new one for each sweep, warmed up with one
   request per route and set of query parameters.
3. For every GET route of the app, `--clients` keep-alive connections from a separate
   load process (a raw asyncio HTTP/1.1 client, light on the CPU) send `--duration` s
   of requests, round-robin over keys and ids of several projects: the detail routes
   over every stored id, 404s over other projects' ids, unknown keys (401), the latest
   recommendation over thousands of distinct filter combinations spread over the
   seeded deployments. Conditional GETs of job status, job result and latest
   recommendation send `If-None-Match` with the ETag each answer had when fetched
   once before the load, and expect 304; where the server sent no ETag the request
   goes without the header and expects the status it got (counted in a line before
   the table). Then one phase of all routes mixed. Every route of the app must be
   driven (checked, printed). `--repeats` sweeps; the table shows medians of req/s,
   p50, p99 and the server's CPU per request (the `servetune serve` process, all its
   threads, from /proc on Linux; PostgreSQL's processes not counted): on a noisy
   machine it moves far less than req/s and p99, so compare changes with it.

What it leaves out, read the numbers with it in mind:
- ONE MACHINE: LOAD CLIENT, SERVER AND POSTGRESQL SHARE ITS (2) CORES: INDICATIVE FIGURES.
- NO WRITES DURING THE READ PHASES: no job runs or reports progress, no trace is
  uploaded while reads are measured (`--uploads N`: N parallel uploads of distinct
  100k-row traces afterwards, on their own). Loopback only: no TLS, no proxy.

Usage: .venv/bin/python benchmarks/bench_api.py [--database sqlite|postgresql|URL]
       [--duration 3] [--repeats 3] [--clients 50] [--uploads 10] [--mix-only]
(PostgreSQL: the server of SERVETUNE_TEST_POSTGRES_URL, default postgres@127.0.0.1:5432.)
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
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import httpx
import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_seed import PROJECTS, Seeded, scratch_database, seed, write_trace
from bench_common import REPO, SERVETUNE
from http_load import encode_get, load_process

sys.path.insert(0, str(REPO))
TARGET_P99_MS = {"sqlite": 100.0, "postgresql": 150.0}  # per database backend
RESULT = "/v1/tuning-jobs/{job_id}/result"
UI_RESULT = "/ui/jobs/{job_id}/result.json"
LATEST = "/v1/recommendations/latest"
CONDITIONAL = " (If-None-Match)"  # label suffix: sends the ETag fetched before the load
MIXED = "all endpoints at once"


class Request(NamedTuple):
    path: str
    key: str | None
    status: int  # expected
    etag: str | None = None  # sent as If-None-Match

    def headers(self) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        return {**auth, **({"If-None-Match": self.etag} if self.etag else {})}


@contextmanager
def serving(url: str):
    """A `servetune serve` on `url`, ready: (its pid, base URL, port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SERVETUNE_DATABASE_URL": url, "PYTHONPATH": str(REPO)}
    cmd = [SERVETUNE, "serve", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("server did not become ready")
            time.sleep(0.2)
        yield proc.pid, base, port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def warm_up(base: str, requests: dict[str, list[Request]]) -> None:
    """One request per route and set of query parameters on a new server (its first of
    each imports, builds and compiles what it needs, as on a server that has run a while)."""
    with httpx.Client(base_url=base, timeout=30) as c:
        for reqs in requests.values():
            shapes: dict[frozenset[str], Request] = {}
            for r in reqs:
                query = r.path.partition("?")[2]
                shapes.setdefault(frozenset(p.split("=")[0] for p in query.split("&")), r)
            for r in shapes.values():
                c.get(r.path, headers=r.headers())


# --- the plan: label -> requests, per GET route -------------------------------------------


def plan(seeded: Seeded) -> dict[str, list[Request]]:
    rng = random.Random(1)
    own = [(p, k) for p in PROJECTS for k in seeded.keys[p]]
    any_key, models = [k for _, k in own], seeded.latency_models

    def each(resource: dict[str, list[int]], fmt: str) -> list[Request]:
        return [Request(fmt.format(i), k, 200) for p, k in own for i in resource[p]]

    def foreign(resource: dict[str, list[int]], fmt: str) -> list[Request]:
        return [
            Request(fmt.format(i), k, 404)
            for p, k in own for q in PROJECTS if q != p for i in resource[q]
        ]  # fmt: skip

    def per_key(*paths: str) -> list[Request]:
        return [Request(path, k, 200) for path in paths for k in any_key]

    # Every subset of the filters of every seeded deployment, asked by both keys of its
    # project, in a shuffled order.
    latest = [Request(f"{LATEST}?{q}", k, 200) for p, k in own for q in sorted(seeded.filters[p])]
    rng.shuffle(latest)
    public = ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs",
              "/docs/oauth2-redirect", "/redoc")  # fmt: skip
    return {
        **{path: [Request(path, None, 200)] for path in public},
        "/v1/traces": per_key("/v1/traces", "/v1/traces?stream=prod-chat"),
        "/v1/traces (401 unknown key)": [
            Request("/v1/traces", f"st_bogus{i}", 401) for i in range(50)
        ],
        "/v1/traces/{trace_id}": each(seeded.traces, "/v1/traces/{}"),
        "/v1/traces/{trace_id} (404 other project)": foreign(seeded.traces, "/v1/traces/{}"),
        "/v1/traces/{trace_id}/stats": each(seeded.traces, "/v1/traces/{}/stats"),
        "/v1/tuning-jobs": per_key("/v1/tuning-jobs", "/v1/tuning-jobs?status=succeeded&limit=20"),
        "/v1/tuning-jobs/{job_id}": each(seeded.jobs, "/v1/tuning-jobs/{}"),
        "/v1/tuning-jobs/{job_id} (404 other project)": foreign(seeded.jobs, "/v1/tuning-jobs/{}"),
        "/v1/tuning-jobs/{job_id}" + CONDITIONAL: each(seeded.jobs, "/v1/tuning-jobs/{}"),
        RESULT: each(seeded.jobs, "/v1/tuning-jobs/{}/result"),  # 200 or 409: see fix_up
        RESULT + CONDITIONAL: each(seeded.jobs, "/v1/tuning-jobs/{}/result"),
        LATEST + " (distinct filters)": latest,
        LATEST + CONDITIONAL: latest[:600],
        "/v1/schedules": per_key("/v1/schedules"),
        "/v1/schedules/{schedule_id}": each(seeded.schedules, "/v1/schedules/{}"),
        "/v1/profiles": per_key("/v1/profiles"),
        "/v1/profiles/{run_id}": per_key(*(f"/v1/profiles/{i}" for i in seeded.profiles)),
        "/v1/latency-models": per_key("/v1/latency-models"),
        "/v1/latency-models/{model_id}": per_key(*(f"/v1/latency-models/{i}" for i in models)),
        "/v1/deployments": per_key("/v1/deployments"),
        "/v1/deployments/{deployment_id}": each(seeded.deployments, "/v1/deployments/{}"),
        "/v1/deployments/{deployment_id}/observations": each(
            seeded.deployments, "/v1/deployments/{}/observations"
        ),
        "/v1/keys": [
            Request(path, key, 200)
            for p, key in seeded.admins.items()
            for path in ("/v1/keys", f"/v1/keys?project={p}")
        ],
        "/ui/jobs/{job_id}": each(seeded.jobs, "/ui/jobs/{}"),
        "/ui/jobs/{job_id} (401 no key)": [
            Request(f"/ui/jobs/{i}", None, 401) for i in seeded.jobs["alpha"]
        ],
        UI_RESULT: each(seeded.jobs, "/ui/jobs/{}/result.json"),  # 200 or 409: see fix_up
    }


def check_coverage(labels: list[str]) -> list[str]:
    """GET routes of the app that the plan does not drive."""
    from api.app import create_app
    from api.settings import Settings

    def walk(routes):
        for route in routes:
            included = getattr(route, "original_router", None)  # an included APIRouter
            yield from walk(included.routes) if included is not None else (route,)

    app = create_app(Settings(database_url="sqlite://"))
    routes = {r.path for r in walk(app.routes) if "GET" in (getattr(r, "methods", None) or ())}
    covered = {label.split(" (")[0] for label in labels}
    return sorted(routes - covered)


def fix_up(base: str, requests: dict[str, list[Request]]) -> None:
    """Asked once before the load: a job result's status (200 when the job succeeded, else
    409) and, for the conditional GETs, each 200 answer's ETag, then sent as If-None-Match,
    304 expected (no ETag: sent without the header, the status it got expected)."""
    with httpx.Client(base_url=base, timeout=30) as c:
        for label, reqs in requests.items():
            conditional = label.endswith(CONDITIONAL)
            if label not in (RESULT, UI_RESULT) and not conditional:
                continue
            fixed = []
            for r in reqs:
                got = c.get(r.path, headers=r.headers())
                etag = got.headers.get("etag") if conditional and got.status_code == 200 else None
                fixed.append(r._replace(status=304 if etag else got.status_code, etag=etag))
            requests[label] = fixed
            if conditional:
                counts = dict(sorted(Counter(r.status for r in fixed).items()))
                etags = sum(r.etag is not None for r in fixed)
                print(f"{label}: expected statuses {counts} ({etags} sent with an ETag)")


@dataclass
class Stats:
    """Per sweep: p50 and p99 in ms, requests per second, server CPU per request (Linux)."""

    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)

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


def sweep(requests: dict[str, list[Request]], args, pool) -> dict[str, Row]:
    """`args.repeats` sweeps, each on a new server, warmed up."""
    labels = list(requests)
    alone = [
        [(i, encode_get(r.path, None, r.headers()), r.status) for r in requests[label]]
        for i, label in enumerate(labels)
    ]
    # Every endpoint equally often, each cycling through its own requests.
    rounds = min(max(len(phase) for phase in alone), 5000)
    order = list(range(len(alone)))
    mixed = []
    for k in range(rounds):
        random.Random(k).shuffle(order)
        mixed += [alone[i][k % len(alone[i])] for i in order]
    rows = {label: Row() for label in [*labels, MIXED]}
    phases = [*([] if args.mix_only else alone), mixed]
    for r in range(args.repeats):
        with serving(args.url) as (pid, base, port):
            warm_up(base, requests)
            load = os.getloadavg()[0]
            got = pool.submit(load_process, port, phases, args.clients, args.duration, pid)
            *each, (mix_latencies, mix_errors, mix_wall, mix_cpu) = got.result()
        for label, (latencies, errors, wall, cpu) in zip(labels, each, strict=not args.mix_only):
            (values,) = latencies.values()
            rows[label].alone.add(values, wall, cpu)
            rows[label].errors += sum(errors.values())
        for i, label in enumerate(labels):
            rows[label].mixed.add(mix_latencies[i], mix_wall)
            rows[label].errors += mix_errors[i]
        every = [v for vs in mix_latencies.values() for v in vs]
        rows[MIXED].mixed.add(every, mix_wall, mix_cpu)
        print(
            f"  sweep {r + 1}/{args.repeats}: 1-min load average {load:.2f} before, "
            f"{os.getloadavg()[0]:.2f} after",
            flush=True,
        )
    return rows


def report(rows: dict[str, Row], args) -> None:
    """Medians over the sweeps; PASS when p99 <= the target and no unexpected status."""
    target = TARGET_P99_MS[args.backend]
    width = max(len(label) for label in rows)
    med = statistics.median
    print(
        f"\n{args.backend}, {args.clients} clients, medians of {args.repeats} sweeps of "
        f"{args.duration:g} s; target p99 <= {target:.0f} ms\n"
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
            verdict = "PASS" if p99 <= target and row.errors == 0 else "MISS"
            passed += verdict == "PASS"
            total += 1
            cells.append(f"{med(stats.rate):>7,.0f} {med(stats.p50):>7.1f} {p99:>7.1f} {verdict:4}")
        cpu = row.alone.cpu_us or row.mixed.cpu_us
        cpu_cell = f"{med(cpu):>17,.0f}" if cpu else f"{'':>17}"
        print(f"{label:<{width}}  {cells[0]}  {cells[1]}  {row.errors:>6}  {cpu_cell}")
    print(
        f"{passed}/{total} PASS\n(server CPU: the `servetune serve` process, all its threads, "
        "per request answered, alone on the endpoint; for the mix, over the mix. "
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--database", default="sqlite", help="sqlite, postgresql or an admin URL")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per endpoint phase")
    ap.add_argument("--repeats", type=int, default=3, help="sweeps; the table shows medians")
    ap.add_argument("--only", default="", help="only endpoints whose label contains this")
    ap.add_argument("--mix-only", action="store_true", help="only the phase of all at once")
    ap.add_argument("--uploads", type=int, default=0, help="then N parallel 100k-row uploads")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, scratch_database(args.database, Path(tmp)) as url:
        args.url, args.backend = url, sa.make_url(url).get_backend_name()
        t = time.perf_counter()
        seeded = seed(url, Path(tmp))
        print(
            f"seeded {args.backend} in {time.perf_counter() - t:.0f} s: "
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
        if any(label in (RESULT, UI_RESULT) or label.endswith(CONDITIONAL) for label in requests):
            with serving(url) as (_, base, _port):
                fix_up(base, requests)
        print(f"{os.cpu_count()} CPUs; server: `servetune serve`, a new one per sweep", flush=True)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            rows = sweep(requests, args, pool)
        report(rows, args)
        if args.uploads:
            with serving(url) as (_, base, _port):
                uploads(base, seeded.keys["alpha"][0], url, args.uploads, 100_000)


if __name__ == "__main__":
    main()
