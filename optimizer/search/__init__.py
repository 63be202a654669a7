"""Optuna Pareto search over serving configs: the request and outcome contract, space,
evaluation (fleet sizing, the trace and closed-loop evaluators), study, recommendation,
launch flags, diagnosis and reports.

`TuneRequest` / `TuneOutcome` are the one tuning contract the CLI, the REST API,
the job worker and storage share; `api.services.tuning.run_tuning_job` runs a
study on a stored trace. Importing this package does not import Optuna
(`optimizer.search.study` does).
"""

from optimizer.search.evaluation import EvalSettings, EvalStatus, Evaluation, TrialError
from optimizer.search.outcome import Recommendation, TuneOutcome
from optimizer.search.request import TuneProgress, TuneRequest, TuneRequestError
from optimizer.search.space import SearchSpace, build_config, enumerate_grid
from optimizer.search.trace_evaluator import TraceEvaluator

__all__ = [
    "EvalSettings",
    "EvalStatus",
    "Evaluation",
    "Recommendation",
    "SearchSpace",
    "TraceEvaluator",
    "TrialError",
    "TuneOutcome",
    "TuneProgress",
    "TuneRequest",
    "TuneRequestError",
    "build_config",
    "enumerate_grid",
]
