"""A statement's rows bound (``engine.session._bind_rows``): rows of one positional
parameter each (psycopg's multi-row INSERT, 1000 rows of one ``$n``) are bound without a
``_bind`` call a value and only once per statement, with the values and errors that
binding each value gives (docs/durable_produce.md, round 21)."""

from __future__ import annotations

from typing import Any

import pytest

from engine import session as session_module
from engine.session import Session, _bind, _bind_rows
from grammar import ast
from storage.errors import InvalidParameterValueError

ROWS = 1000


@pytest.fixture
def bind_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many values ``_bind`` bound (the way every value was bound before)."""
    calls = [0]
    bind = session_module._bind

    def counting(value: Any, parameters: Any) -> Any:
        calls[0] += 1
        return bind(value, parameters)

    monkeypatch.setattr(session_module, "_bind", counting)
    return calls


@pytest.mark.parametrize("rows", [ROWS, 9])  # the usual way, and append_plain's combiner
def test_rows_of_one_parameter_are_bound_without_a_call_a_value(
    session: Session, bind_calls: list[int], rows: int
) -> None:
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 1)")
    text = "INSERT INTO TOPIC t (data) VALUES " + ", ".join(f"(${i})" for i in range(1, rows + 1))
    values = [b"m%d" % i for i in range(rows)]
    assert session.execute(text, values)[-1].tag == f"INSERT 0 {rows}"
    assert bind_calls[0] == 0  # was 2 a value for 1000 rows (bound twice), 1 for 9
    table = session.execute("SELECT data FROM TOPIC t")[-1].table
    assert table.column("data").to_pylist() == values


P = ast.Parameter
MANY = [(P(i),) for i in range(1, 21)]  # past _BIND_ROWS_LOOP_MAX: the C loops


@pytest.mark.parametrize("rows, parameters", [
    ([(P(1),), (P(2),), (P(3),)], [b"a", "b", None]),
    ([(P(2),), (P(1),), (P(2),)], (b"a", b"b")),  # out of order, repeated, a tuple
    ([(P(1),), ("literal",), (None,)], [b"a"]),  # literals between parameters
    ([(P(1), "k"), (P(2), P(1))], [b"a", b"b"]),  # two columns
    ([(P(1),), (P(2),)], {"1": b"a", "2": b"b"}),  # named
    ([("x",), ("y",)], None),  # no parameters at all
    ([(P(3),)], [b"a", b"b", b"c", b"d"]),  # more parameters than used
    ([], [b"a"]),
    (MANY, [b"%d" % i for i in range(20)]),
    (MANY[::-1] + MANY, tuple(str(i) for i in range(25))),
    ([*MANY, ("literal",)], [b"%d" % i for i in range(20)]),
    ([*MANY, (P(1), P(2))], [b"%d" % i for i in range(20)]),
    (MANY, {str(i): b"%d" % i for i in range(1, 21)}),
])  # fmt: skip
def test_the_same_values_as_binding_each_value(rows: list[tuple[Any, ...]], parameters: Any
                                               ) -> None:  # fmt: skip
    assert _bind_rows(rows, parameters) == [tuple(_bind(v, parameters) for v in row)
                                            for row in rows]  # fmt: skip


@pytest.mark.parametrize("rows, parameters", [
    ([(P(1),), (P(3),)], [b"a", b"b"]),  # $3 of two
    ([(P(1),)], None),
    ([(P(1),), (P(2),)], {"1": b"a"}),
    (MANY, [b"a"] * 19),  # $20 of 19, in the C loops
])  # fmt: skip
def test_a_missing_parameter_is_the_same_error(rows: list[tuple[Any, ...]], parameters: Any
                                               ) -> None:  # fmt: skip
    with pytest.raises(InvalidParameterValueError) as expected:
        [tuple(_bind(v, parameters) for v in row) for row in rows]
    with pytest.raises(InvalidParameterValueError) as got:
        _bind_rows(rows, parameters)
    assert str(got.value) == str(expected.value)
