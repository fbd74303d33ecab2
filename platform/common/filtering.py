"""Message filters: tag expressions and SQL92 expressions over message properties.

A subscription carries an expression and its type:

* ``TAG``: ``*`` (or empty) for all, else ``A || B || C``.  The broker matches the
  tag hash stored in the consume queue and re-checks the tag string; the client
  re-checks again (hashes collide).
* ``SQL92``: RocketMQ's SQL92 filter grammar: comparisons
  ``= <> > >= < <=``, ``[NOT] BETWEEN a AND b``, ``[NOT] IN ('a', 'b')``,
  ``IS [NOT] NULL``, ``AND OR NOT``, parentheses, literals ``'text'`` (``''`` escapes a
  quote), integers, decimals, ``TRUE FALSE NULL``, and the extensions
  ``[NOT] CONTAINS / STARTSWITH / ENDSWITH 'text'``.  Keywords are case-insensitive;
  property names are case-sensitive.

Semantics follow SQL's three-valued logic: a missing property, or a value that is
not a number where a number is compared, makes a comparison *unknown*; ``NOT
unknown`` is unknown; a message matches only when the whole expression is true.
Property values are strings, so a comparison with a numeric literal compares
numerically (``a > 5`` matches ``a='10'``), and with ``TRUE``/``FALSE`` compares
case-insensitively with ``'true'``/``'false'``.

The grammar is parsed with lark (LALR) once per subscription and compiled to a tree
of closures, so evaluating a message costs a handful of Python calls.  A malformed
expression raises ``FILTER_EXPRESSION_ILLEGAL`` with the line, column and position.
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from .codec import tag_hash
from .errors import ErrorCode, SparkMQError

__all__ = [
    "FILTER_TAG",
    "FILTER_SQL92",
    "FILTER_TYPES",
    "MessageFilter",
    "TagFilter",
    "SqlFilter",
    "compile_filter",
    "parse_tags",
]

FILTER_TAG = "TAG"
FILTER_SQL92 = "SQL92"
FILTER_TYPES = (FILTER_TAG, FILTER_SQL92)
#: Longest expression accepted (a guard against pathological subscriptions).
MAX_EXPRESSION_LENGTH = 4096

Props = Mapping[str, str]
#: A compiled node: properties → True, False or None (unknown).
Node = Callable[[Props], Any]


def _illegal(message: str) -> SparkMQError:
    return SparkMQError(ErrorCode.FILTER_EXPRESSION_ILLEGAL, message)


class MessageFilter:
    """What a pull or a consumer asks of each message."""

    #: Tag hashes to match in the consume queue first; None = no hash pre-filter.
    tag_hashes: frozenset[int] | None = None

    def matches(self, properties: Props) -> bool:
        """Whether a message with these properties is delivered."""
        raise NotImplementedError


# -- tags -------------------------------------------------------------------------------

def parse_tags(expression: str | None) -> frozenset[str] | None:
    """The tags of ``A || B`` (None for ``*`` or empty = every message).

    Example::

        >>> sorted(parse_tags("TagA || TagB"))
        ['TagA', 'TagB']
        >>> parse_tags("*") is None
        True
    """
    if expression is None:
        return None
    if not isinstance(expression, str):
        raise _illegal(f"a tag expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if text in ("", "*"):
        return None
    tags = [t.strip() for t in text.split("||")]
    for i, tag in enumerate(tags):
        if not tag:
            raise _illegal(f"tag expression {expression!r}: empty tag at position {i} (write 'A || B')")
        if tag == "*":
            raise _illegal(f"tag expression {expression!r}: '*' cannot be combined with other tags")
    return frozenset(tags)


@dataclass(frozen=True)
class TagFilter(MessageFilter):
    """Deliver messages whose tag is one of ``tags`` (None = all)."""

    tags: frozenset[str] | None
    expression: str = "*"

    @property
    def tag_hashes(self) -> frozenset[int] | None:  # type: ignore[override]
        """Hashes of ``tags`` for the consume-queue pre-filter."""
        return None if self.tags is None else frozenset(tag_hash(t) for t in self.tags)

    def matches(self, properties: Props) -> bool:
        """The string re-check after the hash matched."""
        return self.tags is None or properties.get("TAGS") in self.tags


# -- SQL92 ------------------------------------------------------------------------------

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*          -> or_
?and_expr: not_expr (_AND not_expr)*        -> and_
?not_expr: _NOT not_expr                    -> not_
         | predicate
?predicate: value COMPARE value             -> compare
          | value _BETWEEN value _AND value -> between
          | value _NOT _BETWEEN value _AND value -> not_between
          | value _IN "(" literal ("," literal)* ")"      -> in_
          | value _NOT _IN "(" literal ("," literal)* ")" -> not_in
          | value _IS _NULL                 -> is_null
          | value _IS _NOT _NULL            -> is_not_null
          | value STRING_OP value           -> string_op
          | value _NOT STRING_OP value      -> not_string_op
          | "(" or_expr ")"
          | boolean
?value: IDENT -> prop
      | literal
?literal: STRING -> string
        | NUMBER -> number
        | boolean
        | _NULL  -> null
boolean: TRUE | FALSE

COMPARE: "<>" | ">=" | "<=" | "=" | ">" | "<"
STRING_OP.2: /(?i:contains|startswith|endswith)\b/
_OR.2: /(?i:or)\b/
_AND.2: /(?i:and)\b/
_NOT.2: /(?i:not)\b/
_BETWEEN.2: /(?i:between)\b/
_IN.2: /(?i:in)\b/
_IS.2: /(?i:is)\b/
_NULL.2: /(?i:null)\b/
TRUE.2: /(?i:true)\b/
FALSE.2: /(?i:false)\b/
IDENT: /[A-Za-z_$][A-Za-z0-9_.$]*/
STRING: /'(?:[^']|'')*'/
NUMBER: /[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?/

%import common.WS
%ignore WS
"""


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(_GRAMMAR, parser="lalr", propagate_positions=False, maybe_placeholders=False)


class _Prop(str):
    """A property reference (a str subclass so the transformer can tell it from a literal)."""


class _Null:
    """The NULL literal."""


_NULL = _Null()

_NUMERIC_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def _to_number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value else None  # NaN compares with nothing


def _operand(value: Any) -> Node:
    """A node yielding the raw operand: a property's string (or None), or a literal."""
    if isinstance(value, _Prop):
        name = str(value)
        return lambda props: props.get(name)
    if value is _NULL:
        return lambda props: None
    return _constant(value)


def _constant(value: Any) -> Node:
    """A node yielding ``value`` whatever the properties."""
    return lambda props: value


def _compare(op: str, left: Any, right: Any) -> Node:
    """A comparison node with the coercions described in the module docstring."""
    fn = _NUMERIC_OPS[op]
    lnode, rnode = _operand(left), _operand(right)

    def node(props: Props) -> bool | None:
        a, b = lnode(props), rnode(props)
        if a is None or b is None:
            return None
        if isinstance(a, bool) or isinstance(b, bool):
            if op not in ("=", "<>"):
                return None
            a = a if isinstance(a, bool) else {"true": True, "false": False}.get(str(a).lower())
            b = b if isinstance(b, bool) else {"true": True, "false": False}.get(str(b).lower())
            return None if a is None or b is None else fn(a, b)
        if isinstance(a, str) and isinstance(b, str):
            if op in ("=", "<>"):
                return fn(a, b)
            a, b = _to_number(a), _to_number(b)
        elif isinstance(a, str):
            a = _to_number(a)
        elif isinstance(b, str):
            b = _to_number(b)
        if a is None or b is None:
            return None
        return fn(a, b)

    return node


def _and(left: Node, right: Node) -> Node:
    def node(props: Props) -> bool | None:
        a = left(props)
        if a is False:
            return False
        b = right(props)
        if b is False:
            return False
        return None if a is None or b is None else True
    return node


def _or(left: Node, right: Node) -> Node:
    def node(props: Props) -> bool | None:
        a = left(props)
        if a is True:
            return True
        b = right(props)
        if b is True:
            return True
        return None if a is None or b is None else False
    return node


def _not(inner: Node) -> Node:
    def node(props: Props) -> bool | None:
        value = inner(props)
        return None if value is None else not value
    return node


def _as_condition(value: Any) -> Node:
    """A bare operand used as a condition: TRUE/FALSE literals, or a property holding 'true'/'false'."""
    if isinstance(value, bool):
        return _constant(value)
    if isinstance(value, _Prop):
        name = str(value)
        return lambda props: {"true": True, "false": False}.get((props.get(name) or "").lower())
    raise _illegal(f"{_describe(value)} is not a condition")


def _describe(value: Any) -> str:
    if isinstance(value, _Prop):
        return f"property {str(value)!r}"
    if value is _NULL:
        return "NULL"
    return f"literal {value!r}"


@v_args(inline=True)
class _Compiler(Transformer):
    """Turns the parse tree into closures, checking operand types where the grammar cannot."""

    def string(self, token: Token) -> str:
        return str(token)[1:-1].replace("''", "'")

    def number(self, token: Token) -> int | float:
        value = _to_number(str(token))
        if value is None:
            raise _illegal(f"bad number {str(token)!r}")
        return value

    def boolean(self, token: Token) -> bool:
        return str(token).lower() == "true"

    def null(self) -> _Null:
        return _NULL

    def prop(self, token: Token) -> _Prop:
        return _Prop(str(token))

    def compare(self, left: Any, op: Token, right: Any) -> Node:
        if left is _NULL or right is _NULL:
            raise _illegal(f"compare with NULL using IS NULL / IS NOT NULL, not {str(op)!r}")
        if isinstance(left, str) and not isinstance(left, _Prop) and isinstance(right, str) \
                and not isinstance(right, _Prop) and str(op) not in ("=", "<>"):
            raise _illegal(f"{str(op)!r} needs numbers, got two strings")
        return _compare(str(op), left, right)

    def between(self, value: Any, low: Any, high: Any) -> Node:
        for bound in (low, high):
            if isinstance(bound, bool) or not isinstance(bound, int | float | _Prop):
                raise _illegal(f"BETWEEN needs numeric bounds, got {_describe(bound)}")
        return _and(_compare(">=", value, low), _compare("<=", value, high))

    def not_between(self, value: Any, low: Any, high: Any) -> Node:
        return _not(self.between(value, low, high))

    def in_(self, value: Any, *items: Any) -> Node:
        if not isinstance(value, _Prop):
            raise _illegal(f"IN needs a property on its left, got {_describe(value)}")
        if any(item is _NULL or isinstance(item, bool) for item in items):
            raise _illegal("IN lists hold strings or numbers")
        wanted = frozenset(str(i) if isinstance(i, str) else _canonical_number(i) for i in items)
        numeric = any(not isinstance(i, str) for i in items)
        name = str(value)

        def node(props: Props) -> bool | None:
            got = props.get(name)
            if got is None:
                return None
            if got in wanted:
                return True
            if numeric:
                number = _to_number(got)
                return number is not None and _canonical_number(number) in wanted
            return False
        return node

    def not_in(self, value: Any, *items: Any) -> Node:
        return _not(self.in_(value, *items))

    def is_null(self, value: Any) -> Node:
        operand = _operand(value)
        return lambda props: operand(props) is None

    def is_not_null(self, value: Any) -> Node:
        operand = _operand(value)
        return lambda props: operand(props) is not None

    def string_op(self, value: Any, op: Token, pattern: Any) -> Node:
        if not isinstance(pattern, str) or isinstance(pattern, _Prop):
            raise _illegal(f"{str(op).upper()} needs a string literal on its right, got {_describe(pattern)}")
        method = {"contains": str.__contains__, "startswith": str.startswith,
                  "endswith": str.endswith}[str(op).lower()]
        operand = _operand(value)

        def node(props: Props) -> bool | None:
            got = operand(props)
            return None if got is None else method(str(got), pattern)
        return node

    def not_string_op(self, value: Any, op: Token, pattern: Any) -> Node:
        return _not(self.string_op(value, op, pattern))

    def and_(self, *parts: Any) -> Node:
        nodes = [p if callable(p) else _as_condition(p) for p in parts]
        return functools.reduce(_and, nodes)

    def or_(self, *parts: Any) -> Node:
        nodes = [p if callable(p) else _as_condition(p) for p in parts]
        return functools.reduce(_or, nodes)

    def not_(self, inner: Any) -> Node:
        return _not(inner if callable(inner) else _as_condition(inner))


def _canonical_number(value: int | float) -> str:
    # 5 and 5.0 are the same member of an IN list.
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def _position_message(expression: str, exc: UnexpectedInput) -> str:
    pos = getattr(exc, "pos_in_stream", None)
    if isinstance(exc, UnexpectedEOF) or pos is None:
        pos = len(expression)
    line, column = getattr(exc, "line", 1), getattr(exc, "column", pos + 1)
    if isinstance(exc, UnexpectedCharacters):
        what = f"unexpected character {expression[pos]!r}"
    elif isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        what = f"unexpected {str(exc.token)!r}"
    else:
        what = "unexpected end of expression"
        pos = len(expression)
        line, column = expression.count("\n") + 1, len(expression.rsplit("\n", 1)[-1]) + 1
    caret = expression + "\n" + " " * pos + "^"
    return f"{what} at line {line} column {column} (position {pos}):\n{caret}"


@dataclass(frozen=True)
class SqlFilter(MessageFilter):
    """A compiled SQL92 expression over message properties."""

    expression: str
    _node: Node

    @classmethod
    def compile(cls, expression: str) -> SqlFilter:
        """Parse and compile ``expression``; FILTER_EXPRESSION_ILLEGAL with the error's position.

        Example::

            >>> f = SqlFilter.compile("a > 5 AND region IN ('eu', 'us')")
            >>> f.matches({"a": "10", "region": "eu"}), f.matches({"a": "3", "region": "eu"})
            (True, False)
        """
        if not isinstance(expression, str) or not expression.strip():
            raise _illegal("an SQL92 expression must be a non-empty string")
        if len(expression) > MAX_EXPRESSION_LENGTH:
            raise _illegal(f"the expression is {len(expression)} characters, the limit is {MAX_EXPRESSION_LENGTH}")
        try:
            tree = _parser().parse(expression)
        except UnexpectedInput as exc:
            raise _illegal(_position_message(expression, exc)) from None
        try:
            compiled = _Compiler().transform(tree)
        except VisitError as exc:
            if isinstance(exc.orig_exc, SparkMQError):
                raise exc.orig_exc from None
            raise
        node = compiled if callable(compiled) else _as_condition(compiled)
        return cls(expression, node)

    def evaluate(self, properties: Props) -> bool | None:
        """The three-valued result: True, False or None (unknown)."""
        return self._node(properties)

    def matches(self, properties: Props) -> bool:
        """Whether the expression is true for these properties."""
        return self._node(properties) is True


def compile_filter(expression: str | None, filter_type: str = FILTER_TAG) -> MessageFilter:
    """The filter for a subscription; FILTER_EXPRESSION_ILLEGAL for bad expressions or types.

    Example::

        >>> compile_filter("A || B").matches({"TAGS": "B"})
        True
    """
    kind = (filter_type or FILTER_TAG).upper()
    if kind == FILTER_TAG:
        return TagFilter(parse_tags(expression), expression or "*")
    if kind == FILTER_SQL92:
        return SqlFilter.compile(expression or "")
    raise _illegal(f"unknown filter type {filter_type!r}; use one of {', '.join(FILTER_TYPES)}")
