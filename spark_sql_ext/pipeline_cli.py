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


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="topicbase pipeline",
                                     description="Run a Topicbase pipeline on Spark.")
    parser.add_argument("--url", default="topicbase://127.0.0.1:5434",
                        help="the Flight door of topicbase serve")
    parser.add_argument("--user", default=os.environ.get("USER", "topicbase"))
    parser.add_argument("--password", default=os.environ.get("TOPICBASE_PASSWORD", ""))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument("--once", action="store_true", help="read what is there, then stop")
    parser.add_argument("--interval", default="1 second", help="processing-time trigger")
    parser.add_argument("--max-per-trigger", type=int, default=None)
    parser.add_argument("--consumer", help="commit this consumer's offsets as batches end")
    commands = parser.add_subparsers(dest="command", required=True)
    reshard = commands.add_parser("reshard", help="topic -> topic partitioned by a JSON key")
    reshard.add_argument("source")
    reshard.add_argument("target")
    reshard.add_argument("--key", required=True, help="JSON field of the message")
    fold = commands.add_parser("to-table", help="topic -> table of per-key counts")
    fold.add_argument("source")
    fold.add_argument("table")
    fold.add_argument("--key", required=True, help="JSON field of the message")
    fold.add_argument("--key-column", default="key")
    fold.add_argument("--count-column", default="n")
    return parser.parse_args(argv)


def session(master: str) -> object:
    """A SparkSession with the source registered (an editable install hides the
    ``pyspark_topicbase`` module from Spark's discovery); local masters stay on loopback."""
    from pyspark.sql import SparkSession

    import spark_sql_ext

    # Spark's Python workers run this interpreter (its packages: pyarrow, spark_sql_ext).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName("topicbase-pipeline")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC"))  # fmt: skip
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))  # fmt: skip
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark_sql_ext.register(spark)
    return spark


def main(argv: list[str] | None = None) -> int:
    arguments = parse(sys.argv[1:] if argv is None else argv)
    spark = session(arguments.master)
    connection = pipelines.Connection(arguments.url, arguments.user, arguments.password)
    common = {"consumer": arguments.consumer, "once": arguments.once,
              "interval": arguments.interval, "max_per_trigger": arguments.max_per_trigger}
    if arguments.command == "reshard":
        query = pipelines.reshard(spark, connection, arguments.source, arguments.target,
                                  arguments.key, arguments.checkpoint, **common)
    else:
        query = pipelines.to_table(spark, connection, arguments.source, arguments.table,
                                   arguments.key, arguments.checkpoint,
                                   key_column=arguments.key_column,
                                   count_column=arguments.count_column, **common)
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
