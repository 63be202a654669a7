"""Reading a forward-pass-metrics run's whole requests: what was sent, paired with the
end-to-end times its collection logged, for the run's own block of the log only."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.validation.compare import ValidationError
from optimizer.validation.fpm_requests import MeasuredRequest, segment_requests

HEADER = "workload_label,request_index,endpoint,target_isl,target_osl,prompt_tokens,max_tokens\n"
LOG = """+ bash collect.sh --run-dir /runs/x/tp1_ep1_past4096 --phases context
request_ok index=7 status=200 target_isl=9 target_osl=9 prompt_tokens=9 elapsed_seconds=9.000
+ bash collect.sh --run-dir /runs/x/tp2_ep1_past4096 --phases context
request_ok index=3 status=200 target_isl=100 target_osl=1 prompt_tokens=100 elapsed_seconds=0.100
[20:29:11] Sending 2 real-workload requests at concurrency 32
request_ok index=5 status=200 target_isl=300 target_osl=30 prompt_tokens=300 elapsed_seconds=2.500
request_ok index=4 status=200 target_isl=200 target_osl=20 prompt_tokens=200 elapsed_seconds=1.250
request_ok index=4 status=200 target_isl=200 target_osl=20 prompt_tokens=200 elapsed_seconds=1.250
+ bash collect.sh --run-dir /runs/x/tp4_ep1_past4096 --phases context
request_ok index=4 status=200 target_isl=200 target_osl=20 prompt_tokens=200 elapsed_seconds=7.000
"""


def _run(tmp_path: Path, rows: str, log: str = LOG) -> Path:
    (tmp_path / "collect.log").write_text(log)
    folder = tmp_path / "tp2_ep1_past4096"
    folder.mkdir()
    (folder / "request_workload.csv").write_text(HEADER + rows)
    return folder


def test_the_real_requests_in_sending_order_with_their_own_runs_times(tmp_path) -> None:
    rows = "context,3,completions,100,1,100,1\nreal,4,completions,200,20,200,20\n"
    rows += "real,5,completions,300,30,300,30\n"
    folder = _run(tmp_path, rows)
    got = segment_requests(folder)
    # index 4 is logged twice in this run's block and again (7 s) in the next run's
    assert got == [MeasuredRequest(4, 200, 20, 1.25), MeasuredRequest(5, 300, 30, 2.5)]
    # another segment of the same run: the context prompt sent before them
    assert segment_requests(folder, "context") == [MeasuredRequest(3, 100, 1, 0.1)]


def test_a_request_without_a_logged_time_is_named(tmp_path) -> None:
    rows = "real,4,completions,200,20,200,20\nreal,6,completions,1,1,1,1\n"
    with pytest.raises(ValidationError, match=r"no time for 1 of the 2 'real' requests .*index 6"):
        segment_requests(_run(tmp_path, rows))


def test_a_workload_without_real_requests_or_columns_is_refused(tmp_path) -> None:
    with pytest.raises(ValidationError, match="no requests labelled 'real'"):
        segment_requests(_run(tmp_path, "context,3,completions,100,1,100,1\n"))
    bad = tmp_path / "b"
    bad.mkdir()
    (bad / "tp2_ep1_past4096").mkdir()
    (bad / "collect.log").write_text(LOG)
    (bad / "tp2_ep1_past4096" / "request_workload.csv").write_text("workload_label\nreal\n")
    with pytest.raises(ValidationError, match="expected request_index, prompt_tokens"):
        segment_requests(bad / "tp2_ep1_past4096")
