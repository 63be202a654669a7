"""A worker process with the real executors, for the plan-part tests:
`python -m tests.api_tests.plan_worker URL LEASE_S POLL_S PEER_WAIT_S`.

Its plan-part executor first waits (at most PEER_WAIT_S) until two workers have claimed
plan parts, so that two such processes are sure to split one plan's parts rather
than one taking them all by being quicker to claim (and a worker to be killed is sure to
be killed mid-part).
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import sqlalchemy as sa

from api.worker import JobContext, Worker, WorkerOptions, default_executors
from optimizer.plan import FleetReplay
from storage.db import make_engine
from storage.service_records import JobKind

# A part keeps its last lease holder's name once finished.
CLAIMERS = sa.text("select count(distinct lease_owner) from jobs where kind = 'plan_part'")


def main() -> None:
    url, lease_s, poll_s, peer_wait_s = sys.argv[1], *map(float, sys.argv[2:5])
    engine = make_engine(url)
    executors = dict(default_executors())
    run_part = executors[JobKind.PLAN_PART]

    def run_part_with_a_peer(ctx: JobContext) -> FleetReplay:
        deadline = time.monotonic() + peer_wait_s
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if conn.execute(CLAIMERS).scalar_one() >= 2:
                    break
            time.sleep(0.05)
        replay = run_part(ctx)
        assert isinstance(replay, FleetReplay)
        return replay

    executors[JobKind.PLAN_PART] = run_part_with_a_peer
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
