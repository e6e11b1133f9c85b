"""``topicbase pipeline``'s options reach the pipelines: the connection (TLS roots), the
starting offsets, the trigger and limits; a bad option fails before Spark starts."""

from __future__ import annotations

from typing import Any

import pytest

from spark_sql_ext import pipeline_cli, pipelines


class _Query:
    def awaitTermination(self) -> None:  # pyspark's name
        return None

    def exception(self) -> None:
        return None


def _run(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> dict[str, Any]:
    """Run ``main`` with Spark and the query replaced: what the pipeline was called with."""
    calls: dict[str, Any] = {}

    def record(name: str):
        def start(spark: Any, connection: pipelines.Connection, *args: Any, **kwargs: Any):
            calls.update(name=name, connection=connection, args=args, kwargs=kwargs)
            return _Query()

        return start

    def session(master: str, conf: list[tuple[str, str]]) -> None:
        calls.update(master=master, conf=conf)

    monkeypatch.setattr(pipeline_cli, "session", session)
    monkeypatch.setattr(pipelines, "reshard", record("reshard"))
    monkeypatch.setattr(pipelines, "to_table", record("to_table"))
    monkeypatch.setenv("TOPICBASE_PASSWORD", "from-env")
    assert pipeline_cli.main(argv) == 0
    return calls


def test_options_reach_the_pipeline(monkeypatch) -> None:
    calls = _run(monkeypatch, [
        "--url", "topicbase+tls://db.example:5434", "--tls-root-certs", "/etc/ca.pem",
        "--user", "etl", "--checkpoint", "/cp/r", "--starting-offsets", '{"0": 5, "1": -2}',
        "--max-per-trigger", "100", "--consumer", "resharder",
        "reshard", "a", "b", "--key", "user"])  # fmt: skip
    assert calls["name"] == "reshard" and calls["master"] == "local[2]"
    assert calls["connection"] == pipelines.Connection(
        "topicbase+tls://db.example:5434", "etl", "from-env", "/etc/ca.pem")
    assert calls["connection"].options()["tlsRootCerts"] == "/etc/ca.pem"
    assert calls["args"] == ("a", "b", "user", "/cp/r")
    assert calls["kwargs"] == {"consumer": "resharder", "once": False, "interval": "1 second",
                               "max_per_trigger": 100, "starting_offsets": '{"0": 5, "1": -2}'}


def test_to_table_defaults(monkeypatch) -> None:
    calls = _run(monkeypatch, ["--checkpoint", "/cp/f", "--once", "to-table", "t", "totals",
                               "--key", "user", "--key-column", "user_id"])  # fmt: skip
    assert calls["name"] == "to_table"
    assert calls["connection"].options() == {"url": "topicbase://127.0.0.1:5434",
                                             "user": calls["connection"].user,
                                             "password": "from-env"}  # fmt: skip
    assert calls["kwargs"]["starting_offsets"] == "earliest" and calls["kwargs"]["once"]
    assert calls["kwargs"]["key_column"] == "user_id" and calls["kwargs"]["count_column"] == "n"
    assert calls["kwargs"]["mode"] == "count" and calls["kwargs"]["value"] is None


def test_bad_starting_offsets_fail_before_spark_starts(monkeypatch, capsys) -> None:
    monkeypatch.setattr(pipeline_cli, "session", lambda *_: pytest.fail("Spark started"))
    for bad in (["--starting-offsets", "yesterday"], ["--conf", "spark.executor.memory"]):
        with pytest.raises(SystemExit) as caught:
            pipeline_cli.main(["--checkpoint", "/cp", *bad, "reshard", "a", "b", "--key", "k"])
        assert caught.value.code == 2
        assert bad[0] in capsys.readouterr().err


def test_conf_reaches_the_session_and_wins_over_the_defaults(monkeypatch) -> None:
    calls = _run(monkeypatch, [
        "--master", "spark://head:7077", "--conf", "spark.executor.memory=4g",
        "--conf", "spark.sql.shuffle.partitions=64", "--conf", "spark.app.tag=a=b",
        "--checkpoint", "/cp", "reshard", "a", "b", "--key", "k"])  # fmt: skip
    assert calls["master"] == "spark://head:7077"
    assert calls["conf"] == [("spark.executor.memory", "4g"),
                             ("spark.sql.shuffle.partitions", "64"), ("spark.app.tag", "a=b")]
    chosen = pipeline_cli.settings(calls["master"], calls["conf"])
    assert chosen["spark.executor.memory"] == "4g"
    assert chosen["spark.sql.shuffle.partitions"] == "64"  # over the default 2
    assert "spark.driver.bindAddress" not in chosen  # loopback only for local masters
    assert pipeline_cli.settings("local[2]")["spark.driver.bindAddress"] == "127.0.0.1"


@pytest.mark.parametrize("mode", ["sum", "upsert"])
def test_to_table_modes_reach_the_pipeline(monkeypatch, mode: str) -> None:
    calls = _run(monkeypatch, ["--checkpoint", "/cp/f", "to-table", "t", "totals", "--key", "u",
                               "--mode", mode, "--value", "amount", "--value-column", "total",
                               "--value-type", "DECIMAL(18, 2)"])  # fmt: skip
    assert calls["args"] == ("t", "totals", "u", "/cp/f")
    assert {k: calls["kwargs"][k] for k in ("mode", "value", "value_column", "value_type")} == {
        "mode": mode, "value": "amount", "value_column": "total", "value_type": "DECIMAL(18, 2)"}


@pytest.mark.parametrize("bad", [["--mode", "sum"], ["--value", "amount"],
                                 ["--mode", "max", "--value", "amount"]])  # fmt: skip
def test_to_table_mode_and_value_go_together(monkeypatch, capsys, bad: list[str]) -> None:
    monkeypatch.setattr(pipeline_cli, "session", lambda *_: pytest.fail("Spark started"))
    with pytest.raises(SystemExit) as caught:
        pipeline_cli.main(["--checkpoint", "/cp", "to-table", "a", "b", "--key", "k", *bad])
    assert caught.value.code == 2
    assert "--value" in capsys.readouterr().err or "--mode" in bad


@pytest.mark.parametrize("arguments", [{"mode": "sum", "value": "a'b"},
                                       {"mode": "upsert", "value": "v", "value_type": "INT; x"},
                                       {"mode": "count", "value": "v"},
                                       {"mode": "sum"}])  # fmt: skip
def test_to_table_refuses_bad_arguments_before_reading(arguments: dict) -> None:
    """Checked before anything touches Spark (``spark`` is None here)."""
    with pytest.raises(ValueError):
        pipelines.to_table(None, pipelines.Connection("topicbase://x:1", "u", "p"), "t",
                           "totals", "k", "/cp", **arguments)  # fmt: skip
