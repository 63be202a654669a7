"""ORM tables, one module per concept. Rows never leave `storage/`."""

from storage.models.base import Base
from storage.models.traces import TraceRequestRow, TraceRow

__all__ = ["Base", "TraceRequestRow", "TraceRow"]
