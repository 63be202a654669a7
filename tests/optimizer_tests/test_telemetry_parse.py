"""The Prometheus text parser: what it reads, and the lines it refuses (with where)."""

from __future__ import annotations

import math

import pytest

from optimizer.telemetry import ExpositionSyntaxError, parse_exposition
from optimizer.telemetry.exposition import MetricType

PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# a free comment
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 12.0 1700000000000
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5e0
odd{path="a\\\\b \\"q\\"\\nz" , kind="x",} NaN

plain_total -Inf
"""


def test_reads_samples_labels_types_and_specials() -> None:
    page = parse_exposition(PAGE)
    assert [s.name for s in page.samples] == [
        "vllm:num_requests_running",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_sum",
        "odd",
        "plain_total",
    ]
    assert page.type_of("vllm:num_requests_running") is MetricType.GAUGE
    assert page.type_of("vllm:time_to_first_token_seconds") is MetricType.HISTOGRAM
    assert page.type_of("plain") is None
    running = page.samples[0]
    assert running.value == 3.0 and running.labels == (("engine", "0"), ("model_name", "m"))
    inf_bucket = page.samples[2]
    assert inf_bucket.label("le") == "+Inf" and inf_bucket.value == 12.0  # timestamp dropped
    assert page.samples[3].value == 1.5
    odd = page.samples[4]
    assert odd.label("path") == 'a\\b "q"\nz' and odd.label("kind") == "x"
    assert math.isnan(odd.value)
    assert page.samples[5].value == -math.inf


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ok 1\nok 2\n", "line 2: the series ok appears twice"),
        ('a{x="1"} 1\na{x="1"} 2\n', 'line 2: the series a{x="1"} appears twice'),
        ("ok 1\nvllm:x one\n", "line 2: expected a number, got 'one'"),
        ("ok 1\n9bad 1\n", "line 2: expected a metric name"),
        ('a{x="1} 1\n', "line 1: label x has an unterminated value"),
        ('a{x="\\t"} 1\n', "line 1: label x: unknown escape \\t"),
        ('a{x="1" y="2"} 1\n', "line 1: expected ',' or '}' after label x"),
        ('a{x="1",x="2"} 1\n', "line 1: label x given twice"),
        ("a{x=1} 1\n", 'line 1: expected label="value"'),
        ("a 1 2 3\n", "line 1: expected '<name>{labels} <value> [timestamp]'"),
        ("a\n", "line 1: expected '<name>{labels} <value> [timestamp]'"),
        ("# TYPE a colour\n", "line 1: unknown metric type 'colour'"),
        ("# TYPE a gauge\n# TYPE a gauge\n", "line 2: a second # TYPE line for a"),
        ("# TYPE\n", "line 1: expected a metric name after # TYPE"),
    ],
)
def test_refuses_malformed_lines_naming_the_line(text: str, expected: str) -> None:
    with pytest.raises(ExpositionSyntaxError) as info:
        parse_exposition(text, source="AFTER (a.prom)")
    assert str(info.value).startswith("AFTER (a.prom), line ")
    assert expected in str(info.value)
