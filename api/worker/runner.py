"""The worker loop: fire due schedules, claim a job, run it under a heartbeat lease.

Any number of workers (threads or processes, on any machine sharing the
database) may run at once; the queue's row locks keep their claims apart.
A heartbeat thread renews the lease and polls the job row for a cancel
request every `poll_s` seconds, so a cancel takes effect within seconds and a
worker that lost its lease stops and writes nothing more.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from api.worker.context import Executor, JobContext, JobFailed, JobOutcome, JobStopped
from api.worker.scheduling import fire_due_schedules
from optimizer.search import TrialError
from storage.db import session_scope
from storage.jobs import claim_job, finish_job, renew_lease, report_progress
from storage.service_records import ClaimedJob, JobKind, JobProgress, JobStatus

log = logging.getLogger("servetune.worker")


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    lease_s: float = 30.0  # a job whose worker is silent this long is taken over
    poll_s: float = 1.0  # heartbeat / cancel polling and idle queue polling period
    max_attempts: int = 3
    run_schedules: bool = True

    def __post_init__(self) -> None:
        if self.poll_s <= 0 or self.lease_s < 2 * self.poll_s:
            raise ValueError("worker: need poll_s > 0 and lease_s >= 2 * poll_s")


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class _Lease:
    """The heartbeat thread's view of one claimed job."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.lost = threading.Event()
        self.done = threading.Event()

    def should_stop(self) -> bool:
        return self.cancelled.is_set() or self.lost.is_set()


class Worker:
    def __init__(
        self,
        engine: Engine,
        *,
        storage_url: str,
        executors: Mapping[JobKind, Executor],
        options: WorkerOptions = WorkerOptions(),
        name: str | None = None,
    ) -> None:
        self.engine = engine
        self.storage_url = storage_url
        self.executors = executors
        self.options = options
        self.name = name or worker_name()

    def run(self, stop: threading.Event) -> None:
        log.info("worker %s started", self.name)
        while not stop.is_set():
            try:
                busy = self.run_once()
            except Exception:  # the database may be briefly unreachable: keep going
                log.exception("worker %s: iteration failed", self.name)
                busy = False
            if not busy:
                stop.wait(self.options.poll_s)
        log.info("worker %s stopped", self.name)

    def run_once(self) -> bool:
        """Fire due schedules, then run at most one job; True when a job ran."""
        if self.options.run_schedules:
            fire_due_schedules(self.engine)
        return self._claim_and_run(None)

    def run_part_of(self, parent_id: int) -> bool:
        """Claim one runnable part of job `parent_id` and run it; False when none was."""
        return self._claim_and_run(parent_id)

    def _claim_and_run(self, parent_id: int | None) -> bool:
        """Claim one runnable job (a part of `parent_id`, when given) and run it."""
        with session_scope(self.engine) as session:
            claim = claim_job(
                session,
                worker=self.name,
                lease_s=self.options.lease_s,
                max_attempts=self.options.max_attempts,
                parent_id=parent_id,
            )
        if claim is None:
            return False
        self.execute(claim)
        return True

    def _heartbeat(self, claim: ClaimedJob, lease: _Lease) -> None:
        while not lease.done.wait(self.options.poll_s):
            try:
                with session_scope(self.engine) as session:
                    state = renew_lease(session, claim, lease_s=self.options.lease_s)
            except Exception:
                log.exception("heartbeat for job %s failed", claim.job.id)
                continue
            if state.cancel_requested:
                lease.cancelled.set()
            if not state.held:
                lease.lost.set()
                return

    def _report(self, claim: ClaimedJob, lease: _Lease, progress: JobProgress) -> None:
        with session_scope(self.engine) as session:
            if not report_progress(session, claim, progress):
                lease.lost.set()

    def execute(self, claim: ClaimedJob) -> JobStatus | None:
        """Run a claimed job to its end; the final status, or None when the lease was lost."""
        job = claim.job
        lease = _Lease()
        beat = threading.Thread(
            target=self._heartbeat, args=(claim, lease), name=f"heartbeat-{job.id}", daemon=True
        )
        beat.start()
        ctx = JobContext(
            job=job,
            storage_url=self.storage_url,
            study_name=f"servetune-job-{job.id}",
            resumed=claim.attempt > 1,
            report=lambda progress: self._report(claim, lease, progress),
            should_stop=lease.should_stop,
            cancel_requested=lease.cancelled.is_set,
            run_part=lambda: self.run_part_of(job.id),
            poll_s=self.options.poll_s,
        )
        outcome: JobOutcome | None = None
        error: str | None = None
        executor = self.executors.get(job.kind)
        try:
            if executor is None:
                raise JobFailed(f"no executor for job kind {job.kind!r} in this worker")
            outcome = executor(ctx)
            status = JobStatus.CANCELLED if lease.cancelled.is_set() else JobStatus.SUCCEEDED
            if status is JobStatus.CANCELLED:
                error = "cancelled while running"
        except JobStopped:  # cancelled (a lost lease is discarded below)
            status, error = JobStatus.CANCELLED, "cancelled while running"
        except JobFailed as exc:
            status, error = JobStatus.FAILED, str(exc)
        except TrialError as exc:  # a bug, not a bad config: show where it happened
            log.error("job %s: %s", job.id, exc.details())
            status, error = JobStatus.FAILED, f"internal error: {exc.details()}"
        except Exception as exc:
            log.exception("job %s crashed", job.id)
            status, error = JobStatus.FAILED, f"internal error: {type(exc).__name__}: {exc}"
        finally:
            lease.done.set()
            beat.join()
        if lease.lost.is_set():
            log.warning("job %s: lease lost to another worker; result discarded", job.id)
            return None
        with session_scope(self.engine) as session:
            written = finish_job(session, claim, status=status, outcome=outcome, error=error)
        return status if written else None


def start_worker_thread(worker: Worker, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=worker.run, args=(stop,), name="servetune-worker", daemon=True)
    thread.start()
    return thread
