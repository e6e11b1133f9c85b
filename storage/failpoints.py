"""Named failpoints: places where tests make the process crash or an I/O fail.

Switched on by the environment variable ``TOPICBASE_FAILPOINTS`` (read once at
import) or by ``activate`` in tests: a comma-separated list of
``name=action`` where action is ``crash`` (``os._exit(137)`` at once, like
SIGKILL: no cleanup, no flush), ``error`` (raise ``StorageIOError``) or ``nomem``
(raise ``MemoryError``: an allocation failing there, as one does under the server's
process memory cap, ``sql.pgwire.memory_cap``; not an I/O error, so no handler meant
for those catches it), with an optional ``@n``: trigger on the n-th hit only
(``commit.after_stage=crash@3``).

Zero cost when off: ``hit`` tests one module-level boolean.

Names in use: ``tables.new_file_made`` (a new data directory's DuckDB file made under
its temporary name, not yet synced or renamed: ``engine.tables.create_whole``),
``fs.before_sync``, ``fs.after_sync`` (every counted fsync),
``index.before_flush``, ``segment.torn_write`` (half a frame written),
``partition.after_write`` (a frame written at a partition's log end, its producer state
not recorded, not yet published: every append, publish and spread share),
``segment.roll_after_seal``, ``segment.roll_before_snapshot``,
``retention.before_roll``, ``retention.after_roll`` (an idle partition's expired
active segment rolled by retention), ``retention.before_delete``,
``split.after_child``, ``split.before_save``, ``split.after_save`` (inside an
autopartitioning split), ``split.mid_redirect`` (between the children of a publish
redirected from a split partition), ``staging.after_sync``, ``staging.torn_record``
(half a commit record written), ``staging.prewrite`` (before the zeros of a staging
file's pre-written window are written; ``error`` is a failed zero write, as ENOSPC),
``commit.after_stage``, ``commit.after_commit_point``,
``commit.before_validate`` (a commit's slot being made: claims and turn, before its
validation), ``commit.before_log_append``, ``commit.log_appended`` (a topic-only commit's
record appended, under the commit lock), ``commit.after_log_append`` (a topic-only commit),
``commit.mid_publish``, ``commit.log_durable`` (a topic-only commit's record durable,
the committer's state not yet caught up), ``commit.before_mirror`` (committed, the
offsets' mirror not moved), ``commit.before_note_done`` (published, not yet counted for
the checkpoint), ``commit.checkpoint_before_delete``,
``commit.checkpoint_before_release``, ``recovery.after_republish``; a bulk commit by
reference (``engine.staged_refs``): ``bulk.mid_manifest`` (a commit directory's manifest
created under its temporary name, nothing written in it), ``bulk.mid_move`` (one write
moved to its commit
directory), ``bulk.before_commit`` (files synced, no transaction yet), ``bulk.mid_release``
(between two commit directories deleted); ``publish.mid_share`` (between two frames of a
transactional publish: a share cut into bounded frames, ``storage.frame_cuts``);
``publish.mid_spread`` (between two partitions' shares of a publish over many
partitions, ``storage.spread_publish``); an own staged frames file adopted as a segment
(``PartitionLog._adopt_locked``; a share's consecutive own files adopted together, each
point hit per file but ``adopt.before_sync``): ``adopt.before_patch`` (nothing done to the
file), ``adopt.mid_patch`` (half its headers patched), ``adopt.before_sync`` (every file
of the run patched, none synced), ``adopt.before_rename`` (every file patched and synced,
the earlier ones renamed, this one still in the commit directory),
``adopt.before_dir_sync`` (renamed into the partition, the directory not synced),
``adopt.before_visible`` (indexed, the directory synced, not yet published),
``adopt.after_visible`` (published, the commit directory still there);
``publish.frames_then_rows`` (between a share's staged frames and its rows, a bulk
commit of frames and Arrow rows of one partition); ``deltas.before_commit`` and
``deltas.after_commit`` (around the DuckDB COMMIT of a group of counter deltas, ``engine.deltas``);
``sink.after_commit`` (a sink's batch committed with its ``(sink id, batch id)`` record,
its answer not yet sent, ``engine.bulk_write``); ``page_cache.after_drop_behind`` (a write
just dropped written-back, unsynced log bytes from the page cache,
``storage.page_cache.drop_behind``); the ledger (``storage.ledger``): ``ledger.torn_frame``
(half of a group-commit round's frames written, then the action), ``ledger.after_write``
(a round's frames written, not synced), ``ledger.after_sync`` (synced, not yet indexed or
acknowledged), ``ledger.mid_drop`` (a ledger file deleted behind the copy, the next not
yet); the copy (``storage.ledger_copy``): ``ledger.copy_after_append`` (a partition's
copied rows synced in its log, not yet released in the ledger).
"""

from __future__ import annotations

import os
import threading

from storage.errors import StorageIOError

ENVIRONMENT_VARIABLE = "TOPICBASE_FAILPOINTS"

_armed: dict[str, tuple[str, int]] = {}
_hits: dict[str, int] = {}
_lock = threading.Lock()
ACTIVE = False


def activate(spec: str) -> None:
    """Arm failpoints from a ``name=action[@n],...`` specification (replaces earlier ones)."""
    global ACTIVE
    armed: dict[str, tuple[str, int]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        assert action in ("crash", "error", "nomem"), f"unknown failpoint action {action!r}"
        armed[name] = (action, int(nth or 1))
    with _lock:
        _armed.clear()
        _armed.update(armed)
        _hits.clear()
        ACTIVE = bool(armed)


def deactivate() -> None:
    activate("")


def armed(name: str) -> bool:
    """True if ``name`` is armed (whatever its hit count): for failpoints that must
    prepare damage (a torn write) before they fire."""
    return ACTIVE and name in _armed


def hit(name: str) -> None:
    """Pass a failpoint: crash or fail here if it is armed and due."""
    if not ACTIVE:
        return
    with _lock:
        armed = _armed.get(name)
        if armed is None:
            return
        count = _hits.get(name, 0) + 1
        _hits[name] = count
    action, nth = armed
    if count != nth:
        return
    if action == "crash":
        os._exit(137)
    if action == "nomem":
        raise MemoryError(f"failpoint {name} injected an allocation failure")
    raise StorageIOError(f"failpoint {name} injected an I/O error", failpoint=name)


activate(os.environ.get(ENVIRONMENT_VARIABLE, ""))
