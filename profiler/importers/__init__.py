"""Importers of public GPU kernel measurements into the project's sample schema.

Two sources are understood (DOMAIN.md §9, ../shared/data/README.md):

- NVIDIA AIConfigurator's Parquet performance database, one folder per GPU
  (`.../aiconfigurator/h100_sxm`): generic GEMMs by (m, n, k), context
  (prefill) and generation (decode) attention, NCCL and vLLM all-reduces, the fused
  MoE layer and DeepEP's all-to-all (`aiconfigurator_moe`), and vLLM's whole MLA block
  (`aiconfigurator_mla`).
- Vidur's per-operator CSVs (`mlp.csv`, `attention.csv`, `all_reduce.csv`), a
  single file or a folder searched recursively.

Both map onto `optimizer.records.KernelSample` so the latency model trains on
imported and self-measured profiles alike. 16-bit rows are kept, plus the
quantised formats vLLM runs (FP8 GEMMs and KV cache, FP8 and 4-bit MoE experts,
NVFP4 GEMMs, the MLA block's FP8 / NVFP4 projections); see each module for the exact
filter. This package never imports torch.
"""

from __future__ import annotations

from pathlib import Path

from profiler.importers._common import ImportedProfile, ImportFormat, ProfileImportError


def import_profile(path: Path, fmt: ImportFormat, gpu: str | None = None) -> ImportedProfile:
    """Read public measurements at `path` in format `fmt`.

    `gpu` names the accelerator of files whose path names none (a path part such as
    `h100_sxm` or `a100_dgx` always wins); files of several accelerators in one import
    are refused. Raises `ProfileImportError` on bad input.
    """
    path = Path(path)
    if not path.exists():
        raise ProfileImportError(f"{path}: no such file or folder")
    fmt = ImportFormat(fmt)
    if fmt is ImportFormat.AICONFIGURATOR:
        from profiler.importers.aiconfigurator import import_aiconfigurator

        return import_aiconfigurator(path, gpu)
    from profiler.importers.vidur import import_vidur

    return import_vidur(path, gpu)


__all__ = ["ImportFormat", "ImportedProfile", "ProfileImportError", "import_profile"]
