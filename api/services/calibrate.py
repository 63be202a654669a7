"""A deployment's calibration: fitted on one stored observation's window, checked on a
later one, stored, and applied to the deployment's later observations and searches.

`servetune deployments calibrate` and POST /v1/deployments/{id}/calibrations run
`calibrate_deployment`; `servetune observe --deployment`, the REST observations and the
deployment's re-tuning jobs price through `deployment_latency`, which says which
calibration it applied.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from sqlalchemy.orm import Session

from optimizer.latency.base import LatencySource
from optimizer.telemetry.calibrate import (
    calibrated,
    calibration_of,
    check_window,
    fit_window,
)
from storage.deployment_calibrations import latest_calibration, save_calibration
from storage.deployments import get_deployment, list_observations, observed_window_of
from storage.service_records import DeploymentCalibration


class CalibrateError(ValueError):
    """The observations cannot calibrate the deployment (the message says why)."""


@dataclass(frozen=True, slots=True)
class DeploymentLatency:
    source: LatencySource
    label: str
    calibration_id: int | None


def deployment_latency(
    session: Session, deployment_id: int, base: LatencySource, label: str
) -> DeploymentLatency:
    """`base` with the deployment's newest calibration applied, labelled so."""
    cal = latest_calibration(session, deployment_id)
    if cal is None:
        return DeploymentLatency(base, label, None)
    source = calibrated(base, calibration_of(cal.overhead_s, cal.prefill_scale, cal.decode_scale))
    return DeploymentLatency(source, f"{label} + {cal.describe()}", cal.id)


def _pick(session: Session, deployment_id: int, fit_on: int | None, check_on: int | None,
          project: str | None) -> tuple[int, int | None]:  # fmt: skip
    """Default: fit on the second newest observation, check on the newest (one alone: fit
    on it, no check)."""
    if fit_on is not None:
        return fit_on, check_on
    # newest first; with check_on, only the observations before it (the keyset cursor)
    newest = list_observations(session, deployment_id, project=project, limit=2, after=check_on)
    ids = [o.id for o in newest]
    if check_on is not None:
        if not ids:
            raise CalibrateError(f"no observation before {check_on} to fit on; give --fit")
        return ids[0], check_on
    if not ids:
        raise CalibrateError(
            f"deployment {deployment_id} has no observations; observe it first "
            f"(`servetune observe --deployment {deployment_id} ...`)"
        )
    return (ids[1], ids[0]) if len(ids) == 2 else (ids[0], None)


def calibrate_deployment(
    sessions: Callable[[], AbstractContextManager[Session]],
    deployment_id: int,
    latency: LatencySource,
    *,
    fit_on: int | None = None,
    check_on: int | None = None,
    seed: int = 0,
    project: str | None = None,
) -> DeploymentCalibration:
    """Fit on observation `fit_on`'s window, check on the later `check_on`'s, store it.
    `latency` is the base the deployment's observations price with (a refit replaces
    the deployment's calibration, it does not stack). `sessions()` opens a session: the
    windows are read in one, fitted outside any (the simulations may store compiled
    latency tables), and the result stored in another."""
    with sessions() as session:
        deployed = get_deployment(session, deployment_id, project=project)
        fit_on, check_on = _pick(session, deployment_id, fit_on, check_on, project)
        if check_on is not None and check_on <= fit_on:
            raise CalibrateError(
                f"the check observation ({check_on}) must be later than the fitted one ({fit_on})"
            )
        fitted = observed_window_of(session, deployment_id, fit_on)
        held = None if check_on is None else observed_window_of(session, deployment_id, check_on)
    cfg = deployed.config
    fit = fit_window(fitted, cfg, latency, seed=seed)
    doc = fit.to_dict()
    if held is not None:
        doc["check"] = check_window(held, cfg, latency, fit.calibration, seed=seed).to_dict()
    with sessions() as session:
        return save_calibration(
            session, deployment_id, fitted_on=fit_on, checked_on=check_on,
            overhead_s=fit.overhead_s, prefill_scale=fit.prefill_scale,
            decode_scale=fit.decode_scale, fit=doc, project=project,
        )  # fmt: skip
