"""Spark's auto-discovery hook: a top-level ``pyspark_*`` module with a ``DefaultSource``
(a ``DataSource`` subclass) registers it by name, here ``topicbase``."""

from spark_sql_ext.datasource import TopicbaseDataSource as DefaultSource

__all__ = ["DefaultSource"]
