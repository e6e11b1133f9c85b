"""`make demo`: a walk through the storage layer on an embedded data directory.

Two producers write to a topic, one of them resends a batch (as a producer
that lost its acknowledgement would), the resend is skipped as duplicates, the
store is closed and reopened, and everything is read back.
"""

from __future__ import annotations

import argparse
import shutil

from storage.codecs import Codec, encode
from storage.config import TopicConfig
from storage.record_batch import build_wire_batch
from storage.store import Store
from storage.topic_log import TopicAppendResult


def describe(label: str, result: TopicAppendResult) -> None:
    print(
        f"  {label}: {result.written_count} written, {result.duplicate_count} duplicate; "
        f"partitions {sorted(set(result.partitions.tolist()))}, offsets {result.offsets.tolist()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", default="./demo-data")
    parser.add_argument("--keep", action="store_true", help="keep data from an earlier run")
    args = parser.parse_args()
    if not args.keep:
        shutil.rmtree(args.data_dir, ignore_errors=True)

    print(f"Opening a store in {args.data_dir}")
    with Store.open(args.data_dir) as store:
        topic = store.create_topic(TopicConfig(partition_count=2))
        print(f"Created topic {topic.topic_id} with partitions {topic.partition_ids()}")
        first = build_wire_batch(
            [b'{"user": "ann", "n": 1}', b'{"user": "bob", "n": 2}'],
            producer_id="srv-1",
            seq_no=[1, 2],
        )
        zstd_body = encode(Codec.ZSTD, b'{"user": "cy", "n": 3}' * 20)
        second = build_wire_batch(
            [b'{"user": "dan", "n": 4}', zstd_body],
            producer_id="srv-2",
            seq_no=[10, 11],
            codec=[Codec.RAW, Codec.ZSTD],
        )
        describe("srv-1 writes seq 1-2", topic.append(first))
        describe("srv-2 writes seq 10-11", topic.append(second))
        describe("srv-1 resends seq 1-2", topic.append(first))
        more = build_wire_batch([b'{"user": "eve", "n": 5}'], producer_id="srv-1", seq_no=[3])
        describe("srv-1 writes seq 3", topic.append(more))
        topic_id = topic.topic_id

    print("Closed and reopened the store")
    with Store.open(args.data_dir) as store:
        topic = store.topic(topic_id)
        for producer in ("srv-1", "srv-2"):
            print(f"  {producer} continues after seq_no {topic.last_seq_no(producer)}")
        total = 0
        for partition_id in topic.partition_ids():
            result = topic.read(partition_id, 0)
            for batch in result.batches:
                rows = batch.to_pydict()
                for i in range(batch.num_rows):
                    data = rows["data"][i]
                    if rows["codec"][i] != Codec.RAW:
                        data = b"(zstd, %d bytes stored)" % len(data)
                    print(
                        f"  partition {partition_id} offset {rows['offset'][i]} "
                        f"{rows['producer_id'][i]} seq {rows['seq_no'][i]}: {data[:40].decode()}"
                    )
                    total += 1
        print(
            f"Read back {total} messages: the resent pair was skipped, nothing was written twice."
        )
        assert total == 5, total


if __name__ == "__main__":
    main()
