"""optimizer.plain: the strict round trip, and each refusal naming its dotted path."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pytest

from optimizer.plain import PlainDataError, from_plain, to_plain


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Leaf:
    n: int
    x: float = 0.0


@dataclass(frozen=True)
class Node:
    name: str
    colour: Colour
    on: bool
    leaves: tuple[Leaf, ...] = ()
    pair: tuple[int, str] = (0, "")
    extra: Mapping[str, Any] = field(default_factory=dict)
    anything: Any = None
    child: Node | None = None  # a class holding its own type
    size: int = field(init=False, default=0)  # derived: written, ignored when read


GOOD = {
    "name": "root", "colour": "red", "on": True,
    "leaves": [{"n": 1, "x": 2.5}, {"n": 2, "x": None}], "pair": [3, "c"],
    "extra": {"k": [1]}, "anything": {"a": 1}, "size": 9,
    "child": {"name": "kid", "colour": "blue", "on": False, "child": None},
}  # fmt: skip


def test_a_document_reads_back_as_it_was_written() -> None:
    node = from_plain(Node, GOOD, "node")
    assert node.leaves[0] == Leaf(1, 2.5)
    assert node.leaves[1].n == 2 and math.isnan(node.leaves[1].x)  # null: NaN
    assert node.colour is Colour.RED and node.pair == (3, "c") and node.size == 0
    assert node.extra == {"k": [1]} and node.anything == {"a": 1}
    assert node.child == Node("kid", Colour.BLUE, False)
    assert to_plain(node) == {**GOOD, "size": 0, "child": {**to_plain(node.child)}}
    assert to_plain(from_plain(Node, to_plain(node), "node")) == to_plain(node)
    assert from_plain(Leaf, {"n": 4, "x": 1}, "leaf").x == 1.0  # an int is a number


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "green"}, "node.colour: expected one of ['red', 'blue'], got 'green'"),
        ({"on": 1}, "node.on: expected a bool, got int 1"),
        ({"name": 5}, "node.name: expected a string, got int 5"),
        ({"leaves": {"n": 1}}, "node.leaves: expected a list, got dict {'n': 1}"),
        ({"leaves": [{"n": 1}, {"n": True}]}, "node.leaves[1].n: expected an int, got bool True"),
        ({"leaves": [{"n": 1, "x": "2"}]}, "node.leaves[0].x: expected a number, got str '2'"),
        ({"leaves": [{"m": 1}]}, "node.leaves[0]: unknown keys ['m']; expected some of ['n', 'x']"),
        ({"leaves": [5]}, "node.leaves[0]: expected a mapping, got int 5"),
        ({"pair": [1]}, "node.pair: expected 2 values, got 1"),
        ({"pair": [1, 2]}, "node.pair[1]: expected a string, got int 2"),
        ({"extra": [1]}, "node.extra: expected a mapping, got list [1]"),
        ({"child": {"name": "k", "colour": "red", "on": 0}},
         "node.child.on: expected a bool, got int 0"),
        ({"child": {"name": "k", "colour": "red"}},
         "node.child: Node.__init__() missing 1 required positional argument: 'on'"),
    ],
)  # fmt: skip
def test_each_refusal_names_where_and_what(change: dict, message: str) -> None:
    with pytest.raises(PlainDataError) as err:
        from_plain(Node, {**GOOD, **change}, "node")
    assert str(err.value) == message
