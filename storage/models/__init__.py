"""ORM tables, one module per concept. Rows never leave `storage/`."""

from storage.models.base import Base
from storage.models.latency_models import LatencyModelRow
from storage.models.service import ApiKeyRow, JobRow, RecommendationRow, ScheduleRow
from storage.models.traces import TraceRequestRow, TraceRow

__all__ = [
    "ApiKeyRow",
    "Base",
    "JobRow",
    "LatencyModelRow",
    "RecommendationRow",
    "ScheduleRow",
    "TraceRequestRow",
    "TraceRow",
]
