"""Job workers: the queue loop, executors and schedule firing."""

from api.worker.context import Executor, JobContext, JobFailed, JobOutcome, JobStopped
from api.worker.executors import default_executors
from api.worker.runner import Worker, WorkerOptions

__all__ = [
    "Executor",
    "JobContext",
    "JobFailed",
    "JobOutcome",
    "JobStopped",
    "Worker",
    "WorkerOptions",
    "default_executors",
]
