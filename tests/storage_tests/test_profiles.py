"""Profile runs and kernel samples: round trip, filters, atomicity, on both back-ends."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

import storage.profiles as profiles
from optimizer.records import DeviceInfo, KernelSample, OpKind
from storage.db import session_scope
from storage.profiles import (
    ProfileRunNotFound,
    count_samples_by_op,
    create_profile_run,
    delete_profile_run,
    get_profile_run,
    list_profile_runs,
    load_samples,
)

CPU = DeviceInfo(kind="cpu", name="AMD EPYC", memory_gb=16.0, torch_version="2.13.0", num_threads=1)
GPU = DeviceInfo(
    kind="cuda",
    name="NVIDIA H100 80GB HBM3",
    memory_gb=85.0,
    compute_capability="9.0",
    driver="550.54.15",
    cuda_version="12.4",
    torch_version="2.13.0",
)


def make_sample(op: OpKind = OpKind.QKV_PROJ, median: float = 1.0, **kw: object) -> KernelSample:
    fields = {"p10_ms": median * 0.9, "p90_ms": median * 1.2, "num_repeats": 5, "model": "tiny"}
    fields.update(kw)
    return KernelSample(op=op, median_ms=median, **fields)  # type: ignore[arg-type]


def varied_samples() -> list[KernelSample]:
    return [
        make_sample(OpKind.QKV_PROJ, 0.125, num_tokens=64, n=384, k=256, dtype="float32"),
        make_sample(OpKind.MLP_UP, 0.5, num_tokens=64, n=768, k=256, tp=2),
        make_sample(
            OpKind.PREFILL_ATTN,
            2.5,
            batch_size=2,
            q_len=128,
            kv_len=640,
            num_heads=8,
            num_kv_heads=2,
            head_dim=32,
            num_tokens=256,
        ),
        make_sample(OpKind.ALL_REDUCE, 0.04, model="", num_gpus=8, message_bytes=3 * 2**31),
        make_sample(OpKind.GEMM, 7e-4, model="", num_tokens=16384, n=2**20, k=8192),
        make_sample(OpKind.QKV_PROJ, 0.25, num_tokens=128, n=384, k=256, model='a,"b"'),
    ]


def test_round_trip_keeps_every_field(engine) -> None:
    samples = varied_samples()
    with session_scope(engine) as s:
        info = create_profile_run(
            s, name="h100 run", source="profiler", accelerator="h100", device=GPU, samples=samples
        )
    assert info.num_samples == len(samples)
    assert info.device == GPU
    assert info.created_at.tzinfo is not None
    with session_scope(engine) as s:
        assert load_samples(s, info.id) == samples
        assert get_profile_run(s, info.id) == info
        assert list_profile_runs(s) == [info]
        assert load_samples(s, info.id, OpKind.QKV_PROJ) == [samples[0], samples[5]]
        assert load_samples(s, info.id, OpKind.DECODE_ATTN) == []
        counts = count_samples_by_op(s, info.id)
    assert counts[OpKind.QKV_PROJ] == (2, 0.125, 0.25)
    assert counts[OpKind.GEMM] == (1, 7e-4, 7e-4)
    assert set(counts) == {s.op for s in samples}


def test_loaded_samples_are_records_not_rows(engine) -> None:
    with session_scope(engine) as s:
        info = create_profile_run(
            s, name="r", source="profiler", accelerator="cpu", device=CPU, samples=[make_sample()]
        )
        (loaded,) = load_samples(s, info.id)
    assert type(loaded) is KernelSample
    assert type(loaded.op) is OpKind
    assert type(loaded.median_ms) is float and type(loaded.tp) is int


def test_many_samples_and_delete(engine) -> None:
    samples = [
        make_sample(OpKind.DECODE_ATTN, 0.01 * (i + 1), batch_size=i % 64 + 1, kv_len=i)
        for i in range(20_000)
    ]
    with session_scope(engine) as s:
        big = create_profile_run(
            s, name="big", source="vidur", accelerator="a100", device=CPU, samples=samples
        )
        small = create_profile_run(
            s, name="small", source="profiler", accelerator="cpu", device=CPU, samples=samples[:3]
        )
    with session_scope(engine) as s:
        assert load_samples(s, big.id) == samples
        delete_profile_run(s, big.id)
    with session_scope(engine) as s:
        assert [r.id for r in list_profile_runs(s)] == [small.id]
        assert load_samples(s, small.id) == samples[:3]
        left = s.execute(sa.text("SELECT count(*) FROM kernel_samples")).scalar_one()
        assert left == 3
        with pytest.raises(ProfileRunNotFound):
            get_profile_run(s, big.id)
        with pytest.raises(ProfileRunNotFound):
            load_samples(s, big.id)
        with pytest.raises(ProfileRunNotFound):
            delete_profile_run(s, big.id)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (make_sample(median=-1.0, p10_ms=-1.0), "median_ms -1.0 is not >= 0"),
        (make_sample(median=1.0, p10_ms=2.0), "p10 <= median <= p90"),
        (make_sample(median=float("nan")), "median_ms nan"),
        (make_sample(tp=0), "tp 0 is outside"),
        (make_sample(batch_size=2**31), "batch_size 2147483648 is outside"),
        (make_sample(num_tokens=1.5), "num_tokens 1.5 is not an int"),
        (make_sample(op="matmul"), "op 'matmul' is not one of"),
        (make_sample(dtype="x" * 40), "dtype must be a string of at most 32"),
    ],
)
def test_bad_sample_is_named_and_nothing_is_stored(engine, bad: KernelSample, message: str) -> None:
    samples = [make_sample(), bad]
    with pytest.raises(ValueError, match=r"sample 1\b") as err, session_scope(engine) as s:
        create_profile_run(
            s, name="bad", source="profiler", accelerator="cpu", device=CPU, samples=samples
        )
    assert message in str(err.value)
    with session_scope(engine) as s:
        assert list_profile_runs(s) == []


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"name": " "}, "name must be a non-empty string"),
        ({"source": "x" * 33}, "source is 33 characters"),
        ({"samples": []}, "at least one kernel sample"),
        ({"device": {"kind": "cpu"}}, "device must be a DeviceInfo"),
    ],
)
def test_bad_run_fields_are_rejected(engine, kw: dict, message: str) -> None:
    args = {
        "name": "r",
        "source": "profiler",
        "accelerator": "cpu",
        "device": CPU,
        "samples": [make_sample()],
    }
    args.update(kw)
    with pytest.raises(ValueError, match=message), session_scope(engine) as s:
        create_profile_run(s, **args)


def test_failure_during_bulk_insert_leaves_no_run(engine, monkeypatch) -> None:
    def broken(session, run_id, cols) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(profiles, "_bulk_insert", broken)
    with pytest.raises(RuntimeError, match="disk full"), session_scope(engine) as s:
        create_profile_run(
            s, name="r", source="profiler", accelerator="cpu", device=CPU, samples=[make_sample()]
        )
    with session_scope(engine) as s:
        assert list_profile_runs(s) == []


def test_failing_insert_in_the_database_rolls_back(engine) -> None:
    # Two samples with the same (run_id, seq) cannot exist: force a constraint failure
    # inside the bulk insert by inserting the rows twice.
    original = profiles._bulk_insert

    def twice(session, run_id, cols) -> None:
        original(session, run_id, cols)
        original(session, run_id, cols)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(profiles, "_bulk_insert", twice)
        with pytest.raises(Exception) as err, session_scope(engine) as s:
            create_profile_run(
                s, name="r", source="x", accelerator="cpu", device=CPU, samples=[make_sample()]
            )
    assert "unique" in str(err.value).lower() or "duplicate" in str(err.value).lower()
    with session_scope(engine) as s:
        assert list_profile_runs(s) == []
        assert s.execute(sa.text("SELECT count(*) FROM kernel_samples")).scalar_one() == 0


def test_device_json_round_trip_and_version_check() -> None:
    data = profiles.device_to_json(GPU)
    assert data["schema_version"] == profiles.DEVICE_SCHEMA_VERSION
    assert profiles.device_from_json(data) == GPU
    with pytest.raises(ValueError, match="schema_version"):
        profiles.device_from_json({**dataclasses.asdict(GPU), "schema_version": 99})
