"""What the benchmarks share: where the data is, running servetune as users do, and a
database holding a fitted H100 latency model (the path `tune` and `simulate` price with)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SERVETUNE_SHARED_DATA", REPO.parent / "shared" / "data"))
TRACES = SHARED / "traces" / "azure2023"
AICONFIGURATOR = SHARED / "profiles" / "aiconfigurator"
AICONFIGURATOR_H100 = AICONFIGURATOR / "h100_sxm"
SERVETUNE = str(Path(sys.executable).with_name("servetune"))


def run(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, str]:
    """Run a command; its wall time and output (exits with its stderr when it fails)."""
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, done.stdout + done.stderr


def prepare_database(
    url: str | None,
    workdir: Path,
    gpus: tuple[str, ...] = ("h100",),
    package_gpus: tuple[str, ...] = (),
) -> tuple[str, dict[str, str]]:
    """A database holding a fitted model of each of `gpus` (AIConfigurator's tables, the
    shared copy's, imported and fitted when it has none) and of each of `package_gpus` (the
    installed aiconfigurator-core's tables: `profile import --aiconfigurator --gpu G`,
    which also fits)."""
    from storage.db import make_engine, session_scope, upgrade_database
    from storage.latency_models import list_latency_models

    url = url or f"sqlite:///{workdir / 'bench.db'}"
    env = {**os.environ, "SERVETUNE_DATABASE_URL": url}
    upgrade_database(url)
    engine = make_engine(url)
    with session_scope(engine) as s:
        have = {m.accelerator for m in list_latency_models(s)}
    engine.dispose()
    for gpu in gpus:
        if gpu in have:
            continue
        print(f"importing and fitting the AIConfigurator {gpu} tables (once) ...", flush=True)
        _, out = run([SERVETUNE, "profile", "import", str(AICONFIGURATOR / f"{gpu}_sxm"),
                      "--format", "aiconfigurator"], env)  # fmt: skip
        run_id = re.search(r"stored profile run (\d+)", out).group(1)
        run([SERVETUNE, "latency", "fit", "--profile", run_id], env)
    for gpu in package_gpus:
        if gpu in have:
            continue
        print(f"importing and fitting the installed package's {gpu} tables (once) ...", flush=True)
        run([SERVETUNE, "profile", "import", "--aiconfigurator", "--gpu", gpu], env)
    return url, env
