"""A journal of segment format version 4 (copies right after their batches), as release 7f6cb35
left it after a crash, loads in this release, restores from its copies and continues."""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

from journal_layout import layout, version

from shoal.node.raft._io import RealIO
from shoal.node.raft.journal import RECORD_HEADER_BYTES, Journal

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "journal-v4" / "p0.raft"
SEGMENT = f"{1:020d}.wal"


def payload(index: int) -> bytes:
    """What ``make_fixture.py`` wrote as entry ``index``."""
    return b"entry %d:" % index + bytes(range(256))[index % 7 :: 3]


def copied(tmp_path: Path) -> Path:
    directory = tmp_path / "p0.raft"
    shutil.copytree(FIXTURE, directory)
    return directory


def test_the_fixture_is_a_crashed_version_4_journal() -> None:
    raw = (FIXTURE / SEGMENT).read_bytes()
    assert version(raw) == 4
    assert [kind for kind, _, _ in layout(raw)][-2:] == ["entry", "copy"]  # the last batch's copy stayed
    assert hashlib.sha256(raw).hexdigest() == "28f5a11abd005e2db406995cb5049ad02dca1df3d01d663d3f562e7e6f46aab4"


def test_a_version_4_journal_reads_back_every_entry_with_its_term_and_vote(tmp_path) -> None:
    j = Journal(RealIO(disk_free_min_bytes=0), str(copied(tmp_path)))
    assert (j.first_index, j.last_index) == (1, 12)
    assert j.entries(1, 13) == [(payload(i), i, 3) for i in range(1, 13)]
    assert (j.meta.state.term, j.meta.state.voted_for) == (3, "n2")
    j.close()


def test_damage_in_its_last_batch_is_restored_from_the_version_4_copy(tmp_path, caplog) -> None:
    directory = copied(tmp_path)
    path = directory / SEGMENT
    raw = bytearray(path.read_bytes())
    (offset,) = [o for kind, o, i in layout(bytes(raw)) if kind == "entry" and i == 11]
    raw[offset + RECORD_HEADER_BYTES + 3] ^= 0x20
    path.write_bytes(bytes(raw))
    # The synced mark names the first batch and the mark record ahead of entry 9 the second:
    # only the copy vouches for the last batch.
    with caplog.at_level(logging.WARNING, logger="shoal.node.raft.journal"):
        j = Journal(RealIO(disk_free_min_bytes=0), str(directory))
    assert "restored from their copy" in caplog.text
    assert j.entries(1, 13) == [(payload(i), i, 3) for i in range(1, 13)]
    j.close()


def test_the_first_append_seals_it_and_the_log_goes_on_in_the_current_format(tmp_path) -> None:
    directory = copied(tmp_path)
    j = Journal(RealIO(disk_free_min_bytes=0), str(directory))
    for index in range(13, 31):
        j.append(index, 4, payload(index))
        if index % 6 == 0:
            j.sync()
    j.close()
    names = sorted(p.name for p in directory.iterdir() if p.suffix == ".wal")
    assert names == [SEGMENT, f"{13:020d}.wal"]
    old = (directory / SEGMENT).read_bytes()
    assert version(old) == 4 and layout(old)[-1][0] == "copy"  # sealed as it was, its copy kept
    assert version((directory / names[1]).read_bytes()) == 5
    j = Journal(RealIO(disk_free_min_bytes=0), str(directory))
    assert j.entries(1, 31) == [(payload(i), i, 3 if i <= 12 else 4) for i in range(1, 31)]
    j.close()
