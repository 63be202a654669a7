"""Job workers: the queue loop, executors and schedule firing."""

from api.worker.executors import Executor, JobContext, JobFailed, default_executors
from api.worker.runner import Worker, WorkerOptions

__all__ = ["Executor", "JobContext", "JobFailed", "Worker", "WorkerOptions", "default_executors"]
