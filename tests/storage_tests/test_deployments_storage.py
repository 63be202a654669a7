"""storage.deployments on every back-end: configs stored and read back, newest first with
a keyset cursor, project isolation, observations deleted with their deployment, the
Prometheus fields checked; migration 0110 up, down and up again."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import Engine

from optimizer.config import InstanceConfig, ServingConfig
from storage.db import _alembic_config, make_engine, session_scope, upgrade_database
from storage.deployments import (
    DeploymentError,
    DeploymentNotFound,
    check_prometheus,
    count_deployments,
    count_observations,
    create_deployment,
    delete_deployment,
    get_deployment,
    list_deployments,
    list_observations,
    save_observation,
)

CONFIG = ServingConfig.colocated(
    "llama-3.1-8b", InstanceConfig(accelerator="h100", tp=2), num_replicas=3,
    engine_version="0.10.0",
)  # fmt: skip
REPORT = {
    "window_s": 60.0, "num_requests": 300, "request_rate": 5.0,
    "ttft": {"metric": "vllm:time_to_first_token_seconds",
             "observed": {"p50": 0.05, "p90": 0.1, "p99": 0.2},
             "predicted": {"p50": 0.04, "p90": 0.09, "p99": None}},
    "itl": {"metric": "vllm:inter_token_latency_seconds",
            "observed": {"p50": 0.01, "p90": 0.02, "p99": 0.03},
            "predicted": {"p50": 0.01, "p90": 0.025, "p99": 0.03}},
}  # fmt: skip


def _observe(s, deployment_id: int, **kw):
    return save_observation(
        s, deployment_id, report=REPORT, latency="roofline", priced_as="vLLM 0.10",
        before_sha256="a" * 64, after_sha256="b" * 64, **kw,
    )  # fmt: skip


def test_deployments_round_trip_page_and_stay_in_their_project(engine: Engine) -> None:
    with session_scope(engine) as s:
        first = create_deployment(
            s, project="a", name="prod", config=CONFIG, prometheus_url="https://prom.example/x",
            label_selector='{job="vllm",pod!~"canary-.*",}',
        )  # fmt: skip
        ids = [first.id] + [
            create_deployment(s, project="a", name=f"d{i}", config=CONFIG).id for i in range(3)
        ]
        create_deployment(s, project="b", name="theirs", config=CONFIG)
    with session_scope(engine) as s:
        got = get_deployment(s, first.id, project="a")
        assert got == first and got.config == CONFIG and got.config.num_gpus == 6
        assert got.config.engine_release.label == CONFIG.engine_release.label
        with pytest.raises(DeploymentNotFound, match=f"deployment {first.id} not found"):
            get_deployment(s, first.id, project="b")
        page = list_deployments(s, project="a", limit=2)
        assert [d.id for d in page] == ids[::-1][:2]
        assert [d.id for d in list_deployments(s, project="a", after=page[-1].id)] == ids[:2][::-1]
        assert count_deployments(s, project="a") == 4 and count_deployments(s) == 5
        with pytest.raises(DeploymentNotFound):
            delete_deployment(s, first.id, project="b")
        with pytest.raises(DeploymentNotFound):
            _observe(s, first.id, project="b")


def test_observations_are_listed_newest_first_and_deleted_with_the_deployment(
    engine: Engine,
) -> None:
    with session_scope(engine) as s:
        one = create_deployment(s, project="a", name="one", config=CONFIG)
        two = create_deployment(s, project="a", name="two", config=CONFIG)
        saved = [_observe(s, one.id) for _ in range(3)]
        _observe(s, two.id)
    with session_scope(engine) as s:
        listed = list_observations(s, one.id, project="a")
        assert [o.id for o in listed] == [o.id for o in saved[::-1]]
        o = listed[0]
        assert o.latency == "roofline" and o.priced_as == "vLLM 0.10" and o.report == REPORT
        assert (o.ttft_p90_observed_s, o.ttft_p90_predicted_s) == (0.1, 0.09)
        assert (o.itl_p90_observed_s, o.itl_p90_predicted_s) == (0.02, 0.025)
        assert o.request_rate == 5.0 and o.window_s == 60.0
        assert [x.id for x in list_observations(s, one.id, after=saved[2].id, limit=1)] == [
            saved[1].id
        ]
        with pytest.raises(DeploymentNotFound):
            list_observations(s, one.id, project="b")
        delete_deployment(s, one.id, project="a")
    with session_scope(engine) as s:
        assert count_observations(s, one.id) == 0 and count_observations(s, two.id) == 1
        with pytest.raises(DeploymentNotFound):
            get_deployment(s, one.id)
        # The foreign key cascades too (a row deleted outside `delete_deployment`).
        s.execute(sa.text("DELETE FROM deployments WHERE id = :id"), {"id": two.id})
    with session_scope(engine) as s:
        assert count_observations(s, two.id) == 0


@pytest.mark.parametrize(
    ("url", "selector", "field"),
    [
        ("prometheus:9090", None, "prometheus_url"),
        ("file:///etc/passwd", None, "prometheus_url"),
        ("http:///path", None, "prometheus_url"),
        ("http://prom example:9090", None, "prometheus_url"),
        ("http://p/" + "x" * 600, None, "prometheus_url"),
        (None, "job", "label_selector"),
        (None, '{job="vllm"', "label_selector"),
        (None, '{job="vllm"} or up', "label_selector"),
        (None, "{1job='x'}", "label_selector"),
        (None, "{job=~vllm}", "label_selector"),
    ],
)
def test_prometheus_fields_are_checked(url, selector, field: str) -> None:
    with pytest.raises(DeploymentError) as err:
        check_prometheus(url, selector)
    assert err.value.field == field


def test_prometheus_fields_accepted() -> None:
    check_prometheus("http://prometheus:9090", "{}")
    check_prometheus("https://thanos.example.com/prom/", '{ job = "vllm" , ns =~ "a\\"b" }')
    check_prometheus(None, None)


def _tables(engine: Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def test_migration_0110_up_down_up(db_url: str) -> None:
    command.upgrade(_alembic_config(db_url), "0100_plain_reads")
    engine = make_engine(db_url)
    try:
        assert not {"deployments", "deployment_observations"} & _tables(engine)
        upgrade_database(db_url)
        assert {"deployments", "deployment_observations"} <= _tables(engine)
        indexes = {ix["name"] for ix in sa.inspect(engine).get_indexes("deployment_observations")}
        assert "ix_deployment_observations_deployment_id" in indexes
        with session_scope(engine) as s:
            d = create_deployment(s, project="a", name="prod", config=CONFIG)
            _observe(s, d.id)
        command.downgrade(_alembic_config(db_url), "0100_plain_reads")
        assert not {"deployments", "deployment_observations"} & _tables(engine)
        upgrade_database(db_url)
        with session_scope(engine) as s:
            assert count_deployments(s) == 0
    finally:
        engine.dispose()
