"""The acceptor of the prototype's ``passed`` mode (docs/durable_produce.md, round 28).

``python acceptor.py STORE_SOCKET PORT FRONTS``: starts ``FRONTS`` front processes
(``front.py STORE_SOCKET passed FD``), each with one end of a Unix socket pair, listens
on ``127.0.0.1:PORT`` and hands each accepted connection to the next front in turn
(``socket.send_fds``: SCM_RIGHTS), closing its own copy. Prints ``ready`` once every
front is; ``stop`` on stdin (or its end) stops the fronts and itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str]) -> int:
    store_path, port, count = argv[0], int(argv[1]), int(argv[2])
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(count)]
    fronts = []
    for _, theirs in pairs:
        fronts.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "front.py"), store_path, "passed",
             str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, text=True,
        ))  # fmt: skip
        theirs.close()
    for front in fronts:
        assert front.stdout is not None
        assert front.stdout.readline().strip() == "ready"
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)

    def accept_forever() -> None:
        turn = 0
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            socket.send_fds(pairs[turn % count][0], [b"c"], [sock.fileno()])
            sock.close()
            turn += 1

    threading.Thread(target=accept_forever, daemon=True).start()
    print("ready", flush=True)
    try:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
    finally:
        listener.close()
        for front in fronts:
            front.terminate()
        for front in fronts:
            front.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
