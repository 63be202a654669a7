"""The shared real traces: exact row counts and the figures in ../shared/data/README.md."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from optimizer.records import TraceFormat
from optimizer.traces import parse_trace

pytestmark = pytest.mark.shared_data


def _trace(shared_data: Path, rel: str) -> Path:
    return shared_data / "traces" / rel


def test_azure_code(shared_data: Path) -> None:
    parsed = parse_trace(_trace(shared_data, "azure2023/AzureLLMInferenceTrace_code.csv"))
    s = parsed.stats
    assert parsed.format is TraceFormat.AZURE
    assert s.num_requests == len(parsed.columns) == 8819
    assert s.duration_s == pytest.approx(3435.9, abs=0.05)
    assert round(s.mean_rate, 2) == 2.57
    assert s.input_tokens.mean == pytest.approx(2047.85, abs=0.005)
    assert (s.input_tokens.p50, s.input_tokens.p99) == (1469, 7436)
    assert s.output_tokens.mean == pytest.approx(27.88, abs=0.005)
    assert s.output_tokens.p50 == 13
    assert s.prefix_hit_ratio is None and parsed.warnings == () and parsed.num_dropped == 0
    assert len(parsed.content_hash) == 64


def test_azure_conv(shared_data: Path) -> None:
    parsed = parse_trace(_trace(shared_data, "azure2023/AzureLLMInferenceTrace_conv.csv"))
    s = parsed.stats
    assert s.num_requests == 19366
    assert s.duration_s == pytest.approx(3501.7, abs=0.05)
    assert round(s.mean_rate, 2) == 5.53
    assert s.input_tokens.mean == pytest.approx(1154.70, abs=0.005)
    assert (s.input_tokens.p50, s.input_tokens.p99, s.input_tokens.max) == (1020, 4142, 14050)
    assert s.output_tokens.mean == pytest.approx(211.13, abs=0.005)
    assert (s.output_tokens.p50, s.output_tokens.max) == (129, 1000)
    # First row: 2023-11-16 18:15:46.6805900, second 18:15:50.9951690 (7 fractional digits).
    assert parsed.columns.arrival_s[0] == 0.0
    assert parsed.columns.arrival_s[1] == pytest.approx(4.314579, abs=1e-7)
    assert s.peak_rate_1s >= s.peak_rate_10s >= s.peak_rate_60s >= s.mean_rate


def test_mooncake_synthetic(shared_data: Path) -> None:
    parsed = parse_trace(_trace(shared_data, "mooncake/synthetic_trace.jsonl"))
    s, cols = parsed.stats, parsed.columns
    assert parsed.format is TraceFormat.MOONCAKE and parsed.block_size == 512
    assert s.num_requests == 3993
    assert s.duration_s == pytest.approx(1022.0, abs=0.05)
    assert s.input_tokens.mean == pytest.approx(15325.48, abs=0.005)
    assert s.input_tokens.max == 191378
    assert s.output_tokens.mean == pytest.approx(149.12, abs=0.005)
    assert round(s.prefix_hit_ratio, 3) == 0.651
    assert cols.prefix_hashes is not None
    lengths = np.array([h.shape[0] for h in cols.prefix_hashes])
    assert np.array_equal(lengths, [math.ceil(n / 512) for n in cols.input_tokens])
    assert cols.prefix_hashes[0][:3].tolist() == [0, 1, 2]
    assert parsed.warnings == ()


def test_same_file_same_hash(shared_data: Path) -> None:
    path = _trace(shared_data, "mooncake/synthetic_trace.jsonl")
    assert parse_trace(path).content_hash == parse_trace(path).content_hash
