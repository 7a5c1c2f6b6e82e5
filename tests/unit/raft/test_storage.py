"""storage.py: the deferred test I/O (a SIGKILL is a power cut), the node's sync barriers, NO_SPACE codes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from shoal.cluster.config import ConfigError, load_config
from shoal.cluster.errors import ErrorCode
from shoal.node.http.util import STATUS_BY_CODE
from shoal.node.raft._io import RealIO
from shoal.node.raft.journal import (
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    Journal,
    JournalCorrupt,
    read_sync_mark,
)
from shoal.node.raft.replica import FAIL_NO_SPACE, fail_reason_error
from shoal.node.raft.storage import DeferredIO, NodeStorage, make_io


def test_deferred_io_keeps_unsynced_bytes_in_the_process_until_a_kill(tmp_path) -> None:
    # A child process appends 3 entries, syncs 2 of them, writes a third and is SIGKILLed.
    code = textwrap.dedent(f"""
        import os, signal
        from shoal.node.raft.storage import DeferredIO
        from shoal.node.raft.journal import Journal
        j = Journal(DeferredIO(disk_free_min_bytes=0), {str(tmp_path / "j")!r})
        j.append(1, 1, b"one"); j.append(2, 1, b"two"); j.sync()
        j.append(3, 1, b"three")
        assert [e[0] for e in j.entries(1, 4)] == [b"one", b"two", b"three"]  # readable before the sync
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert done.returncode == -9, done.stderr.decode()
    j = Journal(RealIO(disk_free_min_bytes=0), str(tmp_path / "j"))
    assert [e[0] for e in j.entries(1, 10)] == [b"one", b"two"]
    j.close()


def test_under_deferred_io_a_kill_loses_unsynced_rewrites_and_synced_damage_is_refused(tmp_path) -> None:
    # The synced mark is rewritten in place without a flush of its own after a copied sync: a
    # kill loses it as a power cut may. The mark record written ahead of entry 101, synced with
    # it, still vouches for the first batch: damage to it is refused, not cut as a torn tail.
    code = textwrap.dedent(f"""
        import os, signal
        from shoal.node.raft.storage import DeferredIO
        from shoal.node.raft.journal import Journal
        j = Journal(DeferredIO(disk_free_min_bytes=0), {str(tmp_path / "j")!r})
        for i in range(1, 101):
            j.append(i, 1, b"%04d" % i * 25)
        j.sync()
        j.append(101, 1, b"kept"); j.sync()
        j.append(102, 1, b"lost")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert done.returncode == -9, done.stderr.decode()
    io = RealIO(disk_free_min_bytes=0)
    assert read_sync_mark(io, str(tmp_path / "j")).index == 0  # its lazy writes died with the process
    (segment,) = [p for p in (tmp_path / "j").iterdir() if p.suffix == ".wal"]
    clean = segment.read_bytes()
    raw = bytearray(clean)
    offset = SEGMENT_HEADER_BYTES + 49 * (RECORD_HEADER_BYTES + 100)  # entry 50
    raw[offset + RECORD_HEADER_BYTES] ^= 0x04
    segment.write_bytes(bytes(raw))
    with pytest.raises(JournalCorrupt) as err:
        Journal(io, str(tmp_path / "j"))
    assert (err.value.path, err.value.offset) == (str(segment), offset)
    assert "mark record" in str(err.value)
    segment.write_bytes(clean)
    j = Journal(io, str(tmp_path / "j"))
    assert j.last_index == 101 and j.entries(101, 102)[0][0] == b"kept"
    j.close()


def test_deferred_io_truncate_and_rewrite(tmp_path) -> None:
    io = DeferredIO(disk_free_min_bytes=0)
    h = io.open(str(tmp_path / "f"))
    h.append(b"abcdef")
    h.datasync()
    h.append(b"ghij")
    assert h.pread(4, 4) == b"efgh" and os.path.getsize(tmp_path / "f") == 6
    h.truncate(8)
    h.datasync()
    assert (tmp_path / "f").read_bytes() == b"abcdefgh"
    h.truncate(3)
    assert (tmp_path / "f").read_bytes() == b"abc" and h.size == 3
    h.close()


def test_make_io_refuses_an_unknown_test_mode(monkeypatch) -> None:
    monkeypatch.setenv("SHOAL_TEST_IO", "nonsense")
    with pytest.raises(ValueError, match="deferred"):
        make_io()
    monkeypatch.setenv("SHOAL_TEST_IO", "deferred")
    assert isinstance(make_io(), DeferredIO)


def test_barriers_sync_by_role_and_class(tmp_path) -> None:
    storage = NodeStorage(RealIO(disk_free_min_bytes=0), str(tmp_path))
    follower, leader, lazy = (storage.open_journal(p) for p in range(3))
    leader.leader_appends = True
    lazy.lazy_appends = True
    for j in (follower, leader, lazy):
        j.append(j.last_index + 1, 1, b"x")
    storage.barrier()  # before a frame leaves: the follower's answer needs its sync
    assert not follower.dirty and leader.dirty and lazy.dirty
    storage.after_send()  # right after: the leader's own copy
    assert not leader.dirty and lazy.dirty
    storage.sync_lazy()  # the sync_interval_ms timer
    assert not lazy.dirty
    assert storage.barrier_syncs == 2 and storage.lazy_syncs == 1
    storage.close()
    for j in (follower, leader, lazy):
        j.close()


def test_before_sync_runs_ahead_of_a_barrier_that_syncs_and_never_for_a_lone_replica(tmp_path) -> None:
    # The node writes its clients' answers there: they vouch for nothing on this node's disk.
    storage = NodeStorage(RealIO(disk_free_min_bytes=0), str(tmp_path))
    follower, leader = storage.open_journal(0), storage.open_journal(1)
    leader.leader_appends = True
    seen: list[tuple[bool, bool]] = []
    storage.before_sync = lambda: seen.append((follower.dirty, leader.dirty))
    storage.barrier()
    storage.after_send()
    assert seen == []  # nothing to sync: nothing runs early
    for j in (follower, leader):
        j.append(j.last_index + 1, 1, b"x")
    storage.barrier()
    storage.after_send()
    assert seen == [(True, True), (False, True)]  # each time before the sync, not after
    for j in (follower, leader):
        j.append(j.last_index + 1, 1, b"y")
    storage.sync_all_now()  # a lone replica's answers leave after its sync, with its commits
    assert len(seen) == 2 and not follower.dirty and not leader.dirty
    storage.close()
    follower.close()
    leader.close()


def test_a_failed_sync_calls_the_fail_stop_hook(tmp_path) -> None:
    failures: list[BaseException] = []
    storage = NodeStorage(RealIO(disk_free_min_bytes=0), str(tmp_path), on_sync_failed=failures.append)
    j = storage.open_journal(0)
    j.append(j.last_index + 1, 1, b"x")
    j._active.datasync = lambda: (_ for _ in ()).throw(OSError(5, "EIO"))  # type: ignore[union-attr]
    storage.barrier()
    assert len(failures) == 1 and "fdatasync" in str(failures[0])


def test_no_space_codes_and_config() -> None:
    assert fail_reason_error(FAIL_NO_SPACE).code == ErrorCode.NO_SPACE
    assert STATUS_BY_CODE["NO_SPACE"] == 507
    cfg = load_config(env={"SHOAL_PEERS": "a=127.0.0.1", "SHOAL_SYNC_INTERVAL_MS": "250",
                           "SHOAL_DISK_FREE_MIN_BYTES": "0"})
    assert (cfg.sync_interval_ms, cfg.disk_free_min_bytes) == (250, 0)
    default = load_config(env={"SHOAL_PEERS": "a=127.0.0.1"})
    assert (default.sync_interval_ms, default.disk_free_min_bytes) == (1_000, 256 * 1024 * 1024)
    assert "sync_interval_ms = 1000" in default.to_toml()
    with pytest.raises(ConfigError, match="sync_interval_ms"):
        load_config(env={"SHOAL_PEERS": "a=127.0.0.1", "SHOAL_SYNC_INTERVAL_MS": "0"})
