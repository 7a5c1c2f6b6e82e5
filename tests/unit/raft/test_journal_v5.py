"""A journal of segment format version 5 (copies ahead of the records), the format this release
writes, as release 87f0e8b left it after a crash: it loads, restores its newest batch from its
copy, and goes on where it ended. A release that writes another format keeps reading it."""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

from journal_layout import entry_offset, layout, records_end, version

from shoal.node.raft._io import RealIO
from shoal.node.raft.journal import RECORD_HEADER_BYTES, Journal

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "journal-v5" / "p0.raft"
SEGMENT = f"{1:020d}.wal"
SIZES = [100] * 12 + [12_000] * 3 + [100] * 4


def payload(index: int, size: int | None = None) -> bytes:
    """What ``make_fixture.py`` wrote as entry ``index``."""
    size = SIZES[index - 1] if size is None else size
    head = b"entry %d:" % index
    return head + (bytes(range(256))[index % 7 :: 3] * (size // 80 + 1))[: size - len(head)]


def copied(tmp_path: Path) -> Path:
    directory = tmp_path / "p0.raft"
    shutil.copytree(FIXTURE, directory)
    return directory


def open_journal(directory: Path) -> Journal:
    return Journal(RealIO(disk_free_min_bytes=0), str(directory), zeros_ahead=True)


def test_the_fixture_is_a_crashed_version_5_journal() -> None:
    raw = (FIXTURE / SEGMENT).read_bytes()
    assert version(raw) == 5
    assert [kind for kind, _, _ in layout(raw)][-2:] == ["entry", "copy"]  # the last batch's copy record
    assert raw.endswith(bytes(4096)), "the zeros written ahead of the records are still there"
    assert hashlib.sha256(raw).hexdigest() == "7d37ea7da74594e19c3e9238ac52014fa79c1a522b4afb4b5db884277effb20f"


def test_a_version_5_journal_reads_back_every_entry_with_its_term_and_vote(tmp_path) -> None:
    j = open_journal(copied(tmp_path))
    assert (j.first_index, j.last_index) == (1, 19)
    assert j.entries(1, 20) == [(payload(i), i, 3) for i in range(1, 20)]
    assert (j.meta.state.term, j.meta.state.voted_for) == (3, "n2")
    j.close()


def test_damage_in_its_last_batch_is_restored_from_the_version_5_copy_ahead(tmp_path, caplog) -> None:
    directory = copied(tmp_path)
    path = directory / SEGMENT
    raw = bytearray(path.read_bytes())
    raw[entry_offset(bytes(raw), 18) + RECORD_HEADER_BYTES + 3] ^= 0x20
    path.write_bytes(bytes(raw))
    # The durable synced mark names the large batch (entries 13-15); only the copy ahead of the
    # records vouches for the last batch.
    with caplog.at_level(logging.WARNING, logger="shoal.node.raft.journal"):
        j = open_journal(directory)
    assert "restored from their copy" in caplog.text
    assert j.entries(1, 20) == [(payload(i), i, 3) for i in range(1, 20)]
    j.close()


def test_the_first_append_goes_on_where_it_ended(tmp_path) -> None:
    directory = copied(tmp_path)
    j = open_journal(directory)
    for index in range(20, 41):
        j.append(index, 4, payload(index, 20_000))  # batches of 40 KB and more: too large to copy
        if index % 3 == 0:
            j.sync()
    j.close()
    assert sorted(p.name for p in directory.iterdir() if p.suffix == ".wal") == [SEGMENT]
    raw = (directory / SEGMENT).read_bytes()
    assert version(raw) == 5 and len(raw) == records_end(raw), "closed at its last record"
    j = open_journal(directory)
    assert j.entries(1, 41) == [(payload(i), i, 3) for i in range(1, 20)] + [
        (payload(i, 20_000), i, 4) for i in range(20, 41)]
    j.close()
