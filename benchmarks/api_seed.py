"""bench_api.py's database, filled the way users fill one.

Three projects with two keys and an admin key each; the real traces in
shared/data/traces (else generated ones) plus generated ones, ingested per
project by the upload path's `ingest_trace`; per trace three finished tuning
jobs (fake outcomes: no search is run; some failed) with their recommendations,
and a cancelled one; three schedules per project, not due during a run (one
paused); profile runs imported from shared/data/profiles (AIConfigurator H100,
130k samples; Vidur H100 and A100); two latency models per profile run with
megabyte payloads; two deployments per project with three stored observations each
(one `servetune observe` comparison of synthetic vLLM scrapes, stored six times a
project). `scratch_database`: where (SQLite, or a PostgreSQL database
created and dropped).
"""

from __future__ import annotations

import itertools
import os
import random
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from bench_common import SHARED

ADMIN_URL = os.environ.get(
    "SERVETUNE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
PROJECTS = ("alpha", "beta", "gamma")
REAL_TRACES = (
    SHARED / "traces" / "azure2023" / "AzureLLMInferenceTrace_code.csv",
    SHARED / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv",
    SHARED / "traces" / "mooncake" / "synthetic_trace.jsonl",
)
PROFILES = (
    (SHARED / "profiles" / "aiconfigurator" / "h100_sxm", "aiconfigurator"),
    (SHARED / "profiles" / "vidur" / "compute" / "h100", "vidur"),
    (SHARED / "profiles" / "vidur" / "compute" / "a100", "vidur"),
)


@dataclass
class Seeded:
    """What the load refers to: keys per project and ids per project and resource."""

    keys: dict[str, list[str]] = field(default_factory=dict)
    admins: dict[str, str] = field(default_factory=dict)  # an admin key per project
    traces: dict[str, list[int]] = field(default_factory=dict)
    jobs: dict[str, list[int]] = field(default_factory=dict)
    schedules: dict[str, list[int]] = field(default_factory=dict)
    filters: dict[str, set[str]] = field(default_factory=dict)  # matching latest-rec queries
    profiles: list[int] = field(default_factory=list)
    latency_models: list[int] = field(default_factory=list)
    deployments: dict[str, list[int]] = field(default_factory=dict)


@contextmanager
def scratch_database(which: str, workdir: Path):
    """A scratch database's URL: SQLite in `workdir`, or a PostgreSQL database created on
    the server of `ADMIN_URL` (or of the admin URL `which`), dropped afterwards."""
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


def write_trace(path: Path, n: int, seed_: int) -> Path:
    rng = np.random.default_rng(seed_)
    arrivals = np.sort(rng.uniform(0, 3600, n))
    inputs = rng.integers(10, 4000, n)
    outputs = rng.integers(1, 500, n)
    with path.open("w") as fh:
        fh.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        fh.writelines(
            f"{a:.6f},{i},{o}\n" for a, i, o in zip(arrivals, inputs, outputs, strict=True)
        )
    return path


def _filter_queries(p, trace_id: int) -> set[str]:
    """Every subset of the filters a recommendation of `p` matches, as query strings."""
    values = {
        "trace_id": trace_id, "model": p.model, "gpu": ",".join(p.gpu_types),
        "num_gpus": p.gpu_budget, "slo_ttft_ms": p.slo_ttft_ms, "slo_tpot_ms": p.slo_tpot_ms,
    }  # fmt: skip
    out = set()
    for r in range(len(values) + 1):
        for names in itertools.combinations(values, r):
            out.add("&".join(f"{n}={values[n]}" for n in names))
    return out


def seed(url: str, workdir: Path) -> Seeded:
    from api.services.ingest import ingest_trace
    from optimizer.search import TuneRequest
    from profiler.importers import ImportFormat, import_profile
    from storage.db import make_engine, session_scope, upgrade_database
    from storage.jobs import claim_job, enqueue_job, finish_job, request_cancel
    from storage.keys import create_key
    from storage.latency_models import save_latency_model
    from storage.profiles import create_profile_run
    from storage.schedules import create_schedule, set_paused
    from storage.service_records import JobStatus
    from tests.api_tests.fakes import fake_outcome

    upgrade_database(url)
    engine = make_engine(url)
    out = Seeded()
    real = [p for p in REAL_TRACES if p.exists()]
    generated = [write_trace(workdir / f"gen{i}.csv", 20_000, i) for i in range(6 - len(real))]
    rng = random.Random(0)
    for pi, project in enumerate(PROJECTS):
        with session_scope(engine) as s:
            out.keys[project] = [create_key(s, project=project, name=f"k{i}")[1] for i in range(2)]
            out.admins[project] = create_key(s, project=project, name="ops", is_admin=True)[1]
        out.traces[project], out.jobs[project], out.schedules[project] = [], [], []
        out.filters[project] = set()
        own = [write_trace(workdir / f"{project}.csv", 20_000, 100 + pi)]
        for i, path in enumerate([*real, *generated, *own]):
            with session_scope(engine) as s:
                stream = ("prod-chat", "batch", None)[i % 3]
                got = ingest_trace(s, path, project=project, stream=stream)
            out.traces[project].append(got.trace.id)
        for ti, trace_id in enumerate(out.traces[project]):
            for model, gpu, budget, ttft in (
                ("llama-3.1-8b", "h100", 8, 2000.0),
                ("llama-3.1-8b", "a100", 4, 3000.0),
                ("llama-3.1-70b", "h100", 16, 4000.0),
            ):
                params = TuneRequest(
                    model=model, gpu_types=(gpu,), gpu_budget=budget, slo_ttft_ms=ttft,
                    slo_tpot_ms=50.0 + ti, trace_id=trace_id, num_trials=20,
                )  # fmt: skip
                with session_scope(engine) as s:
                    job = enqueue_job(s, project=project, params=params)
                with session_scope(engine) as s:
                    claim = claim_job(s, worker="bench", lease_s=60)
                    assert claim is not None and claim.job.id == job.id
                    if rng.random() < 0.15:
                        finish_job(s, claim, status=JobStatus.FAILED, error="bench: failed")
                    else:
                        outcome = fake_outcome(params, 6)
                        finish_job(s, claim, status=JobStatus.SUCCEEDED, outcome=outcome)
                        out.filters[project] |= _filter_queries(params, trace_id)
                out.jobs[project].append(job.id)
            with session_scope(engine) as s:  # a cancelled one too
                job = enqueue_job(s, project=project, params=params)
                request_cancel(s, job.id, project=project)
                out.jobs[project].append(job.id)
        stream_params = TuneRequest(
            model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=8, slo_ttft_ms=2000,
            slo_tpot_ms=50, stream="prod-chat",
        )  # fmt: skip
        later = datetime.now(UTC) + timedelta(days=30)  # never due during the run
        with session_scope(engine) as s:
            for i, (interval, cron) in enumerate(
                ((3600.0, None), (None, "0 3 * * *"), (900.0, None))
            ):
                info = create_schedule(
                    s, project=project, name=f"s{i}", params=stream_params, interval_s=interval,
                    cron=cron, start_at=later,
                )  # fmt: skip
                out.schedules[project].append(info.id)
            set_paused(s, out.schedules[project][-1], paused=True, project=project)
    for path, fmt in PROFILES:
        if not path.exists():
            continue
        imported = import_profile(path, ImportFormat(fmt))
        with session_scope(engine) as s:
            run = create_profile_run(
                s, name=f"{fmt}:{path.name}", source=imported.source,
                accelerator=imported.accelerator, device=imported.device, samples=imported.samples,
            )  # fmt: skip
        out.profiles.append(run.id)
        with session_scope(engine) as s:
            for _ in range(2):  # fitted payloads are megabytes; the API never serves them
                info = save_latency_model(
                    s, name=f"{fmt}:{path.name}", accelerator=imported.accelerator,
                    payload=os.urandom(2 * 1024**2), schema_version=1, profile_run_id=run.id,
                    features=("num_tokens", "kv_len"), tp_degrees=(1, 2, 4),
                )  # fmt: skip
                out.latency_models.append(info.id)
    _seed_deployments(engine, out)
    engine.dispose()
    return out


def _seed_deployments(engine: sa.Engine, out: Seeded) -> None:
    """Two deployments per project of examples/colocated-h100.yaml, three observations each
    (one comparison of synthetic scrapes, roofline-priced, stored again and again)."""
    import yaml

    from api.services.observe import observe, read_scrape, store
    from optimizer.config import ServingConfig
    from optimizer.latency import build_catalog
    from optimizer.telemetry.synthetic import VllmTraffic, render_vllm_page
    from storage.db import session_scope
    from storage.deployments import create_deployment

    example = Path(__file__).resolve().parents[1] / "examples" / "colocated-h100.yaml"
    config = ServingConfig.from_dict(yaml.safe_load(example.read_text()))
    first = VllmTraffic.random(50, 0)
    before = read_scrape(render_vllm_page(first), "BEFORE", "before.prom")
    after = read_scrape(
        render_vllm_page(first.plus(VllmTraffic.random(300, 1))), "AFTER", "after.prom"
    )
    observed = observe(before, after, 60.0, config, build_catalog(config.shape, []), "roofline")
    for project in PROJECTS:
        out.deployments[project] = []
        with session_scope(engine) as s:
            for i in range(2):
                d = create_deployment(s, project=project, name=f"prod-{i}", config=config)
                for _ in range(3):
                    store(s, d.id, observed, project=project)
                out.deployments[project].append(d.id)
