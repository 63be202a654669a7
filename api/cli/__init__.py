"""The `servetune` command line. Sub-commands live one module per resource."""

from __future__ import annotations

import typer

from api.cli import db, keys, latency, observations, profile, serve, traces, validate
from api.cli.quickstart import quickstart
from api.cli.simulate import simulate
from api.cli.tune import explain, tune
from api.cli.tune import worker as tune_worker

app = typer.Typer(
    name="servetune",
    help="Trace-driven Pareto optimizer for LLM serving configs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(db.app, name="db")
app.add_typer(traces.app, name="traces")
app.add_typer(profile.app, name="profile")
app.add_typer(latency.app, name="latency")
app.command("quickstart")(quickstart)
app.add_typer(keys.app, name="keys")
app.command("serve")(serve.serve)
app.command("worker")(serve.worker)
app.command("tune")(tune)
app.command("tune-worker")(tune_worker)
app.command("explain")(explain)
app.command("simulate")(simulate)
app.command("validate")(validate.validate)
app.add_typer(observations.app, name="observations")
app.command("calibrate")(observations.calibrate)


def main() -> None:
    """The console script: user-level failures (files, the database) are one `error:` line
    and exit status 2, never a traceback."""
    from sqlalchemy.exc import OperationalError

    from api.cli.common import database_error, fail
    from api.settings import get_settings

    try:
        app()
    except OperationalError as exc:
        fail(database_error(get_settings().database_url, exc))
    except OSError as exc:
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        fail(f"{where}{exc.strerror or exc}")
