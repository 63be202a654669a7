"""Latency model accuracy and speed on real GPU tables (issue 3, "Accuracy and speed").

    .venv/bin/python benchmarks/bench_latency_model.py [--cpu] [--data ../shared/data]

Prints, per table and operator: median and p90 absolute percentage error on a
random 20% hold-out and on an extrapolation hold-out (largest 10% of token
counts withheld); the fit time of each GPU's tables; compiled lookups per
second (batch) and per scalar call; the decode floor check (weight bytes / HBM
bandwidth, DOMAIN.md §1) for Llama-3.1-8B on H100/H200. With --cpu it also
profiles the tiny shape on this CPU (about a minute) and checks per-op
hold-out error and composed predictions of measured mixed iterations.
Targets: median <= 5%, p90 <= 15% (random); median <= 10% (extrapolation);
fit <= 60 s; >= 1M lookups/s; CPU ops <= 10% median; mixed <= 15% median.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from optimizer.latency import StepLoad, build_catalog, fit_latency_model
from optimizer.latency.compose import Pricing, fit_overhead_s, iteration_ms
from optimizer.latency.features import token_count
from optimizer.latency.model import FitOptions, fit_op_model, group_samples
from optimizer.latency.roofline import RooflinePricer, decode_floor_s
from profiler.hardware import get_accelerator
from profiler.importers import ImportFormat, import_profile
from profiler.shapes import get_shape
from storage.records import KernelSample, OpKind

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return np.abs(pred / true - 1.0) * 100.0


def _flag(ok: bool) -> str:
    return "ok" if ok else "MISS"


def accuracy_table(name: str, samples: list[KernelSample], target_med: float = 5.0) -> bool:
    rng = np.random.default_rng(0)
    options = FitOptions()
    print(f"\n{name}")
    print(
        f"{'op':15s}{'rows':>7s} | {'rand med':>8s} {'p90':>7s} | {'extrap med':>10s} {'p90':>7s}"
    )
    all_ok = True
    for op, (batch, t) in group_samples(samples).items():
        idx = rng.permutation(len(batch))
        cut = int(0.8 * idx.size)
        model = fit_op_model(batch.take(idx[:cut]), t[idx[:cut]], options)
        rand = _ape(model.predict_ms(batch.take(idx[cut:])), t[idx[cut:]])
        tok = token_count(batch)
        far = tok > np.quantile(tok, 0.9)
        if not far.any():
            far = tok >= np.quantile(tok, 0.9)
        model = fit_op_model(batch.take(np.flatnonzero(~far)), t[~far], options)
        ext = _ape(model.predict_ms(batch.take(np.flatnonzero(far))), t[far])
        ok = (
            np.median(rand) <= target_med
            and np.percentile(rand, 90) <= 15.0
            and np.median(ext) <= 10.0
        )
        all_ok &= bool(ok)
        rand_txt = f"{np.median(rand):7.2f}% {np.percentile(rand, 90):6.2f}%"
        ext_txt = f"{np.median(ext):9.2f}% {np.percentile(ext, 90):6.2f}%"
        print(f"{op.value:15s}{len(batch):7d} | {rand_txt} | {ext_txt}  {_flag(bool(ok))}")
    return all_ok


def speed_and_floor(models: dict[str, object]) -> None:
    shape = get_shape("llama-3.1-8b")
    rng = np.random.default_rng(0)
    n = 1_000_000
    for acc_name, model in models.items():
        t0 = time.perf_counter()
        catalog = build_catalog(shape, [model], tps=(1,))
        compile_s = time.perf_counter() - t0
        table = catalog.for_instance(acc_name, 1)
        args = (
            rng.integers(1, 8192, n),
            rng.integers(1, 256, n),
            rng.integers(0, 256, n),
            rng.integers(0, 256 * 4000, n),
            rng.integers(0, 2048, n),
            rng.integers(0, 8192, n),
        )
        t0 = time.perf_counter()
        table.step_times_s(*args)
        rate = n / (time.perf_counter() - t0)
        load = StepLoad(544, 33, (512,), (4096,), 32, 32 * 3000)
        t0 = time.perf_counter()
        for _ in range(100_000):
            table.step_time_s(load)
        scalar_us = (time.perf_counter() - t0) / 100_000 * 1e6
        acc = get_accelerator(acc_name)
        floor = decode_floor_s(shape, acc)
        worst = min(
            table.step_time_s(StepLoad(b, b, (), (), b, b * kv)) / floor
            for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
            for kv in (1, 16, 128, 1024, 8192, 32768)
        )
        print(
            f"{shape.name} on {acc_name} TP1: compile {compile_s:.2f} s, batch "
            f"{rate / 1e6:.2f}M lookups/s ({_flag(rate >= 1e6)}), scalar {scalar_us:.2f} us/step, "
            f"decode min prediction / floor ({floor * 1e3:.2f} ms) = {worst:.3f} "
            f"({_flag(worst >= 1.0)}); batch-1 decode at 1k KV = "
            f"{table.step_time_s(StepLoad(1, 1, (), (), 1, 1000)) * 1e3:.2f} ms"
        )


def _mixed_load(s: KernelSample) -> StepLoad:
    chunk, decodes = s.q_len, s.batch_size
    return StepLoad(
        num_tokens=chunk + decodes,
        num_logits=decodes + (1 if chunk else 0),
        prefill_q=(chunk,) if chunk else (),
        prefill_kv=(chunk,) if chunk else (),
        num_decode_seqs=decodes,
        decode_kv_tokens=decodes * s.kv_len,
    )


def cpu_check() -> None:
    from profiler.sweep import default_cpu_grid, run_sweep

    shape = get_shape("tiny")
    t0 = time.perf_counter()
    samples = run_sweep(shape, default_cpu_grid(), "cpu")
    took = time.perf_counter() - t0
    print(f"\nown CPU profile of {shape.name}: {len(samples)} samples in {took:.0f} s")
    accuracy_table("CPU per-op hold-out (target median <= 10%)", samples, target_med=10.0)
    mixed = [s for s in samples if s.op is OpKind.MIXED_ITERATION]
    model = fit_latency_model(samples, accelerator="cpu", source="profiler")
    pricing = Pricing(shape, 1, RooflinePricer(get_accelerator("cpu")), model)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(mixed))
    fit_idx, test_idx = idx[: len(idx) // 2], idx[len(idx) // 2 :]
    loads = [_mixed_load(s) for s in mixed]
    overhead = fit_overhead_s(
        pricing, [loads[i] for i in fit_idx], [mixed[i].median_ms / 1e3 for i in fit_idx]
    )
    pred = np.array([iteration_ms(pricing, loads[i], overhead) for i in test_idx])
    true = np.array([mixed[i].median_ms for i in test_idx])
    ape = _ape(pred, true)
    print(
        f"mixed iterations: overhead fitted on {fit_idx.size}, tested on {test_idx.size}: "
        f"{overhead * 1e3:.3f} ms; composed median APE {np.median(ape):.2f}%, p90 "
        f"{np.percentile(ape, 90):.2f}% ({_flag(np.median(ape) <= 15.0)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--cpu", action="store_true", help="also profile the tiny shape on CPU")
    args = parser.parse_args()
    aic = args.data / "profiles" / "aiconfigurator"
    models = {}
    for gpu in ("h100_sxm", "h200_sxm"):
        profile = import_profile(aic / gpu, ImportFormat.AICONFIGURATOR)
        accuracy_table(f"AIConfigurator {gpu} (vLLM tables)", profile.samples)
        t0 = time.perf_counter()
        models[profile.accelerator] = fit_latency_model(
            profile.samples, accelerator=profile.accelerator, source=profile.source
        )
        fit_s = time.perf_counter() - t0
        print(f"fit of all {gpu} tables: {fit_s:.1f} s ({_flag(fit_s <= 60)})")
    vidur = args.data / "profiles" / "vidur" / "compute" / "h100" / "meta-llama" / "Llama-2-7b-hf"
    profile = import_profile(vidur, ImportFormat.VIDUR)
    accuracy_table("Vidur H100 Llama-2-7B (mlp.csv)", profile.samples)
    t0 = time.perf_counter()
    fit_latency_model(profile.samples, accelerator="h100", source="vidur")
    print(f"fit of the Vidur H100 Llama-2-7B table: {time.perf_counter() - t0:.1f} s")
    print()
    speed_and_floor(models)
    if args.cpu:
        cpu_check()


if __name__ == "__main__":
    main()
