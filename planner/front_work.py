"""One statement's front work: its sqlglot trees parsed once, and its long Python work
interruptible (round 28, H2).

Before DuckDB sees a statement, the sandbox, the privilege checks and the planner each read
its text with sqlglot (``planner.duckdb_sql.parse_duckdb``); a text past
``limits.CACHED_TEXT_CHARS_MAX`` is kept by no text cache, so each of them parsed it again,
and the parse holds the interpreter lock for ~4-10 us a byte (megabytes of text: tens of
seconds) with nothing looking at a cancel or ``statement_timeout``.

``statement_front`` opens a scope on the current thread for one statement's front (the
engine opens it around planning and the door, ``engine.interrupts.front_checked``):

- **One parse per text.** ``shared_parse`` gives every reader of the same text in the scope
  the same tree (or the same ``ParseError``). Invariant: **no reader mutates a tree it got
  from ``parse_duckdb``** — what rewrites a tree copies it first (``tree.copy()``,
  ``transform`` copies by default; ``planner.relations._rewrite``, ``_truncate_without_only``,
  ``engine.describe._with_typed_nulls`` copy). ``tests/engine/test_front_work.py`` checks a
  statement's shared trees print the same after its front as right after their parse.
- **One walk per tree.** ``find_all`` answers the nodes of some classes, in sqlglot's
  breadth-first order, from an index of the tree built by one walk (each full-tree
  ``find_all`` of a consumer was a walk of its own: ~14 of them for a ``WHERE`` of many
  terms). Outside a scope it is the tree's own ``find_all``.
- **Interruptible.** ``tick`` calls the scope's ``stop`` every ``CHECK_EVERY`` units of
  work; ``stop`` raises (the session's: 57014 once a cancel or ``statement_timeout`` asked).
  The parse ticks per token read by sqlglot's tokenizer and parser (``checked_parse``), the
  index per node (the consumers' own loops over a tree's nodes do not tick).

Outside a scope nothing is shared and nothing ticks: the functions behave as sqlglot's own.
Scopes do not nest (an inner ``statement_front`` joins the outer one). Thread-local: a scope
is its thread's only.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from array import array
from collections.abc import Callable, Iterable
from typing import Any

from sqlglot import expressions as exp

# Units of work (tokens, nodes) between two calls of ``stop``: a call costs ~0.1 us, a
# unit ~1-5 us, so a cancel is seen within a few ms and the checks cost well under 1 %.
CHECK_EVERY = 4096

# Texts shorter than this are parsed without the per-token checks (their parse takes
# under ~0.1 s); the trees are shared whatever their size.
CHECKED_TEXT_CHARS_MIN = 16 * 1024


class _Scope:
    __slots__ = ("countdown", "indexes", "roots", "stop", "stopped", "trees")

    def __init__(self, stop: Callable[[], None] | None) -> None:
        self.stop = stop
        self.stopped: BaseException | None = None  # what ``stop`` raised
        self.countdown = CHECK_EVERY
        # text -> (tree, None) or (None, the ParseError it raised)
        self.trees: dict[str, tuple[Any, BaseException | None]] = {}
        # id(tree) -> tree: the roots parsed here of texts of INDEXED_TEXT_CHARS_MIN or more
        self.roots: dict[int, Any] = {}
        # id(tree) -> (tree, its index): the tree kept so its id is not reused
        self.indexes: dict[int, tuple[exp.Expression, _Index]] = {}


_LOCAL = threading.local()


def _scope() -> _Scope | None:
    return getattr(_LOCAL, "scope", None)


class statement_front:
    """The scope of one statement's front on this thread (module doc); ``stop`` raises to
    end the work (None: nothing interrupts it). Joins an enclosing scope. A class, not a
    generator: it is entered once per statement (~0.5 us, not ~2)."""

    __slots__ = ("_opened", "_stop")

    def __init__(self, stop: Callable[[], None] | None = None) -> None:
        self._stop = stop
        self._opened = False

    def __enter__(self) -> None:
        if getattr(_LOCAL, "scope", None) is None:
            _LOCAL.scope = _Scope(self._stop)
            self._opened = True

    def __exit__(self, *exc: object) -> None:
        if self._opened:
            _LOCAL.scope = None
            self._opened = False


def tick(units: int = 1) -> None:
    """Note ``units`` of work done; every ``CHECK_EVERY`` of them the scope's ``stop``
    (what it raises is noted in the scope, and raised)."""
    scope = _scope()
    if scope is None or scope.stop is None:
        return
    scope.countdown -= units
    if scope.countdown <= 0:
        scope.countdown = CHECK_EVERY
        try:
            scope.stop()
        except BaseException as error:
            scope.stopped = error
            raise


def shared_parse(sql: str, parse: Callable[[str], Any]) -> Any:
    """``parse(sql)``, once per text in the scope: later calls get the same tree, or the
    same exception raised again (``RecursionError`` is not kept: it depends on the stack).
    Outside a scope, ``parse(sql)``."""
    scope = _scope()
    if scope is None:
        return parse(sql)
    kept = scope.trees.get(sql)
    if kept is not None:
        tree, error = kept
        if error is not None:
            raise error
        return tree
    try:
        tree = parse(sql)
    except RecursionError:
        raise
    except Exception as error:
        scope.trees[sql] = (None, error)
        raise
    scope.trees[sql] = (tree, None)
    if tree is not None and len(sql) >= INDEXED_TEXT_CHARS_MIN:
        scope.roots[id(tree)] = tree
    return tree


def checked_parse(sql: str, dialect: Any) -> list[Any]:
    """sqlglot's parse of ``sql`` in ``dialect`` (``Dialect.parse``), ticking once per token
    its tokenizer adds and its parser reads when in a scope with a ``stop`` and ``sql`` is
    long; else the dialect's own parse. What ``stop`` raises comes out as it is (sqlglot's
    tokenizer wraps any exception in a ``TokenError``: unwrapped here)."""
    scope = _scope()
    if scope is None or scope.stop is None or len(sql) < CHECKED_TEXT_CHARS_MIN:
        return dialect.parse(sql)  # type: ignore[no-any-return]
    try:
        tokenizer = dialect.tokenizer()
        core = getattr(tokenizer, "_core", None)
        if _TickingCore is not None and type(core) is _TickingCore.__bases__[0]:
            core.__class__ = _TickingCore  # same layout (no slots of its own)
        tokens = tokenizer.tokenize(sql)
        parser = dialect.parser()
        _tick_on(parser, "_advance")
        return parser.parse(tokens, sql)  # type: ignore[no-any-return]
    except Exception:
        if scope.stopped is not None:
            raise scope.stopped from None
        raise


def _tick_on(instance: Any, method: str) -> None:
    """Make ``instance.method`` (one positional argument at most, as the parser's
    ``_advance``) tick before each call: an attribute of the instance, which the class's own
    calls through ``self`` find first; unchanged if it cannot be set. Counts down itself
    and calls ``tick`` once per ``CHECK_EVERY`` calls (the hot path is one subtraction)."""
    bound = getattr(instance, method)
    left = CHECK_EVERY

    def ticking(*args: Any) -> Any:
        nonlocal left
        left -= 1
        if not left:
            left = CHECK_EVERY
            tick(CHECK_EVERY)
        return bound(*args)

    with contextlib.suppress(AttributeError, TypeError):  # a compiled class: no __dict__
        setattr(instance, method, ticking)


def _ticking_core() -> type | None:
    """sqlglot's tokenizer core (``__slots__``, so no attribute of an instance can stand in
    for its ``_add``) with an ``_add`` that ticks first; None where it cannot be made (a
    compiled sqlglot): then the tokenizer runs unchecked, the parser still ticks."""
    try:
        from sqlglot.tokenizer_core import TokenizerCore

        class TickingCore(TokenizerCore):  # type: ignore[misc]
            __slots__ = ()

            def _add(self, *args: Any, **kwargs: Any) -> None:
                tick()
                TokenizerCore._add(self, *args, **kwargs)

    except (ImportError, TypeError, AttributeError):
        return None
    return TickingCore


_TickingCore = _ticking_core()


class _Index:
    """A tree's nodes by class, each list in breadth-first order, with each node's place in
    that order beside it (an ``array`` of 8 bytes a node, to merge several classes' lists:
    a dict by node id would cost ~100 bytes a node, ~100 MB for a 3 MiB INSERT's tree)."""

    __slots__ = ("by_class", "places")

    def __init__(self, tree: exp.Expression) -> None:
        self.by_class: dict[type, list[exp.Expression]] = {}
        self.places: dict[type, array[int]] = {}
        by_class = self.by_class
        places = self.places
        for place, node in enumerate(tree.bfs()):
            cls = type(node)
            nodes = by_class.get(cls)
            if nodes is None:
                nodes = by_class[cls] = []
                places[cls] = array("q")
            nodes.append(node)
            places[cls].append(place)
            if not place & 1023:
                tick(1024)

    def find_all(self, types: tuple[type, ...]) -> list[exp.Expression]:
        classes = [cls for cls in self.by_class if issubclass(cls, types)]
        if not classes:
            return []
        if len(classes) == 1:
            return self.by_class[classes[0]]
        merged = heapq.merge(*(zip(self.places[c], self.by_class[c], strict=True) for c in classes),
                             key=lambda pair: pair[0])  # fmt: skip
        return [node for _, node in merged]


# Trees of texts shorter than this are walked by sqlglot itself: an index costs more than
# the few walks it saves there.
INDEXED_TEXT_CHARS_MIN = 16 * 1024


def find_all(tree: exp.Expression, *types: type) -> Iterable[Any]:
    """The nodes of ``tree`` (itself included) of any of ``types``, breadth-first as
    ``tree.find_all``. For the root of a long text parsed in the scope (``shared_parse``),
    from the scope's index of it: one walk for every call (a list, the caller's to read,
    not to change). Else the tree's own ``find_all``."""
    scope = _scope()
    if scope is None:
        return tree.find_all(*types)
    kept = scope.indexes.get(id(tree))
    if kept is None or kept[0] is not tree:
        root = scope.roots.get(id(tree))
        if root is not tree:
            return tree.find_all(*types)
        kept = (tree, _Index(tree))
        scope.indexes[id(tree)] = kept
    return kept[1].find_all(types)
