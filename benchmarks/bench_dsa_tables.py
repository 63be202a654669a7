"""DeepSeek sparse attention decoding, measured against the estimate (issue 45): for the
DSA presets (DeepSeek-V3.2, GLM-5) at TP 8 on H100, B200 and B300, one layer's decode of
b sequences at KV length kv priced by the installed aiconfigurator-core's vLLM DSA
decode block (`dsa_decode` / `dsa_decode_fp8kv`, fitted as `servetune profile import`
fits them) and by the estimate (`optimizer.latency.dsa`: sparse MLA attention and the
indexer by the roofline, plus the block's projections, here by the roofline too as no
GEMM table is fitted). The docs/moe.md table is this script's output. Usage:

    .venv/bin/python benchmarks/bench_dsa_tables.py
"""

from __future__ import annotations

import numpy as np

from optimizer.hardware import get_accelerator
from optimizer.latency import dsa
from optimizer.latency.compose import Pricing
from optimizer.latency.fit import fit_latency_model
from optimizer.latency.model import LatencyModel
from optimizer.latency.roofline import RooflinePricer
from optimizer.shapes import get_shape
from profiler.importers.aiconfigurator_dsa import dsa_samples
from profiler.importers.aiconfigurator_package import locate_package

GPUS = {"h100": "h100_sxm", "b200": "b200_sxm", "b300": "b300_sxm"}
PRESETS = ("deepseek-v3.2", "glm-5")
TP = 8
CASES = ((1.0, 4096.0), (32.0, 4096.0), (256.0, 4096.0), (32.0, 65536.0))


def fitted(gpu: str) -> LatencyModel:
    """The DSA decode ops of one GPU folder of the installed package, fitted."""
    samples = dsa_samples(locate_package().folder(GPUS[gpu]))
    return fit_latency_model(samples, accelerator=gpu, source="aic")


def layer_ms(pricing: Pricing, b: float, kv: float) -> float:
    """One layer's decode of b sequences at KV kv, with the layer's projections."""
    full = pricing.shape.num_full_attention_layers
    per = float(pricing.decode_attn_ms(np.array([b]), np.array([kv]))[0]) / full
    if dsa.decode_block(pricing) is None:  # layer_ms holds the projections: add them
        per += float(pricing.dsa_projections_ms(np.array([b]))[0])
    return per


def main() -> None:
    models = {gpu: fitted(gpu) for gpu in GPUS}
    head = " | ".join(f"{gpu.upper()} measured / estimate" for gpu in GPUS)
    print(f"| preset, tp {TP} | b | kv | {head} |")
    print("|---|---:|---:|" + "---:|" * len(GPUS))
    for name in PRESETS:
        shape = get_shape(name)
        for b, kv in CASES:
            cells = []
            for gpu, model in models.items():
                roofline = RooflinePricer(get_accelerator(gpu))
                measured = Pricing(shape, TP, roofline, model)
                assert dsa.decode_block(measured) is not None, (name, gpu)
                meas = layer_ms(measured, b, kv)
                est = layer_ms(Pricing(shape, TP, roofline), b, kv)
                cells.append(f"{1e3 * meas:.0f} / {1e3 * est:.0f} = {meas / est:.2f}")
            print(
                f"| {name} ({shape.quantization}) | {b:.0f} | {kv:.0f} | "
                + " | ".join(cells)
                + " |"
            )


if __name__ == "__main__":
    main()
