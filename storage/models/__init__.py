"""ORM tables, one module per concept. Rows never leave `storage/`."""

from storage.models.base import Base
from storage.models.latency_models import LatencyModelRow
from storage.models.profiles import KernelSampleRow, ProfileRunRow
from storage.models.service import ApiKeyRow, JobRow, RecommendationRow, ScheduleRow
from storage.models.traces import TraceRequestRow, TraceRow
from storage.models.tuning import TuningRunRow

__all__ = [
    "ApiKeyRow",
    "Base",
    "JobRow",
    "KernelSampleRow",
    "LatencyModelRow",
    "ProfileRunRow",
    "RecommendationRow",
    "ScheduleRow",
    "TraceRequestRow",
    "TraceRow",
    "TuningRunRow",
]
