"""Python's cyclic garbage collector, tuned for a process that holds a database open.

Why: a process with a database open holds many long-lived objects (catalog entries,
per-partition state, indexes, producer tables, sessions), and CPython's collector
(3.11: generations with thresholds ``(700, 10, 10)``) walks all of them in every full
(generation-2) collection. A statement that allocates many container objects at once (a
consumer read of 20,000 messages over 1000 partitions holds thousands of frame slices and
headers) promotes them into the older generations and triggers full collections inside
the statement: with Python's defaults, half of such reads took one, of 60-170 ms, on top
of ~75 ms of work (docs/scale.md, "Round 5: the garbage collector").

What ``configure`` does, once per process, when a database opens (``engine.database``),
and ``freeze_owned_process`` when Topicbase owns the process (``topicbase serve``):

- thresholds ``GC_THRESHOLDS`` = ``(50_000, 20, 10)``: a young collection every 50,000
  net container allocations instead of 700, so a statement's short-lived objects mostly
  die by reference count before a collection sees them and are not promoted; a full
  collection is considered every 10,000,000 (CPython also skips it until the objects
  waiting for it are a quarter of those already in the oldest generation). The third
  threshold stays 10, not higher, to bound how long garbage that reached the oldest
  generation (a closed session's, say) waits; with the freeze a full collection walks
  only what was made since the open, so it is cheap when it comes.
- ``gc.collect()`` then ``gc.freeze()``, only in a process Topicbase owns (the server calls
  ``freeze_owned_process`` once its database is open): what exists then (the modules, the
  catalog, the partitions opened) moves to the permanent generation, which no collection
  walks. Garbage in it is never freed; the collect before it frees what is garbage at
  that moment, so only live objects are frozen, once. Embedded (the DB-API, the console,
  a Spark driver) nothing is frozen: a freeze there would keep the host's own cyclic data
  alive for ever once it became garbage, and the first ``Database`` after its ``close``;
  the thresholds alone gave the same read CPU (77.7 ms against 77.0 with the freeze,
  docs/scale.md).

Cyclic garbage is still collected: the collector stays enabled; cycles made after the
freeze are found by the next young (or, if they survived one, older) collection.

Setting: the environment variable ``TOPICBASE_GC`` read when ``configure`` runs:

- unset or ``tuned`` (the default): the thresholds, and the freeze in an owned process;
- ``threshold``: the thresholds only; ``freeze``: the freeze only (at the first open,
  embedded too: the process asked for it);
- ``python``: leave Python's collector as it is (so does an unknown value, with a warning).

A process that already chose its own thresholds (anything but Python's defaults), or
disabled the collector, is left as it is. A forked child inherits the parent's
thresholds and frozen objects (CPython keeps both across ``fork``), so it needs nothing.
"""

from __future__ import annotations

import gc
import logging
import os
import threading

ENVIRONMENT_VARIABLE = "TOPICBASE_GC"
PYTHON_THRESHOLDS = (700, 10, 10)  # CPython 3.11's defaults
GC_THRESHOLDS = (50_000, 20, 10)
MODES = ("tuned", "threshold", "freeze", "python")
DEFAULT_MODE = "tuned"

log = logging.getLogger(__name__)

_lock = threading.Lock()
_configured_mode: str | None = None  # the mode the first ``configure`` applied
_frozen = False  # gc.freeze ran (once per process)


def mode_from_environment() -> str:
    """The mode ``TOPICBASE_GC`` asks for (``DEFAULT_MODE`` when unset or empty; an
    unknown value is logged and leaves the collector as it is: ``python``)."""
    mode = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() or DEFAULT_MODE
    if mode not in MODES:
        log.warning(
            "%s=%r is not one of %s: Python's collector left as it is",
            ENVIRONMENT_VARIABLE, mode, ", ".join(MODES),
        )  # fmt: skip
        return "python"
    return mode


def configure() -> str:
    """Tune the collector for this process (the first call only; later calls return the
    mode applied then). Returns the mode in effect: ``mode_from_environment()``, or
    ``python`` when the process had its own settings already."""
    global _configured_mode
    with _lock:
        if _configured_mode is not None:
            return _configured_mode
        mode = mode_from_environment()
        if not gc.isenabled() or gc.get_threshold() != PYTHON_THRESHOLDS:
            mode = "python"  # the process chose for itself
        if mode in ("tuned", "threshold"):
            gc.set_threshold(*GC_THRESHOLDS)
        if mode == "freeze":
            _freeze_locked()
        _configured_mode = mode
        assert _configured_mode in MODES
        return mode


def freeze_owned_process() -> bool:
    """In a process Topicbase owns (the server), once its database is open: move what is
    alive to the permanent generation if the mode says so (``tuned`` or ``freeze``).
    Returns whether the process is frozen now. Needs ``configure`` to have run."""
    with _lock:
        assert _configured_mode is not None, "configure() runs when a database opens"
        if _configured_mode in ("tuned", "freeze"):
            _freeze_locked()
        return _frozen


def _freeze_locked() -> None:
    global _frozen
    if not _frozen:
        gc.collect()  # only live objects go to the permanent generation
        gc.freeze()
        _frozen = True


def configured_mode() -> str | None:
    """The mode ``configure`` applied in this process (None: not yet called)."""
    return _configured_mode
