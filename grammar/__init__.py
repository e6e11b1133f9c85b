"""Topicbase's SQL grammar: text in, typed statement objects out.

``parse``/``parse_one`` (grammar.parse), ``split_statements`` (grammar.split), the
statement classes (grammar.ast) and the setting tables and checks (grammar.settings).
"""

from __future__ import annotations

from grammar.parse import SQL_TEXT_BYTES_MAX, parse, parse_one
from grammar.split import split_statements

__all__ = ["SQL_TEXT_BYTES_MAX", "parse", "parse_one", "split_statements"]
