"""``text_cache``: an LRU cache for functions of a statement's text, bounded in bytes too.

Parsing and analysing SQL is cached by text (a client's loop repeats the same statements),
but a cache of N entries keyed by text holds N texts: with statements of up to 16 MiB a
plain ``functools.lru_cache`` could hold gigabytes for one user's huge INSERTs, which are
never repeated anyway. Texts longer than ``limits.CACHED_TEXT_CHARS_MAX`` are therefore
computed every time and never kept.

Thread-safe as ``functools.lru_cache`` is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from storage import limits

Function = TypeVar("Function", bound=Callable[..., Any])


def text_cache(maxsize: int) -> Callable[[Function], Function]:
    """Cache calls whose first argument, a text, is at most ``CACHED_TEXT_CHARS_MAX``."""

    def decorate(function: Function) -> Function:
        cached = functools.lru_cache(maxsize=maxsize)(function)

        @functools.wraps(function)
        def call(text: str, *rest: Any) -> Any:
            if len(text) > limits.CACHED_TEXT_CHARS_MAX:
                return function(text, *rest)
            return cached(text, *rest)

        call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        call.cache_info = cached.cache_info  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return decorate
