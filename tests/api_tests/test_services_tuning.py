"""run_tuning_job end to end on a stored trace; storage round trip; two workers, one study."""

from __future__ import annotations

import json
import multiprocessing as mp
from dataclasses import replace

import pytest

from api.services.tuning import TuneRequest, TuneRequestError, run_tuning_job, run_worker
from optimizer.workload import FixedLength, LognormalLength, synthetic_workload


def _store_trace(url: str) -> int:
    from optimizer.records import TraceColumns, TraceFormat
    from optimizer.traces.stats import compute_stats
    from storage.db import make_engine, session_scope, upgrade_database
    from storage.traces import store_trace

    upgrade_database(url)
    wl = synthetic_workload(
        120, 3.0, input_lengths=LognormalLength(600, 0.5, max_tokens=3000),
        output_lengths=FixedLength(40), seed=2,
    )  # fmt: skip
    cols = TraceColumns(wl.arrival_s, wl.input_tokens, wl.output_tokens)
    engine = make_engine(url)
    with session_scope(engine) as s:
        info, _ = store_trace(s, name="t", source_format=TraceFormat.GENERIC, content_hash="x" * 64,
                              columns=cols, stats=compute_stats(cols))  # fmt: skip
    engine.dispose()
    return info.id


SPACE = {"tp": [1, 2], "max_num_batched_tokens": [512, 2048], "max_num_seqs": [64, 256]}


def _request(trace_id: int, n: int) -> TuneRequest:
    return TuneRequest(
        trace_id=trace_id, model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=2,
        slo_ttft_ms=2000, slo_tpot_ms=50, num_trials=n, seed=0, search_space=SPACE,
        max_requests=120,
    )  # fmt: skip


def test_request_rejects_bad_fields():
    with pytest.raises(TuneRequestError, match="slo_ttft_ms"):
        TuneRequest(trace_id=1, model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=2,
                    slo_ttft_ms=-1, slo_tpot_ms=50)  # fmt: skip
    with pytest.raises(TuneRequestError, match="unknown keys"):
        TuneRequest(trace_id=1, model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=2,
                    slo_ttft_ms=1, slo_tpot_ms=50, search_space={"bogus": 1})  # fmt: skip
    r = _request(1, 5)
    assert TuneRequest.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_job_runs_resumes_and_is_stored(db_url):
    from storage.db import make_engine, session_scope
    from storage.tuning import TuningStatus, get_tuning_run

    trace_id = _store_trace(db_url)
    seen = []
    out = run_tuning_job(_request(trace_id, 4), database_url=db_url, study_name="job1",
                         should_stop=lambda: False, on_progress=seen.append)  # fmt: skip
    assert out.num_trials == 4 and seen[-1].trials_done == 4
    assert out.baseline.config.replica.max_num_batched_tokens == 8192
    assert out.to_dict()["schema_version"] == 5
    # Every figure shown is a verified fleet's, on the whole (120-request) trace.
    assert out.evaluated.trace.num_requests == 120
    assert all(p.predicted.stage.value == "verified" for p in out.pareto)
    assert seen[-1].stage.startswith("capacity plan") or out.recommendation is None
    # Resuming the same job keeps the 4 completed trials and runs none again.
    out2 = run_tuning_job(_request(trace_id, 4), database_url=db_url, study_name="job1",
                          should_stop=lambda: False, on_progress=lambda _p: None)  # fmt: skip
    assert out2.num_trials == 4
    import optuna

    from optimizer.search.study import make_storage

    assert len(optuna.load_study(study_name="job1", storage=make_storage(db_url)).trials) == 4
    engine = make_engine(db_url)
    with session_scope(engine) as s:
        run = get_tuning_run(s, "job1")
    engine.dispose()
    assert run.status is TuningStatus.DONE and run.trace_id == trace_id
    assert run.outcome["num_trials"] == 4 and run.latency_label.startswith("roofline")


def _worker(url: str, name: str) -> None:
    run_worker(url, name)


@pytest.mark.postgres
def test_two_workers_share_one_study(postgres_url):
    import optuna

    from optimizer.search.study import make_storage, open_study

    trace_id = _store_trace(postgres_url)
    req = _request(trace_id, 10)
    study = open_study("shared", make_storage(postgres_url), seed=0)
    study.set_user_attr("request", json.dumps(req.to_dict()))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(postgres_url, "shared")) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    trials = optuna.load_study(study_name="shared", storage=make_storage(postgres_url)).trials
    done = [t for t in trials if t.state is optuna.trial.TrialState.COMPLETE]
    assert len(done) == 10  # none lost, none beyond the budget
    assert len({t.number for t in done}) == 10  # none duplicated
    assert all("surplus" not in t.user_attrs for t in done)
    assert all("config" in t.user_attrs or "config_error" in t.user_attrs for t in done)


def test_extra_worker_processes_share_the_study_and_lose_nothing(db_url):
    import optuna

    from optimizer.search.study import make_storage

    trace_id = _store_trace(db_url)
    out = run_tuning_job(_request(trace_id, 12), database_url=db_url, study_name="two",
                         should_stop=lambda: False, on_progress=lambda _p: None,
                         workers=2)  # fmt: skip
    assert out.num_trials == 12
    trials = optuna.load_study(study_name="two", storage=make_storage(db_url)).trials
    done = [t for t in trials if t.state is optuna.trial.TrialState.COMPLETE]
    assert len(done) == 12 and len({t.number for t in done}) == 12


class _Broken:
    """A latency source with a bug: every step raises."""

    def for_instance(self, accelerator, tp, reach=None, precision=None, engine=None, layout=None):
        raise ZeroDivisionError("bug in the latency model")


def test_a_bug_fails_the_job_with_its_traceback_not_as_invalid_configs(db_url):
    from api.services.tuning import TrialError

    trace_id = _store_trace(db_url)
    only_valid = {"modes": ["colocated"], "tp": [1], "chunked_prefill": [True]}
    request = replace(_request(trace_id, 3), search_space=only_valid)
    with pytest.raises(TrialError, match="trial 0 failed: ZeroDivisionError") as info:
        run_tuning_job(request, database_url=db_url, study_name="broken",
                       should_stop=lambda: False, on_progress=lambda _p: None,
                       latency=_Broken())  # fmt: skip
    assert "ZeroDivisionError: bug in the latency model" in info.value.details()
    assert "Traceback (most recent call last)" in info.value.details()
