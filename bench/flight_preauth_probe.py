"""What an UNAUTHENTICATED client makes the Flight door hold (round 23, H1).

The door runs in a child process (code from ``$TREE``, default this checkout); a raw
``FlightClient`` that never logs in sends ``DoAction`` / ``GetFlightInfo`` / ``DoGet``
with a body of ``argv[1]`` MiB (default 256), ``argv[2]`` calls at once (default 1); the
door's peak (VmHWM, reset before each kind) and RSS after are read from ``/proc``.
Usage: ``python bench/flight_preauth_probe.py 256 4``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pyarrow.flight as flight

SERVER = textwrap.dedent("""
    import sys
    from engine.database import Database
    from sql.flight.server import start_flight
    from sql.pgwire.users import add_user, default_users_path
    db = Database.open(sys.argv[1], retention_interval_s=None)
    add_user(default_users_path(db.path), "alice", "a", superuser=True)
    door = start_flight(db, "127.0.0.1", 0, "scram")
    print(door.port, flush=True)
    sys.stdin.read()
    door.stop()
    db.close()
""")


def status_mib(pid: int) -> tuple[int, int]:
    """(VmHWM, VmRSS) of ``pid`` in MiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            fields[name] = value
    return int(fields["VmHWM"].split()[0]) >> 10, int(fields["VmRSS"].split()[0]) >> 10


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as handle:
        handle.write("5")


def call(port: int, kind: str, body: bytes) -> str:
    client = flight.FlightClient(f"grpc+tcp://127.0.0.1:{port}")
    try:
        if kind == "DoAction":
            list(client.do_action(flight.Action("stage", body)))
        elif kind == "GetFlightInfo":
            client.get_flight_info(flight.FlightDescriptor.for_command(body))
        else:
            client.do_get(flight.Ticket(body)).read_all()
        return "accepted"
    except flight.FlightError as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"
    finally:
        client.close()


def _into(answers: list[str], port: int, kind: str, body: bytes) -> None:
    answers.append(call(port, kind, body))


def main() -> None:
    size = (int(sys.argv[1]) if len(sys.argv) > 1 else 256) << 20
    parallel = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    tree = os.environ.get("TREE", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory() as scratch:
        server = subprocess.Popen([sys.executable, "-c", SERVER, scratch + "/data"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  cwd=tree, env={**os.environ, "PYTHONPATH": tree})  # fmt: skip
        port = int(server.stdout.readline())
        body = b"\0" * size
        for kind in ("DoAction", "GetFlightInfo", "DoGet"):
            time.sleep(0.5)
            reset_peak(server.pid)
            _, rss_before = status_mib(server.pid)
            answers: list[str] = []
            threads = [threading.Thread(target=_into, args=(answers, port, kind, body))
                       for _ in range(parallel)]  # fmt: skip
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            time.sleep(0.5)
            peak, rss = status_mib(server.pid)
            print(f"{kind} x{parallel}, body {size >> 20} MiB: {answers[0]} | door peak "
                  f"+{peak - rss_before} MiB, RSS after +{rss - rss_before} MiB",
                  flush=True)  # fmt: skip
        server.communicate("", timeout=60)


if __name__ == "__main__":
    main()
