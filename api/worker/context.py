"""What a job executor is given and how it fails.

An executor is a callable `(JobContext) -> TuneOutcome`. It reports progress
through `ctx.report(...)` after each completed trial, and polls
`ctx.should_stop()` between trials: True means the job was cancelled or this
worker lost its lease (another worker took over), and the executor must return
promptly (a partial outcome is fine). An executor that cannot run the job raises
`JobFailed` with a message for the user. Jobs that are taken over after a crash
are run again with `ctx.resumed` True and the last reported progress in
`ctx.job.progress`; the tuning executor resumes the Optuna study named
`ctx.study_name` in the RDB storage at `ctx.storage_url`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from optimizer.search import TuneOutcome, TuneProgress
from storage.service_records import JobInfo


class JobFailed(RuntimeError):
    """The job cannot complete; the message is shown to the user as the job's error."""


@dataclass(frozen=True, slots=True)
class JobContext:
    job: JobInfo
    storage_url: str  # the service database; Optuna's RDB storage lives there too
    study_name: str  # stable across attempts, so a takeover resumes the same study
    resumed: bool  # True when an earlier attempt of this job died mid-run
    report: Callable[[TuneProgress], None]
    should_stop: Callable[[], bool]


class Executor(Protocol):
    def __call__(self, ctx: JobContext) -> TuneOutcome: ...
