"""Topicbase for Spark: the ``topicbase`` PySpark data source and the Spark SQL catalog.

``spark.dataSource.register(TopicbaseDataSource)`` (or nothing at all: Spark finds the
source through the ``pyspark_topicbase`` module) makes ``format("topicbase")`` available;
``configure(builder, url=..., user=..., password=...)`` also installs the Java catalog
(``spark_sql_ext/java``, built into ``spark_sql_ext/jars/topicbase-spark.jar`` by ``make
spark-jar``). Everything talks to ``topicbase serve`` through its Arrow Flight door, except,
with ``wire_url``, the catalog's batch reads and its writes of topics: the catalog's JVM
reads them over the server's PostgreSQL wire (``COPY ... TO STDOUT (FORMAT arrow)``) as
columnar batches (``spark_sql_ext/java/io/topicbase/spark/WireScan.java``) and writes them as
Arrow staged by each task (``COPY ... FROM STDIN (FORMAT arrow, WRITE_ID ...)``) and published
once by the driver (``COMMIT WRITES``, ``WireWrite.java``), with no Python worker.
"""

from __future__ import annotations

import os
from typing import Any

JAR_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jars", "topicbase-spark.jar")
CATALOG_CLASS = "io.topicbase.spark.TopicbaseCatalog"
# A directory whose ``sitecustomize`` makes Spark's Python workers import the installed
# pyspark rather than its ``pyspark.zip`` copy (``worker_site/sitecustomize.py``: ~3x less
# CPU at a worker's start, so a stream's worker connects back within Spark's fixed 10 s
# under load); ``configure`` puts it first on the workers' ``PYTHONPATH``.
WORKER_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_site")
WORKER_PATH_KEY = "spark.executorEnv.PYTHONPATH"


def data_source() -> type:
    """The data source class (imports pyspark on first use)."""
    from spark_sql_ext.datasource import TopicbaseDataSource

    return TopicbaseDataSource


def register(spark: Any) -> None:
    """Register the ``topicbase`` format on a SparkSession."""
    spark.dataSource.register(data_source())


def configure(builder: Any, *, url: str, user: str, password: str = "",
              catalog: str = "topicbase", default: bool = False, wire_url: str | None = None,
              sslmode: str | None = None, sslrootcert: str | None = None,
              worker_site: bool = False) -> Any:  # fmt: skip
    """``builder`` with the catalog jar and settings in place: ``SELECT * FROM
    topicbase.main.events`` (or bare names with ``default=True``) once the session starts.

    ``wire_url``: ``host:port`` (or ``postgresql://host:port``) of the server's PostgreSQL
    wire, for the JVM's batch reads and writes of topics (same user and password); ``sslmode``
    (``require`` or ``verify-full``) and ``sslrootcert`` (a PEM file of the CA) for TLS.

    ``worker_site=True`` also sets ``spark.executorEnv.PYTHONPATH`` to ``WORKER_SITE``
    followed by what was set on ``builder`` before (streams start more surely on a loaded
    machine: ``worker_site/sitecustomize.py``). Off by default: a value from
    ``spark-defaults.conf`` or ``spark-submit --conf`` is not visible here and the builder's
    would replace it; there, add ``WORKER_SITE`` to that value yourself. It is the driver's
    path: on a node where it does not exist the workers import ``pyspark.zip`` as usual."""
    if not os.path.exists(JAR_PATH):
        raise FileNotFoundError(f"{JAR_PATH} is missing: build it with `make spark-jar`")
    prefix = f"spark.sql.catalog.{catalog}"
    builder = (builder.config("spark.jars", JAR_PATH)
               .config(prefix, CATALOG_CLASS)
               .config(f"{prefix}.url", url)
               .config(f"{prefix}.user", user)
               .config(f"{prefix}.password", password))  # fmt: skip
    if wire_url is not None:
        address = wire_url.split("://", 1)[-1].rstrip("/")
        if ":" not in address or "/" in address or "@" in address:
            raise ValueError(f"wire_url {wire_url!r} is not host:port")
        builder = builder.config(f"{prefix}.wire", address)
        for key, value in (("sslmode", sslmode), ("sslrootcert", sslrootcert)):
            if value is not None:
                builder = builder.config(f"{prefix}.{key}", value)
    if default:
        builder = builder.config("spark.sql.defaultCatalog", catalog)
    if worker_site:
        builder = builder.config(WORKER_PATH_KEY, worker_python_path(builder))
    return builder


def worker_python_path(builder: Any) -> str:
    """``WORKER_SITE`` first, then the workers' ``PYTHONPATH`` set on ``builder`` before
    (Spark adds the driver's own ``PYTHONPATH`` after it); ``WORKER_SITE`` once."""
    earlier = getattr(builder, "_options", {}).get(WORKER_PATH_KEY) or ""
    paths = [p for p in earlier.split(os.pathsep) if p and p != WORKER_SITE]
    return os.pathsep.join([WORKER_SITE, *paths])
