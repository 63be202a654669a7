"""Job workers: the queue loop, executors and schedule firing."""

from api.worker.context import Executor, JobContext, JobFailed
from api.worker.executors import default_executors
from api.worker.runner import Worker, WorkerOptions

__all__ = ["Executor", "JobContext", "JobFailed", "Worker", "WorkerOptions", "default_executors"]
