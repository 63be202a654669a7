"""Gated DeltaNet core, measured against the published-rate estimate (issue 45): for the
Qwen3.5 / 3.6 GDN presets on H100, B200 and B300, one layer's core (`optimizer.latency.gdn`)
priced by the installed aiconfigurator-core's vLLM GDN tables (`gdn_prefill` /
`gdn_decode`, fitted as `servetune profile import` fits them) and by the estimate alone
(no learned model), per prefill chunk and per decode batch. The docs/moe.md table is this
script's output. Usage:

    .venv/bin/python benchmarks/bench_gdn_tables.py [--engine vllm|sglang]

Rows: the preset at TP `tp` (per-rank key / value heads), the phase and size (a chunk of
q prompt tokens of one sequence; b decoding sequences); per GPU both prices in
microseconds a layer and measured / estimate. The measured prefill includes what the
table does not hold (the q/k/v copies and the state's gather and scatter by their bytes,
and their kernels' launches: `gdn.UNMEASURED_KERNELS`); in brackets the table's own
kernels alone (conv1d + delta rule), as fitted.
"""

from __future__ import annotations

import argparse

import numpy as np

from optimizer.hardware import get_accelerator
from optimizer.latency import gdn
from optimizer.latency.compose import Pricing
from optimizer.latency.fit import fit_latency_model
from optimizer.latency.model import LatencyModel
from optimizer.latency.roofline import RooflinePricer
from optimizer.records import OpKind
from optimizer.shapes import get_shape
from profiler.importers.aiconfigurator_gdn import gdn_samples
from profiler.importers.aiconfigurator_package import locate_package

GPUS = {"h100": "h100_sxm", "b200": "b200_sxm", "b300": "b300_sxm"}
CASES = (("qwen3.5-27b", 4), ("qwen3.6-35b-a3b", 2), ("qwen3.5-397b-a17b", 8))
CHUNKS = (256.0, 2048.0, 8192.0)
BATCHES = (1.0, 32.0, 256.0)


def fitted(gpu: str, engine: str) -> LatencyModel:
    """The GDN ops of one GPU folder of the installed package, fitted."""
    folder = locate_package().folder(GPUS[gpu])
    return fit_latency_model(gdn_samples(folder, engine), accelerator=gpu, source="aic")


def rows(gpu: str, model: LatencyModel) -> list[tuple]:
    """(case, phase, size, measured us, estimate us, core us) per case of this GPU."""
    out = []
    for name, tp in CASES:
        shape = get_shape(name)
        roofline = RooflinePricer(get_accelerator(gpu))
        measured, estimate = Pricing(shape, tp, roofline, model), Pricing(shape, tp, roofline)
        beyond = ("gdn_prefill:beyond_32768", "gdn_decode:beyond_1024", "gdn_state:float32")
        assert gdn.estimated(measured) == beyond
        hk, hv, _, _ = gdn.rank_heads(measured)
        case = f"{name} tp{tp} ({hk:.0f}/{hv:.0f})"
        q, b = np.array(CHUNKS), np.array(BATCHES)
        prefill = gdn.chunk_ms(measured, q), gdn.chunk_ms(estimate, q)
        core = gdn.measured_core_ms(measured, gdn.covering(measured, OpKind.GDN_PREFILL)[0], 1.0, q)
        decode = gdn.decode_ms(measured, b), gdn.decode_ms(estimate, b)
        for i, size in enumerate(CHUNKS):
            out.append((case, "prefill q", size, prefill[0][i], prefill[1][i], core[i]))
        for i, size in enumerate(BATCHES):
            out.append((case, "decode b", size, decode[0][i], decode[1][i], decode[0][i]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", default="vllm", choices=("vllm", "sglang"))
    args = parser.parse_args()
    per_gpu = {gpu: rows(gpu, fitted(gpu, args.engine)) for gpu in GPUS}
    head = " | ".join(f"{gpu.upper()} measured (core) / estimate" for gpu in GPUS)
    print(f"| preset, tp (key/value heads a rank) | phase | size | {head} |")
    print("|---|---|---:|" + "---:|" * len(GPUS))
    for i, (case, phase, size, *_) in enumerate(per_gpu["h100"]):
        cells = []
        for gpu in GPUS:
            _, _, _, meas, est, core = per_gpu[gpu][i]
            core_part = f" ({1e3 * core:.1f})" if phase.startswith("prefill") else ""
            cells.append(f"{1e3 * meas:.1f}{core_part} / {1e3 * est:.1f} = {meas / est:.2f}")
        print(f"| {case} | {phase} | {size:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
