"""A node's identity file: written once, read back on every start, and what it refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shoal.node.identity import (IDENTITY_FILE, IdentityError, NodeIdentity, load_identity, new_incarnation,
                                 read_identity, write_identity)
from shoal.node.raft._io import RealIO, SimIO


def test_first_start_writes_an_identity_that_every_later_start_reads_back(tmp_path: Path) -> None:
    data = str(tmp_path / "n1")
    first = load_identity(data, "cluster-a", "n1")
    assert (first.cluster_id, first.node_id) == ("cluster-a", "n1") and len(first.incarnation) == 16
    assert (tmp_path / "n1" / IDENTITY_FILE).is_file()
    assert load_identity(data, "cluster-a", "n1") == first


def test_an_empty_data_directory_gets_a_new_incarnation(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    first = load_identity(str(data), "c", "n1")
    for name in os.listdir(data):
        os.unlink(data / name)  # the disk was wiped
    second = load_identity(str(data), "c", "n1")
    assert second.incarnation != first.incarnation and (second.cluster_id, second.node_id) == ("c", "n1")


def test_data_without_an_identity_takes_a_new_incarnation(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "n1"
    data.mkdir()
    (data / "p0.raft").mkdir()
    identity = load_identity(str(data), "c", "n1", make_incarnation=lambda: "f00d")
    assert identity.incarnation == "f00d" and read_identity(RealIO(), str(data / IDENTITY_FILE)) == identity
    assert "holds 1 files but no identity" in caplog.text


def test_a_data_directory_of_another_cluster_is_refused_naming_both(tmp_path: Path) -> None:
    data = str(tmp_path / "n1")
    load_identity(data, "cluster-a", "n1")
    with pytest.raises(IdentityError, match="cluster 'cluster-a'.*cluster 'cluster-b'"):
        load_identity(data, "cluster-b", "n1")


def test_a_data_directory_of_another_node_is_refused_naming_both(tmp_path: Path) -> None:
    data = str(tmp_path / "n1")
    load_identity(data, "c", "n1")
    with pytest.raises(IdentityError, match="node 'n1'.*'n2'"):
        load_identity(data, "c", "n2")


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "not ours", "empty", "bad field", "huge"])
def test_a_damaged_identity_file_is_refused_by_name(tmp_path: Path, damage: str) -> None:
    data = tmp_path / "n1"
    load_identity(str(data), "c", "n1")
    path = data / IDENTITY_FILE
    raw = path.read_bytes()
    if damage == "flip a byte":
        raw = raw[:-3] + bytes([raw[-3] ^ 0x20]) + raw[-2:]
    elif damage == "truncate":
        raw = raw[:len(raw) // 2]
    elif damage == "not ours":
        raw = b'{"cluster_id": "c"}'
    elif damage == "empty":
        raw = b""
    elif damage == "bad field":
        io = RealIO()
        write_identity(io, str(path), NodeIdentity("c", "n1", ""))
        raw = path.read_bytes()
    else:
        raw = b"x" * 10_000
    path.write_bytes(raw)
    with pytest.raises(IdentityError) as refused:
        load_identity(str(data), "c", "n1")
    assert str(path) in str(refused.value)
    assert path.read_bytes() == raw, "a damaged identity is never overwritten"


def test_new_incarnations_differ() -> None:
    assert len({new_incarnation() for _ in range(100)}) == 100


class _Cut(Exception):
    pass


def test_a_power_cut_at_any_step_of_the_first_write_leaves_no_identity_or_the_whole_one() -> None:
    """Replay the first start's I/O steps, cutting the power after each one."""
    completed = False
    for cut_after in range(1, 30):
        io = SimIO()
        steps = [0]

        def hook(what: str) -> None:
            steps[0] += 1
            if steps[0] == cut_after:
                raise _Cut(what)

        io.step_hook = hook
        written: NodeIdentity | None = None
        try:
            written = load_identity("/d", "c", "n1", io=io, make_incarnation=lambda: "abc")
            completed = True
        except _Cut:
            pass
        io.step_hook = None
        io.power_cut()
        after = read_identity(io, "/d/" + IDENTITY_FILE)  # never IdentityError: no torn file
        assert after in (None, NodeIdentity("c", "n1", "abc"))
        if completed:
            assert after == written, "load_identity returned before the identity was durable"
            break
    assert completed
