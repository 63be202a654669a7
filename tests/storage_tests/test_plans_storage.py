"""Fleet plans on every back-end: the request and outcome documents round trip, another
project's plan is not found, and the migration's downgrade removes the table."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from storage.db import session_scope, upgrade_database
from storage.models import PlanRow
from storage.plans import PlanNotFound, get_plan, list_plans, save_plan
from tests.factories import make_plan


@pytest.fixture(scope="module")
def plan():
    return make_plan(trace_id=7)


def test_a_plan_round_trips(engine, plan) -> None:
    with session_scope(engine) as s:
        saved = save_plan(s, plan)
        other = save_plan(s, plan, project="other")
    with session_scope(engine) as s:
        back = get_plan(s, saved.id)
        row = s.get(PlanRow, saved.id)
        assert row.request == plan.request.to_dict()
        assert row.request["schema_version"] == 1 and row.outcome["schema_version"] == 2
        assert (row.trace_id, row.model, row.gpu) == (7, "llama-3.1-8b", "h100")
        assert [p.id for p in list_plans(s, trace_id=7)] == [saved.id]
        assert list_plans(s, trace_id=8) == []
        with pytest.raises(PlanNotFound, match=f"plan {other.id} not found"):
            get_plan(s, other.id, project="default")
    assert back.plan == plan and back.trace_id == 7 and back.project == "default"


def test_a_plan_without_its_stored_trace_is_not_saved(engine) -> None:
    with session_scope(engine) as s, pytest.raises(ValueError, match="trace_id is None"):
        save_plan(s, make_plan(trace_id=None))


def test_the_migration_goes_down_and_up(db_url: str) -> None:
    upgrade_database(db_url)
    engine = sa.create_engine(db_url)
    try:
        assert "plans" in sa.inspect(engine).get_table_names()
        from alembic import command

        from storage.db import _alembic_config

        command.downgrade(_alembic_config(db_url), "0150_synthetic_traces")
        assert "plans" not in sa.inspect(engine).get_table_names()
        upgrade_database(db_url)
        assert "plans" in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
