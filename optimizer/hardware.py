"""Accelerator specs: the vendor figures a roofline estimate and KV sizing need.

Presets hold vendor peak figures (DOMAIN.md §3); users describe any other part
in a small YAML or JSON spec file (`load_accelerator`). Real kernels reach a
fraction of these peaks, which is why measured profiles take precedence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

GB = 1e9


class HardwareError(ValueError):
    """An accelerator name or spec file is invalid."""


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One GPU (or other accelerator) as the cost model sees it."""

    name: str
    bf16_tflops: float  # dense peak, TFLOP/s
    hbm_gb: float  # memory capacity, GB (1e9 bytes)
    hbm_tb_s: float  # memory bandwidth, TB/s
    link_gb_s: float = 450.0  # intra-node link per direction (NVLink), GB/s
    price_per_hour: float | None = None  # optional USD per GPU-hour

    def __post_init__(self) -> None:
        for f in ("bf16_tflops", "hbm_gb", "hbm_tb_s", "link_gb_s"):
            value = getattr(self, f)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise HardwareError(f"{self.name}: {f} must be a positive number, got {value!r}")

    @property
    def flops_per_s(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * GB

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_s * 1e12

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from bandwidth- to compute-bound."""
        return self.flops_per_s / self.hbm_bytes_per_s


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator("a100", 312.0, 80.0, 2.0, 300.0),
        Accelerator("h100", 989.0, 80.0, 3.35, 450.0),
        Accelerator("h200", 989.0, 141.0, 4.8, 450.0),
        Accelerator("b200", 2250.0, 180.0, 8.0, 900.0),
        Accelerator("l40s", 362.0, 48.0, 0.864, 32.0),
        # The CPU this project profiles on in CI; figures are rough, for tiny shapes only.
        Accelerator("cpu", 0.2, 16.0, 0.02, 10.0),
    )
}

_ALIASES = {
    "a100_sxm": "a100",
    "a100-sxm": "a100",
    "h100_sxm": "h100",
    "h100-sxm": "h100",
    "h200_sxm": "h200",
    "h200-sxm": "h200",
}


def get_accelerator(name: str) -> Accelerator:
    """A preset by name (case-insensitive; `h100_sxm` etc. accepted) or a spec file path."""
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key in ACCELERATORS:
        return ACCELERATORS[key]
    path = Path(name)
    if path.suffix in (".yaml", ".yml", ".json") and path.exists():
        return load_accelerator(path)
    raise HardwareError(
        f"unknown accelerator {name!r}: expected one of {sorted(ACCELERATORS)} "
        "or a path to a .yaml/.json spec file"
    )


def load_accelerator(path: str | Path) -> Accelerator:
    """Read a spec file: name, bf16_tflops, hbm_gb, hbm_tb_s [, link_gb_s, price_per_hour]."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        raise HardwareError(f"{path}: cannot parse accelerator spec: {exc}") from exc
    if not isinstance(data, dict):
        raise HardwareError(f"{path}: expected a mapping of spec fields")
    known = {f.name for f in fields(Accelerator)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise HardwareError(f"{path}: unknown keys {unknown}; expected some of {sorted(known)}")
    missing = sorted({"bf16_tflops", "hbm_gb", "hbm_tb_s"} - set(data))
    if missing:
        raise HardwareError(f"{path}: missing keys {missing}")
    data.setdefault("name", path.stem)
    return Accelerator(**data)
