"""How much work DuckDB's predicate rewrites may be handed for one statement.

Two passes of DuckDB's optimizer take time quadratic in a statement's predicates, and
neither stops for an interrupt, so ``statement_timeout`` cannot end them (round 27,
DuckDB 2.0.1, embedded ``PREPARE``, thread CPU, a 10-row table):

- The expression rewriter's distributivity rule, on an OR whose disjuncts are
  conjunctions: ``(a = 0 AND b = 0) OR (a = 1 AND b = 1) OR …`` 500 / 1,000 / 2,000
  disjuncts 0.35 / 1.4 / 7.5 s (three columns a disjunct: 0.56 / 2.6 / 12 s), the same in
  HAVING, in a JOIN's ON, in a subquery, under nested parentheses, and when the disjuncts
  are boolean columns of a subquery's SELECT list that each hold a conjunction.
- Filter pushdown and its filter combiner, on the conjuncts of a statement's filters that
  are not plain comparisons: ``a <> 0 AND a <> 1 AND …`` 500 / 1,000 / 2,000: 0.22 / 0.88
  / 3.3 s; the same for ``NOT (a = i)``, ``IS DISTINCT FROM``, ``NOT IN (…)``, ``NOT
  BETWEEN``, ``LIKE`` and ``NOT LIKE``, ``IN (…)``, boolean function calls
  (``contains``, ``starts_with``: 3.4 s at 1,000), conjuncts that are ORs, and
  ``NOT (a = 0 OR a = 1 …)`` (DeMorgan's conjuncts); filters of nested subqueries and of
  a chain of CTEs are pushed into one scan and combine (250 CTEs each ``WHERE a <> i``:
  0.28 s, 500: 1.5 s).

Cheap, never counted: comparisons ``=``, ``<``, ``>``, ``<=``, ``>=`` (merged into ranges:
8,000 ``a = i OR …`` 0.1 s, 2,000 ``a > i AND …`` 0.05 s), ``IS [NOT] NULL``, ``BETWEEN``,
one ``IN`` list of any length (one conjunct), and an OR that is not a conjunct of filters.

Two counts per statement, each with a linear upper bound from DuckDB's tokens that most
statements end at, and an exact count on sqlglot's tree past it:

- ``disjunct_terms``: an OR tree's conjunction terms (nested ORs and parentheses
  flattened): an AND disjunct counts its conjuncts, a disjunct that is a bare column
  reference (or a function of columns with no comparison: ``NOT c``, ``c IS TRUE``)
  counts the largest conjunction of the statement (it may be a SELECT item DuckDB puts in
  its place). Several OR trees count as the root of the sum of their squares: one tree of
  that many terms takes as long as all of them (4 trees of 1,000 terms 1.7 s, one of
  2,000 1.5 s). Bound: 0 without both AND and OR, else 2 x ANDs + the runs of tokens
  next to an OR with an identifier and no comparison x (ANDs + 1), which is at least
  their sum.
- ``filter_conjuncts``: over every filter (WHERE, HAVING, QUALIFY, a JOIN's ON) and every
  other AND tree, its conjuncts that are not the cheap kinds above; ``NOT`` of an OR counts
  the OR's disjuncts, ``NOT BETWEEN`` two. Bound: 2 x ANDs + the filter keywords + 2 x NOTs
  (+ the ORs when a NOT is present).

Views count by their name only (a view's own query was counted when it was created, but
filters of stacked views combine when read). Pure; safe from any thread.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from sqlglot import expressions as exp

from planner.front_work import find_all
from planner.plan_relations import Token

# Comparisons DuckDB's filter combiner merges cheaply (into ranges or equivalence sets).
_CHEAP_CONJUNCTS = (exp.EQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Is, exp.Between,
                    exp.Boolean, exp.Null)  # fmt: skip
# Nodes that make a disjunct a predicate of its own (not a column standing for a SELECT
# item's conjunction).
_PREDICATES = (exp.Predicate, exp.Connector, exp.In, exp.Like, exp.ILike, exp.Glob,
               exp.SimilarTo, exp.Between, exp.Exists)  # fmt: skip
_FILTER_KEYWORDS = frozenset({"where", "having", "qualify", "on"})
# Tokens that make a run of tokens a predicate (``_bare_disjuncts``): only those that
# always give one of ``_PREDICATES`` (a token missing here would only over-count).
_PREDICATE_OPERATORS = frozenset({"=", "==", "<>", "!=", "<", ">", "<=", ">="})
_PREDICATE_KEYWORDS = frozenset({"like", "ilike", "in", "between", "glob", "similar"})
# Keywords that end a disjunct's run of tokens (never inside one expression).
_CLAUSE_KEYWORDS = frozenset({
    "select", "from", "where", "group", "having", "qualify", "order", "limit", "on",
    "using", "join", "union", "except", "intersect", "returning", "window",
})  # fmt: skip


class PredicateWork(NamedTuple):
    """A statement's two counts (or their upper bounds)."""

    disjunct_terms: int
    filter_conjuncts: int


def predicate_bound(tokens: Sequence[Token]) -> PredicateWork:
    """Upper bounds of ``predicate_work`` read from DuckDB's tokens in one pass (see the
    module)."""
    ands = ors = nots = filters = 0
    for token in tokens:
        if token.kind != "keyword":
            continue
        word = token.text.lower()
        if word == "and":
            ands += 1
        elif word == "or":
            ors += 1
        elif word == "not":
            nots += 1
        elif word in _FILTER_KEYWORDS:
            filters += 1
    terms = 2 * ands + _bare_disjuncts(tokens) * (ands + 1) if ands and ors else 0
    conjuncts = 2 * ands + filters + 2 * nots + (ors if nots else 0)
    return PredicateWork(terms, conjuncts)


class _Segment:
    """The tokens between two boundaries at one parenthesis depth: whether they hold an
    identifier and a predicate's token, and whether an OR began them."""

    __slots__ = ("after_or", "any_ident", "any_predicate", "ident", "predicate")

    def __init__(self) -> None:
        self.after_or = False
        self.ident = self.predicate = False
        self.any_ident = self.any_predicate = False  # the whole parenthesis's


def _bare_disjuncts(tokens: Sequence[Token]) -> int:
    """An upper bound of the disjuncts ``_stands_for_an_item`` counts: token runs next to
    an OR (between ORs, commas, clause keywords and the parentheses around them) with an
    identifier and no predicate's token (a comparison, LIKE, IN, BETWEEN …)."""
    count = 0
    stack = [_Segment()]

    def close(segment: _Segment, by_or: bool) -> None:
        nonlocal count
        if (by_or or segment.after_or) and segment.ident and not segment.predicate:
            count += 1
        segment.after_or = by_or
        segment.ident = segment.predicate = False

    for token in tokens:
        text = token.text
        word = text.lower()
        top = stack[-1]
        if text == "(":
            stack.append(_Segment())
            continue
        if text == ")" and len(stack) > 1:
            inner = stack.pop()
            close(inner, False)
            top = stack[-1]
            top.ident = top.ident or inner.any_ident
            top.predicate = top.predicate or inner.any_predicate
            top.any_ident = top.any_ident or inner.any_ident
            top.any_predicate = top.any_predicate or inner.any_predicate
            continue
        if token.kind == "keyword" and word == "or":
            close(top, True)
        elif text == "," or (token.kind == "keyword" and word in _CLAUSE_KEYWORDS):
            close(top, False)
        elif token.kind == "identifier":
            top.ident = top.any_ident = True
        elif (token.kind == "operator" and text in _PREDICATE_OPERATORS) or (
            token.kind == "keyword" and word in _PREDICATE_KEYWORDS
        ):
            top.predicate = top.any_predicate = True
    while stack:
        close(stack.pop(), False)
    return count


def predicate_work(tree: exp.Expression) -> PredicateWork:
    """The two counts of ``tree`` (see the module). Iterative: safe for long chains."""
    largest_and = 0
    squares = 0
    conjuncts = 0
    ands = [node for node in find_all(tree, exp.And) if not _inside(node, exp.And)]
    for node in ands:
        largest_and = max(largest_and, sum(1 for _ in _flat(node, exp.And)))
    for node in find_all(tree, exp.Or):
        if _inside(node, exp.Or):
            continue
        total = 0
        for disjunct in _flat(node, exp.Or):
            if isinstance(disjunct, exp.And):
                total += sum(1 for _ in _flat(disjunct, exp.And))
            elif _stands_for_an_item(disjunct):
                total += largest_and
        squares += total * total
    roots: list[exp.Expression] = list(ands)
    for clause in find_all(tree, exp.Where, exp.Having, exp.Qualify):
        roots.append(clause.this)
    for join in find_all(tree, exp.Join):
        if isinstance(join.args.get("on"), exp.Expression):
            roots.append(join.args["on"])
    seen: set[int] = set()
    for root in roots:
        root = _unparenthesised(root)
        if id(root) in seen:
            continue
        seen.add(id(root))
        conjuncts += sum(_cost(conjunct) for conjunct in _flat(root, exp.And))
    return PredicateWork(math.ceil(math.sqrt(squares)), conjuncts)


def _cost(conjunct: exp.Expression) -> int:
    """What one conjunct of a filter adds to the filter combiner's list."""
    if isinstance(conjunct, _CHEAP_CONJUNCTS) and not _compares_a_predicate(conjunct):
        return 0
    if isinstance(conjunct, exp.Not):
        inner = _unparenthesised(conjunct.this)
        if isinstance(inner, exp.Is):
            return 0  # IS NOT NULL
        if isinstance(inner, exp.Or):  # DeMorgan: a conjunct per disjunct
            return sum(max(1, _cost(d)) for d in _flat(inner, exp.Or))
        if isinstance(inner, exp.Between):
            return 2
    return 1


def _compares_a_predicate(comparison: exp.Expression) -> bool:
    """Whether a comparison's operand is itself a predicate or a boolean constant
    (``(a = 1) = false``: not merged cheaply)."""
    for operand in comparison.iter_expressions():
        for node in operand.walk():
            if isinstance(node, (*_PREDICATES, exp.Not, exp.Boolean)):
                return True
    return False


def _stands_for_an_item(disjunct: exp.Expression) -> bool:
    """Whether a disjunct is a column (or an expression of columns) with no predicate:
    it may name a SELECT item DuckDB puts in its place, a conjunction among them."""
    if isinstance(disjunct, _PREDICATES) and not isinstance(disjunct, exp.Is):
        return False
    has_column = False
    for node in disjunct.walk():
        if isinstance(node, exp.Column):
            has_column = True
        elif isinstance(node, _PREDICATES) and not isinstance(node, exp.Is):
            return False
    return has_column


def _unparenthesised(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _inside(node: exp.Expression, kind: type[exp.Expression]) -> bool:
    """Whether ``node``'s parent, parentheses skipped, is a ``kind`` too."""
    parent = node.parent
    while isinstance(parent, exp.Paren):
        parent = parent.parent
    return isinstance(parent, kind)


def _flat(node: exp.Expression, kind: type[exp.Connector]) -> Iterator[exp.Expression]:
    """The operands of a chain of ``kind`` (parentheses skipped), left to right."""
    stack = [_unparenthesised(node)]
    while stack:
        current = stack.pop()
        if isinstance(current, kind):
            stack.append(_unparenthesised(current.expression))
            stack.append(_unparenthesised(current.this))
        else:
            yield current
