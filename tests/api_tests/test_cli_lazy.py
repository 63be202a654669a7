"""The console script imports only the sub-command it runs; its help still lists all."""

from __future__ import annotations

import json
import subprocess
import sys

from api.cli import COMMANDS, app

PROBE = """
import json, sys
sys.argv = ["servetune", *sys.argv[1:]]
from api.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("api.", "profiler")))))
"""


def _modules_after(args: list[str]) -> tuple[set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120
    )
    last = done.stdout.strip().splitlines()[-1]
    return set(json.loads(last)), done.stdout


def test_simulate_imports_only_its_own_module() -> None:
    modules, out = _modules_after(["simulate", "--help"])
    assert "Replay a trace under one config" in out
    assert "api.cli.simulate" in modules
    for other in ("api.cli.profile", "api.cli.tune", "api.cli.observations", "api.cli.validate",
                  "profiler.importers", "api.services.tuning"):  # fmt: skip
        assert other not in modules, other


def test_top_level_help_lists_every_command() -> None:
    modules, out = _modules_after(["--help"])
    for name in COMMANDS:
        assert name in out, name
    assert {"api.cli.profile", "api.cli.tune", "api.cli.simulate"} <= modules


def test_the_full_app_has_every_command() -> None:
    import typer.main

    group = typer.main.get_command(app)
    assert set(group.commands) == set(COMMANDS)
