"""ORM tables, one module per concept. Rows never leave `storage/`."""

from storage.models.base import Base
from storage.models.deployments import (
    DeploymentCalibrationRow,
    DeploymentObservationRow,
    DeploymentRow,
)
from storage.models.latency_models import LatencyModelRow, LatencyTableRow
from storage.models.plans import PlanRow
from storage.models.profiles import KernelSampleRow, ProfileRunRow
from storage.models.service import ApiKeyRow, JobRow, RecommendationRow, ScheduleRow
from storage.models.traces import TraceRequestRow, TraceRow
from storage.models.tuning import TuningRunRow
from storage.models.validation import CalibrationRow, ObservationRow, ValidationRunRow

__all__ = [
    "ApiKeyRow",
    "Base",
    "CalibrationRow",
    "DeploymentCalibrationRow",
    "DeploymentObservationRow",
    "DeploymentRow",
    "JobRow",
    "KernelSampleRow",
    "LatencyModelRow",
    "LatencyTableRow",
    "ObservationRow",
    "PlanRow",
    "ProfileRunRow",
    "RecommendationRow",
    "ScheduleRow",
    "TraceRequestRow",
    "TraceRow",
    "TuningRunRow",
    "ValidationRunRow",
]
