"""The node's identity on its disk: whose data its data directory holds, and which incarnation.

On its first start a node writes ``<data dir>/identity``: the cluster id and node id
the data is written for, and a random *incarnation* id. Every later start reads it
back, and refuses (:class:`IdentityError`, naming both sides) a data directory of
another cluster or of another node id, or a damaged identity file.

The incarnation tells a node that kept its disk from one that lost it. A data
directory without an identity (a wiped or new disk) gets a new incarnation: the node
is a new member under its old id, whatever it voted before is gone, and its peers see
that on the Raft link (:mod:`.raft.handshake` carries the incarnation and proves it).
A directory that holds files but no identity takes a new incarnation too (its data was
written by a version without identities, or the file was removed): nothing proves the
node is the member that wrote it.

Written like Raft's term and vote (:mod:`.raft.meta`): temp file, fsync, rename,
directory fsync, so a power cut leaves no file or the whole file. Format:
``b"SHOALID1\\n"``, a 4-byte little-endian CRC32C of the JSON body, then the body
``{"cluster_id": str, "node_id": str, "incarnation": str}``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass

import google_crc32c

from .raft._io import FileIO, RealIO

__all__ = ["NodeIdentity", "IdentityError", "IDENTITY_FILE", "INCARNATION_CHARS_MAX", "new_incarnation",
           "read_identity", "write_identity", "load_identity"]

log = logging.getLogger(__name__)

#: The identity file's name inside the node's data directory.
IDENTITY_FILE = "identity"
#: The longest incarnation id (the Raft handshake carries it in a short field).
INCARNATION_CHARS_MAX = 64
_MAGIC = b"SHOALID1\n"
_IDENTITY_BYTES_MAX = 4096
_ID_CHARS_MAX = 200


class IdentityError(Exception):
    """The data directory cannot be used by this node; the message names the file and both sides."""


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Whose data a data directory holds."""

    cluster_id: str
    node_id: str
    incarnation: str


def new_incarnation() -> str:
    """A random incarnation id (64 bits, hex)."""
    return secrets.token_hex(8)


def read_identity(io: FileIO, path: str) -> NodeIdentity | None:
    """The identity stored at ``path``; None when there is no file, :class:`IdentityError` when it is damaged."""
    if not io.exists(path):
        return None
    raw = io.read_all(path)
    if len(raw) > _IDENTITY_BYTES_MAX:
        raise IdentityError(f"{path}: {len(raw)} bytes, more than {_IDENTITY_BYTES_MAX}: not a node identity file")
    if not raw.startswith(_MAGIC) or len(raw) < len(_MAGIC) + 4:
        raise IdentityError(f"{path}: not a Shoal node identity file (bad header)")
    (crc,) = struct.unpack_from("<I", raw, len(_MAGIC))
    body = raw[len(_MAGIC) + 4:]
    if google_crc32c.value(body) != crc:
        raise IdentityError(f"{path}: damaged (checksum mismatch over {len(body)} bytes)")
    try:
        doc = json.loads(body)
        identity = NodeIdentity(doc["cluster_id"], doc["node_id"], doc["incarnation"])
    except (ValueError, KeyError, TypeError) as exc:
        raise IdentityError(f"{path}: damaged (unreadable body: {exc})") from exc
    for name, value, limit in (("cluster_id", identity.cluster_id, _ID_CHARS_MAX),
                               ("node_id", identity.node_id, _ID_CHARS_MAX),
                               ("incarnation", identity.incarnation, INCARNATION_CHARS_MAX)):
        if not isinstance(value, str) or not 1 <= len(value) <= limit:
            raise IdentityError(f"{path}: damaged (bad {name} {value!r})")
    return identity


def write_identity(io: FileIO, path: str, identity: NodeIdentity) -> None:
    """Store ``identity`` at ``path`` durably before returning."""
    body = json.dumps({"cluster_id": identity.cluster_id, "node_id": identity.node_id,
                       "incarnation": identity.incarnation}, separators=(",", ":")).encode()
    io.write_atomic(path, [_MAGIC, struct.pack("<I", google_crc32c.value(body)), body])


def load_identity(data_dir: str, cluster_id: str, node_id: str, *, io: FileIO | None = None,
                  make_incarnation: Callable[[], str] = new_incarnation) -> NodeIdentity:
    """The identity of ``data_dir`` for node ``node_id`` of ``cluster_id``, written first if it has none.

    Raises :class:`IdentityError` when the directory belongs to another cluster or node, or its
    identity file is damaged.
    """
    io = io if io is not None else RealIO(disk_free_min_bytes=0)
    io.makedirs(data_dir)
    path = os.path.join(data_dir, IDENTITY_FILE)
    found = read_identity(io, path)
    if found is not None:
        if found.cluster_id != cluster_id:
            raise IdentityError(
                f"{data_dir} holds data of cluster {found.cluster_id!r} (its {IDENTITY_FILE} file says so), "
                f"but this node is configured for cluster {cluster_id!r}: give the node its own data directory, "
                "or the cluster id its data was written for")
        if found.node_id != node_id:
            raise IdentityError(
                f"{data_dir} holds data of node {found.node_id!r} of cluster {cluster_id!r}, but this node is "
                f"{node_id!r}: give each node its own data directory")
        log.info("node %s of cluster %s: incarnation %s (from %s)", node_id, cluster_id, found.incarnation, path)
        return found
    identity = NodeIdentity(cluster_id, node_id, make_incarnation())
    others = [name for name in io.listdir(data_dir) if name not in (IDENTITY_FILE, IDENTITY_FILE + ".tmp")]
    write_identity(io, path, identity)
    if others:
        log.warning("node %s of cluster %s: %s holds %d files but no identity; this node takes the new "
                    "incarnation %s (nothing proves it is the member that wrote them)", node_id, cluster_id,
                    data_dir, len(others), identity.incarnation)
    else:
        log.info("node %s of cluster %s: new incarnation %s (empty data directory %s)", node_id, cluster_id,
                 identity.incarnation, data_dir)
    return identity
