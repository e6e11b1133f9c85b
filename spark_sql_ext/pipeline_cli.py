"""``topicbase pipeline reshard|to-table``: the Spark pipelines from the command line.

``topicbase pipeline`` hands over to this module (``python -m spark_sql_ext.pipeline_cli``),
which starts a SparkSession (``--master``, default ``local[2]``; on a cluster run it with
``spark-submit`` instead) and runs one query until it has read everything there is
(``--once``, Trigger.AvailableNow) or forever at ``--interval``. The password comes from
``--password`` or the ``TOPICBASE_PASSWORD`` environment variable.
"""

from __future__ import annotations

import argparse
import os
import sys

from spark_sql_ext import pipelines
from spark_sql_ext.options import OptionError, parse_position

EXAMPLE = """example (the password from the environment, not the command line):
  TOPICBASE_PASSWORD=... topicbase pipeline --url topicbase://127.0.0.1:5434 \\
      --user etl --checkpoint /tmp/cp/reshard --consumer resharder \\
      reshard logs_by_server logs_by_user --key user

The common options go before the command. A checkpoint belongs to one query: a restart with
the same --checkpoint continues exactly where it stopped (--starting-offsets then counts no
more); the sink id is derived from the command, source and target, so each batch is
published once across restarts."""


def _position(text: str) -> str:
    """``--starting-offsets`` checked as the source will read it (a bad value fails here,
    not after Spark's ~20 s start)."""
    try:
        parse_position(text, "earliest", "--starting-offsets")
    except OptionError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="topicbase pipeline",
                                     description="Run a Topicbase pipeline on Spark.",
                                     epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="topicbase://127.0.0.1:5434",
                        help="the Flight door of topicbase serve; topicbase+tls://host:port "
                             "for TLS (default %(default)s)")  # fmt: skip
    parser.add_argument("--tls-root-certs", metavar="PEM",
                        help="CA certificate(s) to check a topicbase+tls:// server "
                             "against (default: the system's); on every node")  # fmt: skip
    parser.add_argument("--user", default=os.environ.get("USER", "topicbase"),
                        help="the Topicbase user (default %(default)s)")
    parser.add_argument("--password", default=os.environ.get("TOPICBASE_PASSWORD", ""),
                        help="default: $TOPICBASE_PASSWORD (prefer it: a command line is "
                             "visible to other users of the machine)")  # fmt: skip
    parser.add_argument("--master", default="local[2]",
                        help="Spark master (default %(default)s; on a cluster, or "
                             "spark-submit a script of spark_sql_ext.pipelines)")  # fmt: skip
    parser.add_argument("--conf", type=_setting, action="append", default=[],
                        metavar="KEY=VALUE",
                        help="a Spark setting, as spark-submit's --conf (repeatable), "
                             "e.g. spark.executor.memory=4g or spark.pyspark.python=PATH "
                             "(the executors' Python)")  # fmt: skip
    parser.add_argument("--checkpoint", required=True,
                        help="Spark checkpoint directory (one per query; on a cluster "
                             "a fault-tolerant path such as HDFS or S3)")  # fmt: skip
    parser.add_argument("--starting-offsets", default="earliest", type=_position,
                        help="where a new checkpoint starts: earliest, latest, JSON offsets "
                             "per partition or an ISO-8601 time (default %(default)s)")  # fmt: skip
    parser.add_argument("--once", action="store_true",
                        help="read what is there (Trigger.AvailableNow), then stop")
    parser.add_argument("--interval", default="1 second",
                        help="processing-time trigger without --once (default %(default)s)")
    parser.add_argument("--max-per-trigger", type=int, default=None,
                        help="messages per micro-batch at most (default: no limit)")
    parser.add_argument("--consumer", help="commit this consumer's offsets as batches end "
                                           "(sys.consumers shows the pipeline's lag)")  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    reshard = commands.add_parser("reshard", help="topic -> topic partitioned by a JSON key",
                                  description="Write every message of SOURCE to TARGET with "
                                  "its JSON key as message group (one partition per key), "
                                  "in per-source order, exactly once.")  # fmt: skip
    reshard.add_argument("source", help="the topic read")
    reshard.add_argument("target", help="the topic written (it must exist)")
    reshard.add_argument("--key", required=True, help="JSON field of the message")
    fold = commands.add_parser("to-table", help="topic -> table of per-key counts, sums "
                               "or latest values",
                               description="Fold SOURCE into TABLE by its JSON key, exactly "
                               "once; the table must exist, keyed by KEY_COLUMN. --mode count "
                               "(default) adds each key's message count to COUNT_COLUMN; sum "
                               "adds each key's sum of the JSON field --value to VALUE_COLUMN; "
                               "upsert stores each key's latest --value (the last by "
                               "partition, offset) in VALUE_COLUMN. Messages without the "
                               "--value field are skipped.")  # fmt: skip
    fold.add_argument("source", help="the topic read")
    fold.add_argument("table", help="the table written")
    fold.add_argument("--key", required=True, help="JSON field of the message")
    fold.add_argument("--key-column", default="key", help="default %(default)s")
    fold.add_argument("--mode", choices=pipelines.FOLD_MODES, default="count",
                      help="default %(default)s")
    fold.add_argument("--count-column", default="n", help="mode count (default %(default)s)")
    fold.add_argument("--value", help="JSON field of the message (modes sum and upsert)")
    fold.add_argument("--value-column", default="value",
                      help="modes sum and upsert (default %(default)s)")
    fold.add_argument("--value-type",
                      help="the Spark SQL type --value is cast to (default DOUBLE for sum, "
                           "STRING for upsert)")  # fmt: skip
    arguments = parser.parse_args(argv)
    if arguments.command == "to-table" and (arguments.value is None) != (
            arguments.mode == "count"):  # fmt: skip
        fold.error("--value (a JSON field) is for --mode sum and upsert, and needed there")
    return arguments


def _setting(text: str) -> tuple[str, str]:
    """``--conf KEY=VALUE`` as Spark's ``spark-submit --conf`` takes it."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--conf takes KEY=VALUE, not {text!r}")
    return key.strip(), value


def settings(master: str, conf: list[tuple[str, str]] | None = None) -> dict[str, str]:
    """The session's settings: the pipeline's defaults (UI off, 2 shuffle partitions, UTC,
    local masters on loopback), then ``conf`` (``--conf``), which wins."""
    chosen = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
              "spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC",
              "spark.driver.extraJavaOptions": "-XX:+UseSerialGC"}  # fmt: skip
    if master.startswith("local"):
        chosen.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    chosen.update(conf or [])
    return chosen


def session(master: str, conf: list[tuple[str, str]] | None = None) -> object:
    """A SparkSession with the source registered (an editable install hides the
    ``pyspark_topicbase`` module from Spark's discovery); local masters stay on loopback."""
    from pyspark.sql import SparkSession

    import spark_sql_ext

    # Spark's Python workers run this interpreter (its packages: pyarrow, spark_sql_ext);
    # on a cluster that path must exist on every node, or set spark.pyspark.python.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName("topicbase-pipeline")
    for key, value in settings(master, conf).items():
        builder = builder.config(key, value)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark_sql_ext.register(spark)
    return spark


def main(argv: list[str] | None = None) -> int:
    arguments = parse(sys.argv[1:] if argv is None else argv)
    spark = session(arguments.master, arguments.conf)
    connection = pipelines.Connection(arguments.url, arguments.user, arguments.password,
                                      arguments.tls_root_certs)  # fmt: skip
    common = {"consumer": arguments.consumer, "once": arguments.once,
              "interval": arguments.interval, "max_per_trigger": arguments.max_per_trigger,
              "starting_offsets": arguments.starting_offsets}
    if arguments.command == "reshard":
        query = pipelines.reshard(spark, connection, arguments.source, arguments.target,
                                  arguments.key, arguments.checkpoint, **common)
    else:
        query = pipelines.to_table(spark, connection, arguments.source, arguments.table,
                                   arguments.key, arguments.checkpoint,
                                   key_column=arguments.key_column,
                                   count_column=arguments.count_column,
                                   mode=arguments.mode, value=arguments.value,
                                   value_column=arguments.value_column,
                                   value_type=arguments.value_type, **common)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
        return 130
    if query.exception() is not None:
        print(f"ERROR: {query.exception()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
