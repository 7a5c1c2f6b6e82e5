"""Term and vote on disk (Raft paper §5.1): durable before store() returns."""

from __future__ import annotations

import pytest

from shoal.node.raft._io import RealIO, SimIO
from shoal.node.raft.meta import MetaCorrupt, MetaState, RaftMeta


def test_store_then_read_back(tmp_path) -> None:
    io = RealIO(disk_free_min_bytes=0)
    meta = RaftMeta(io, str(tmp_path / "meta"))
    assert meta.state == MetaState()
    meta.store(7, "node-b:9001", 41)
    assert RaftMeta(io, str(tmp_path / "meta")).state == MetaState(7, "node-b:9001", 41)


def test_power_cut_after_store_keeps_the_vote() -> None:
    io = SimIO()
    RaftMeta(io, "/d/meta").store(3, "a")
    io.power_cut()
    assert RaftMeta(io, "/d/meta").state.voted_for == "a"


class _Cut(Exception):
    pass


def test_power_cut_at_every_step_leaves_old_or_new_never_partial() -> None:
    """Replay the store's I/O steps, cutting the power after each one."""
    completed = False
    for cut_after in range(1, 30):
        io = SimIO()
        meta = RaftMeta(io, "/d/meta")
        meta.store(1, "old")
        steps = [0]

        def hook(what: str) -> None:
            steps[0] += 1
            if steps[0] == cut_after:
                raise _Cut(what)

        io.step_hook = hook
        try:
            meta.store(2, "new")
            completed = True
        except _Cut:
            pass
        io.step_hook = None
        io.power_cut()
        state = RaftMeta(io, "/d/meta").state
        assert (state.term, state.voted_for) in {(1, "old"), (2, "new")}
        if completed:
            assert state.term == 2, "store() returned before the new vote was durable"
            break
    assert completed


def test_corrupt_file_is_a_clear_error(tmp_path) -> None:
    io = RealIO(disk_free_min_bytes=0)
    path = tmp_path / "meta"
    RaftMeta(io, str(path)).store(5, None)
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(MetaCorrupt, match="checksum mismatch"):
        RaftMeta(io, str(path))
    path.write_bytes(b"garbage")
    with pytest.raises(MetaCorrupt, match=str(path)):
        RaftMeta(io, str(path))
