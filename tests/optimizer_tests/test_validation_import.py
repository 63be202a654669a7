"""`vllm bench serve --save-detailed` import: a hand-written file and precise rejections."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from optimizer.validation import ObservationFormatError, load_vllm_result, parse_vllm_result


def vllm_result(**overrides: object) -> dict:
    data = {
        "backend": "vllm",
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "request_rate": 4.0,
        "duration": 2.5,
        "completed": 3,
        "mean_ttft_ms": 40.0,
        "p99_ttft_ms": 61.0,
        "mean_tpot_ms": 10.0,
        "request_goodput": 1.2,
        "input_lens": [100, 200, 50],
        "output_lens": [3, 2, 1],
        "ttfts": [0.03, 0.06, 0.02],
        "itls": [[0.01, 0.012], [0.02], []],
        "latencies": [0.052, 0.08, 0.02],
        "start_times": [1000.5, 1000.0, 1000.25],
        "errors": ["", "", ""],
    }
    data.update(overrides)
    return data


def test_hand_written_file(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(vllm_result()))
    obs = load_vllm_result(path)
    # sorted by arrival (start_times re-based at 0)
    assert obs.workload.arrival_s.tolist() == [0.0, 0.25, 0.5]
    assert obs.workload.input_tokens.tolist() == [200, 50, 100]
    assert obs.outcomes.ttft_s.tolist() == [0.06, 0.02, 0.03]
    np.testing.assert_allclose(obs.outcomes.tpot_s[[0, 2]], [0.02, 0.011])
    assert np.isnan(obs.outcomes.tpot_s[1])  # one output token: no TPOT
    assert obs.summary["p99_ttft_ms"] == 61.0 and obs.num_failed == 0
    assert obs.name == "result" and obs.backend == "vllm"


def test_latencies_from_itls_and_failed_requests_dropped() -> None:
    data = vllm_result(errors=["", "timeout", ""], output_lens=[3, 0, 1])
    del data["latencies"]
    obs = parse_vllm_result(data)
    assert obs.num_failed == 1 and obs.workload.num_requests == 2
    np.testing.assert_allclose(obs.outcomes.e2e_s, [0.02, 0.052])


def test_burst_run_without_start_times() -> None:
    data = vllm_result(request_rate="inf")
    del data["start_times"]
    assert parse_vllm_result(data).workload.arrival_s.tolist() == [0.0, 0.0, 0.0]


def test_finite_rate_without_start_times_regenerates_the_clients_schedule() -> None:
    # A pre-0.9 client: first request at 0, then numpy's gamma gaps seeded with --seed.
    data = vllm_result(seed=7)
    del data["start_times"]
    gaps = np.random.RandomState(7).gamma(shape=1.0, scale=1.0 / 4.0, size=3)
    expected = [0.0, gaps[0], gaps[0] + gaps[1]]
    np.testing.assert_allclose(parse_vllm_result(data).workload.arrival_s, expected)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ttfts": [0.03, 0.06]}, "'ttfts' has 2 entries, input_lens has 3"),
        ({"ttfts": [0.03, "x", 0.02]}, r"ttfts\[1\] = 'x' is not a finite number"),
        ({"input_lens": [100, 2.5, 50]}, r"input_lens\[1\] = 2.5: expected a positive integer"),
        ({"latencies": [0.01, 0.08, 0.02]}, "request 0: ttft 0.03 s and latency 0.01 s"),
        ({"errors": ["a", "b", "c"]}, "all 3 requests failed"),
        ({"input_lens": []}, "'input_lens' is empty"),
        ({"errors": "none"}, "'errors' must be a list of 3 strings"),
    ],
)
def test_malformed_fields_are_named(change: dict, message: str) -> None:
    with pytest.raises(ObservationFormatError, match=message):
        parse_vllm_result(vllm_result(**change))


def test_missing_keys_and_arrivals() -> None:
    data = vllm_result()
    del data["ttfts"]
    with pytest.raises(ObservationFormatError, match=r"missing key 'ttfts'.*--save-detailed"):
        parse_vllm_result(data)
    data = vllm_result(max_concurrency=2)
    del data["start_times"]
    with pytest.raises(ObservationFormatError, match="when each request was sent depends"):
        parse_vllm_result(data)
    data = vllm_result(request_rate="bad")
    del data["start_times"]
    with pytest.raises(ObservationFormatError, match="request_rate: expected a positive"):
        parse_vllm_result(data)
    with pytest.raises(ObservationFormatError, match="expected a JSON object"):
        parse_vllm_result([1, 2])


def test_unreadable_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"input_lens": [1,')
    with pytest.raises(ObservationFormatError, match="not valid JSON at line 1"):
        load_vllm_result(bad)
    with pytest.raises(ObservationFormatError, match="cannot read"):
        load_vllm_result(tmp_path / "missing.json")
