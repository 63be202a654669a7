"""A trial started after another worker took the study's last trial ends quietly as
surplus: no failure and no traceback on stderr, and it never counts as finished."""

from __future__ import annotations

import logging

import optuna
from optuna.storages import InMemoryStorage
from optuna.trial import TrialState

from optimizer.search.study import count_finished, open_study, run_trials


class _RacedStorage(InMemoryStorage):
    """In-memory storage where another worker creates and finishes a trial just before
    this worker's `race_at`-th trial is created (between its budget check and its ask)."""

    def __init__(self, race_at: int) -> None:
        super().__init__()
        self.race_at: int | None = race_at

    def create_new_trial(self, study_id, template_trial=None):
        if self.race_at is not None and len(self.get_all_trials(study_id)) == self.race_at:
            self.race_at = None
            other = super().create_new_trial(study_id)
            self.set_trial_state_values(other, TrialState.COMPLETE, (1.0, 1.0))
        return super().create_new_trial(study_id, template_trial)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_surplus_trial_is_quiet_and_not_counted() -> None:
    study = open_study("race", _RacedStorage(race_at=1), seed=0, n_startup_trials=1)
    ran: list[int] = []

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        ran.append(trial.number)
        return 1.0, 1.0

    records = _Records()
    optuna_logger = logging.getLogger("optuna")
    optuna_logger.addHandler(records)
    try:
        done = run_trials(study, objective, 2)
    finally:
        optuna_logger.removeHandler(records)
    # Trial 0 ran here, trial 1 was the other worker's, trial 2 found the budget taken.
    assert ran == [0] and done == 2 == count_finished(study)
    surplus = study.trials[2]
    assert surplus.user_attrs == {"surplus": True} and surplus.state is not TrialState.COMPLETE
    assert surplus.state is not TrialState.FAIL
    loud = [r for r in records.records if r.levelno >= logging.WARNING or r.exc_info]
    assert loud == [], [r.getMessage() for r in loud]
