from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient

if TYPE_CHECKING:
    from api.worker import Worker


@pytest.fixture
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's tables one line per row whatever the terminal (xdist workers and narrow
    terminals set COLUMNS, which wraps rows a test reads)."""
    from api.cli.common import console

    monkeypatch.setattr(console, "_width", 240)


# --- the REST service -------------------------------------------------------------------


def write_trace_csv(path: Path, n: int = 50, *, seed: int = 0, input_scale: int = 1) -> Path:
    """A small valid trace in the splitwise format (arrived_at s, prefill, decode tokens)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0, 60, n))
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    for a in arrivals:
        lines.append(
            f"{a:.6f},{int(rng.integers(100, 2000)) * input_scale},{int(rng.integers(10, 300))}"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Service:
    """A running app (no embedded worker) with keys for projects a and b and an admin key."""

    client: TestClient
    url: str
    key_a: str
    key_b: str
    admin: str

    @staticmethod
    def auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def worker(self, delay_s: float = 0.0, **options) -> Worker:
        from api.worker import Worker, WorkerOptions
        from storage.db import make_engine
        from storage.service_records import JobKind
        from tests.api_tests.fakes import make_fake_executor

        return Worker(
            make_engine(self.url),
            storage_url=self.url,
            executors={JobKind.TUNING: make_fake_executor(delay_s)},
            options=WorkerOptions(**{"lease_s": 5.0, "poll_s": 0.2, **options}),
        )


def make_service_keys(url: str) -> tuple[str, str, str]:
    from storage.db import make_engine, session_scope, upgrade_database
    from storage.keys import create_key

    upgrade_database(url)
    engine = make_engine(url)
    with session_scope(engine) as s:
        _, key_a = create_key(s, project="a")
        _, key_b = create_key(s, project="b")
        _, admin = create_key(s, project="ops", is_admin=True)
    engine.dispose()
    return key_a, key_b, admin


@pytest.fixture
def service(db_url: str, tmp_path: Path) -> Iterator[Service]:
    from api.app import create_app
    from api.settings import Settings

    key_a, key_b, admin = make_service_keys(db_url)
    settings = Settings(
        database_url=db_url,
        max_upload_bytes=200_000,
        max_trace_rows=5_000,
        upload_dir=str(tmp_path),
    )
    app = create_app(settings, embedded_worker=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Service(client, db_url, key_a, key_b, admin)
