"""Data-modifying statements nested in another statement (``WITH u AS (UPDATE ...)``).

DuckDB runs an INSERT, UPDATE, DELETE or MERGE written as a common table expression,
under a SELECT, a CREATE TABLE ... AS, or another data-modifying statement. Topicbase
does not support them: its analyses (tag, tables written, privileges, read-only
transactions, streaming) read a statement's kind from its root, so the planner refuses
every such statement (0A000), and the sandbox (``engine.sandbox``) refuses them again
from DuckDB's own tokens, whatever sqlglot makes of the text.

Invariant: ``nested_writes(tree)`` is every Insert/Update/Delete/Merge node of the tree
except the root itself and the actions of a MERGE (``WHEN ... THEN UPDATE``), which
are the MERGE's own writes of its target.
"""

from __future__ import annotations

from sqlglot import expressions as exp

from planner.front_work import find_all
from storage.errors import FeatureNotSupportedError

DATA_MODIFYING = (exp.Insert, exp.Update, exp.Delete, exp.Merge)
REFUSAL = "data-modifying statements in WITH are not supported"


def nested_writes(tree: exp.Expression) -> list[exp.Expression]:
    """The data-modifying statements inside ``tree`` other than the root."""
    return [
        node
        for node in find_all(tree, *DATA_MODIFYING)
        if node is not tree and not isinstance(node.parent, exp.When)
    ]


def refuse_nested_writes(tree: exp.Expression) -> None:
    """0A000 if ``tree`` holds a data-modifying statement below its root."""
    if nested_writes(tree):
        raise FeatureNotSupportedError(REFUSAL)
