"""``text_cache``: a least-recently-used cache for functions of a statement's text, bounded
in entries and in bytes (``grammar.bounded_cache``).

Parsing and analysing SQL is cached by text (a client's loop repeats the same statements),
but what is derived from a text holds many times its characters (sqlglot's tree of
a wide ``SELECT`` up to ~14 bytes a character), and a client chooses its texts. So each
entry costs its text's length times ``bytes_per_char`` (``TEXT_COST_PER_CHAR`` by default,
measured for the cached functions' widest results) and the cache holds at most
``limits.TEXT_CACHE_BYTES_MAX`` of them, within the process-wide
``limits.TEXT_CACHES_BYTES_MAX``. Texts longer than ``limits.CACHED_TEXT_CHARS_MAX`` are
computed every time and never kept (a huge INSERT is never repeated anyway).

A hit costs about what ``functools.lru_cache``'s does behind a wrapper: one dict look-up
and one ``move_to_end``, no lock. Exceptions are not kept. Thread-safe
(``BoundedCache``); two threads missing the same text at once both compute it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from grammar.bounded_cache import TEXT_COST_PER_CHAR, BoundedCache
from storage import limits

Function = TypeVar("Function", bound=Callable[..., Any])


def text_cache(
    maxsize: int, bytes_per_char: int = TEXT_COST_PER_CHAR
) -> Callable[[Function], Function]:
    """Cache calls whose first argument, a text, is at most ``CACHED_TEXT_CHARS_MAX``
    characters; the cache is the function's ``cache`` attribute."""

    def decorate(function: Function) -> Function:
        cache = BoundedCache(f"{function.__module__}.{function.__qualname__}", maxsize)
        find = cache._entries.get
        touch = cache._entries.move_to_end
        put = cache.put

        @functools.wraps(function)
        def call(text: str, *rest: Any) -> Any:
            key = (text, *rest) if rest else text
            entry = find(key)
            if entry is not None:
                try:  # noqa: SIM105 - contextlib.suppress costs more on the hit path
                    touch(key)
                except KeyError:  # evicted by another thread since: still a hit
                    pass
                return entry[0]
            value = function(text, *rest)
            if len(text) <= limits.CACHED_TEXT_CHARS_MAX:
                put(key, value, len(text) * bytes_per_char)
            return value

        call.cache = cache  # type: ignore[attr-defined]
        call.cache_clear = cache.clear  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return decorate
