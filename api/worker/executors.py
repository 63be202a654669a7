"""The executors a worker runs, by job kind (see `api.worker.context` for the contract)."""

from __future__ import annotations

from collections.abc import Mapping

from api.worker.context import Executor
from api.worker.plan_parts import run_part_job
from api.worker.planning import run_planning
from api.worker.tuning import run_tuning
from storage.service_records import JobKind


def default_executors() -> Mapping[JobKind, Executor]:
    """The real executors: tuning runs the search (`api.services.tuning`), a plan job the
    fleet plan (`api.services.planning`), a plan part one piece of a plan job's
    (`api.worker.plan_parts`)."""
    return {
        JobKind.TUNING: run_tuning,
        JobKind.PLAN: run_planning,
        JobKind.PLAN_PART: run_part_job,
    }
