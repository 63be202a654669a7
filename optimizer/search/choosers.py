"""The choices `optimizer.search.space.build_config` asks for, and who makes them: an
Optuna trial (`TrialChooser`), a finished trial's parameters (`FixedChooser`) or one path
of the grid (`PathChooser`). Every knob is an integer index into its choice tuple."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class Chooser(Protocol):
    """Makes the choices `build_config` asks for (an Optuna trial, or a grid path)."""

    def index(self, name: str, num_choices: int) -> int: ...


@dataclass(frozen=True, slots=True)
class TrialChooser:
    """Choices from an Optuna trial: every knob is an integer index."""

    trial: Any  # optuna.Trial

    def index(self, name: str, num_choices: int) -> int:
        if num_choices == 1:
            return 0
        return int(self.trial.suggest_int(name, 0, num_choices - 1))


@dataclass(frozen=True, slots=True)
class FixedChooser:
    """Choices from a mapping of parameter name to index (a finished trial's params)."""

    params: Mapping[str, int]

    def index(self, name: str, num_choices: int) -> int:
        return int(self.params.get(name, 0)) if num_choices > 1 else 0


def pick(chooser: Chooser, name: str, values: Sequence[Any]) -> Any:
    return values[chooser.index(name, len(values))]


@dataclass(slots=True)
class PathChooser:
    """Choices along one path of the grid (`enumerate_grid`), recording the fan-out."""

    path: list[int]
    fanout: list[int] = field(default_factory=list)
    params: dict[str, int] = field(default_factory=dict)

    def index(self, name: str, num_choices: int) -> int:
        if num_choices == 1:
            return 0
        i = len(self.fanout)
        self.fanout.append(num_choices)
        if i >= len(self.path):
            self.path.append(0)
        self.params[name] = self.path[i]
        return self.path[i]
