"""A worker SIGKILLed mid-job: another worker process takes the job over after the lease
expires and resumes it; no completed trial is lost or run twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from optimizer.search import TuneRequest
from storage.db import make_engine, session_scope, upgrade_database
from storage.jobs import enqueue_job, get_job
from storage.service_records import JobStatus

REPO = Path(__file__).resolve().parents[2]
NUM_TRIALS = 25


def _spawn(url: str, start_log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SERVETUNE_FAKE_START_LOG": str(start_log)}
    # lease 2 s, poll 0.2 s, 0.1 s per fake trial
    return subprocess.Popen(
        [sys.executable, "-m", "tests.api_tests.fake_worker", url, "2", "0.2", "0.1"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _job(engine, jid: int):
    with session_scope(engine) as s:
        return get_job(s, jid)


def _wait(engine, jid: int, done, timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = _job(engine, jid)
        if done(job):
            return job
        time.sleep(0.1)
    raise AssertionError(f"timed out; job is {_job(engine, jid)}")


def test_sigkilled_worker_is_taken_over(db_url: str, tmp_path: Path) -> None:
    upgrade_database(db_url)
    engine = make_engine(db_url)
    params = TuneRequest(
        model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=8, slo_ttft_ms=1000,
        slo_tpot_ms=50, trace_id=1, num_trials=NUM_TRIALS,
    )  # fmt: skip
    starts = tmp_path / "starts.txt"
    with session_scope(engine) as s:
        jid = enqueue_job(s, project="p", params=params).id
    first = _spawn(db_url, starts)
    second = None
    try:
        running = _wait(
            engine, jid, lambda j: j.progress is not None and j.progress.trials_done >= 5
        )
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        before = _job(engine, jid).progress.trials_done
        assert running.status is JobStatus.RUNNING and before < NUM_TRIALS
        second = _spawn(db_url, starts)
        job = _wait(engine, jid, lambda j: j.status.finished)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
        engine.dispose()
    assert job.status is JobStatus.SUCCEEDED, job.error
    assert job.attempts == 2
    assert job.progress.trials_done == NUM_TRIALS
    # The second attempt resumed where the dead worker's last report left off: the
    # reported trials were kept (not rerun) and none was skipped.
    assert starts.read_text().split() == ["0", str(before)]
