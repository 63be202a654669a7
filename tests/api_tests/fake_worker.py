"""A worker process running the fake executor: `python -m tests.api_tests.fake_worker URL`."""

from __future__ import annotations

import signal
import sys
import threading

from api.worker import Worker, WorkerOptions
from storage.db import make_engine
from storage.service_records import JobKind
from tests.api_tests.fakes import make_fake_executor


def main() -> None:
    url, lease_s, poll_s, delay_s = sys.argv[1], *map(float, sys.argv[2:5])
    engine = make_engine(url)
    worker = Worker(
        engine,
        storage_url=url,
        executors={JobKind.TUNING: make_fake_executor(delay_s)},
        options=WorkerOptions(lease_s=lease_s, poll_s=poll_s),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"ready {worker.name}", flush=True)
    worker.run(stop)


if __name__ == "__main__":
    main()
