"""Reads kept while the database is unchanged (api.reads): served from memory, and never
stale once anything commits, by this process or another one (on SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from api.fastpath import CachedGetMiddleware
from api.reads import ReadLog
from storage.db import make_engine, session_scope
from storage.keys import create_key, revoke_key
from storage.traces import delete_trace
from tests.api_tests.conftest import Service
from tests.api_tests.test_api_jobs import _trace


def _reader(service: Service):
    return service.client.app.state.reader


def _fastpath(service: Service) -> CachedGetMiddleware:
    layer = service.client.app.middleware_stack
    while not isinstance(layer, CachedGetMiddleware):
        layer = layer.app
    return layer


def _served_from_memory(service: Service) -> int:
    """Requests answered without a database read: kept reads and replayed answers."""
    return _reader(service).hits + _fastpath(service).replayed


def _until_from_memory(service: Service, path: str, headers: dict, count=_served_from_memory):
    """GET `path` until one request is answered from memory; each answer is returned for
    the caller to check. On PostgreSQL the version is the whole cluster's: other tests'
    commits (parallel workers) make some requests read again, never all of them."""
    answers = []
    for _ in range(50):
        before = count(service)
        answers.append(service.client.get(path, headers=headers))
        if count(service) == before + 1:
            return answers
    raise AssertionError(f"{path}: never answered from memory in {len(answers)} requests")


def test_a_kept_read_is_served_again_until_another_connection_commits(
    service: Service, tmp_path: Path
) -> None:
    h = service.auth(service.key_a)
    tid = _trace(service, tmp_path, name="before")
    first = service.client.get(f"/v1/traces/{tid}", headers=h)
    for again in _until_from_memory(service, f"/v1/traces/{tid}", h):
        assert again.content == first.content
    # Another connection (a CLI, a worker) deletes it: the next read sees that at once.
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        delete_trace(s, tid, project="a")
    gone = service.client.get(f"/v1/traces/{tid}", headers=h)
    assert gone.status_code == 404 and gone.json()["detail"] == f"trace {tid} not found"
    # The not-found answer is kept too (a fresh error each time), until the next commit.
    for again in _until_from_memory(service, f"/v1/traces/{tid}", h):
        assert again.status_code == 404 and again.json() == gone.json()
        assert again.headers["content-type"] == gone.headers["content-type"]
    listing = service.client.get("/v1/traces", headers=h).json()
    assert listing["total"] == 0
    tid2 = _trace(service, tmp_path, name="after")  # a write through the API itself
    listing = service.client.get("/v1/traces", headers=h).json()
    assert [t["id"] for t in listing["items"]] == [tid2]
    engine.dispose()


def test_an_unknown_key_is_refused_until_it_is_created_and_after_it_is_revoked(
    service: Service,
) -> None:
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        info, token = create_key(s, project="c")
        revoke_key(s, info.id)
    fastpath = _fastpath(service)
    refusals = _until_from_memory(  # the refusal is kept, and sent again before routing ...
        service, "/v1/traces", service.auth(token), count=lambda _: fastpath.replayed
    )
    for r in refusals:
        assert r.status_code == 401 and r.headers["www-authenticate"] == 'Bearer realm="servetune"'
    with session_scope(engine) as s:  # ... until the database changes: a new key works at once
        _, fresh = create_key(s, project="c")
    assert service.client.get("/v1/traces", headers=service.auth(fresh)).status_code == 200
    engine.dispose()


def test_the_job_counts_follow_the_queue(service: Service, tmp_path: Path) -> None:
    from tests.api_tests.test_api_jobs import _create

    def queued() -> str:
        text = service.client.get("/metrics").text
        return next(line for line in text.splitlines() if 'status="queued"' in line)

    assert queued().endswith(" 0")
    _create(service, trace_id=_trace(service, tmp_path), num_trials=2)
    assert queued().endswith(" 1")


def test_openapi_is_encoded_once_as_fastapi_encodes_it(service: Service) -> None:
    from fastapi.responses import JSONResponse

    app = service.client.app
    body = service.client.get("/openapi.json")
    assert body.status_code == 200 and body.headers["content-type"] == "application/json"
    assert body.content == JSONResponse(app.openapi()).body
    assert service.client.get("/openapi.json").content == body.content
    assert "/openapi.json" not in app.openapi()["paths"]


def test_postgresql_reads_stay_exact_while_the_version_connection_is_down(
    service: Service, tmp_path: Path
) -> None:
    """Without its own version connection the reader reads the version inside each read's
    transaction: still kept, still never stale."""
    import pytest

    reader = _reader(service)
    if reader._async_engine is None:
        pytest.skip("PostgreSQL only: SQLite reads its version on the reader's connection")
    reader._conninfo = "postgresql://postgres@127.0.0.1:1/nowhere"  # nothing listens there
    service.client.portal.call(reader._close_version_conn)
    assert service.client.portal.call(reader._read_version) is None
    h = service.auth(service.key_a)
    tid = _trace(service, tmp_path, name="x")
    first = service.client.get(f"/v1/traces/{tid}", headers=h)
    hits = _until_from_memory(service, f"/v1/traces/{tid}", h, count=lambda s: reader.hits)
    assert all(again.content == first.content for again in hits)
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        delete_trace(s, tid, project="a")
    engine.dispose()
    assert service.client.get(f"/v1/traces/{tid}", headers=h).status_code == 404


def test_a_replayed_answer_follows_keys_projects_and_revocation(
    service: Service, tmp_path: Path
) -> None:
    """Answers sent again before routing are keyed by path, query and the caller's grant
    (project, admin scope), and only while the key cache holds the caller's key: every
    key of a project shares them, another project's key gets its own 404, and a key
    revoked through the API is refused at once."""
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        _, second = create_key(s, project="a")
        _, admin = create_key(s, project="a", is_admin=True)
    engine.dispose()
    a, a2 = service.auth(service.key_a), service.auth(second)
    tid = _trace(service, tmp_path, name="mine")
    fastpath = _fastpath(service)
    first = service.client.get(f"/v1/traces/{tid}", headers=a)
    replays = _until_from_memory(service, f"/v1/traces/{tid}", a, count=lambda s: fastpath.replayed)
    assert all(again.content == first.content for again in replays)
    # The other key of project a, once in the key cache (any request), is sent the same
    # answer without routing on its first request for it.
    assert service.client.get("/v1/traces", headers=a2).status_code == 200
    shared = _until_from_memory(service, f"/v1/traces/{tid}", a2, count=lambda s: fastpath.replayed)
    assert all(again.content == first.content for again in shared)
    stored = [k for k in fastpath._answers if k[1:3] == (f"/v1/traces/{tid}", b"")]
    assert stored == [("grant", f"/v1/traces/{tid}", b"", "a", False)]  # one for both keys
    replayed = fastpath.replayed
    assert service.client.get(f"/v1/traces/{tid}?x=1", headers=a).content == first.content
    assert fastpath.replayed == replayed  # another query string: through the route
    other = service.client.get(f"/v1/traces/{tid}", headers=service.auth(service.key_b))
    assert other.status_code == 404 and fastpath.replayed == replayed
    # The metrics label a replayed request by its route, like any other.
    ok = 2 + len(replays) + len(shared)
    text = service.client.get("/metrics").text
    assert f'route="/v1/traces/{{trace_id}}",status="200"}} {ok}' in text
    # Key a revoked through the API (a commit, and the key dropped from the key cache).
    keys = service.client.get("/v1/keys", headers=service.auth(admin)).json()["items"]
    (key_id,) = [k["id"] for k in keys if k["prefix"] == service.key_a[: len(k["prefix"])]]
    revoked = service.client.delete(f"/v1/keys/{key_id}", headers=service.auth(admin))
    assert revoked.status_code == 200
    assert service.client.get(f"/v1/traces/{tid}", headers=a).status_code == 401
    assert service.client.get(f"/v1/traces/{tid}", headers=a2).content == first.content


def test_an_answer_is_replayed_only_when_read_at_one_version() -> None:
    log = ReadLog()
    assert log.replayable_at() is None  # not a kept read's answer
    log.answered = True
    log.versions.add(7)
    assert log.replayable_at() == 7
    log.versions.add(8)  # the key read before a commit, the answer after it
    assert log.replayable_at() is None
    log.versions.discard(8)
    log.unkept = True  # a read that is not kept
    assert log.replayable_at() is None


def test_stored_answers_are_bounded_in_number_and_bytes(service: Service, tmp_path: Path) -> None:
    fastpath = _fastpath(service)
    h = service.auth(service.key_a)
    tids = [_trace(service, tmp_path, name=f"t{i}") for i in range(3)]
    fastpath.max_answers = 2
    for tid in tids:
        service.client.get(f"/v1/traces/{tid}", headers=h)
    assert len(fastpath._answers) <= 2
    fastpath.max_bytes = 10  # smaller than any answer: each one replaces the others
    service.client.get(f"/v1/traces/{tids[0]}", headers=h)
    assert len(fastpath._answers) == 1 and fastpath._bytes > 10


def test_postgresql_misses_are_read_in_batches_that_fail_one_read_alone(postgres_url: str) -> None:
    """Concurrent misses share one read-only REPEATABLE READ transaction; a read that raises
    or whose statement fails (aborting the transaction) fails alone, the others answer."""
    import asyncio

    import sqlalchemy as sa

    from api.reads import Reader

    engine = make_engine(postgres_url)

    def ok(i: int):
        def work(session) -> tuple:
            level = session.execute(sa.text("SHOW transaction_isolation")).scalar()
            read_only = session.execute(sa.text("SHOW transaction_read_only")).scalar()
            return i, level, read_only

        return work

    def bad_statement(session) -> None:
        session.execute(sa.text("SELECT 1 / 0"))

    def raises(session) -> None:
        raise RuntimeError("a bug in one read")

    async def scenario() -> list:
        reader = Reader(engine)
        batches = []
        batch = reader._pg_batch

        async def counted(misses):
            batches.append(len(misses))
            await batch(misses)

        reader._pg_batch = counted
        # The failing statement first: every other read runs after it aborted the transaction.
        works = {"bad": bad_statement, "raises": raises, **{("ok", i): ok(i) for i in range(20)}}
        keys = list(works)
        try:
            got = await asyncio.gather(
                *(reader.run(works[k], key=k) for k in keys), return_exceptions=True
            )
        finally:
            await reader.aclose()
            reader.close()
        return [dict(zip(keys, got, strict=True)), batches]

    answers, batches = asyncio.run(scenario())
    engine.dispose()
    assert sum(batches) == 22 and len(batches) <= 2, batches  # not one transaction per read
    assert isinstance(answers["bad"], sa.exc.DBAPIError)
    assert isinstance(answers["raises"], RuntimeError)
    for i in range(20):
        assert answers[("ok", i)] == (i, "repeatable read", "on")


def test_reads_of_many_rows_are_read_together(db_url: str) -> None:
    """`Reader.each`: on PostgreSQL the concurrent misses of one `read_many` are read by one
    call with all their items (SQLite reads each alone, on the loop); an answer that is a
    not-found is raised as a kept read's error; a `read_many` that raises fails its own
    items alone."""
    import asyncio

    import sqlalchemy as sa

    from api.reads import Reader
    from storage.jobs import JobNotFound

    calls = []

    def squares(session, items: list[int]) -> dict:
        calls.append(sorted(items))
        session.execute(sa.text("SELECT 1"))
        return {i: JobNotFound(i) if i < 0 else i * i for i in items}

    def broken(session, items: list[int]) -> dict:
        raise RuntimeError("a bug in one read")

    def plain(session) -> int:
        return session.execute(sa.text("SELECT 2")).scalar()

    async def scenario() -> list:
        reader = Reader(engine)
        try:
            return await asyncio.gather(
                *(reader.each(squares, i, key=("square", i)) for i in (1, 2, 3, -1)),
                *(reader.each(broken, i, key=("broken", i)) for i in (1, 2)),
                reader.run(plain, key="plain"),
                return_exceptions=True,
            )
        finally:
            await reader.aclose()
            reader.close()

    engine = make_engine(db_url)
    got = asyncio.run(scenario())
    engine.dispose()
    assert got[:3] == [1, 4, 9] and got[-1] == 2
    assert isinstance(got[3], JobNotFound)
    assert all(isinstance(e, RuntimeError) for e in got[4:6])
    if db_url.startswith("sqlite"):
        assert calls == [[1], [2], [3], [-1]]
    else:
        assert calls == [[-1, 1, 2, 3]]  # one call, one statement


def test_postgresql_batches_replace_a_connection_the_server_dropped(postgres_url: str) -> None:
    import asyncio

    import sqlalchemy as sa

    from api.reads import Reader

    engine = make_engine(postgres_url)

    def one(session) -> int:
        return session.execute(sa.text("SELECT 1")).scalar()

    async def scenario() -> list:
        reader = Reader(engine)
        try:
            assert await reader.run(one, key="before") == 1  # the pool now holds a connection
            with engine.connect() as admin:  # what a server restart does to it
                admin.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
                admin.commit()
            await reader.version()  # the version connection notices (and reconnects next)
            return await asyncio.gather(*(reader.run(one, key=i) for i in range(5)))
        finally:
            await reader.aclose()
            reader.close()

    assert asyncio.run(scenario()) == [1] * 5
    engine.dispose()


def test_answers_from_memory_equal_fresh_reads_through_a_random_history(
    service: Service, tmp_path: Path
) -> None:
    """Uploads through the API, deletions, new keys and queued jobs by another connection,
    and key revocations through the API, between GETs over several paths and keys (on
    PostgreSQL, a commit leaves standing the answers read from other tables): every answer,
    many of them kept or sent again before routing, is byte for byte the one a second app
    reads afresh with every cache emptied."""
    import random

    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.settings import Settings
    from optimizer.search.request import TuneRequest
    from storage.jobs import enqueue_job
    from tests.api_tests.conftest import write_trace_csv
    from tests.api_tests.test_api_jobs import PARAMS

    rng = random.Random(7)
    job = TuneRequest(**PARAMS, trace_id=1)
    engine = make_engine(service.url)
    with session_scope(engine) as s:  # admins of each project revoke its keys via the API
        admins = {p: create_key(s, project=p, is_admin=True)[1] for p in ("a", "b")}
    keys = {"a": service.key_a, "b": service.key_b, "unknown": "st_" + "0" * 40}
    owner = {"a": "a", "b": "b"}
    live: list[tuple[int, str]] = []  # (trace id, project)
    ids: list[int] = []  # every id ever made: deleted ones are read too (404)
    settings = Settings(database_url=service.url, upload_dir=str(tmp_path / "ref"))
    with TestClient(create_app(settings, embedded_worker=False)) as reference:
        ref_fastpath = reference.app.middleware_stack
        while not isinstance(ref_fastpath, CachedGetMiddleware):
            ref_fastpath = ref_fastpath.app

        def fresh(path: str, headers: dict):
            ref_fastpath._answers.clear()
            reference.app.state.reader._kept.clear()
            reference.app.state.key_cache.clear()
            return reference.get(path, headers=headers)

        from_memory = 0
        for step in range(150):
            op = rng.random()
            if op < 0.10:
                project = rng.choice("ab")
                csv = write_trace_csv(tmp_path / f"t{step}.csv", seed=step)
                with csv.open("rb") as fh:
                    r = service.client.post(
                        "/v1/traces", headers=service.auth(keys[project]), files={"file": fh}
                    )
                assert r.status_code == 201, r.text
                live.append((r.json()["id"], project))
                ids.append(r.json()["id"])
            elif op < 0.14 and live:
                tid, project = live.pop(rng.randrange(len(live)))
                with session_scope(engine) as s:
                    delete_trace(s, tid, project=project)
            elif op < 0.17:
                name, project = f"k{step}", rng.choice("ab")
                with session_scope(engine) as s:
                    keys[name] = create_key(s, project=project)[1]
                owner[name] = project
            elif op < 0.19:
                name = rng.choice([n for n in keys if n not in ("a", "b", "unknown")] or ["-"])
                if name in owner:
                    admin = service.auth(admins[owner[name]])
                    listed = service.client.get("/v1/keys?limit=1000", headers=admin).json()
                    prefix = keys[name][: len(listed["items"][0]["prefix"])]
                    (key_id,) = [k["id"] for k in listed["items"] if k["prefix"] == prefix]
                    assert service.client.delete(f"/v1/keys/{key_id}", headers=admin).is_success
                    del owner[name]
            elif op < 0.24:
                with session_scope(engine) as s:  # a job queued by another connection
                    enqueue_job(s, project=rng.choice("ab"), params=job)
            # Then (after a write: at once) GETs: the second is usually answered from memory.
            name = rng.choice(sorted(keys))
            paths = [
                "/v1/traces",
                "/v1/traces?limit=1",
                "/v1/tuning-jobs",
                "/v1/tuning-jobs?limit=1",
            ]
            paths += [f"/v1/traces/{i}{rng.choice(['', '/stats'])}" for i in ids[-4:]]
            path = rng.choice(paths)
            headers = service.auth(keys[name])
            for _ in range(2):
                before = _served_from_memory(service)
                got = service.client.get(path, headers=headers)
                from_memory += _served_from_memory(service) - before
                want = fresh(path, headers)
                assert (got.status_code, got.content) == (want.status_code, want.content), (
                    step, path, name,
                )  # fmt: skip
    engine.dispose()
    assert from_memory >= 40, from_memory  # the history did exercise the memory


def test_a_snapshot_is_unchanged_until_a_transaction_ends() -> None:
    from api.reads import PgSnapshot

    def unchanged(old: str, later: str) -> bool:
        return PgSnapshot.parse(old).unchanged_at(PgSnapshot.parse(later))

    assert PgSnapshot.parse("10:20:10,14") == PgSnapshot(10, 20, frozenset({10, 14}))
    assert unchanged("100:100:", "100:100:")
    assert unchanged("100:100:", "100:101:100")  # 100 began writing
    assert unchanged("100:101:100", "100:103:100,101,102")  # 101 and 102 too
    assert not unchanged("100:100:", "101:101:")  # 100 ended
    assert not unchanged("100:103:100,101", "100:103:100")  # 101 ended
    assert not unchanged("100:101:100", "100:103:100,102")  # 101 began and ended
    assert not unchanged("100:103:100", "100:101:100")  # not later: only the same one


def test_postgresql_kept_reads_stand_while_a_write_has_only_begun(postgres_url: str) -> None:
    """The reader keeps an answer across snapshots that differ only by transactions that
    began writing, and reads again once one of them ended (versions fed by hand: the
    cluster's own change whenever other tests write)."""
    import asyncio

    from api.reads import PgSnapshot, PgVersion, Reader

    engine = make_engine(postgres_url)
    snapshots = iter(["100:100:", "100:101:100", "100:102:100,101", "101:102:101", "101:102:101"])
    calls: list[int] = []

    def work(session) -> int:
        calls.append(1)
        return len(calls)

    async def scenario() -> list[int]:
        reader = Reader(engine)

        async def version() -> PgVersion:
            return PgVersion(PgSnapshot.parse(next(snapshots)))

        reader._read_version = version
        try:
            return [await reader.run(work, key="k") for _ in range(5)]
        finally:
            await reader.aclose()
            reader.close()

    assert asyncio.run(scenario()) == [1, 1, 1, 2, 2]
    engine.dispose()


def test_a_postgresql_version_stands_for_the_tables_whose_counters_did_not_move() -> None:
    """Golden cases worked out by hand: counters (jobs, traces) read before and after each
    snapshot; a kept answer read `traces`, or `jobs`, or unknown tables (None)."""
    from api.reads import PgSnapshot, PgVersion

    names = ("jobs", "traces")

    def v(snapshot: str, before=(5, 7), after=(5, 7)) -> PgVersion:
        return PgVersion(PgSnapshot.parse(snapshot), names, before, after)

    traces, jobs, both = frozenset({"traces"}), frozenset({"jobs"}), frozenset(names)
    kept = v("100:100:")
    # a heartbeat to jobs committed (transaction 100 ended, jobs' counter moved)
    heartbeat = v("101:101:", before=(6, 7), after=(6, 7))
    assert kept.unchanged_at(heartbeat, traces)
    assert not kept.unchanged_at(heartbeat, jobs)
    assert not kept.unchanged_at(heartbeat, both)
    assert not kept.unchanged_at(heartbeat, None)  # unknown tables: any commit counts
    assert kept.unchanged_at(heartbeat, frozenset())  # read no table at all
    # no transaction ended: unchanged whatever the counters say (a write has only begun)
    assert kept.unchanged_at(v("100:101:100", after=(6, 8)), both)
    # the write ran between this version's two counter reads: `before` is what counts
    racing = v("100:100:", before=(5, 7), after=(6, 7))
    assert not racing.unchanged_at(v("101:101:", before=(6, 7), after=(6, 7)), jobs)
    # a transaction running at the kept version wrote jobs before its counters were read,
    # then committed: only its end shows it
    running = v("100:101:100", before=(6, 7), after=(6, 7))
    assert not running.unchanged_at(v("101:101:", before=(6, 7), after=(6, 7)), jobs)
    assert not running.unchanged_at(v("101:101:", before=(6, 7), after=(6, 7)), traces)
    assert running.unchanged_at(v("100:102:100", before=(7, 7), after=(7, 7)), traces)
    # not later, or counted differently, or no counters: only the snapshot rule
    assert not heartbeat.unchanged_at(kept, traces)
    assert not kept.unchanged_at(PgVersion(heartbeat.snapshot), traces)
    assert not PgVersion(kept.snapshot).unchanged_at(heartbeat, traces)
    other = PgVersion(heartbeat.snapshot, ("traces", "jobs"), (7, 6), (7, 6))
    assert not kept.unchanged_at(other, traces)
    assert not kept.unchanged_at(heartbeat, frozenset({"schedules"}))  # not counted


def test_a_sqlite_version_stands_for_the_tables_whose_counters_did_not_move() -> None:
    from api.reads import SqliteVersion

    names = ("jobs", "traces")
    kept = SqliteVersion(7, names, (3, 5))
    jobs, traces = frozenset({"jobs"}), frozenset({"traces"})
    assert kept.unchanged_at(SqliteVersion(7, names, (3, 5)), None)  # nothing committed
    # a progress report to jobs committed
    progress = SqliteVersion(8, names, (4, 5))
    assert kept.unchanged_at(progress, traces)
    assert not kept.unchanged_at(progress, jobs)
    assert not kept.unchanged_at(progress, jobs | traces)
    assert not kept.unchanged_at(progress, None)  # unknown tables: any commit counts
    assert kept.unchanged_at(progress, frozenset())  # read no table at all
    # a commit to a table without a counter (a bulk table, or one a migration adds)
    assert not kept.unchanged_at(SqliteVersion(9, names, (3, 5)), frozenset({"schedules"}))
    assert kept.unchanged_at(SqliteVersion(9, names, (3, 5)), jobs | traces)
    # no counters on either side (before migration 0090), or another set of tables
    assert not SqliteVersion(7).unchanged_at(SqliteVersion(8), traces)
    assert not kept.unchanged_at(SqliteVersion(8), traces)
    assert not kept.unchanged_at(SqliteVersion(8, ("traces", "jobs"), (5, 3)), traces)
    assert SqliteVersion(7).unchanged_at(SqliteVersion(7), None)


def test_answers_stand_across_commits_to_tables_they_did_not_read(
    service: Service, tmp_path: Path
) -> None:
    """A job enqueued by another connection after each read: the trace's answer is still
    served from memory, the job list is read again (and shows the job at once)."""
    from optimizer.search.request import TuneRequest
    from storage.jobs import enqueue_job
    from tests.api_tests.test_api_jobs import PARAMS

    h = service.auth(service.key_a)
    tid = _trace(service, tmp_path, name="x")
    first = service.client.get(f"/v1/traces/{tid}", headers=h)
    _until_from_memory(service, f"/v1/traces/{tid}", h)
    engine = make_engine(service.url)
    request = TuneRequest(**PARAMS, trace_id=tid)
    after_commit = 0
    for n in range(1, 11):
        with session_scope(engine) as s:
            enqueue_job(s, project="a", params=request)
        before = _served_from_memory(service)
        again = service.client.get(f"/v1/traces/{tid}", headers=h)
        after_commit += _served_from_memory(service) - before
        assert again.content == first.content
        assert service.client.get("/v1/tuning-jobs", headers=h).json()["total"] == n
    engine.dispose()
    if _reader(service)._async_engine is None:  # SQLite: nobody else writes to the file
        assert after_commit == 10, after_commit
    # PostgreSQL: other tests' transactions running at a kept version and ending since
    # make some reads compute again; without per-table versions every one of these would.
    assert after_commit >= 1, after_commit


def test_job_reads_stand_across_heartbeats_not_progress(service: Service, tmp_path: Path) -> None:
    """A worker's heartbeats (another connection) leave the job's answers served from
    memory; its progress report shows at the next read."""
    from optimizer.search import TuneProgress
    from optimizer.search.request import TuneRequest
    from storage.jobs import claim_job, enqueue_job, renew_lease, report_progress
    from tests.api_tests.test_api_jobs import PARAMS

    h = service.auth(service.key_a)
    tid = _trace(service, tmp_path, name="beats")
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        job = enqueue_job(s, project="a", params=TuneRequest(**PARAMS, trace_id=tid))
    claim = None
    while claim is None or claim.job.id != job.id:  # (other tests' queued jobs first)
        with session_scope(engine) as s:
            claim = claim_job(s, worker="beating", lease_s=30)
    detail, listing = f"/v1/tuning-jobs/{job.id}", "/v1/tuning-jobs?status=running"
    first = service.client.get(detail, headers=h)
    assert first.json()["status"] == "running" and first.json()["worker"] == "beating"
    _until_from_memory(service, detail, h)
    listed = service.client.get(listing, headers=h)
    reader, read_again = _reader(service), 0
    for _ in range(10):
        with session_scope(engine) as s:
            assert renew_lease(s, claim, lease_s=60).held
        before = reader.misses
        assert service.client.get(detail, headers=h).content == first.content
        assert service.client.get(listing, headers=h).content == listed.content
        read_again += reader.misses - before
    # All 20 would compute again if a heartbeat were counted, 10 if either read named the
    # lease's expiry. On PostgreSQL other tests' transactions (parallel workers) can make
    # a few do so; on SQLite nobody else writes to the file.
    assert read_again <= (5 if _reader(service)._async_engine is not None else 0), read_again
    with session_scope(engine) as s:
        assert report_progress(s, claim, TuneProgress(3, 7))
    shown = service.client.get(detail, headers=h).json()["progress"]
    assert (shown["trials_done"], shown["trials_total"]) == (3, 7)
    engine.dispose()


def test_sqlite_reads_its_version_once_per_turn_of_the_loop(tmp_path: Path) -> None:
    import asyncio

    import sqlalchemy as sa

    from api.reads import Reader
    from storage.db import read_scope

    url = f"sqlite:///{tmp_path / 'turns.db'}"
    engine, other = make_engine(url), make_engine(url)  # `other`: another process's writes
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (x INTEGER)"))
    pragmas: list[str] = []

    def write(bind) -> None:
        with bind.begin() as conn:
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))

    async def scenario() -> None:
        reader = Reader(engine)
        reader._raw.set_trace_callback(pragmas.append)
        try:
            first = await reader.version()
            write(other)
            # Same turn: the version read when the turn began stands (every request served
            # in it arrived before that read).
            assert await reader.version() == first and len(pragmas) == 1
            await asyncio.sleep(0)  # the next turn: read again, and the commit is seen
            second = await reader.version()
            assert second != first and len(pragmas) == 2
            write(engine)  # this process's own commit drops the turn's version at once
            assert await reader.version() != second and len(pragmas) == 3
            with read_scope(engine) as session:  # a read's end is no commit to see
                session.execute(sa.text("SELECT 1"))
            await reader.version()
            assert len(pragmas) == 3
        finally:
            reader.close()

    asyncio.run(scenario())
    engine.dispose()
    other.dispose()
