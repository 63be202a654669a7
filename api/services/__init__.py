"""Services: the orchestration between the database and the core.

Each loads what it needs from `storage`, calls the pure core (`optimizer`) or
the profiler, and saves the result; the CLI commands, REST routes, job worker,
tests and benchmarks all call these functions.

- `api.services.ingest`: a trace file parsed, validated and stored in one transaction.
- `api.services.export`: stored traces written back to files `traces import` reads.
- `api.services.stream_windows`: a trace stream's rolling window and the drift test.
- `api.services.archives`: an uploaded profile archive unpacked safely.
- `api.services.latency`: which latency model prices a run (stored fitted models,
  calibrations, the roofline), and fitting a stored profile into a stored model.
- `api.services.observe`: two scrapes of a vLLM server's /metrics against the
  simulator's prediction for its config, and storing it with a deployment.
- `api.services.tuning`: a tuning job — load the trace, run or resume the Optuna
  study, store the outcome.
- `api.services.validation`: the simulator against the reference engine on this
  machine (profile, fit, self-calibrate, replay, compare, store).
"""
