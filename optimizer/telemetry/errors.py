"""What can be wrong with a pair of scrapes; each message says what, where, and what was
expected."""

from __future__ import annotations


class TelemetryError(ValueError):
    """A scrape or a window that cannot be read as vLLM telemetry."""


class ExpositionSyntaxError(TelemetryError):
    """A line that is not Prometheus text exposition format."""


class MissingMetricError(TelemetryError):
    """A series `observe` needs is not on the page."""


class ForeignEngineError(MissingMetricError):
    """The page is another engine's (SGLang, TGI, ...): only vLLM's names are read."""


class CounterResetError(TelemetryError):
    """A counter or histogram fell between the two scrapes (the server restarted)."""


class BucketMismatchError(TelemetryError):
    """A histogram's bucket boundaries differ between the two scrapes."""


class EmptyWindowError(TelemetryError):
    """No request finished inside the window."""


class WindowError(TelemetryError):
    """The window's length or the label selection is unusable."""
