"""Many partition logs made durable by one sync of their file system (round 32).

A ledger copier's pass (``storage.ledger_route``) syncs every partition it copied rows
into: 1000 logs, 1000 ``fdatasync`` calls, each its own journal commit and cache flush
and its own release and re-take of the GIL (~90 ms of CPU a pass on this machine, about
half of the copier's CPU; docs/scale.md, round 32). ``sync_logs`` makes them durable with
ONE ``syncfs`` of the file system they are on, where the file system offers it
(``FileSystem.open_sync_handle``), and falls back to each log's own sync otherwise.

Invariants:
- a log is reported synced (``durable_end`` raised) only when a sync that began after
  its bytes were written reported success: its own ``fdatasync``, or a ``syncfs`` of its
  file system through a handle that reports every write-back failure on that file system
  since it was opened, and one nobody had seen before (Linux >= 5.8); the handle is
  opened before the topic's first ledger frame, so before any row it covers reaches a log
  (``TopicLedger._file_system_sync``; bytes a log held
  before are its own syncs' concern: a failure one of them saw refuses the log, as
  below);
- a ``syncfs`` that reports a failure is followed by each log's own sync, so the failure
  reaches the log it concerns (the kernel reports it to that file's syncs too), which
  fences as any failed sync does; a log whose earlier sync failed is never reported
  synced (``LogSegment.synced_together``);
- only logs on the handle's file system (``device`` equal) are covered by its sync.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from storage.errors import PartitionFencedError, StorageIOError
from storage.fs import FileSystem
from storage.partition_log import PartitionLog, SyncTicket


class FileSystemSync:
    """A handle for syncing many logs under one directory at once: opened before the
    writes it is to cover (``FileSystem.open_sync_handle``), closed with ``close``."""

    def __init__(self, fs: FileSystem, directory: str) -> None:
        self._fs = fs
        self._handle = fs.open_sync_handle(directory)
        self._device = None if self._handle is None else os.fstat(self._handle).st_dev
        self._on_device: dict[str, bool] = {}  # a log's directory -> on the handle's device
        self.together = 0  # syncs of the whole file system that reported success
        self.fell_back = 0  # ... that reported a failure (each log synced on its own)

    def sync_logs(self, logs: Sequence[PartitionLog]) -> dict[int, BaseException]:
        """Make everything written to ``logs`` so far durable, as each one's ``sync``
        would (a fenced or failing log raises nothing here: its error is returned by
        partition id, the others are synced all the same). What publishes to a log were
        redirected to (``PartitionLog.sync_redirected``) is synced too."""
        failed: dict[int, BaseException] = {}
        begun: list[tuple[PartitionLog, SyncTicket]] = []
        alone: list[PartitionLog] = []
        for log in logs:
            if not self._covers(log):
                alone.append(log)
                continue
            try:
                ticket = log.begin_sync()
            except (PartitionFencedError, StorageIOError) as error:
                failed[log.partition_id] = error
                continue
            if ticket is not None:
                begun.append((log, ticket))
        synced = False
        try:
            if begun:
                synced = self._sync_file_system()
        finally:  # every ticket ended, whatever happened (each holds a descriptor)
            for log, ticket in begun:
                try:
                    log.end_sync(ticket, synced=synced)
                    if log.sync_redirected is not None:
                        log.sync_redirected()
                except (PartitionFencedError, StorageIOError) as error:
                    failed[log.partition_id] = error
        for log in alone:
            try:
                log.sync()
            except (PartitionFencedError, StorageIOError) as error:
                failed[log.partition_id] = error
        return failed

    def _sync_file_system(self) -> bool:
        """One ``syncfs`` through the handle; False when it failed (each log then syncs on
        its own, and those syncs report what failed to the logs it concerns)."""
        assert self._handle is not None
        try:
            synced = self._fs.sync_file_system(self._handle)
        except StorageIOError:  # (a failpoint's error: as a reported failure)
            synced = False
        if synced:
            self.together += 1
        else:
            self.fell_back += 1
        return synced

    def _covers(self, log: PartitionLog) -> bool:
        """Whether one sync through the handle covers ``log`` (its directory is on the
        handle's file system; asked once a directory)."""
        if self._handle is None:
            return False
        directory = log.directory
        known = self._on_device.get(directory)
        if known is None:
            try:
                known = os.stat(directory).st_dev == self._device
            except OSError:
                known = False
            self._on_device[directory] = known
        return known

    def close(self) -> None:
        if self._handle is not None:
            self._fs.close(self._handle)
            self._handle = None
