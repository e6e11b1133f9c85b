"""Tests of storage/fs.py: the one file layer, its errors and its counters."""

from __future__ import annotations

import os
from typing import Any

import pytest

from storage.errors import ObjectInUseError, StorageIOError
from storage.fs import FileSystem


def test_write_file_atomic_creates_and_replaces(tmp_path: Any) -> None:
    fs = FileSystem()
    path = os.path.join(str(tmp_path), "state.json")
    fs.write_file_atomic(path, b"first version, longer")
    fs.write_file_atomic(path, b"second")
    assert fs.read_file(path) == b"second"
    assert os.listdir(tmp_path) == ["state.json"], "no temp file is left behind"


def test_durable_atomic_write_syncs_file_and_directory(tmp_path: Any) -> None:
    fs = FileSystem()
    fs.write_file_atomic(os.path.join(str(tmp_path), "a"), b"x")
    assert (fs.fsync_count, fs.directory_fsync_count) == (1, 1)
    fs.write_file_atomic(os.path.join(str(tmp_path), "b"), b"x", durable=False)
    assert (fs.fsync_count, fs.directory_fsync_count) == (1, 1)


def test_leftover_temp_file_is_overwritten(tmp_path: Any) -> None:
    fs = FileSystem()
    path = os.path.join(str(tmp_path), "f")
    with open(path + ".tmp", "wb") as file:
        file.write(b"a much longer leftover from a crash")
    fs.write_file_atomic(path, b"new")
    assert fs.read_file(path) == b"new"


def test_pwrite_and_pread_at_positions(tmp_path: Any) -> None:
    fs = FileSystem()
    fd = fs.open_write(os.path.join(str(tmp_path), "f"))
    try:
        fs.pwrite(fd, b"hello", 0)
        fs.pwrite(fd, memoryview(b"world"), 8)
        assert fs.pread(fd, 100, 0) == b"hello\0\0\0world"
        assert fs.pread(fd, 3, 8) == b"wor"
        assert fs.file_size(fd) == 13
        fs.truncate(fd, 5)
        assert fs.file_size(fd) == 5
    finally:
        fs.close(fd)


def test_open_write_never_truncates(tmp_path: Any) -> None:
    fs = FileSystem()
    path = os.path.join(str(tmp_path), "f")
    fs.write_file_atomic(path, b"keep me", durable=False)
    fs.close(fs.open_write(path))
    assert fs.read_file(path) == b"keep me"


def test_sync_is_counted(tmp_path: Any) -> None:
    fs = FileSystem()
    fd = fs.open_write(os.path.join(str(tmp_path), "f"))
    try:
        for _ in range(3):
            fs.sync(fd)
    finally:
        fs.close(fd)
    assert fs.fsync_count == 3
    fs.sync_directory(str(tmp_path))
    assert fs.directory_fsync_count == 1


def test_os_errors_become_storage_io_errors_naming_the_path(tmp_path: Any) -> None:
    fs = FileSystem()
    missing = os.path.join(str(tmp_path), "no", "such", "dir", "f")
    with pytest.raises(StorageIOError) as raised:
        fs.open_write(missing)
    assert raised.value.sqlstate == "58030"
    assert missing in str(raised.value) and "ENOENT" in str(raised.value)
    assert raised.value.context["path"] == missing


def test_failed_sync_raises_naming_the_file(tmp_path: Any) -> None:
    fs = FileSystem()
    path = os.path.join(str(tmp_path), "f")
    fd = fs.open_write(path)
    fs.close(fd)
    with pytest.raises(StorageIOError, match="fsync"):
        fs.sync(fd)  # a closed descriptor: EBADF


def test_missing_files_are_reported_as_such(tmp_path: Any) -> None:
    fs = FileSystem()
    missing = os.path.join(str(tmp_path), "gone")
    with pytest.raises(FileNotFoundError):
        fs.open_read(missing)
    with pytest.raises(FileNotFoundError):
        fs.read_file(missing)
    assert fs.list_directory(missing) == []
    assert not fs.exists(missing)
    fs.remove(missing)
    fs.remove_tree(missing)


def test_directory_helpers(tmp_path: Any) -> None:
    fs = FileSystem()
    nested = os.path.join(str(tmp_path), "a", "b")
    fs.make_directory(nested)
    fs.make_directory(nested)
    fs.write_file_atomic(os.path.join(nested, "z"), b"12345", durable=False)
    fs.write_file_atomic(os.path.join(nested, "y"), b"1", durable=False)
    assert fs.list_directory(nested) == ["y", "z"]
    assert fs.path_size(os.path.join(nested, "z")) == 5
    fs.rename(os.path.join(nested, "z"), os.path.join(nested, "x"))
    assert fs.list_directory(nested) == ["x", "y"]
    fs.remove_tree(os.path.join(str(tmp_path), "a"))
    assert not fs.exists(nested)


def test_lock_directory_is_exclusive_and_names_the_owner(tmp_path: Any) -> None:
    fs = FileSystem()
    fd = fs.lock_directory(str(tmp_path))
    assert fs.read_file(os.path.join(str(tmp_path), "LOCK")) == f"{os.getpid()}\n".encode()
    with pytest.raises(ObjectInUseError) as raised:
        FileSystem().lock_directory(str(tmp_path))
    assert raised.value.sqlstate == "55006" and f"pid {os.getpid()}" in str(raised.value)
    fs.unlock_directory(fd)
    FileSystem().unlock_directory(FileSystem().lock_directory(str(tmp_path)))


def test_pwritev_of_more_buffers_than_the_kernel_takes_writes_them_all(tmp_path: Any) -> None:
    # os.pwritev refuses more than IOV_MAX buffers with EINVAL; a transaction that staged
    # batches for 1000 partitions hands the staging log well over 1024 parts.
    fs = FileSystem()
    path = str(tmp_path / "many")
    fd = fs.open_write(path)
    parts = [bytes([i % 251]) * (1 + i % 7) for i in range(3000)]
    try:
        fs.pwritev(fd, parts, 5)
    finally:
        os.close(fd)
    with open(path, "rb") as handle:
        data = handle.read()
    assert data == b"\0" * 5 + b"".join(parts)


@pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="no copy_file_range")
def test_copy_range_falls_back_when_the_kernel_copies_nothing(tmp_path: Any, monkeypatch) -> None:
    # copy_file_range returning 0 before the end (a file system that copies nothing
    # where it cannot) is not an end of file: the bytes are read and written instead.
    data = os.urandom(300_007)
    (tmp_path / "src").write_bytes(data)
    real = os.copy_file_range
    calls = []

    def first_then_nothing(source, target, count, source_position, target_position):
        calls.append(count)
        if len(calls) == 1:
            return real(source, target, 1000, source_position, target_position)
        return 0

    monkeypatch.setattr(os, "copy_file_range", first_then_nothing)
    fs = FileSystem()
    source = fs.open_read(str(tmp_path / "src"))
    target = fs.open_write(str(tmp_path / "dst"))
    try:
        fs.copy_range(source, 3, target, 8, len(data) - 3)
        assert (tmp_path / "dst").read_bytes()[8:] == data[3:]
        with pytest.raises(StorageIOError):  # a real end of file is still an error
            fs.copy_range(source, len(data) - 10, target, 0, 20)
    finally:
        fs.close(source)
        fs.close(target)
