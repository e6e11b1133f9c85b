"""A spy on the CRC-32C checksums a storage module computes (``storage.segment``,
``storage.bulk_scan``), shared by the tests of what is verified once per process."""

from __future__ import annotations

import types
from typing import Any

import crc32c
import pytest


def count_checksums(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType) -> list[int]:
    """The sizes of the checksums ``module`` computes from now on (its ``crc32c`` replaced
    by a counting one that gives the same values)."""
    sizes: list[int] = []

    def counted(data: Any, value: int = 0) -> int:
        sizes.append(len(data))
        return crc32c.crc32c(data, value)

    monkeypatch.setattr(module, "crc32c", types.SimpleNamespace(crc32c=counted))
    return sizes
