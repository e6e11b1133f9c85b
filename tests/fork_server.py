"""A fork server for crash tests' child scripts: a cold ``python child.py`` spends about a
second importing (DuckDB, Arrow, pandas, the grammar); a child forked from a process that
has imported them starts in milliseconds, so a crash test spends its time crashing.

    python tests/fork_server.py CHILD_SCRIPT

imports ``CHILD_SCRIPT`` as a module (its ``if __name__ == "__main__"`` block does not
run), then reads one JSON object a line on stdin: ``{"argv": [...], "environment":
{...}, "failpoints": "...", "stdout": PATH, "stderr": PATH}``. For each it forks a child
that sets those environment variables, arms the failpoints (what ``TOPICBASE_FAILPOINTS``
does at import; the server starts without it), points its stdout and stderr at the files,
sets ``sys.argv`` and runs the module's ``main()`` (``main(argv)`` if it takes one): its
exit code is ``main``'s return value (``None``: 0), a ``SystemExit``'s code, 1 for an
exception (traceback in stderr), 137 for a failpoint crash. The server prints ``exit
<code>`` when the child ends. One child at a time; the server is single-threaded and
opens nothing, so forking is safe. End of stdin ends it.

``ForkServer`` is the test side. What a child does and where it crashes are the same as
in a cold start; a test that kills at random moments should still start real processes
(``subprocess``), so that some kills land in the start itself.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import select
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _load(script: Path):
    sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(script.stem, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[script.stem] = module
    spec.loader.exec_module(module)
    return module


def _child(module, command: dict) -> None:
    """In the forked child: redirect, arm, run ``main``; never returns."""
    code = 1
    try:
        for fd, key in ((1, "stdout"), (2, "stderr")):
            opened = os.open(command[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        os.environ.update(command["environment"])
        from storage import failpoints

        failpoints.activate(command["failpoints"])
        sys.argv = [str(module.__file__), *command["argv"]]
        try:
            takes_argv = bool(inspect.signature(module.main).parameters)
            result = module.main(command["argv"]) if takes_argv else module.main()
            code = 0 if result is None else int(result)
        except SystemExit as ended:
            code = ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(script: Path) -> None:
    sys.path.insert(0, str(ROOT))
    module = _load(script)
    for line in sys.stdin:
        command = json.loads(line)
        child = os.fork()
        if child == 0:
            _child(module, command)
        _, status = os.waitpid(child, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)


# The store's ledger switches (``storage.config``): a child gets the test process's.
LEDGER_SWITCHES = ("TOPICBASE_LEDGER", "TOPICBASE_LEDGER_SHARES_MIN")


class ForkServer:
    """Runs ``script``'s ``main`` in forked children, one at a time (see the module doc)."""

    def __init__(self, script: Path, tmp: Path) -> None:
        self.tmp = tmp
        self.runs = 0
        environment = {k: v for k, v in os.environ.items() if k != "TOPICBASE_FAILPOINTS"}
        self.proc = subprocess.Popen([sys.executable, __file__, str(script)], env=environment,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)  # fmt: skip

    def run(self, argv: list[str], *, environment: dict[str, str] | None = None,
            failpoints: str = "", timeout: float = 300) -> subprocess.CompletedProcess:  # fmt: skip
        """Run a child to its end: its exit code (137: crashed at a failpoint) and output."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.runs += 1
        out, err = self.tmp / f"child-{self.runs}.out", self.tmp / f"child-{self.runs}.err"
        # the ledger's switches as this process has them now (a test may pin them,
        # ``ledger_off`` in tests/conftest.py), not as they were when the server started
        environment = {**{name: os.environ.get(name, "") for name in LEDGER_SWITCHES},
                       **(environment or {})}  # fmt: skip
        command = {"argv": argv, "environment": environment, "failpoints": failpoints,
                   "stdout": str(out), "stderr": str(err)}  # fmt: skip
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"the child {argv} did not end within {timeout} s"
        line = self.proc.stdout.readline()
        assert line.startswith("exit "), (line, err.read_text())
        return subprocess.CompletedProcess(argv, int(line.split()[1]), out.read_text(),
                                           err.read_text())  # fmt: skip

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class ModuleForkServer:
    """One ``ForkServer`` of ``script`` for a test module: ``fixture()`` (bound to a name in
    the module; module-scoped, autouse) starts it before the module's first test and closes
    it after the last; ``server`` is it while it runs, else None."""

    def __init__(self, script: Path) -> None:
        self.script = script
        self.server: ForkServer | None = None

    def fixture(self) -> Any:
        import pytest  # the served children never need it

        @pytest.fixture(scope="module", autouse=True)
        def fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
            self.server = ForkServer(self.script, tmp_path_factory.mktemp("children"))
            try:
                yield
            finally:
                self.server.close()
                self.server = None

        return fork_server

    def run(self, argv: list[str], **options: Any) -> subprocess.CompletedProcess:
        """``ForkServer.run`` on the module's server."""
        assert self.server is not None, "the module's fork server is not running"
        return self.server.run(argv, **options)


if __name__ == "__main__":
    serve(Path(sys.argv[1]).resolve())
