"""Tag and SQL92 filters: parsing, errors with positions, and a property-based check
against an independent reference evaluator of the same expression trees."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkmq.platform.common.codec import tag_hash
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.filtering import SqlFilter, TagFilter, compile_filter, parse_tags

# -- tags -------------------------------------------------------------------------------------


def test_tag_expressions() -> None:
    assert parse_tags("*") is None and parse_tags("") is None and parse_tags(None) is None
    assert parse_tags(" A || B ||C ") == {"A", "B", "C"}
    f = compile_filter("A || B")
    assert isinstance(f, TagFilter) and f.tag_hashes == {tag_hash("A"), tag_hash("B")}
    assert f.matches({"TAGS": "A"}) and not f.matches({"TAGS": "C"}) and not f.matches({})
    assert compile_filter("*").matches({}) and compile_filter("*").tag_hashes is None


@pytest.mark.parametrize("bad", ["A ||", "|| A", "A |||| B", "* || A"])
def test_bad_tag_expressions(bad: str) -> None:
    with pytest.raises(SparkMQError) as err:
        parse_tags(bad)
    assert err.value.code is ErrorCode.FILTER_EXPRESSION_ILLEGAL


def test_unknown_filter_type() -> None:
    with pytest.raises(SparkMQError, match="unknown filter type 'REGEX'"):
        compile_filter("a", "REGEX")


# -- SQL92: fixed cases -----------------------------------------------------------------------

MSG = {"a": "10", "b": "2.5", "region": "eu-west", "flag": "TRUE", "name": "O'Brien", "TAGS": "TagA"}


@pytest.mark.parametrize("expression, expected", [
    ("a > 5", True), ("a >= 10 AND a <= 10", True), ("a = 10.0", True), ("a <> 10", False),
    ("b < 3", True), ("b BETWEEN 2 AND 3", True), ("b NOT BETWEEN 2 AND 3", False),
    ("region = 'eu-west'", True), ("region IN ('us', 'eu-west')", True), ("region NOT IN ('us')", True),
    ("a IN (1, 10)", True), ("missing IS NULL", True), ("a IS NOT NULL", True),
    ("region STARTSWITH 'eu'", True), ("region ENDSWITH 'west'", True), ("region CONTAINS 'u-w'", True),
    ("region NOT CONTAINS 'x'", True), ("flag = true", True), ("flag = FALSE", False),
    ("name = 'O''Brien'", True), ("TAGS = 'TagA'", True),
    ("missing > 1", None), ("NOT missing > 1", None), ("missing > 1 OR a > 5", True),
    ("missing > 1 AND a > 5", None), ("missing > 1 AND a < 5", False), ("region > 3", None),
    ("(a > 5 OR b > 5) AND NOT (region = 'us')", True), ("TRUE", True), ("NOT FALSE", True),
    ("a between 1 and 3 or region is not null", True),
])
def test_sql_semantics(expression: str, expected: bool | None) -> None:
    f = SqlFilter.compile(expression)
    assert f.evaluate(MSG) is expected
    assert f.matches(MSG) is (expected is True)


@pytest.mark.parametrize("expression, fragment", [
    ("a >< 3", "unexpected '<' at line 1 column 4 (position 3)"),
    ("a = ", "unexpected end of expression at line 1 column 5 (position 4)"),
    ("(a = 1", "unexpected end of expression"),
    ("a = 1 AND", "unexpected end of expression"),
    ("a # 1", "unexpected character '#' at line 1 column 3 (position 2)"),
    ("a = NULL", "IS NULL"),
    ("a BETWEEN 'x' AND 'y'", "BETWEEN needs numeric bounds"),
    ("'x' > 'y'", "needs numbers"),
    ("a CONTAINS b", "needs a string literal"),
    ("a IN (TRUE)", "IN lists hold strings or numbers"),
    ("", "non-empty"),
    ("a = 1" + " OR a = 1" * 600, "the limit is 4096"),
])
def test_bad_sql_is_refused_with_a_position(expression: str, fragment: str) -> None:
    with pytest.raises(SparkMQError) as err:
        SqlFilter.compile(expression)
    assert err.value.code is ErrorCode.FILTER_EXPRESSION_ILLEGAL
    assert fragment in err.value.message


# -- SQL92: property-based against a reference evaluator --------------------------------------
# Expressions are generated as small trees, rendered to text, and evaluated by the
# reference below, which implements the documented semantics directly on the tree.

PROPS = ["a", "b", "c"]
STRINGS = ["x", "y", "xy", "10", "3"]


@dataclass(frozen=True)
class Cmp:
    prop: str
    op: str
    value: Any  # int or str


@dataclass(frozen=True)
class Between:
    prop: str
    low: int
    high: int
    negated: bool


@dataclass(frozen=True)
class In:
    prop: str
    items: tuple[str, ...]
    negated: bool


@dataclass(frozen=True)
class IsNull:
    prop: str
    negated: bool


@dataclass(frozen=True)
class StrOp:
    prop: str
    op: str
    value: str


@dataclass(frozen=True)
class Bool:
    op: str  # AND / OR / NOT
    parts: tuple[Any, ...]


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def reference(node: Any, msg: dict[str, str]) -> bool | None:
    """Three-valued evaluation of a generated tree, written independently of the compiler."""
    if isinstance(node, Cmp):
        got = msg.get(node.prop)
        if got is None:
            return None
        if isinstance(node.value, str):
            if node.op == "=":
                return got == node.value
            if node.op == "<>":
                return got != node.value
            raise AssertionError("generator only makes = / <> for strings")
        number = _num(got)
        if number is None:
            return None
        return {"=": number == node.value, "<>": number != node.value, ">": number > node.value,
                ">=": number >= node.value, "<": number < node.value, "<=": number <= node.value}[node.op]
    if isinstance(node, Between):
        number = _num(msg.get(node.prop))
        result = None if number is None else node.low <= number <= node.high
        return None if result is None else (result != node.negated)
    if isinstance(node, In):
        got = msg.get(node.prop)
        return None if got is None else ((got in node.items) != node.negated)
    if isinstance(node, IsNull):
        return (msg.get(node.prop) is None) != node.negated
    if isinstance(node, StrOp):
        got = msg.get(node.prop)
        if got is None:
            return None
        return {"CONTAINS": node.value in got, "STARTSWITH": got.startswith(node.value),
                "ENDSWITH": got.endswith(node.value)}[node.op]
    values = [reference(p, msg) for p in node.parts]
    if node.op == "NOT":
        return None if values[0] is None else not values[0]
    if node.op == "AND":
        return False if False in values else (None if None in values else True)
    return True if True in values else (None if None in values else False)


def render(node: Any) -> str:
    if isinstance(node, Cmp):
        value = f"'{node.value}'" if isinstance(node.value, str) else str(node.value)
        return f"{node.prop} {node.op} {value}"
    if isinstance(node, Between):
        return f"{node.prop} {'NOT ' if node.negated else ''}BETWEEN {node.low} AND {node.high}"
    if isinstance(node, In):
        return f"{node.prop} {'not ' if node.negated else ''}in ({', '.join(repr(i) for i in node.items)})"
    if isinstance(node, IsNull):
        return f"{node.prop} IS {'NOT ' if node.negated else ''}NULL"
    if isinstance(node, StrOp):
        return f"{node.prop} {node.op.lower()} '{node.value}'"
    if node.op == "NOT":
        return f"NOT ({render(node.parts[0])})"
    return "(" + f" {node.op} ".join(render(p) for p in node.parts) + ")"


props = st.sampled_from(PROPS)
leaves = st.one_of(
    st.builds(Cmp, props, st.sampled_from(["=", "<>", ">", ">=", "<", "<="]), st.integers(-5, 15)),
    st.builds(Cmp, props, st.sampled_from(["=", "<>"]), st.sampled_from(STRINGS)),
    st.builds(lambda p, lo, span, neg: Between(p, lo, lo + span, neg), props, st.integers(-5, 10),
              st.integers(0, 8), st.booleans()),
    st.builds(In, props, st.lists(st.sampled_from(STRINGS), min_size=1, max_size=3).map(tuple), st.booleans()),
    st.builds(IsNull, props, st.booleans()),
    st.builds(StrOp, props, st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]), st.sampled_from(STRINGS)),
)
trees = st.recursive(leaves, lambda inner: st.one_of(
    st.builds(lambda p: Bool("NOT", (p,)), inner),
    st.builds(lambda ps: Bool("AND", tuple(ps)), st.lists(inner, min_size=2, max_size=3)),
    st.builds(lambda ps: Bool("OR", tuple(ps)), st.lists(inner, min_size=2, max_size=3)),
), max_leaves=8)
values = st.one_of(st.integers(-6, 16).map(str), st.sampled_from(STRINGS), st.just("2.5"))
messages = st.dictionaries(props, values, max_size=3)


@settings(max_examples=400, deadline=None)
@given(tree=trees, batch=st.lists(messages, min_size=1, max_size=20))
def test_compiled_filter_agrees_with_the_reference(tree: Any, batch: list[dict[str, str]]) -> None:
    compiled = SqlFilter.compile(render(tree))
    for msg in batch:
        assert compiled.evaluate(msg) is reference(tree, msg), (render(tree), msg)
