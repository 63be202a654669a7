"""Stored observations, comparisons and calibrations round-trip on every back-end."""

from __future__ import annotations

import numpy as np
import pytest

from storage.db import make_engine, session_scope, upgrade_database
from storage.validation import (
    ValidationNotFound,
    get_observation,
    latest_calibrations,
    list_observations,
    save_calibration,
    save_observation,
    save_validation_run,
)

ARRAYS = {
    "arrival_s": np.array([0.0, 0.5]),
    "input_tokens": np.array([10, 20]),
    "output_tokens": np.array([3, 1]),
    "ttft_s": np.array([0.1, 0.2]),
    "e2e_s": np.array([0.3, 0.2]),
}


def test_round_trip_and_rejections(db_url: str) -> None:
    upgrade_database(db_url)
    engine = make_engine(db_url)
    with session_scope(engine) as s:
        obs = save_observation(
            s, name="run", source="vllm-bench", config={"model": "tiny"},
            summary={"mean_ttft_ms": 150.0, "bad": float("nan")}, num_failed=1, arrays=ARRAYS,
        )  # fmt: skip
        run = save_validation_run(
            s, kind="observation", workload="run", config={"model": "tiny"}, latency="x",
            comparison={"metrics": []}, observation_id=obs.id,
        )  # fmt: skip
        for overhead in (1e-3, 2e-3):
            save_calibration(
                s, shape_name="tiny", accelerator="CPU", tp=1, overhead_s=overhead,
                prefill_scale=1.1, decode_scale=0.9, loss_before=1.0, loss_after=0.1,
                observation_ids=[obs.id],
            )  # fmt: skip
    with session_scope(engine) as s:
        back = get_observation(s, obs.id)
        assert back.summary == {"mean_ttft_ms": 150.0}
        np.testing.assert_array_equal(back.input_tokens, ARRAYS["input_tokens"])
        assert back.e2e_s.tolist() == [0.3, 0.2] and len(list_observations(s)) == 1
        (cal,) = latest_calibrations(s, shape_name="tiny")
        assert cal.overhead_s == 2e-3 and cal.accelerator == "cpu"
        assert run.comparison["schema_version"] == 1
        with pytest.raises(ValueError, match="equal length"):
            save_observation(
                s, name="x", source="s", config={}, summary={}, num_failed=0,
                arrays={**ARRAYS, "ttft_s": np.array([0.1])},
            )  # fmt: skip
        with pytest.raises(ValidationNotFound, match="observation 99"):
            save_calibration(
                s, shape_name="tiny", accelerator="cpu", tp=1, overhead_s=0.0, prefill_scale=1.0,
                decode_scale=1.0, loss_before=0.0, loss_after=0.0, observation_ids=[99],
            )  # fmt: skip
        with pytest.raises(ValueError, match="out of range"):
            save_calibration(
                s, shape_name="tiny", accelerator="cpu", tp=1, overhead_s=-1.0,
                prefill_scale=1.0, decode_scale=1.0, loss_before=0.0, loss_after=0.0,
            )  # fmt: skip
    engine.dispose()
