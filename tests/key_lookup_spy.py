"""The key-lookup tests' shared setup: a spy on ``engine.key_lookup`` that counts the
lookups the index answered, with indexes built after one lookup."""

from __future__ import annotations

from typing import Any

import pytest

from engine import key_lookup


def served_lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lookups the index answered (one entry appended per answer by a spy on
    ``key_lookup._result``), with builds after 1 lookup and every build counted as paid
    for (the threshold stays 1); ``TOPICBASE_KEY_INDEX_BYTES`` unset (the path on)."""
    monkeypatch.setattr(key_lookup, "FIRST_BUILD_LOOKUPS", 1)
    monkeypatch.setattr(key_lookup, "SAVING_PER_LOOKUP_S", 1.0)
    monkeypatch.delenv(key_lookup.BYTES_VARIABLE, raising=False)
    calls: list[int] = []
    original = key_lookup._result

    def spy(*arguments: Any) -> Any:
        calls.append(1)
        return original(*arguments)

    monkeypatch.setattr(key_lookup, "_result", spy)
    return calls
