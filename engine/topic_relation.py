"""The columns of a topic relation, built from storage's read batches.

``FROM TOPIC t`` stands for a table with the columns ``partition, offset,
seq_no, producer_id, message_group_id, created_at, written_at, codec, data,
metadata``; ``data`` is decoded to plain bytes and ``codec`` is the codec's
name. Building it is columnar: no message is touched one by one in Python,
except compressed ones, which must be decompressed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from storage.codecs import Codec, decode_column
from storage.record_batch import METADATA_TYPE, TIMESTAMP

SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("seq_no", pa.int64()),
        pa.field("producer_id", pa.string()),
        pa.field("message_group_id", pa.string()),
        pa.field("created_at", TIMESTAMP),
        pa.field("written_at", TIMESTAMP),
        pa.field("codec", pa.dictionary(pa.int8(), pa.string())),
        pa.field("data", pa.binary()),
        pa.field("metadata", METADATA_TYPE),
    ]
)

# Index = codec id; ids without a codec map to null.
_CODEC_LABELS = pa.array(
    [
        None if i not in {c.value for c in Codec} else Codec(i).label
        for i in range(max(c.value for c in Codec) + 1)
    ],
    pa.string(),
)


def relation_batch(
    partition: int,
    batch: pa.RecordBatch,
    *,
    decode: bool = True,
    partitions: np.ndarray | None = None,
) -> pa.RecordBatch:
    """Turn one storage read batch into a batch of the topic relation: every row of
    ``partition``, or, when given, of ``partitions`` (int32, one per row: a batch
    decoded from many partitions' frames at once)."""
    count = batch.num_rows
    if partitions is None:
        partitions = np.full(count, partition, dtype=np.int32)
    assert partitions.dtype == np.int32 and len(partitions) == count
    codec_ids = batch.column("codec")
    data = batch.column("data")
    if decode:
        data = decode_column(codec_ids, data)
    # The codec name as a dictionary column: indices are the codec ids themselves.
    indices = pa.Array.from_buffers(
        pa.int8(), count, [None, pa.py_buffer(codec_ids.to_numpy(zero_copy_only=False))]
    )
    labels = pa.DictionaryArray.from_arrays(indices, _CODEC_LABELS)
    return pa.RecordBatch.from_arrays(
        [
            pa.Array.from_buffers(pa.int32(), count, [None, pa.py_buffer(partitions)]),
            batch.column("offset"),
            batch.column("seq_no"),
            batch.column("producer_id"),
            batch.column("message_group_id"),
            batch.column("created_at"),
            batch.column("written_at"),
            labels,
            data,
            batch.column("metadata"),
        ],
        schema=SCHEMA,
    )


def empty_table() -> pa.Table:
    return SCHEMA.empty_table()
