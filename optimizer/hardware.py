"""Accelerator specs: the vendor figures a roofline estimate and KV sizing need.

Presets hold vendor peak figures (DOMAIN.md §3) and the memory the device
reports (`torch.cuda.mem_get_info`'s total, which vLLM logs as
`total_gpu_memory`: an "80 GB" H100 reports 79.2 GiB); users describe any other
part in a small YAML or JSON spec file (`load_accelerator`), stating its memory
in GiB (`memory_gib`) or bytes (`memory_bytes`), never an ambiguous "GB". Real
kernels reach a fraction of the peaks, which is why measured profiles take
precedence. `chip` names the part whose measured latency model prices this one
(an A100 40 GB is an A100's chip with less memory).

The parts NVIDIA's aiconfigurator-core measures transcribe its `systems/<system>.yaml`
(peaks, bandwidths, SM version, GPUs per host and per NVLink domain; the map is
`profiler.importers.aiconfigurator_package.SYSTEMS`, and a test holds each preset to its
YAML where the package is installed). Each has its own tables there, so each is its own
`family` (a GB200 is not priced as a B200).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

GIB = 1024**3


class HardwareError(ValueError):
    """An accelerator name or spec file is invalid."""


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One GPU (or other accelerator) as the cost model sees it."""

    name: str
    bf16_tflops: float  # dense peak, TFLOP/s
    # dense FP8 peak, TFLOP/s; None: no FP8 tensor cores (FP8 weights run weight-only)
    fp8_tflops: float | None = field(default=None, kw_only=True)
    # dense FP4 (NVFP4) peak, TFLOP/s; None: no FP4 tensor cores (Blackwell has them)
    fp4_tflops: float | None = field(default=None, kw_only=True)
    memory_gib: float  # what the device reports (GiB, 2^30 bytes)
    hbm_tb_s: float  # memory bandwidth, TB/s
    link_gb_s: float = 450.0  # intra-node link per direction (NVLink), GB/s
    price_per_hour: float | None = None  # optional USD per GPU-hour
    chip: str | None = field(default=None, kw_only=True)  # whose latency model prices it
    # CUDA compute capability ("8.0" A100, "9.0" Hopper, "10.0" B200); None: not a CUDA GPU
    # or not stated (weight-only INT4/MXFP4 kernels need 8.0, `optimizer.config_parts`)
    compute_capability: str | None = field(default=None, kw_only=True)
    # GPUs in one host (its CUDA_VISIBLE_DEVICES range): where one server's commands run
    num_gpus_per_node: int = field(default=8, kw_only=True)
    # GPUs that reach one another at `link_gb_s`: the node, or a rack-wide NVLink domain
    # (GB200/GB300 NVL72: 72 GPUs over NVSwitch, 4 per host); at least num_gpus_per_node
    num_gpus_per_domain: int = field(default=8, kw_only=True)

    def __post_init__(self) -> None:
        for f in ("bf16_tflops", "memory_gib", "hbm_tb_s", "link_gb_s"):
            value = getattr(self, f)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise HardwareError(f"{self.name}: {f} must be a positive number, got {value!r}")
        for f in ("fp8_tflops", "fp4_tflops"):
            value = getattr(self, f)
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0
            ):
                raise HardwareError(f"{self.name}: {f} must be a positive number, got {value!r}")
        for f in ("num_gpus_per_node", "num_gpus_per_domain"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise HardwareError(f"{self.name}: {f} must be an int >= 1, got {value!r}")
        if self.num_gpus_per_domain < self.num_gpus_per_node:
            raise HardwareError(
                f"{self.name}: num_gpus_per_domain ({self.num_gpus_per_domain}) is smaller "
                f"than num_gpus_per_node ({self.num_gpus_per_node})"
            )
        cc = self.compute_capability
        if cc is not None and not _is_capability(cc):
            raise HardwareError(
                f"{self.name}: compute_capability must be a string such as '9.0', got {cc!r}"
            )

    @property
    def capability(self) -> tuple[int, int] | None:
        """(major, minor) of `compute_capability`, None when not stated."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def family(self) -> str:
        """The preset whose measured latency model prices this part (itself by default)."""
        return self.chip or self.name

    @property
    def flops_per_s(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def hbm_bytes(self) -> float:
        """Device memory in bytes, as the device reports it."""
        return self.memory_gib * GIB

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_s * 1e12

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from bandwidth- to compute-bound."""
        return self.flops_per_s / self.hbm_bytes_per_s


def _is_capability(value: object) -> bool:
    if not isinstance(value, str):
        return False
    parts = value.split(".")
    return len(parts) == 2 and all(p.isdigit() for p in parts)


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        # memory_gib: the device-reported totals vLLM logs (H100 79.19-79.22 GiB) or, where
        # no log was at hand, the nvidia-smi total less the same ~1.4% the H100 shows.
        Accelerator("a100", 312.0, 79.15, 2.0, 300.0, compute_capability="8.0"),
        Accelerator("a100-40gb", 312.0, 39.39, 1.555, 300.0, chip="a100", compute_capability="8.0"),
        Accelerator("h100", 989.0, 79.2, 3.35, 450.0, fp8_tflops=1979.0, compute_capability="9.0"),
        Accelerator("h200", 989.0, 139.8, 4.8, 450.0, fp8_tflops=1979.0, compute_capability="9.0"),
        # GH200: an H100 GPU with 96 GB of HBM3 at 4 TB/s (priced with the H100's model)
        Accelerator(
            "gh200",
            989.0,
            94.5,
            4.0,
            450.0,
            fp8_tflops=1979.0,
            chip="h100",
            compute_capability="9.0",
        ),
        # FP4: the dense fp4_tc_flops of AIConfigurator's b200_sxm / b300_sxm system files
        # (9 and 14 PFLOP/s; data/profiles/aiconfigurator/{b200,b300}_sxm/*.yaml).
        Accelerator(
            "b200",
            2250.0,
            178.4,
            8.0,
            900.0,
            fp8_tflops=4500.0,
            fp4_tflops=9000.0,
            compute_capability="10.0",
        ),
        # B300 (Blackwell Ultra): nvidia-smi reports 275,040 MiB; less the ~0.9% the B200 shows.
        Accelerator(
            "b300",
            2250.0,
            266.2,
            8.0,
            900.0,
            fp8_tflops=4500.0,
            fp4_tflops=14000.0,
            compute_capability="10.3",
        ),
        # GB200 / GB300: the Grace-coupled Blackwell GPUs of an NVL72 rack (AIConfigurator's
        # gb200.yaml / gb300.yaml): 4 GPUs per host, 72 in one NVLink domain (its
        # num_gpus_per_rack, reached at the same 900 GB/s as within a host). Memory: the
        # YAML's nvidia-smi totals (189,471 and 284,208 MiB) less the ~0.9% the B200 shows.
        Accelerator(
            "gb200",
            2500.0,
            183.4,
            8.0,
            900.0,
            fp8_tflops=5000.0,
            fp4_tflops=10000.0,
            compute_capability="10.0",
            num_gpus_per_node=4,
            num_gpus_per_domain=72,
        ),
        Accelerator(
            "gb300",
            2500.0,
            275.0,
            8.0,
            900.0,
            fp8_tflops=5000.0,
            fp4_tflops=15000.0,
            compute_capability="10.3",
            num_gpus_per_node=4,
            num_gpus_per_domain=72,
        ),
        # l40s.yaml: 46,068 MiB (nvidia-smi) less the ~1.4% above; PCIe 4.0 between GPUs.
        Accelerator("l40s", 362.05, 44.4, 0.864, 32.0, fp8_tflops=733.0, compute_capability="8.9"),
        # RTX PRO 6000 Blackwell Server Edition (rtx_pro_6000_server.yaml: dense peaks scaled
        # to its 2,430 MHz SM clock; GDDR7; PCIe Gen5 x16 between GPUs, no NVLink). Memory:
        # 97,887 MiB (nvidia-smi) less the ~0.9% the B200 shows.
        Accelerator(
            "rtx-pro-6000",
            467.8,
            94.7,
            1.792,
            64.0,
            fp8_tflops=935.6,
            fp4_tflops=1871.2,
            compute_capability="12.0",
        ),
        # Intel Arc Pro B60 (b60.yaml), not a CUDA GPU. No FP8 matrix compute: the YAML's
        # fp8 figure is its bf16 one ("falls back to BF16"), so fp8_tflops stays None (FP8
        # weights run weight-only, as on an A100). Memory: the YAML's 24 GiB less the same
        # ~0.9% (no device-reported total was at hand). PCIe 5.0 x8 between cards.
        Accelerator("b60", 98.304, 23.8, 0.456, 28.4),
        # The CPU this project profiles on in CI; figures are rough, for tiny shapes only.
        # Their weights (tens of MB) stay in the last-level cache, so the bandwidth is the
        # cache's, bounded high: the decode floor must hold on any host (DRAM's 0.02 TB/s
        # was beaten by a measured profile on a CPU whose L3 streams 39 GB/s to one core).
        Accelerator("cpu", 0.2, 16.0, 0.1, 10.0),
    )
}

_ALIASES = {
    "a100_sxm": "a100",
    "a100-sxm": "a100",
    "h100_sxm": "h100",
    "h100-sxm": "h100",
    "h200_sxm": "h200",
    "h200-sxm": "h200",
    "a100-80gb": "a100",
    "a100_40gb": "a100-40gb",
    "a100-sxm4-40gb": "a100-40gb",
    "rtx_pro_6000_server": "rtx-pro-6000",
    "rtx_pro_6000": "rtx-pro-6000",
    "rtx-pro-6000-server": "rtx-pro-6000",
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
    """Read a spec file: name, bf16_tflops, memory_gib or memory_bytes, hbm_tb_s
    [, fp8_tflops, fp4_tflops, compute_capability, link_gb_s, price_per_hour, chip,
    num_gpus_per_node, num_gpus_per_domain]."""
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
    if "hbm_gb" in data:
        raise HardwareError(
            f"{path}: hbm_gb is ambiguous (an '80 GB' GPU has 80 GiB); give memory_gib "
            "(what the device reports, e.g. 79.2 for an H100) or memory_bytes"
        )
    if "memory_bytes" in data:
        if "memory_gib" in data:
            raise HardwareError(f"{path}: give memory_gib or memory_bytes, not both")
        value = data.pop("memory_bytes")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise HardwareError(f"{path}: memory_bytes must be a positive number, got {value!r}")
        data["memory_gib"] = value / GIB
    known = {f.name for f in fields(Accelerator)} | {"memory_bytes"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise HardwareError(f"{path}: unknown keys {unknown}; expected some of {sorted(known)}")
    missing = sorted({"bf16_tflops", "memory_gib", "hbm_tb_s"} - set(data))
    if missing:
        raise HardwareError(
            f"{path}: missing keys {missing} (memory as memory_gib or memory_bytes)"
        )
    data.setdefault("name", path.stem)
    cc = data.get("compute_capability")
    if isinstance(cc, (int, float)) and not isinstance(cc, bool):  # YAML reads 9.0 as a float
        data["compute_capability"] = f"{cc:.1f}"
    try:
        return Accelerator(**data)
    except TypeError as exc:
        raise HardwareError(f"{path}: {exc}") from exc
