"""The payload of a partition's data entries: a batch of commands and the leader's clock stamp.

A :class:`~shoal.node.raft.replica.PartitionReplica` carries these payloads without reading
them; :class:`~.machine.PartitionMachine` writes them when a batch is proposed and reads them
when the entry is applied. The first byte is the entry kind
(:data:`~shoal.node.raft.messages.ENTRY_DATA`), which the replica routes by.
"""

from __future__ import annotations

from ..log_format import decode_batch as _decode_batch
from ..log_format import encode_batch as _encode_batch
from ..state import Command

__all__ = ["encode_batch", "decode_batch"]


def encode_batch(now_ms: int, commands: list[Command]) -> bytes:
    """The payload of a data entry: the leader's clock stamp and the batch, in the current
    format of :mod:`shoal.node.log_format`."""
    return _encode_batch(now_ms, commands)


def decode_batch(payload: bytes) -> tuple[int, list[Command]]:
    """``(now_ms, commands)`` of a data entry's payload, in any format :mod:`shoal.node.log_format`
    reads; :class:`~shoal.node.log_format.LogFormatError` if it cannot be read."""
    return _decode_batch(payload)
