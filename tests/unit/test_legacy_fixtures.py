"""A journal and a snapshot written by release a0861d3 load in this release with the same state.

The fixtures (``tests/fixtures/release-a0861d3``, README there) hold pickled data entries;
they are read by :func:`shoal.node.partition.log_format.read_legacy_batch`, which runs nothing. Each
test works on a copy: opening a journal writes to its directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import pytest

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError
from shoal.node.partition.log_format import FORMAT_VERSION, LEGACY_PICKLE, decode_batch, encode_batch, payload_version
from shoal.node.raft._io import RealIO
from shoal.node.raft.journal import Journal
from shoal.node.raft.membership import Membership, decode_change
from shoal.node.raft.messages import ENTRY_CONFIG, ENTRY_DATA, NOOP_PAYLOAD
from shoal.node.raft.snapshots import load_snapshot, verify_snapshot
from shoal.node.state import PartitionEngine
from shoal.node.state._key_table import key_hash

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "release-a0861d3"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
PARTITION = EXPECTED["partition"]
pytestmark = pytest.mark.timeout(60)


def render(value: Any) -> Any:
    """The fixture script's rendering of a decoded command (types kept; a tuple as a list)."""
    if isinstance(value, msgspec.Struct):
        return {"struct": type(value).__name__,
                "fields": {f: render(getattr(value, f)) for f in value.__struct_fields__}}
    if type(value) is Raw:
        return {"raw": value.packed.hex()}
    if type(value) is bytes:
        return {"bytes": value.hex()}
    if type(value) is msgpack.ExtType:
        return {"ext": [value.code, value.data.hex()]}
    if type(value) is msgpack.Timestamp:
        return {"timestamp": [value.seconds, value.nanoseconds]}
    if type(value) in (list, tuple):
        return [render(v) for v in value]
    if type(value) is dict:
        return {"dict": [[render(k), render(v)] for k, v in value.items()]}
    if type(value) is float:
        return {"float": value.hex()}
    if value is None or type(value) in (bool, int, str):
        return value
    raise TypeError(f"no rendering for {type(value).__name__}")


@pytest.fixture
def entries(tmp_path: Path) -> list[tuple[bytes, int, int]]:
    """Every entry of the fixture journal, read by this release's journal from a copy."""
    directory = tmp_path / "journal"
    shutil.copytree(FIXTURES / "p3.raft", directory)
    journal = Journal(RealIO(disk_free_min_bytes=0), str(directory))
    try:
        assert (journal.first_index, journal.last_index) == (1, len(EXPECTED["entries"]))
        return journal.entries(1, journal.last_index + 1)
    finally:
        journal.close()


def release_digest(engine: PartitionEngine) -> str:
    """``engine.digest()`` as the release computes it: engine state version 1, which held the
    idempotency window's key strings where version 2 holds their hashes. The fixture's keys are
    each given once and none is dropped, so the window's version-1 form follows from the hashes
    and the keys the fixture's commands give."""
    given = {key_hash(queue, key): (queue, key) for queue, key in (("emails", "k-1"),)}
    fields = msgpack.unpackb(engine.snapshot(), raw=False, strict_map_key=False)
    (over, runs), entries = fields[8], fields[9]
    assert over == -1 and sum(run[2] for run in runs) == len(entries)
    order, live = [], []
    for h, c, seq in entries:
        expires = next(run[0] for run in runs if run[1] >= seq)
        queue, key = given[h, c]
        order.append([expires, [queue, key]])
        live.append([queue, key, f"{engine.partition}-{seq}", expires])
    fields[0], fields[8], fields[9] = 1, order, live
    return hashlib.sha256(msgpack.packb(fields, use_bin_type=True)).hexdigest()


def apply_entry(engine: PartitionEngine, payload: bytes, index: int, term: int) -> None:
    """Apply a committed entry as a replica does (errors are per command and change nothing)."""
    if payload[0] != ENTRY_DATA:
        return
    now_ms, commands = decode_batch(payload, index)
    engine.enter_term(term)
    for cmd in commands:
        try:
            engine.apply(cmd, now_ms, replies=False, events=False)
        except CommandError:
            pass


def test_entries_decode_to_what_the_release_decoded(entries: list[tuple[bytes, int, int]]) -> None:
    for (payload, index, term), want in zip(entries, EXPECTED["entries"], strict=True):
        assert (index, term) == (want["index"], want["term"])
        if want["kind"] == "config":
            assert payload[0] == ENTRY_CONFIG
            change = decode_change(payload)
            assert (change.kind, change.node, change.result) == ("add_learner", "n3",
                                                                  Membership.of(["n1", "n2"], ["n3"]))
            continue
        if want["kind"] == "noop":
            assert payload == NOOP_PAYLOAD
            continue
        assert payload_version(payload) == LEGACY_PICKLE
        now_ms, commands = decode_batch(payload, index)
        assert now_ms == want["now_ms"]
        assert [render(c) for c in commands] == want["decoded"]


def test_journal_replays_to_the_release_state(entries: list[tuple[bytes, int, int]]) -> None:
    engine = PartitionEngine(PARTITION)
    for (payload, index, term), want in zip(entries, EXPECTED["entries"], strict=True):
        apply_entry(engine, payload, index, term)
        assert release_digest(engine) == want["digest"], f"entry {index}"
    assert release_digest(engine) == EXPECTED["final_digest"]


def test_snapshot_loads_and_the_journal_continues_it(tmp_path: Path,
                                                     entries: list[tuple[bytes, int, int]]) -> None:
    path = str(tmp_path / "p3.snap")
    shutil.copyfile(FIXTURES / "p3.snap", path)
    io = RealIO(disk_free_min_bytes=0)
    snap = verify_snapshot(io, path)
    assert (snap.index, snap.term) == (EXPECTED["snapshot_index"], EXPECTED["term"])
    assert snap.membership == Membership.of(["n1", "n2"], ["n3"])
    engine, index, term, membership = load_snapshot(io, path, PartitionEngine.restore_chunks)
    assert (index, term, membership) == (snap.index, snap.term, snap.membership)
    assert release_digest(engine) == EXPECTED["snapshot_digest"]
    for payload, i, t in entries[index:]:
        apply_entry(engine, payload, i, t)
    assert release_digest(engine) == EXPECTED["final_digest"]


def test_release_entries_rewritten_in_the_current_format_give_the_same_state(
        entries: list[tuple[bytes, int, int]]) -> None:
    engine = PartitionEngine(PARTITION)
    for (payload, index, term), want in zip(entries, EXPECTED["entries"], strict=True):
        if payload[0] == ENTRY_DATA:
            now_ms, commands = decode_batch(payload, index)
            payload = encode_batch(now_ms, commands)
            assert payload_version(payload) == FORMAT_VERSION
        apply_entry(engine, payload, index, term)
        assert release_digest(engine) == want["digest"], f"entry {index}"


def test_the_fixture_files_are_unchanged() -> None:
    """The script's record of the snapshot file matches the file (a regenerated fixture shows)."""
    assert hashlib.sha256((FIXTURES / "p3.snap").read_bytes()).hexdigest() == EXPECTED["snapshot_file_sha256"]
    assert EXPECTED["release"] == "a0861d3"
    assert sorted(os.listdir(FIXTURES / "p3.raft")) == ["00000000000000000001.wal", "meta", "synced"]


def test_the_partition_machine_applies_the_release_journal(entries: list[tuple[bytes, int, int]]) -> None:
    """The node's own apply path (the partition's application) reads the pickled entries."""
    from shoal.node.partition import PartitionMachine
    machine = PartitionMachine(PARTITION)
    for payload, index, term in entries:
        if payload[0] == ENTRY_DATA:
            machine.apply(payload, term, leading=False, replies=False)
    assert release_digest(machine.engine) == EXPECTED["final_digest"]
