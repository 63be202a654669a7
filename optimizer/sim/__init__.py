"""Discrete-event serving simulator (chunked prefill, speculation, PD disaggregation)."""

from optimizer.sim.capacity import CapacityResult, max_sustainable_rate
from optimizer.sim.dynamic import simulate_fleet
from optimizer.sim.engine import SimulationError, max_request_tokens, rejection_note, simulate
from optimizer.sim.floor import DecodeFloorError, check_decode_floor, decode_floor_s
from optimizer.sim.metrics import SLO, Percentiles, PhaseBreakdown, SimulationResult

__all__ = [
    "SLO",
    "CapacityResult",
    "DecodeFloorError",
    "Percentiles",
    "PhaseBreakdown",
    "SimulationError",
    "SimulationResult",
    "check_decode_floor",
    "decode_floor_s",
    "max_request_tokens",
    "max_sustainable_rate",
    "rejection_note",
    "simulate",
    "simulate_fleet",
]
