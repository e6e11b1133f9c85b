"""The ledger's switches from the environment (``storage.config``): ``TOPICBASE_LEDGER``
and the test lane's ``TOPICBASE_LEDGER_SHARES_MIN`` (``pytest --ledger``), which a topic's
ledger reads when it opens (``TopicLedger.shares_min``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage import limits
from storage.config import (
    LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE,
    TopicConfig,
    ledger_shares_min,
)
from storage.errors import InvalidParameterValueError
from storage.fs import FileSystem
from storage.store import Store


def test_the_shares_minimum_is_the_limit_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE, raising=False)
    assert ledger_shares_min() == limits.LEDGER_SHARES_MIN
    monkeypatch.setenv(LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE, "4")
    assert ledger_shares_min() == 4
    for bad in ("1", "0", "-3", "four", "2.5"):
        monkeypatch.setenv(LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE, bad)
        with pytest.raises(
            InvalidParameterValueError, match=LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE
        ):
            ledger_shares_min()


def test_a_topics_ledger_takes_the_minimum_when_it_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE, "5")
    with Store.open(os.fspath(tmp_path / "store"), fs=FileSystem(), ledger=True) as store:
        topic = store.create_topic(TopicConfig(partition_count=2))
        assert topic.ledger is not None and topic.ledger.shares_min == 5
