"""Topics on disk: partition -> log -> segments, indexes, batch format, producer state.

Knows nothing of SQL or DuckDB. The public face is ``Store`` (a data
directory of topics), ``TopicLog`` (a topic's partitions and routing) and
``PartitionLog`` (one append-only log).
"""
