"""The messages replicas of one Raft group exchange, and the kinds of log entry.

Every message names the sender's term; a reply also names the term it answers
in, so a leader can tell an answer to its own term from a stale one (Raft
paper §5.1: a message of an older term is ignored). Messages are msgspec
structs encoded as MessagePack arrays whose first element is a tag, so a
frame is small and decoding a peer's message checks every field's type.

Entries are ``(payload, index, term)`` tuples, the journal's own order. The
first byte of a payload says what it is (:data:`ENTRY_DATA`,
:data:`ENTRY_CONFIG`, :data:`ENTRY_NOOP`); the Raft core reads only config
entries, everything else is the application's.
"""

from __future__ import annotations

from typing import Union

import msgspec

__all__ = ["Entry", "AppendEntries", "AppendResponse", "RequestVote", "VoteResponse", "Heartbeat",
           "HeartbeatResponse", "TimeoutNow", "InstallSnapshot", "SnapshotChunk", "SnapshotChunkAck",
           "Message", "encode_message", "decode_message", "ENTRY_DATA", "ENTRY_CONFIG", "ENTRY_NOOP",
           "NOOP_PAYLOAD", "MessageError"]

#: ``(payload, index, term)``.
Entry = tuple[bytes, int, int]

#: An application command batch (the replica's business).
ENTRY_DATA = 0
#: A membership change (:mod:`.membership`); applied by the core when committed.
ENTRY_CONFIG = 1
#: A new leader's first entry: commits the entries of earlier terms (Raft §5.4.2, §8).
ENTRY_NOOP = 2
NOOP_PAYLOAD = bytes([ENTRY_NOOP])


class MessageError(ValueError):
    """A peer's message could not be decoded (wrong shape or types)."""


class _Msg(msgspec.Struct, array_like=True, tag_field="t", frozen=True, gc=False):
    """Base of every message: the sender's current term."""

    term: int


class AppendEntries(_Msg, tag=1, frozen=True, gc=False):
    """Entries ``prev_index + 1 …`` from the leader (none: a probe). ``commit`` is the leader's
    commit index; a follower commits at most up to the last entry this message proved matching.
    ``lazy``: every entry is of the disk durability class (the follower need not sync first).
    ``durable``: the leader's durable index (entries on stable storage on a majority), which a
    follower applies up to and never cuts below."""

    prev_index: int
    prev_term: int
    commit: int
    entries: list[tuple[bytes, int, int]]
    lazy: bool = False
    durable: int = 0


class AppendResponse(_Msg, tag=2, frozen=True, gc=False):
    """Answer to :class:`AppendEntries` (also sent after a snapshot is installed).

    Success: the follower's log matches the leader's up to ``index``. Rejection: ``index``
    is the ``prev_index`` refused, and ``hint_index``/``hint_term`` the follower's last entry
    at or below it, so the leader skips a whole conflicting term at once. ``lost``: the
    follower discarded a damaged log (it is recovering), so entries it acknowledged before
    may be gone: the leader takes ``hint_index`` as its match index even below the old one.
    ``synced``: how far the follower's log is on stable storage as this answer leaves.
    """

    index: int
    reject: bool = False
    hint_index: int = 0
    hint_term: int = 0
    lost: bool = False
    synced: int = 0


class RequestVote(_Msg, tag=3, frozen=True, gc=False):
    """A (pre-)candidate asks for a vote. ``pre``: a pre-vote, which changes no state
    (Raft thesis §9.6); ``transfer``: sent on a leadership transfer, so it is granted even
    while a leader is still heard from."""

    last_index: int
    last_term: int
    pre: bool = False
    transfer: bool = False


class VoteResponse(_Msg, tag=4, frozen=True, gc=False):
    """Answer to :class:`RequestVote` (``term`` is the term voted in for a pre-vote)."""

    granted: bool
    pre: bool = False


class Heartbeat(_Msg, tag=5, frozen=True, gc=False):
    """The leader is alive. ``commit`` is at most what this follower is known to match, so a
    heartbeat never commits an entry that was not checked against the leader's log;
    ``leader_commit`` is the leader's own commit index (a recovering follower that matches
    through it holds every committed entry); ``round`` numbers the leader's heartbeat rounds
    of its term (the answer names it: the leader's read lease and ReadIndex count them);
    ``durable`` the leader's durable index, at most what this follower is known to match."""

    commit: int
    leader_commit: int = 0
    round: int = 0
    durable: int = 0


class HeartbeatResponse(_Msg, tag=6, frozen=True, gc=False):
    """Answer to :class:`Heartbeat`: the follower counts this leader in its term, as of the
    heartbeat round ``round``; its log is on stable storage up to ``synced``."""

    round: int = 0
    synced: int = 0


class TimeoutNow(_Msg, tag=7, frozen=True, gc=False):
    """Leadership transfer: campaign now (Raft thesis §3.10)."""


class InstallSnapshot(_Msg, tag=8, frozen=True, gc=False):
    """A whole snapshot, checked and durable on the follower's disk, handed to its core.

    Never crosses the network as such: the leader streams the file as :class:`SnapshotChunk`
    messages and the follower's replica steps this once the file is complete and verified.
    ``config`` is the membership as of ``index`` (:meth:`.membership.Membership.to_wire`).
    """

    leader: str
    index: int
    snap_term: int
    config: list[list[str]]


class SnapshotChunk(_Msg, tag=9, frozen=True, gc=False):
    """One piece of the snapshot file ending at entry ``index`` (term ``snap_term``).

    ``offset`` and ``total`` place it in the stream; ``file_crc`` is the CRC32C of the whole
    snapshot file (the follower checks it before the file replaces anything); ``crc`` that of
    ``data``. ``files`` (in a stream's chunks at offset 0): the snapshot refers to files of the
    leader, which follow the snapshot file in the stream, in this order, as ``(name, bytes)``;
    ``total`` counts them too.
    """

    index: int
    snap_term: int
    offset: int
    total: int
    file_crc: int
    crc: int
    data: bytes
    files: list[tuple[str, int]] | None = None


class SnapshotChunkAck(_Msg, tag=10, frozen=True, gc=False):
    """The follower holds the snapshot ``index`` up to ``next_offset`` (resume from there).
    ``status``: 0 go on, 1 the file was complete and verified, 2 start over (damaged or a
    different snapshot), 3 not wanted (the follower no longer needs it). ``files``: the
    follower takes a snapshot that refers to files streamed beside it."""

    index: int
    next_offset: int
    status: int = 0
    files: bool = False


Message = Union[AppendEntries, AppendResponse, RequestVote, VoteResponse, Heartbeat, HeartbeatResponse,
                TimeoutNow, InstallSnapshot, SnapshotChunk, SnapshotChunkAck]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode_message(message: Message) -> bytes:
    """MessagePack bytes of ``message``."""
    return _encoder.encode(message)


def decode_message(data: bytes | msgspec.Raw) -> Message:
    """Decode a peer's message; :class:`MessageError` when it is not one."""
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MessageError(f"not a Raft message: {exc}") from exc
