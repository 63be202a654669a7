"""The `servetune` command line. Sub-commands live one module per resource.

Each sub-command's module is imported only when it runs: `servetune simulate`
never imports the profiler's importers or the tuning service, which took a third
of a short command's wall time. `servetune --help` (or an unknown or missing
command) registers all of them, and `from api.cli import app` gives the full app.
"""

from __future__ import annotations

import gc
import importlib
import sys

import typer

# name -> (module, attribute, a group of sub-commands (True) or one command), in help order
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "db": ("api.cli.db", "app", True),
    "traces": ("api.cli.traces", "app", True),
    "profile": ("api.cli.profile", "app", True),
    "latency": ("api.cli.latency", "app", True),
    "quickstart": ("api.cli.quickstart", "quickstart", False),
    "keys": ("api.cli.keys", "app", True),
    "serve": ("api.cli.serve", "serve", False),
    "worker": ("api.cli.serve", "worker", False),
    "tune": ("api.cli.tune", "tune", False),
    "tune-worker": ("api.cli.tune", "worker", False),
    "explain": ("api.cli.tune", "explain", False),
    "simulate": ("api.cli.simulate", "simulate", False),
    "plan": ("api.cli.plan", "plan", False),
    "validate": ("api.cli.validate", "validate", False),
    "observe": ("api.cli.observe", "observe", False),
    "deployments": ("api.cli.deployments", "app", True),
    "observations": ("api.cli.observations", "app", True),
    "calibrate": ("api.cli.observations", "calibrate", False),
}


def _root() -> None:
    """Trace-driven Pareto optimizer for LLM serving configs."""


def build_app(names: list[str] | None = None) -> typer.Typer:
    """The command line with the sub-commands `names` (all of them by default)."""
    app = typer.Typer(
        name="servetune", help=_root.__doc__, no_args_is_help=True, pretty_exceptions_enable=False
    )
    # A callback keeps a one-command app a group (`servetune simulate ...`, not `servetune ...`).
    app.callback()(_root)
    for name in COMMANDS if names is None else names:
        module, attribute, is_group = COMMANDS[name]
        target = getattr(importlib.import_module(module), attribute)
        if is_group:
            app.add_typer(target, name=name)
        else:
            app.command(name)(target)
    return app


def _requested(argv: list[str]) -> list[str] | None:
    """The one sub-command `argv` runs, when it names one; else None (all are needed:
    the top-level help, or an error message that lists them)."""
    if argv and argv[0] in COMMANDS:
        return [argv[0]]
    return None


def __getattr__(name: str) -> typer.Typer:
    if name == "app":
        app = build_app()
        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """The console script: user-level failures (files, the database) are one `error:` line
    and exit status 2, never a traceback."""
    from sqlalchemy.exc import OperationalError

    from api.cli.common import database_error, fail
    from api.settings import SettingsError, get_settings

    app = build_app(_requested(sys.argv[1:]))
    # What the command imported lives as long as the process: out of the collector's
    # reach, so the collections a simulation's allocations trigger scan only its own
    # objects (~7% of a `simulate` run's CPU).
    gc.freeze()
    try:
        try:
            app(prog_name="servetune")
        except SettingsError as exc:  # a bad SERVETUNE_* value met outside `session()`
            fail(str(exc))
        except OperationalError as exc:
            fail(database_error(get_settings().database_url, exc))
        except OSError as exc:
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            fail(f"{where}{exc.strerror or exc}")
    except typer.Exit as exc:  # `fail` outside the app: its status, without a traceback
        sys.exit(exc.exit_code)
