"""The Optuna study: seeded multi-objective TPE with constraints, resumable and distributed.

Objectives (both maximised), from each trial's screen of one unit
(`optimizer.search.evaluation`): per-GPU goodput (per-dollar when GPU prices are
given) and interactivity (median output tokens/s per user). The constraint is
positive for an invalid config (1) and for one whose sized fleet exceeds the GPU
budget (the excess share of the budget, at least 0.1), so the sampler steers
away from them. A trial that fails for any other reason than its config's own
invalidity fails loudly: its traceback is stored on the trial (`error`) and a
`TrialError` ends the run of every worker of the study.

Studies live in Optuna's RDB storage in the project's own database (its tables
sit next to ours; our Alembic revision owns `alembic_version`, hence
`skip_compatibility_check`). Heartbeats mark trials of a dead worker FAILED
and `RetryFailedTrialCallback` re-queues their parameters, so a resumed or
shared study keeps every completed trial and loses none.

`run_trials` stops when the study holds `num_trials` finished trials in total,
counted across every worker. Two workers can both find one trial left and both
start one; the later-numbered trial, past the budget among live trials, ends as
surplus before it runs: PRUNED (Optuna's state for a trial stopped early, logged
below the study's WARNING level), marked `surplus`, never evaluated, never counted.
"""

from __future__ import annotations

import json
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback, fail_stale_trials
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import TrialState

from optimizer.config import ConfigError, RejectReason, ServingConfig
from optimizer.plain import PlainDataError, from_plain, to_plain
from optimizer.search.evaluation import EvalStatus, Evaluation, Evaluator, TrialError
from optimizer.search.recommend import TrialOutcome
from optimizer.search.space import SearchSpace, TrialChooser, build_config
from optimizer.search.trials import RejectedTrial

HEARTBEAT_S = 5
GRACE_S = 20
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
_ATTR_CONFIG = "config"
_ATTR_EVAL = "evaluation"
_ATTR_CONSTRAINT = "constraint"
_ATTR_SURPLUS = "surplus"
_ATTR_ERROR = "error"
_ATTR_CONFIG_ERROR = "config_error"
_ATTR_CONFIG_REASON = "config_error_reason"


def make_storage(url: str) -> RDBStorage:
    """Optuna's RDB storage on the project database (migrate it with ours first)."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 60}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RDBStorage(
            url,
            engine_kwargs=kwargs,
            heartbeat_interval=HEARTBEAT_S,
            grace_period=GRACE_S,
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3),
            skip_compatibility_check=True,
        )


def make_sampler(seed: int, *, n_startup_trials: int = 10) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=n_startup_trials, multivariate=True, group=True
        )


def open_study(
    name: str,
    storage: optuna.storages.BaseStorage | str | None,
    *,
    seed: int,
    n_startup_trials: int = 10,
) -> optuna.Study:
    """Create the study, or load it when it exists (a resumed or shared study)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=make_sampler(seed, n_startup_trials=n_startup_trials),
        directions=["maximize", "maximize"],
        load_if_exists=True,
    )


def trial_outcomes(study: optuna.Study) -> list[TrialOutcome]:
    """Completed trials that produced a valid config, in trial order (trials written by an
    older servetune, whose evaluation this one cannot read, are left out)."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if _ATTR_CONFIG not in t.user_attrs or _ATTR_EVAL not in t.user_attrs:
            continue
        try:
            evaluation = _evaluation(json.loads(t.user_attrs[_ATTR_EVAL]))
        except PlainDataError:
            continue
        config = ServingConfig.from_dict(json.loads(t.user_attrs[_ATTR_CONFIG]))
        out.append(TrialOutcome(t.number, config, evaluation))
    return out


def rejected_trials(study: optuna.Study) -> list[RejectedTrial]:
    """Completed trials whose choices made no valid config, in trial order (a trial of an
    older servetune, which stored no reason, counts as a broken rule)."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        message = t.user_attrs.get(_ATTR_CONFIG_ERROR)
        if message is None:
            continue
        try:
            reason = RejectReason(t.user_attrs.get(_ATTR_CONFIG_REASON, RejectReason.RULE))
        except ValueError:
            reason = RejectReason.RULE
        out.append(RejectedTrial(t.number, reason, message))
    return out


def _evaluation(data: object) -> Evaluation:
    built = from_plain(Evaluation, data, "evaluation")
    assert isinstance(built, Evaluation)
    return built


@dataclass(frozen=True, slots=True)
class Objective:
    """The trial function: build a config, score it, record it on the trial."""

    space: SearchSpace
    evaluator: Evaluator
    per_dollar: bool = False

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        try:
            config = build_config(self.space, TrialChooser(trial))
        except ConfigError as exc:
            trial.set_user_attr(_ATTR_CONFIG_ERROR, str(exc)[:500])
            trial.set_user_attr(_ATTR_CONFIG_REASON, exc.reason.value)
            trial.set_constraint(_ATTR_CONSTRAINT, 1.0)
            return 0.0, 0.0
        try:
            ev = self.evaluator.evaluate(config)
        except Exception as exc:
            tb = traceback.format_exc()[-8000:]
            trial.set_user_attr(_ATTR_ERROR, tb)
            raise TrialError(trial.number, tb) from exc
        trial.set_user_attr(_ATTR_CONFIG, json.dumps(config.to_dict(), sort_keys=True))
        trial.set_user_attr(_ATTR_EVAL, json.dumps(to_plain(ev), sort_keys=True))
        trial.set_user_attr("status", ev.status.value)
        trial.set_user_attr("num_gpus", ev.num_gpus)
        budget = self.evaluator.settings.gpu_budget
        if ev.status is EvalStatus.INVALID:
            violation = 1.0
        elif ev.feasible:
            violation = 0.0
        else:
            violation = max(0.1, (ev.num_gpus - budget) / budget) if ev.num_units else 1.0
        trial.set_constraint(_ATTR_CONSTRAINT, float(violation))
        goodput = ev.goodput_per_gpu
        if self.per_dollar:
            goodput = ev.goodput_per_dollar or 0.0
        return float(goodput), float(ev.interactivity_tok_s)


def warm_cache(study: optuna.Study, evaluator: Evaluator) -> None:
    """Seed the evaluator's cache from the study's completed trials (resume, workers)."""
    from optimizer.search.space import config_key

    for t in trial_outcomes(study):
        evaluator.cache.entries.setdefault(config_key(t.config), t.evaluation)


def count_finished(study: optuna.Study) -> int:
    """Trials that ran to the end (a surplus trial never ran)."""
    finished = study.get_trials(deepcopy=False, states=_FINISHED)
    return sum(1 for t in finished if not t.user_attrs.get(_ATTR_SURPLUS))


def _is_surplus(study: optuna.Study, trial: optuna.Trial, num_trials: int) -> bool:
    """True when `num_trials` live trials numbered before this one already exist."""
    live = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    ahead = [
        t
        for t in study.get_trials(deepcopy=False, states=live)
        if t.number < trial.number and not t.user_attrs.get(_ATTR_SURPLUS)
    ]
    return len(ahead) >= num_trials


def failed_trial(study: optuna.Study, since: int = 0) -> TrialError | None:
    """The first trial numbered `since` or later that failed with an error (another
    worker's too; earlier runs' failures are left to be retried)."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        tb = t.user_attrs.get(_ATTR_ERROR)
        if tb and t.number >= since:
            return TrialError(t.number, tb)
    return None


def run_trials(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], tuple[float, float]],
    num_trials: int,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_trial: Callable[[int], None] = lambda _done: None,
    poll_s: float = 1.0,
) -> int:
    """Run trials until the study holds `num_trials` finished ones; returns that count.

    Safe with any number of workers on one RDB study (Optuna's `optimize` keeps
    the heartbeat and re-queues trials of dead workers). Stops after the
    current trial once `should_stop()` is true.
    """

    def guarded(trial: optuna.Trial) -> tuple[float, float]:
        if _is_surplus(study, trial, num_trials):
            # Another worker took the last trial of the budget after this one was asked
            # for: no failure (Optuna would log a FAIL's traceback), it stops unrun.
            trial.set_user_attr(_ATTR_SURPLUS, True)
            raise optuna.TrialPruned(f"surplus: the study's {num_trials} trials are taken")
        return objective(trial)

    heartbeat = is_heartbeat_enabled(study._storage)
    since = len(study.get_trials(deepcopy=False))
    while not should_stop():
        failed = failed_trial(study, since)
        if failed is not None:
            raise failed
        done = count_finished(study)
        if done >= num_trials:
            return done
        running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        if done + running >= num_trials and not waiting:
            if not running:
                return done
            # Other workers hold the rest of the budget; wait for them or for their
            # heartbeats to lapse (their trials are then failed and re-queued).
            if heartbeat:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    fail_stale_trials(study)
            time.sleep(poll_s)
            continue
        study.optimize(guarded, n_trials=1, gc_after_trial=False)
        on_trial(count_finished(study))
    return count_finished(study)
