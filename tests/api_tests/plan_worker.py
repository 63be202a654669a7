"""A worker process with the real executors, for the plan-part tests:
`python -m tests.api_tests.plan_worker URL LEASE_S POLL_S MODE`.

MODE `peer`: its plan-part executor first waits (at most 60 s), while other parts are
queued, until two workers have claimed plan parts, so that two such processes are sure
to split one plan's parts rather than one taking them all by being quicker to claim.
MODE `hang`: the first part it runs never ends (a worker to be killed mid-part).
MODE `plain`: the real executors as they are.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import sqlalchemy as sa

from api.worker import JobContext, Worker, WorkerOptions, default_executors
from optimizer.plan import PartResult
from storage.db import make_engine
from storage.service_records import JobKind

# A part keeps its last lease holder's name once finished.
CLAIMERS = sa.text("select count(distinct lease_owner) from jobs where kind = 'plan_part'")
QUEUED = sa.text("select count(*) from jobs where kind = 'plan_part' and status = 'queued'")


def main() -> None:
    url, lease_s, poll_s, mode = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    engine = make_engine(url)
    executors = dict(default_executors())
    run_part = executors[JobKind.PLAN_PART]

    def run_part_with_a_peer(ctx: JobContext) -> PartResult:
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if (
                    conn.execute(CLAIMERS).scalar_one() >= 2
                    or not conn.execute(QUEUED).scalar_one()
                ):
                    break
            time.sleep(0.05)
        result = run_part(ctx)
        assert isinstance(result, PartResult)
        return result

    def hang(_ctx: JobContext) -> PartResult:
        threading.Event().wait()
        raise AssertionError("unreachable")

    if mode == "peer":
        executors[JobKind.PLAN_PART] = run_part_with_a_peer
    elif mode == "hang":
        executors[JobKind.PLAN_PART] = hang
    worker = Worker(
        engine,
        storage_url=url,
        executors=executors,
        options=WorkerOptions(lease_s=lease_s, poll_s=poll_s, run_schedules=False),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"ready {worker.name}", flush=True)
    worker.run(stop)


if __name__ == "__main__":
    main()
