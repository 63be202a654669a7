"""AIConfigurator's tables as the `aiconfigurator-core` wheel ships them (the `aic` extra).

The installed package is found without being imported: `importlib.util.find_spec`
names its folder and `importlib.metadata` its version; none of its code runs. Layout
read (aiconfigurator-core 0.12.0):

  aiconfigurator_core/systems/<system>.yaml                         system spec
  aiconfigurator_core/systems/data/<system>/<op>/<engine>/<ver>/    tables, as in the
                                    shared copy's <system>/ folders (`aiconfigurator`)

Never read: `systems/silicon_sample.csv` (end-to-end serving measurements, servetune's
external check; `_common.NEVER_READ` refuses it by name wherever it lies).

servetune accelerators map onto systems by SYSTEMS (each preset's figures transcribe its
system's YAML: `optimizer.hardware`); a system without a servetune preset (h100_pcie, a30,
l4, a100_pcie: folders without tables in 0.12.0) is not imported. Engines per system in
0.12.0 (GEMM and attention tables): vLLM, SGLang and TensorRT-LLM for every mapped
system but b60 (Intel Arc Pro B60), which holds vLLM's only. b60 has no comm/nccl
tables: its collectives were measured with oneCCL (`comm/oneccl`, not read), so its
NCCL-style collectives are priced by the roofline (`notes` says so); its vLLM all-reduce
(`comm/vllm`, eager) is read.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from optimizer.hardware import HardwareError, get_accelerator
from profiler.importers._common import ImportedProfile, ProfileImportError
from profiler.importers.aiconfigurator import ENGINES, import_aiconfigurator

PACKAGE = "aiconfigurator_core"  # the import name, located but never imported
DISTRIBUTION = "aiconfigurator-core"
INSTALL_HINT = "pip install 'servetune[aic]'"
ALL = "all"

# servetune accelerator preset -> the package's system folder. The package's other
# systems (h100_pcie, a30, l4, a100_pcie) hold no tables in 0.12.0 and have no preset.
SYSTEMS = {
    "a100": "a100_sxm",
    "h100": "h100_sxm",
    "h200": "h200_sxm",
    "b200": "b200_sxm",
    "b300": "b300_sxm",
    "gb200": "gb200",
    "gb300": "gb300",
    "l40s": "l40s",
    "rtx-pro-6000": "rtx_pro_6000_server",
    "b60": "b60",
}
_ACCELERATORS = {system: name for name, system in SYSTEMS.items()}
# Tables a system must hold for an engine to be imported (importer's required ones).
_REQUIRED = (
    ("gemm", "gemm_perf.parquet"),
    ("attention", "context_attention_perf.parquet"),
    ("attention", "generation_attention_perf.parquet"),
)


class PackageNotInstalled(ProfileImportError):
    """aiconfigurator-core is not installed in this environment."""


@dataclass(frozen=True, slots=True)
class AicPackage:
    """Where an installed aiconfigurator-core keeps its systems, and its version."""

    version: str
    systems_dir: Path  # .../aiconfigurator_core/systems

    @property
    def label(self) -> str:
        return f"{DISTRIBUTION} {self.version}"

    def systems(self) -> list[str]:
        """The system folders under systems/data (folders only: no file is opened)."""
        data = self.systems_dir / "data"
        return sorted(d.name for d in data.iterdir() if d.is_dir())

    def folder(self, system: str) -> Path:
        return self.systems_dir / "data" / system

    def spec_path(self, system: str) -> Path:
        return self.systems_dir / f"{system}.yaml"

    def has_engine(self, system: str, engine: str) -> bool:
        """Whether the system holds the engine's GEMM and attention tables."""
        root = self.folder(system)
        return all(_holds(root / op / engine, table) for op, table in _REQUIRED)

    def engines(self, system: str) -> list[str]:
        """The engines whose GEMM and attention tables the system holds."""
        return [e for e in ENGINES if self.has_engine(system, e)]

    def notes(self, system: str) -> list[str]:
        """What an import of the system lacks and how servetune prices it instead."""
        comm = self.folder(system) / "comm"
        if _holds(comm / "nccl", "nccl_perf.parquet"):
            return []
        others = (
            sorted(
                d.name for d in comm.iterdir() if d.is_dir() and d.name not in (*ENGINES, "nccl")
            )
            if comm.is_dir()
            else []
        )
        measured = f" (its collectives were measured with {', '.join(others)}, not read)"
        return [
            f"{system} has no comm/nccl tables{measured if others else ''}: NCCL's "
            "all-reduce, all-gather and reduce-scatter are priced by the roofline"
        ]


def _holds(folder: Path, table: str) -> bool:
    """Whether a version folder under `folder` holds `table`."""
    return folder.is_dir() and any((v / table).is_file() for v in folder.iterdir())


@dataclass(frozen=True, slots=True)
class SystemChoice:
    accelerator: str  # servetune preset, e.g. "h100"
    system: str  # the package's folder, e.g. "h100_sxm"


@dataclass(frozen=True, slots=True)
class SkippedSystem:
    system: str
    reason: str


def locate_package() -> AicPackage:
    """The installed package's systems folder and version, found without importing it.

    Raises PackageNotInstalled naming the extra to install."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PackageNotInstalled(
            f"{DISTRIBUTION} is not installed (it ships NVIDIA's measured kernel tables): "
            f"{INSTALL_HINT}"
        )
    for location in spec.submodule_search_locations:
        systems = Path(location) / "systems"
        if (systems / "data").is_dir():
            try:
                version = importlib.metadata.version(DISTRIBUTION)
            except importlib.metadata.PackageNotFoundError:
                version = "unknown version"
            return AicPackage(version, systems)
    raise ProfileImportError(
        f"{DISTRIBUTION} at {list(spec.submodule_search_locations)} has no systems/data "
        "folder; reinstall it: " + INSTALL_HINT
    )


def describe_systems(package: AicPackage) -> str:
    """The package's systems and the servetune accelerators mapped onto them."""
    present = package.systems()
    pairs = [f"{name} ({system})" for name, system in SYSTEMS.items() if system in present]
    return f"{package.label} holds {', '.join(present)}; servetune imports {', '.join(pairs)}"


def choose_systems(
    package: AicPackage, gpu: str, engine: str
) -> tuple[list[SystemChoice], list[SkippedSystem]]:
    """The systems `gpu` names (a servetune accelerator, a system folder, or "all") that
    hold `engine`'s tables, and for "all" the systems skipped with why.

    Raises ProfileImportError for an unknown engine or GPU, or a GPU whose system lacks
    the engine's tables."""
    if engine not in ENGINES:
        raise ProfileImportError(f"--engine {engine!r}: expected one of {list(ENGINES)}")
    present = package.systems()
    key = gpu.lower()
    if key == ALL:
        chosen: list[SystemChoice] = []
        skipped: list[SkippedSystem] = []
        for system in present:
            accelerator = _ACCELERATORS.get(system)
            if not any(d.is_dir() for d in package.folder(system).iterdir()):
                skipped.append(SkippedSystem(system, "no tables (an empty folder)"))
            elif accelerator is None:
                skipped.append(SkippedSystem(system, "no servetune accelerator preset"))
            elif not package.has_engine(system, engine):
                skipped.append(SkippedSystem(system, f"no {engine} GEMM and attention tables"))
            else:
                chosen.append(SystemChoice(accelerator, system))
        return chosen, skipped
    system = SYSTEMS.get(key, key if key in _ACCELERATORS else None)
    if system is None:  # an alias of a mapped preset (rtx_pro_6000, h100-sxm, ...)
        with contextlib.suppress(HardwareError):
            system = SYSTEMS.get(get_accelerator(key).name)
    if system is None or system not in present:
        raise ProfileImportError(
            f"--gpu {gpu!r}: {package.label} has no system for it. {describe_systems(package)}"
        )
    if not package.has_engine(system, engine):
        raise ProfileImportError(
            f"--gpu {gpu!r}: {package.label}'s {system} holds no {engine} GEMM and attention "
            f"tables; try another --engine ({', '.join(ENGINES)})"
        )
    return [SystemChoice(_ACCELERATORS[system], system)], []


def import_system(package: AicPackage, choice: SystemChoice, engine: str) -> ImportedProfile:
    """One system's tables for `engine`, through the folder importer."""
    return import_aiconfigurator(
        package.folder(choice.system),
        choice.accelerator,
        engine=engine,
        spec_path=package.spec_path(choice.system),
    )


@dataclass(frozen=True, slots=True)
class EngineSystem:
    """One system's tables for one engine."""

    engine: str
    choice: SystemChoice


def choose_engine_systems(
    package: AicPackage, engines: Sequence[str], systems: Sequence[str] = (ALL,)
) -> tuple[list[EngineSystem], list[tuple[str, SkippedSystem]]]:
    """Per engine, in order, the systems `choose_systems(package, "all", engine)` chooses,
    kept to those `systems` names (servetune accelerators or system folders; "all": every
    one); and the (engine, system) pairs skipped with why (a named system that lacks the
    engine's tables among them).

    Raises ProfileImportError for an unknown engine or a name the package has no system
    for."""
    keys = {s.lower() for s in systems}
    every = ALL in keys
    wanted = {SYSTEMS.get(key, key) for key in keys - {ALL}}  # system folders
    unknown = sorted(wanted - set(package.systems()))
    if unknown:
        raise ProfileImportError(
            f"systems {unknown}: {package.label} has no system for them. "
            f"{describe_systems(package)}"
        )
    chosen: list[EngineSystem] = []
    skipped: list[tuple[str, SkippedSystem]] = []
    for engine in engines:
        picked, left = choose_systems(package, ALL, engine)
        chosen += [EngineSystem(engine, c) for c in picked if every or c.system in wanted]
        skipped += [(engine, s) for s in left if every or s.system in wanted]
    return chosen, skipped
