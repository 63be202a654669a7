"""What the importers share: the result and error types, guarded Parquet/CSV reads,
accelerator names."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import polars as pl

from optimizer.hardware import HardwareError, get_accelerator
from optimizer.records import DeviceInfo, KernelSample


class ImportFormat(StrEnum):
    AICONFIGURATOR = "aiconfigurator"
    VIDUR = "vidur"


class ProfileImportError(ValueError):
    """A profile file or folder is missing, unreadable or lacks expected columns."""


# Files no importer ever opens, whatever folder they lie in: aiconfigurator-core ships
# `systems/silicon_sample.csv` (end-to-end serving measurements), which servetune keeps
# as its external check, so no price may be learnt from it.
NEVER_READ = frozenset({"silicon_sample.csv"})


def refuse_never_read(path: Path) -> None:
    """Raise ProfileImportError before anything opens a file named in NEVER_READ."""
    if Path(path).name in NEVER_READ:
        raise ProfileImportError(f"{path}: never read (servetune's external check)")


@dataclass(frozen=True, slots=True)
class ImportedProfile:
    source: str  # the ImportFormat value
    accelerator: str  # accelerator preset name, e.g. "h100"
    device: DeviceInfo
    samples: list[KernelSample]
    engine: str = ""  # whose kernels the tables time (`ProfileRunInfo.engine`)


def require_columns(df: pl.DataFrame, columns: Iterable[str], where: Path) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ProfileImportError(f"{where}: missing columns {missing}; found {sorted(df.columns)}")


def read_parquet(path: Path, columns: Iterable[str]) -> pl.DataFrame:
    refuse_never_read(path)
    try:
        df = pl.read_parquet(path)
    except Exception as exc:
        raise ProfileImportError(f"{path}: cannot read Parquet table: {exc}") from exc
    require_columns(df, columns, path)
    return df


def read_csv(path: Path) -> pl.DataFrame:
    refuse_never_read(path)
    try:
        return pl.read_csv(path, infer_schema_length=10_000)
    except Exception as exc:
        raise ProfileImportError(f"{path}: cannot read CSV file: {exc}") from exc


def path_accelerator(parts: Iterable[str]) -> str | None:
    """The accelerator preset the first path part naming one names (`h100`, `a100_dgx`)."""
    for part in parts:
        for key in (part, part.split("_")[0]):
            try:
                return get_accelerator(key).name
            except HardwareError:
                continue
    return None


def accelerator_name(candidates: Iterable[str], gpu: str | None, where: Path) -> str:
    """The preset a file's path names; else `gpu` (which applies only to paths naming
    none); else ProfileImportError."""
    named = path_accelerator(candidates)
    if named is not None:
        return named
    if gpu is not None:
        try:
            return get_accelerator(gpu).name
        except HardwareError as exc:
            raise ProfileImportError(f"{where}: --gpu {gpu!r}: {exc}") from exc
    raise ProfileImportError(
        f"{where}: cannot infer the accelerator from the path; pass gpu= (e.g. 'h100')"
    )


def version_key(text: str) -> tuple[int, ...]:
    """Sort key for version folder names like '0.24.0' or '2.27.3'."""
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
