"""A strict parser of the Prometheus text exposition format (version 0.0.4).

This is what a vLLM server's `/metrics` page serves (through `prometheus_client`).
The core parses it itself: `prometheus_client` is not installed in this project, and
its parser is lenient where this one must not be (a truncated page or a duplicated
series should be an error naming the line, not a silently smaller number).

Read here: `# HELP` and `# TYPE` lines, other comments (ignored), and samples
`name{label="value",...} value [timestamp_ms]`. Label values take the escapes `\\\\`,
`\\"` and `\\n`; values take Go's float forms, `+Inf`, `-Inf` and `NaN`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum

from optimizer.telemetry.errors import ExpositionSyntaxError

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}

Labels = tuple[tuple[str, str], ...]  # (name, value) pairs, sorted by name


class MetricType(StrEnum):
    """A family's `# TYPE`, as the exposition format spells it."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    SUMMARY = "summary"
    UNTYPED = "untyped"


@dataclass(frozen=True, slots=True)
class Sample:
    """One line's series: its sample name (`..._bucket`, `..._total`), labels and value."""

    name: str
    labels: Labels
    value: float

    def label(self, name: str) -> str | None:
        for key, value in self.labels:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class Exposition:
    """A whole `/metrics` page: its samples in page order and its families' types."""

    samples: tuple[Sample, ...]
    types: tuple[tuple[str, MetricType], ...]  # (family name, type), in page order

    def type_of(self, family: str) -> MetricType | None:
        for name, kind in self.types:
            if name == family:
                return kind
        return None

    def named(self, name: str) -> tuple[Sample, ...]:
        return tuple(s for s in self.samples if s.name == name)


def parse_exposition(text: str, *, source: str = "the page") -> Exposition:
    """Parse a text-format page; `source` names it in errors (e.g. "BEFORE (a.prom)")."""
    samples: list[Sample] = []
    types: dict[str, MetricType] = {}
    seen: set[tuple[str, Labels]] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            _comment(line, types, source, number)
            continue
        sample = _sample(line, source, number)
        key = (sample.name, sample.labels)
        if key in seen:
            raise ExpositionSyntaxError(
                f"{source}, line {number}: the series {_show(sample)} appears twice; "
                "expected each series once per page"
            )
        seen.add(key)
        samples.append(sample)
    return Exposition(tuple(samples), tuple(types.items()))


def _show(sample: Sample) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sample.labels)
    return f"{sample.name}{{{inner}}}" if inner else sample.name


def _comment(line: str, types: dict[str, MetricType], source: str, number: int) -> None:
    parts = line[1:].split(None, 3)
    if len(parts) < 1 or parts[0] not in ("HELP", "TYPE"):
        return  # a free comment
    where = f"{source}, line {number}"
    if len(parts) < 2 or not _NAME.fullmatch(parts[1]):
        raise ExpositionSyntaxError(f"{where}: expected a metric name after # {parts[0]}")
    if parts[0] == "TYPE":
        if len(parts) != 3:
            raise ExpositionSyntaxError(f"{where}: expected '# TYPE <name> <type>'")
        try:
            kind = MetricType(parts[2])
        except ValueError:
            known = ", ".join(t.value for t in MetricType)
            raise ExpositionSyntaxError(
                f"{where}: unknown metric type {parts[2]!r}; expected one of {known}"
            ) from None
        if parts[1] in types:
            raise ExpositionSyntaxError(f"{where}: a second # TYPE line for {parts[1]}")
        types[parts[1]] = kind


def _sample(line: str, source: str, number: int) -> Sample:
    where = f"{source}, line {number}"
    match = _NAME.match(line)
    if match is None:
        raise ExpositionSyntaxError(f"{where}: expected a metric name, got {line[:40]!r}")
    name, pos = match.group(), match.end()
    labels: Labels = ()
    if pos < len(line) and line[pos] == "{":
        labels, pos = _labels(line, pos + 1, where)
    rest = line[pos:].split()
    if not 1 <= len(rest) <= 2 or (pos < len(line) and not line[pos].isspace()):
        raise ExpositionSyntaxError(
            f"{where}: expected '<name>{{labels}} <value> [timestamp]', got {line[:80]!r}"
        )
    return Sample(name, labels, _float(rest[0], where))


def _labels(line: str, pos: int, where: str) -> tuple[Labels, int]:
    pairs: dict[str, str] = {}
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return tuple(sorted(pairs.items())), pos + 1
        match = _LABEL_NAME.match(line, pos)
        if match is None or line[match.end() : match.end() + 2] != '="':
            raise ExpositionSyntaxError(f'{where}: expected label="value" at column {pos + 1}')
        key, pos = match.group(), match.end() + 2
        chars: list[str] = []
        while True:
            if pos >= len(line):
                raise ExpositionSyntaxError(f"{where}: label {key} has an unterminated value")
            char = line[pos]
            if char == "\\":
                escaped = line[pos + 1 : pos + 2]
                if escaped not in _ESCAPES:
                    raise ExpositionSyntaxError(
                        f"{where}: label {key}: unknown escape \\{escaped}; expected \\\\, "
                        '\\" or \\n'
                    )
                chars.append(_ESCAPES[escaped])
                pos += 2
            elif char == '"':
                pos += 1
                break
            else:
                chars.append(char)
                pos += 1
        if key in pairs:
            raise ExpositionSyntaxError(f"{where}: label {key} given twice")
        pairs[key] = "".join(chars)
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos >= len(line) or line[pos] != "}":
            raise ExpositionSyntaxError(f"{where}: expected ',' or '}}' after label {key}")


def _float(text: str, where: str) -> float:
    special = {"+inf": math.inf, "inf": math.inf, "-inf": -math.inf, "nan": math.nan}
    if text.lower() in special:
        return special[text.lower()]
    try:
        return float(text)
    except ValueError:
        raise ExpositionSyntaxError(f"{where}: expected a number, got {text!r}") from None
