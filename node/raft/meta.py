"""A replica's Raft metadata on disk: current term, vote, and a commit-index hint.

Raft (paper §5.1, Figure 2) requires ``currentTerm`` and ``votedFor`` to be on
stable storage before the node answers a RequestVote or campaigns, else a node
that restarts can vote twice in one term. :meth:`RaftMeta.store` therefore
returns only once the new file is durable: written to a temp file, fsynced,
renamed over the old one, and the directory fsynced. A power cut at any step
leaves the old or the new file, never a partial one.

The commit index is only a hint (it lets a restarted node apply what it knew
was committed without waiting for a leader); it is stored with the same
discipline but lazily, and is clamped to the journal's end by the reader.

It also keeps what a replica must remember across a loss of its log: the group's first
membership it was created with, and whether it is *recovering* (its log was discarded after
damage, so it may neither vote nor campaign until a leader has caught it up).

File format: ``b"SHOALMETA1\\n"``, a 4-byte little-endian CRC32C of the JSON
body, then the JSON body ``{"term": int, "voted_for": str|null, "commit_index": int,
"initial"?: [[voters], [learners]], "recovering"?: true}``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from typing import Any

import google_crc32c

from ._io import FileIO

__all__ = ["MetaCorrupt", "RaftMeta", "MetaState"]

_MAGIC = b"SHOALMETA1\n"
_META_BYTES_MAX = 64 * 1024


class MetaCorrupt(Exception):
    """The metadata file exists but cannot be trusted; the message names the file and why."""


@dataclass(frozen=True, slots=True)
class MetaState:
    """What the metadata file holds."""

    term: int = 0
    voted_for: str | None = None
    commit_index: int = 0
    #: The group's first membership as this replica was created with it ([[voters], [learners]]),
    #: None until the replica records it.
    initial: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    #: The replica lost its log (damage repaired by discarding it): it neither votes nor
    #: campaigns until a leader has brought it back in line. Survives restarts.
    recovering: bool = False


class RaftMeta:
    """Durable term, vote and commit-index hint of one replica, in one file."""

    def __init__(self, io: FileIO, path: str) -> None:
        self._io = io
        self.path = path
        self.state = self._load()

    def _load(self) -> MetaState:
        if not self._io.exists(self.path):
            return MetaState()
        raw = self._io.read_all(self.path)
        if len(raw) > _META_BYTES_MAX:
            raise MetaCorrupt(f"{self.path}: {len(raw)} bytes, more than {_META_BYTES_MAX}")
        if not raw.startswith(_MAGIC) or len(raw) < len(_MAGIC) + 4:
            raise MetaCorrupt(f"{self.path}: not a Shoal Raft metadata file (bad header)")
        (crc,) = struct.unpack_from("<I", raw, len(_MAGIC))
        body = raw[len(_MAGIC) + 4 :]
        if google_crc32c.value(body) != crc:
            raise MetaCorrupt(f"{self.path}: checksum mismatch over {len(body)} bytes")
        try:
            doc = json.loads(body)
            term, voted, commit = doc["term"], doc["voted_for"], doc["commit_index"]
        except (ValueError, KeyError, TypeError) as exc:
            raise MetaCorrupt(f"{self.path}: unreadable body: {exc}") from exc
        if not isinstance(term, int) or term < 0 or not isinstance(commit, int) or commit < 0:
            raise MetaCorrupt(f"{self.path}: bad term {term!r} or commit index {commit!r}")
        if voted is not None and not isinstance(voted, str):
            raise MetaCorrupt(f"{self.path}: bad voted_for {voted!r}")
        initial = doc.get("initial")
        recovering = doc.get("recovering", False)
        try:
            if initial is not None:
                initial = (tuple(str(v) for v in initial[0]), tuple(str(v) for v in initial[1]))
        except (TypeError, IndexError) as exc:
            raise MetaCorrupt(f"{self.path}: bad initial membership {initial!r}") from exc
        if not isinstance(recovering, bool):
            raise MetaCorrupt(f"{self.path}: bad recovering flag {recovering!r}")
        return MetaState(term, voted, commit, initial, recovering)

    def store(self, term: int, voted_for: str | None, commit_index: int | None = None, **changes: Any) -> None:
        """Make term and vote (and the commit hint, and any of ``initial``/``recovering`` given)
        durable before returning; what is not given keeps its value."""
        if commit_index is None:
            commit_index = self.state.commit_index
        state = replace(self.state, term=term, voted_for=voted_for, commit_index=commit_index, **changes)
        doc: dict[str, Any] = {"term": state.term, "voted_for": state.voted_for, "commit_index": state.commit_index}
        if state.initial is not None:
            doc["initial"] = [list(state.initial[0]), list(state.initial[1])]
        if state.recovering:
            doc["recovering"] = True
        body = json.dumps(doc, separators=(",", ":")).encode()
        self._io.write_atomic(self.path, [_MAGIC, struct.pack("<I", google_crc32c.value(body)), body])
        self.state = state
