"""The one error a plan's bad input raises."""

from __future__ import annotations


class PlanError(ValueError):
    """A plan cannot be made from this input: the message says what, where, and what was
    expected (nothing is stored)."""
