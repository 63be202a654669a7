"""What a job executor is given and how it fails.

An executor is a callable `(JobContext) -> result`, one per job kind: a tuning job's
result is a `TuneOutcome`, a plan job's a `FleetPlan`. It reports progress through
`ctx.report(...)` (its kind's progress: `TuneProgress` after each completed trial,
`PlanProgress` at each step of the plan), and polls `ctx.should_stop()` between them:
True means the job was cancelled or this worker lost its lease (another worker took
over), and the executor must return promptly (a partial tuning outcome is fine) or raise
`JobStopped` (a plan has no partial answer). An executor that cannot run the job raises
`JobFailed` with a message for the user. Jobs that are taken over after a crash
are run again with `ctx.resumed` True and the last reported progress in
`ctx.job.progress`; the tuning executor resumes the Optuna study named
`ctx.study_name` in the RDB storage at `ctx.storage_url`.

A job may queue parts of itself as jobs (a plan job its capacity searches and fleet
replays): any worker of
the pool runs them, and while it waits the job's own worker runs them too
(`ctx.run_part()`: claim one runnable part of this job and run it here, under its own
lease), so a pool of one worker never waits on itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from optimizer.plan import FleetPlan, PartResult
from optimizer.search import TuneOutcome
from storage.service_records import JobInfo, JobProgress

# What an executor returns: its kind's answer.
JobOutcome = TuneOutcome | FleetPlan | PartResult


class JobFailed(RuntimeError):
    """The job cannot complete; the message is shown to the user as the job's error."""


class JobStopped(RuntimeError):
    """The executor stopped early because `should_stop()` said so, with nothing to keep."""


@dataclass(frozen=True, slots=True)
class JobContext:
    job: JobInfo
    storage_url: str  # the service database; Optuna's RDB storage lives there too
    study_name: str  # stable across attempts, so a takeover resumes the same study
    resumed: bool  # True when an earlier attempt of this job died mid-run
    report: Callable[[JobProgress], None]
    should_stop: Callable[[], bool]
    cancel_requested: Callable[[], bool]  # True once the job's cancel was seen
    # Claim one runnable part of this job and run it in this worker; False when none was.
    run_part: Callable[[], bool]
    poll_s: float  # how often to look again while waiting on parts others run


class Executor(Protocol):
    def __call__(self, ctx: JobContext) -> JobOutcome: ...
