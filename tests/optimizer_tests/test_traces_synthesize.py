"""Synthetic traces from a sample (`optimizer.traces.synthesize`): the rate follows the
curve and averages the asked rate, lengths are the sample's pairs, a seed fixes the
output, bad requests and curve files are refused with what was expected."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from optimizer.records import RateCurve, RateCurveAxis
from optimizer.traces.synthesize import (
    _BLOCK,
    DIURNAL,
    MAX_DAYS,
    RateCurveError,
    SynthesisError,
    arrival_times,
    format_rate_curve,
    parse_rate_curve,
    rate_knots,
    read_rate_curve,
    relative_rate_at,
    synthesize,
)

# A sample whose output is a function of its prompt (out = in // 10 + 1): resampling the
# two columns independently would break it on almost every request.
SAMPLE_IN = np.array([37, 120, 455, 800, 1210, 2048, 3000, 4100, 5500, 7999], dtype=np.int64)
SAMPLE_OUT = SAMPLE_IN // 10 + 1


def _synth(curve: RateCurve = DIURNAL, *, days: float = 1.0, rate: float = 1.0, seed: int = 0):
    return synthesize(SAMPLE_IN, SAMPLE_OUT, curve=curve, days=days, mean_rate=rate, seed=seed)


def _curve(axis: RateCurveAxis, points: list[tuple[float, float]]) -> RateCurve:
    return RateCurve("test", axis, tuple(h for h, _ in points), tuple(r for _, r in points))


# ----------------------------------------------------------------------------- the curve


def test_diurnal_peaks_at_14_and_bottoms_at_2_four_to_one_with_mean_one() -> None:
    fine = np.linspace(0.0, 24.0, 24 * 60 + 1)
    rates = relative_rate_at(DIURNAL, fine)
    assert fine[np.argmax(rates)] == 14.0 and fine[np.argmin(rates)] == 2.0
    assert rates.max() / rates.min() == pytest.approx(4.0, rel=1e-12)
    # The points' mean is the curve's mean over a day (linear between hourly points).
    assert np.mean(DIURNAL.relative_rates) == pytest.approx(1.0, abs=1e-12)
    # It repeats every day.
    np.testing.assert_allclose(relative_rate_at(DIURNAL, fine + 24.0 * 5), rates)


def test_a_periodic_curve_wraps_from_its_last_point_to_its_first() -> None:
    curve = _curve(RateCurveAxis.HOUR_OF_DAY, [(6.0, 1.0), (18.0, 3.0)])
    # 18 h -> 30 h (06:00 next day): 3 -> 1 over 12 h; midnight is half-way.
    assert relative_rate_at(curve, np.array([0.0, 24.0, 3.0]))[:2].tolist() == [2.0, 2.0]
    assert relative_rate_at(curve, np.array([3.0]))[0] == pytest.approx(1.5)
    knots, rates = rate_knots(curve, 48.0)
    assert knots.tolist() == [0.0, 6.0, 18.0, 30.0, 42.0, 48.0]
    assert rates.tolist() == [2.0, 1.0, 3.0, 1.0, 3.0, 2.0]


# ----------------------------------------------------------------------------- arrivals


def test_constant_curve_is_the_unit_process_scaled_by_the_rate() -> None:
    """Golden: a flat curve makes t_i = S_i / rate, S the unit process's points."""
    curve = _curve(RateCurveAxis.HOUR_OF_DAY, [(0.0, 5.0)])
    span_s, rate = 2 * 3600.0, 3.0
    times = arrival_times(curve, span_s=span_s, mean_rate=rate, rng=np.random.default_rng(7))
    s = np.cumsum(np.random.default_rng(7).standard_exponential(_BLOCK))
    expected = s[s < rate * span_s] / rate
    np.testing.assert_allclose(times, expected, rtol=1e-12)


def test_linear_ramp_inverts_the_quadratic_exactly() -> None:
    """Golden: rate c t on [0, T] (an `hour` curve from 0 to 1) has Lambda(t) = c t^2 / 2
    and c T^2 / 2 = rate T, so the unit process's S maps to T sqrt(S / (rate T))."""
    curve = _curve(RateCurveAxis.HOUR, [(0.0, 0.0), (24.0, 1.0)])
    span_s, rate = 86400.0, 2.0
    times = arrival_times(curve, span_s=span_s, mean_rate=rate, rng=np.random.default_rng(3))
    s = np.cumsum(np.random.default_rng(3).standard_exponential(_BLOCK))
    s = s[s < rate * span_s]
    np.testing.assert_allclose(times, span_s * np.sqrt(s / (rate * span_s)), rtol=1e-9)


def test_count_matches_the_mean_rate_and_hours_follow_the_diurnal_curve() -> None:
    days, rate = 7.0, 2.0
    cols = _synth(days=days, rate=rate, seed=11)
    expected = rate * days * 86400.0
    assert abs(len(cols) - expected) < 5 * math.sqrt(expected)
    assert np.all(np.diff(cols.arrival_s) >= 0)
    assert cols.arrival_s[0] > 0.0 and cols.arrival_s[-1] < days * 86400.0
    # Every hour of the day holds what the curve's integral over it promises.
    hour = (cols.arrival_s // 3600.0 % 24).astype(np.int64)
    counts = np.bincount(hour, minlength=24)
    edges = relative_rate_at(DIURNAL, np.arange(25, dtype=np.float64))
    want = rate * 3600.0 * days * (edges[:-1] + edges[1:]) / 2.0
    assert np.all(np.abs(counts - want) < 5 * np.sqrt(want)), (counts, want)
    # The busiest hour is [13, 15)'s pair and the quietest [1, 3)'s: the 4x swing.
    assert set(np.argsort(counts)[-2:]) == {13, 14} and set(np.argsort(counts)[:2]) == {1, 2}


def test_mean_rate_holds_over_a_partial_day_too() -> None:
    """The curve's mean over the span (here 06:00 to 18:00 missing) is scaled to the rate."""
    cols = _synth(days=0.75, rate=3.0, seed=5)
    expected = 3.0 * 0.75 * 86400.0
    assert abs(len(cols) - expected) < 5 * math.sqrt(expected)


def test_zero_stretches_of_the_curve_get_no_arrivals() -> None:
    curve = _curve(RateCurveAxis.HOUR_OF_DAY, [(0.0, 0.0), (8.0, 0.0), (12.0, 1.0), (16.0, 0.0)])
    cols = _synth(curve, days=3.0, rate=1.0, seed=2)
    hour = cols.arrival_s / 3600.0 % 24
    assert len(cols) > 1000 and np.all((hour > 8.0) & (hour < 16.0))


def test_a_weekly_curve_gives_its_weekend_its_share() -> None:
    """hour_of_week 0 = Monday 00:00: Saturday and Sunday at a third of weekday traffic."""
    weekday, weekend = 3.0, 1.0
    points = [(0.0, weekday), (119.999, weekday), (120.0, weekend), (167.999, weekend)]
    curve = _curve(RateCurveAxis.HOUR_OF_WEEK, points)
    cols = _synth(curve, days=14.0, rate=0.5, seed=4)
    day = (cols.arrival_s // 86400.0).astype(np.int64) % 7
    per_day = np.bincount(day, minlength=7) / 2.0
    assert per_day[5:].mean() / per_day[:5].mean() == pytest.approx(weekend / weekday, rel=0.05)


# ----------------------------------------------------------------------------- lengths, seeds


def test_lengths_are_the_samples_pairs_resampled_together() -> None:
    cols = _synth(days=1.0, rate=0.5, seed=1)
    np.testing.assert_array_equal(cols.output_tokens, cols.input_tokens // 10 + 1)
    pairs = set(zip(cols.input_tokens.tolist(), cols.output_tokens.tolist(), strict=True))
    assert pairs == set(zip(SAMPLE_IN.tolist(), SAMPLE_OUT.tolist(), strict=True))
    counts = np.unique(cols.input_tokens, return_counts=True)[1]
    assert counts.min() > 0.8 * len(cols) / 10  # uniform over the sample's requests
    assert cols.prefix_hashes is None and cols.session_ids is None
    assert cols.acceptance_length is None


def test_a_seed_fixes_every_column_and_another_seed_changes_them() -> None:
    a, b = _synth(days=2.0, rate=1.0, seed=9), _synth(days=2.0, rate=1.0, seed=9)
    for name in ("arrival_s", "input_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    c = _synth(days=2.0, rate=1.0, seed=10)
    assert len(c) != len(a) or not np.array_equal(c.arrival_s, a.arrival_s)


def test_more_than_one_block_of_arrivals_joins_up_in_order() -> None:
    cols = _synth(days=1.0, rate=2.5 * _BLOCK / 86400.0, seed=0)
    assert len(cols) > 2 * _BLOCK
    assert np.all(np.diff(cols.arrival_s) >= 0)


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"days": 0.0}, "--days 0.0; expected a number of days in (0, 31]"),
        ({"days": -1.0}, "--days -1.0"),
        ({"days": MAX_DAYS + 1}, "--days 32.0; expected a number of days in (0, 31]"),
        ({"days": math.nan}, "--days nan"),
        ({"rate": 0.0}, "--mean-rate 0.0; expected requests/s > 0"),
        ({"rate": -2.0}, "--mean-rate -2.0"),
        ({"rate": math.inf}, "--mean-rate inf"),
        ({"seed": -1}, "--seed -1; expected an integer >= 0"),
    ],
)
def test_bad_requests_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(SynthesisError) as err:
        _synth(**kwargs)
    assert message in str(err.value)


def test_a_sample_of_nine_requests_is_refused() -> None:
    with pytest.raises(SynthesisError, match="the sample has 9 requests; expected at least 10"):
        synthesize(SAMPLE_IN[:9], SAMPLE_OUT[:9], curve=DIURNAL, days=1, mean_rate=1, seed=0)


def test_an_hour_curve_must_cover_the_span() -> None:
    short = _curve(RateCurveAxis.HOUR, [(0.0, 1.0), (100.0, 2.0)])
    with pytest.raises(SynthesisError, match="runs from hour 0 to 100; a 7-day trace needs"):
        _synth(short, days=7.0)
    late = _curve(RateCurveAxis.HOUR, [(1.0, 1.0), (200.0, 2.0)])
    with pytest.raises(SynthesisError, match="runs from hour 1 to 200"):
        _synth(late, days=7.0)


def test_a_curve_zero_over_the_span_is_refused() -> None:
    curve = _curve(RateCurveAxis.HOUR, [(0.0, 0.0), (24.0, 0.0), (48.0, 5.0)])
    with pytest.raises(SynthesisError, match="is 0 over the whole 1 days"):
        _synth(curve, days=1.0)


def test_more_requests_than_the_row_limit_are_refused_before_drawing() -> None:
    with pytest.raises(SynthesisError, match="is 604,800 requests; expected at most 1,000"):
        synthesize(
            SAMPLE_IN, SAMPLE_OUT, curve=DIURNAL, days=7, mean_rate=1, seed=0, max_requests=1000
        )


# ----------------------------------------------------------------------------- curve files


def test_curve_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "day.csv"
    path.write_text(format_rate_curve(DIURNAL))
    curve = read_rate_curve(path)
    assert curve == replace(DIURNAL, name="day.csv")
    # The same points draw the same trace.
    a, b = _synth(curve, days=1.0, seed=3), _synth(DIURNAL, days=1.0, seed=3)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)


def test_curve_file_comments_blank_lines_spaces_and_bom_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "week.csv"
    text = "\ufeff# a weekly shape\n\nhour_of_week, relative_rate\n 0 , 2\n# weekend\n120,1.5\n"
    path.write_text(text, encoding="utf-8")
    curve = read_rate_curve(path)
    assert curve.axis is RateCurveAxis.HOUR_OF_WEEK
    assert curve.hours == (0.0, 120.0) and curve.relative_rates == (2.0, 1.5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "c.csv: no header; expected a line '<hour_of_day | hour_of_week | hour>,"),
        ("# only a comment\n", "no header"),
        ("hour_of_day,relative_rate\n", "c.csv: a header and no points"),
        ("hours,rate\n0,1\n", "line 1: header 'hours,rate'; expected two columns, one of"),
        ("hour_of_day,relative_rate,x\n0,1\n", "line 1: header"),
        ("hour_of_day,relative_rate\n0,1\n5\n", "line 3: 1 fields; expected 2"),
        ("hour_of_day,relative_rate\n0,1,2\n", "line 2: 3 fields; expected 2"),
        ("hour_of_day,relative_rate\nnoon,1\n", "line 2: hour_of_day 'noon' is not a number"),
        ("hour_of_day,relative_rate\n0,lots\n", "line 2: relative_rate 'lots' is not a number"),
        ("hour_of_day,relative_rate\n0,nan\n", "line 2: relative_rate 'nan'; expected a finite"),
        ("hour_of_day,relative_rate\n0,-1\n", "line 2: relative_rate -1.0; expected a finite"),
        ("hour_of_day,relative_rate\n24,1\n", "line 2: hour_of_day 24.0; expected 0 <= hour < 24"),
        ("hour_of_week,relative_rate\n168,1\n", "expected 0 <= hour < 168"),
        ("hour,relative_rate\n-1,1\n", "line 2: hour -1.0; expected a finite hour >= 0"),
        (
            "hour_of_day,relative_rate\n0,1\n# c\n3,1\n3,2\n",
            "line 5: hour 3 is not after the previous point's hour 3; expected strictly",
        ),
        ("hour_of_day,relative_rate\n0,0\n12,0\n", "every relative rate is 0"),
    ],
)
def test_malformed_curve_files_say_where_and_what_was_expected(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "c.csv"
    path.write_text(text)
    with pytest.raises(RateCurveError) as err:
        read_rate_curve(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_missing_and_binary_curve_files(tmp_path: Path) -> None:
    with pytest.raises(RateCurveError, match="no such file; expected a rate curve CSV"):
        read_rate_curve(tmp_path / "nope.csv")
    bad = tmp_path / "bin.csv"
    bad.write_bytes(b"hour,relative_rate\n0,\xff\n")
    with pytest.raises(RateCurveError, match=r"not UTF-8 \(byte 21\)"):
        read_rate_curve(bad)


def test_a_curve_value_is_checked_as_a_file_is() -> None:
    unsorted = _curve(RateCurveAxis.HOUR_OF_DAY, [(5.0, 1.0), (2.0, 1.0)])
    with pytest.raises(RateCurveError, match="point 2 at hour 2 does not come after hour 5"):
        _synth(unsorted)
    ragged = RateCurve("r", RateCurveAxis.HOUR_OF_DAY, (0.0, 1.0), (1.0,))
    with pytest.raises(RateCurveError, match="2 hours but 1 relative rates"):
        _synth(ragged)
    assert parse_rate_curve("hour,relative_rate\n0,1\n", "x").name == "x"


def test_a_span_with_no_arrival_is_refused() -> None:
    with pytest.raises(SynthesisError, match="no request arrived in 1 days at 1e-09 req/s"):
        _synth(days=1.0, rate=1e-9)
