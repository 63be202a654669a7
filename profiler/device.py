"""Which device a profile runs on, and the metadata recorded with it.

`parse_device("cpu" | "cuda" | "cuda:N")` validates a device string;
`describe_device` fills a `optimizer.records.DeviceInfo` (GPU name, memory,
compute capability, driver, CUDA and torch versions; or CPU model and thread
count); `accelerator_name` maps it to a `optimizer.hardware` preset name.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from optimizer.records import DeviceInfo

if TYPE_CHECKING:
    import torch

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")

# GPU name fragments -> optimizer.hardware preset names, most specific first.
_GPU_PRESETS = (  # first match wins: "NVIDIA GB200" holds "b200", "NVIDIA GH200" "h200"
    ("gb200", "gb200"),
    ("gb300", "gb300"),
    ("gh200", "gh200"),
    ("rtx pro 6000", "rtx-pro-6000"),
    ("h200", "h200"),
    ("h100", "h100"),
    ("a100", "a100"),
    ("b300", "b300"),
    ("b200", "b200"),
    ("l40s", "l40s"),
)


class DeviceError(ValueError):
    """A device string is malformed or names a device that is not present."""


def parse_device(spec: str) -> torch.device:
    """`cpu`, `cuda` or `cuda:N` -> torch.device; CUDA must be available and N in range."""
    import torch

    match = _DEVICE_RE.match(spec.strip().lower())
    if match is None:
        raise DeviceError(f"device {spec!r} is not understood; expected cpu, cuda or cuda:N")
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index is not None:
            raise DeviceError(f"device {spec!r}: the CPU takes no index; use cpu")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError(f"device {spec!r}: CUDA is not available to this torch build")
    idx = int(index or 0)
    count = torch.cuda.device_count()
    if idx >= count:
        raise DeviceError(f"device {spec!r}: only {count} CUDA device(s) present")
    return torch.device("cuda", idx)


def describe_device(device: torch.device, num_threads: int | None = None) -> DeviceInfo:
    """Metadata of a torch.device; `num_threads` is the CPU thread count used for timing."""
    import torch

    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        return DeviceInfo(
            kind="cuda",
            name=props.name,
            memory_gb=round(props.total_memory / 1e9, 2),
            compute_capability=f"{props.major}.{props.minor}",
            driver=_nvidia_driver(idx),
            cuda_version=torch.version.cuda,
            torch_version=torch.__version__,
            num_threads=num_threads,
        )
    return DeviceInfo(
        kind="cpu",
        name=cpu_model(),
        memory_gb=_host_memory_gb(),
        torch_version=torch.__version__,
        num_threads=num_threads if num_threads is not None else torch.get_num_threads(),
    )


def accelerator_name(device: DeviceInfo) -> str:
    """The `optimizer.hardware` preset a device corresponds to ("cpu", "h100", ...).

    Unknown GPUs get their lower-cased name with spaces as dashes.
    """
    if device.kind == "cpu":
        return "cpu"
    lowered = device.name.lower()
    for fragment, preset in _GPU_PRESETS:
        if fragment in lowered:
            return preset
    return re.sub(r"\s+", "-", lowered.strip())


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _host_memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 2)
    except (ValueError, OSError, AttributeError):
        return None


def _nvidia_driver(index: int) -> str | None:
    """The NVIDIA driver version (e.g. "550.54.15") via NVML or nvidia-smi, if reachable."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader", "-i", str(index)],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
