"""A/B of the Flight door's upload path: ``TopicbaseClient.put`` of N x 1 KiB messages
staged, then committed, with the server and the client each in its own process.

Round 23 (H1): main's ``put`` sent one DoPut stream; the branch's sends ``stage`` actions
of ~6 MiB of Arrow IPC. Run it with the code trees to compare, alternated::

    python -m bench.flight_stage_ab --tree A=/work/main --tree B=/tmp/h1wt --pairs 3

Each run starts a fresh server (``start_flight`` over a new data directory, code from
its tree) and a fresh client process (same tree); reported per run: the client's wall
time and process CPU of ``put``, the server's CPU (utime + stime from ``/proc``) over
the ``put``, and the same for the commit; rows/s = N / put wall time. The messages are
random bytes (no compression lever), in batches of ``--batch-rows``; ``--partitioned``
adds a ``partition`` column (row % 4), so the rows are staged as partition frames.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

SERVER = textwrap.dedent("""
    import sys, time
    from engine.database import Database
    from sql.flight.server import start_flight
    from sql.pgwire.users import add_user, default_users_path
    database = Database.open(sys.argv[1], retention_interval_s=None)
    add_user(default_users_path(database.path), "bench", "bench", superuser=True)
    session = database.connect()
    session.execute("CREATE TOPIC events WITH (min_active_partitions = 4)")
    session.close()
    door = start_flight(database, "127.0.0.1", 0, "scram")
    print(door.port, flush=True)
    sys.stdin.read()
    door.stop()
    database.close()
""")

CLIENT = textwrap.dedent("""
    import json, os, sys, time
    import pyarrow as pa
    from spark_sql_ext.client import TopicbaseClient
    port, server_pid, rows, batch_rows, partitioned, part_mib = (int(a) for a in sys.argv[1:7])
    if part_mib:  # the stage client's part size (a tree without it ignores this)
        import spark_sql_ext.client
        spark_sql_ext.client.PART_BYTES = part_mib << 20

    def server_cpu():
        with open(f"/proc/{server_pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    values = pa.array([os.urandom(1024) for _ in range(batch_rows)], pa.binary())
    columns = {"data": values}
    if partitioned:  # rows naming their partition: staged as frames, as Spark's tasks do
        columns["partition"] = pa.array([i % 4 for i in range(batch_rows)], pa.int32())
    batch = pa.record_batch(columns)
    client = TopicbaseClient(f"topicbase://127.0.0.1:{port}", "bench", "bench")
    out = {}
    wall, cpu, scpu = time.perf_counter(), time.process_time(), server_cpu()
    write_id = client.put({"topic": "events"}, (batch for _ in range(rows // batch_rows)),
                          batch.schema)
    out["put_wall"] = time.perf_counter() - wall
    out["put_cpu"] = time.process_time() - cpu
    out["put_server_cpu"] = server_cpu() - scpu
    wall, cpu, scpu = time.perf_counter(), time.process_time(), server_cpu()
    answer = client.commit("bench", 0, [write_id])
    out["commit_wall"] = time.perf_counter() - wall
    out["commit_server_cpu"] = server_cpu() - scpu
    assert answer["rows"] == rows, answer
    print(json.dumps(out))
""")


def run(tree: str, rows: int, batch_rows: int, partitioned: bool, part_mib: int
        ) -> dict[str, float]:  # fmt: skip
    env = {**os.environ, "PYTHONPATH": tree}
    with tempfile.TemporaryDirectory() as scratch:
        server = subprocess.Popen([sys.executable, "-c", SERVER, os.path.join(scratch, "d")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  cwd=tree, env=env)  # fmt: skip
        try:
            port = server.stdout.readline().strip()
            done = subprocess.run(
                [sys.executable, "-c", CLIENT, port, str(server.pid), str(rows), str(batch_rows),
                 str(int(partitioned)), str(part_mib)],
                capture_output=True, text=True, cwd=tree, env=env, check=True)  # fmt: skip
        finally:
            server.communicate("", timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tree", action="append", required=True, help="NAME=path")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument(
        "--partitioned",
        action="store_true",
        help="rows carry a partition column (the frames staging path)",
    )
    parser.add_argument(
        "--part-mib",
        type=int,
        default=0,
        help="PART_BYTES of the stage client in MiB (0: its default)",
    )
    arguments = parser.parse_args()
    trees = dict(t.split("=", 1) for t in arguments.tree)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for index in range(arguments.pairs):
        for name, tree in trees.items():  # A B A B ...
            found = run(tree, arguments.rows, arguments.batch_rows, arguments.partitioned,
                        arguments.part_mib)  # fmt: skip
            results[name].append(found)
            print(f"pair {index} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in found.items()),
                  flush=True)  # fmt: skip
    for name, runs in results.items():
        print(f"{name}: median (min-max)")
        for key in runs[0]:
            values = [r[key] for r in runs]
            low, high = min(values), max(values)
            print(f"  {key}: {statistics.median(values):.2f} ({low:.2f}-{high:.2f})")
        rates = [arguments.rows / r["put_wall"] for r in runs]
        low, high = min(rates), max(rates)
        print(f"  put rows/s: {statistics.median(rates):,.0f} ({low:,.0f}-{high:,.0f})")


if __name__ == "__main__":
    main()
