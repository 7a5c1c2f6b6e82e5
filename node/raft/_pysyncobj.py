"""Every pysyncobj name Shoal uses that pysyncobj does not document: all in one place.

pysyncobj computes Raft; Shoal owns the I/O around it through pysyncobj's
extension points (``transport=``, custom serializer hooks, ``autoTick=False``).
A few things have no extension point and are reached here, checked against the
version pinned in ``pyproject.toml`` (:data:`CHECKED_VERSION`). If an upgrade
renames one, :func:`missing_private_names` lists it and the unit test
``tests/unit/raft/test_pysyncobj_seam.py`` fails loudly instead of the node
misbehaving quietly.

Nothing outside ``shoal.node.raft`` imports pysyncobj.
"""

from __future__ import annotations

import pickle
import socket
from typing import Any

_INET_NTOP = socket.inet_ntop

import pysyncobj.pickle as _pickle_mod  # noqa: E402 (the import below must follow the line above)
import pysyncobj.syncobj as _syncobj_mod
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.node import Node
from pysyncobj.transport import Transport
from pysyncobj.version import VERSION

# pysyncobj.win_inet_pton (imported by its TCP transport) replaces socket.inet_ntop on every
# OS with a Windows-only function that fails everywhere else; put the real one back.
socket.inet_ntop = _INET_NTOP

__all__ = ["SyncObj", "SyncObjConf", "replicated", "FAIL_REASON", "Node", "Transport", "monotonic_time",
           "VERSION", "CHECKED_VERSION", "LEADER", "FOLLOWER", "CANDIDATE", "RaftInternals",
           "missing_private_names", "install_module_patches", "HookedSyncObj"]

#: The pysyncobj release this module was checked against (the upper bound in pyproject.toml).
CHECKED_VERSION = "0.3.17"

LEADER = _syncobj_mod._RAFT_STATE.LEADER
FOLLOWER = _syncobj_mod._RAFT_STATE.FOLLOWER
CANDIDATE = _syncobj_mod._RAFT_STATE.CANDIDATE

#: SyncObj's name-mangled attributes and methods read or overridden by Shoal.
PRIVATE_ATTRIBUTES = (
    "_SyncObj__raftState", "_SyncObj__transport", "_SyncObj__otherNodes", "_SyncObj__connectedNodes",
    "_SyncObj__lastResponseTime", "_SyncObj__raftLog", "_SyncObj__raftNextIndex", "_SyncObj__raftMatchIndex",
    "_SyncObj__raftCommitIndex", "_SyncObj__raftLastApplied", "_SyncObj__newAppendEntriesTime",
    "_SyncObj__raftElectionDeadline", "_SyncObj__conf", "_SyncObj__serializer",
)
PRIVATE_METHODS = (
    "_SyncObj__sendAppendEntries", "_SyncObj__onMessageReceived", "_SyncObj__applyLogEntries",
    "_SyncObj__getEntries", "_SyncObj__sendNextNodeIdx", "_onTick", "_checkCommandsToApply", "_isLeader", "_getLeader",
)
PRIVATE_MODULE_NAMES = (
    (_syncobj_mod, "PIPE_NOTIFIER_ENABLED"), (_syncobj_mod, "_RAFT_STATE"), (_pickle_mod, "__protocol"),
    (_syncobj_mod, "createJournal"),
)


def missing_private_names(instance: Any | None = None) -> list[str]:
    """The private pysyncobj names this module relies on that do not exist (empty when all do).

    Attributes are set in ``SyncObj.__init__``, so pass a built instance to check them too.
    """
    missing = [name for name in PRIVATE_METHODS if not hasattr(SyncObj, name)]
    missing += [f"{mod.__name__}.{name}" for mod, name in PRIVATE_MODULE_NAMES if not hasattr(mod, name)]
    if instance is not None:
        missing += [name for name in PRIVATE_ATTRIBUTES if name not in vars(instance)]
    return missing


_patched = False
#: Entries read per slice when pysyncobj asks for a byte-bounded suffix of the log.
ENTRIES_READ_SLICE = 256
#: Most entries one read returns (pysyncobj's apply loop asks for every committed entry at once).
ENTRIES_READ_MAX = 1024


def install_module_patches() -> None:
    """Two module globals, set once per process before any group is built.

    - pysyncobj pickles log entries with protocol 2 (for Python 2 peers), which has no
      binary-bytes opcode: every job payload took a slow latin-1 round trip on every
      replica. All Shoal nodes run Python 3, so protocol 5; ``loads`` reads any protocol.
    - pysyncobj wakes its tick thread through a pipe on every proposal; Shoal ticks from
      its event loop and schedules ticks itself, so the pipe (two syscalls per entry) goes.
    """
    global _patched
    if _patched:
        return
    setattr(_pickle_mod, "__protocol", pickle.HIGHEST_PROTOCOL)
    _syncobj_mod.PIPE_NOTIFIER_ENABLED = False
    _patched = True


class RaftInternals:
    """Typed access to one SyncObj's private state (a view, no state of its own)."""

    __slots__ = ("_obj",)

    def __init__(self, obj: SyncObj) -> None:
        self._obj = obj

    @property
    def state(self) -> int:
        return self._obj._SyncObj__raftState  # type: ignore[attr-defined,no-any-return]

    @property
    def transport(self) -> Any:
        return self._obj._SyncObj__transport  # type: ignore[attr-defined]

    @property
    def other_nodes(self) -> set[Any]:
        return self._obj._SyncObj__otherNodes  # type: ignore[attr-defined,no-any-return]

    @property
    def connected_nodes(self) -> set[Any]:
        return self._obj._SyncObj__connectedNodes  # type: ignore[attr-defined,no-any-return]

    @property
    def last_response_time(self) -> dict[Any, float]:
        return self._obj._SyncObj__lastResponseTime  # type: ignore[attr-defined,no-any-return]

    @property
    def raft_log(self) -> Any:
        return self._obj._SyncObj__raftLog  # type: ignore[attr-defined]

    @property
    def next_index(self) -> dict[Any, int]:
        return self._obj._SyncObj__raftNextIndex  # type: ignore[attr-defined,no-any-return]

    @property
    def match_index(self) -> dict[Any, int]:
        return self._obj._SyncObj__raftMatchIndex  # type: ignore[attr-defined,no-any-return]

    @property
    def commit_index(self) -> int:
        return self._obj._SyncObj__raftCommitIndex  # type: ignore[attr-defined,no-any-return]

    @property
    def last_applied(self) -> int:
        return self._obj._SyncObj__raftLastApplied  # type: ignore[attr-defined,no-any-return]

    @property
    def next_append_entries_time(self) -> float:
        return self._obj._SyncObj__newAppendEntriesTime  # type: ignore[attr-defined,no-any-return]

    @property
    def election_deadline(self) -> float:
        return self._obj._SyncObj__raftElectionDeadline  # type: ignore[attr-defined,no-any-return]

    @election_deadline.setter
    def election_deadline(self, value: float) -> None:
        self._obj._SyncObj__raftElectionDeadline = value  # type: ignore[attr-defined]

    @property
    def conf(self) -> SyncObjConf:
        return self._obj._SyncObj__conf  # type: ignore[attr-defined,no-any-return]

    def install_serializer(self, serializer: Any) -> None:
        """Replace pysyncobj's snapshot ``Serializer`` (same methods) by Shoal's forking one."""
        self._obj._SyncObj__serializer = serializer  # type: ignore[attr-defined]

    def get_entries(self, from_index: int, count: int | None = None, max_bytes: int | None = None) -> list[Any]:
        return self._obj._SyncObj__getEntries(from_index, count, max_bytes)  # type: ignore[attr-defined,no-any-return]

    def send_next_index(self, node: Any, next_index: int, *, success: bool, reset: bool) -> None:
        """Answer an AppendEntries: pysyncobj's ``next_node_idx`` reply."""
        self._obj._SyncObj__sendNextNodeIdx(node, reset=reset, nextNodeIdx=next_index, success=success)  # type: ignore[attr-defined]


class HookedSyncObj(SyncObj):  # type: ignore[misc]
    """``SyncObj`` whose private steps a subclass may refine through ordinary method names.

    pysyncobj calls these steps by their name-mangled names; the overrides live
    here, so the subclass never spells a private name.

    ``journal``, when given, is the Raft log pysyncobj uses instead of the one
    ``conf.journalFile`` would make (pysyncobj has no parameter for it: its
    module-level ``createJournal`` is swapped for the constructor call only).
    """

    def __init__(self, *args: Any, journal: Any = None, **kwargs: Any) -> None:
        #: The Raft log when Shoal's journal is it (counted reads go to it by index).
        self._journal = journal
        if journal is None:
            super().__init__(*args, **kwargs)
            return
        create = _syncobj_mod.createJournal
        _syncobj_mod.createJournal = lambda _path: journal
        try:
            super().__init__(*args, **kwargs)
        finally:
            _syncobj_mod.createJournal = create

    def _SyncObj__getEntries(self, fromIDx: Any, count: Any = None, maxSizeBytes: Any = None) -> list[Any]:  # noqa: N802
        """Entries from ``fromIDx``, read from the journal in bounded slices.

        pysyncobj reads "every entry from here on" and then cuts at ``maxSizeBytes``, and
        applies "every committed entry" in one read: with a journal on disk (a restarted
        replica, a lagging follower) either would load a whole suffix of the log into
        memory. A count above :data:`ENTRIES_READ_MAX` is cut to it (the apply loop goes
        on at the next tick), and a byte-bounded read stops at the bound.
        """
        journal = self._journal
        if count is not None:
            if journal is not None:  # pysyncobj's way slices the log by position: two index lookups more
                if fromIDx is None or fromIDx < journal.first_index:
                    return []
                return journal.entries(fromIDx, fromIDx + min(count, ENTRIES_READ_MAX))  # type: ignore[no-any-return]
            return SyncObj._SyncObj__getEntries(self, fromIDx, min(count, ENTRIES_READ_MAX))  # type: ignore[attr-defined,no-any-return]
        if maxSizeBytes is None:
            return SyncObj._SyncObj__getEntries(self, fromIDx, None, None)  # type: ignore[attr-defined,no-any-return]
        out: list[Any] = []
        total = 0
        while True:
            chunk = SyncObj._SyncObj__getEntries(self, fromIDx, ENTRIES_READ_SLICE)  # type: ignore[attr-defined]
            for entry in chunk:
                out.append(entry)
                total += len(entry[0])
                if total >= maxSizeBytes:
                    return out
            if len(chunk) < ENTRIES_READ_SLICE:
                return out
            fromIDx += len(chunk)

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802 (pysyncobj's name)
        self.send_append_entries()

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 (pysyncobj's name)
        self.handle_message(node, message)

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802 (pysyncobj's name)
        return self.apply_log_entries()

    # --- refinable steps (defaults: pysyncobj's own) --------------------------------------------------

    def send_append_entries(self) -> None:
        """Send every follower what it lacks (or a heartbeat)."""
        SyncObj._SyncObj__sendAppendEntries(self)  # type: ignore[attr-defined]

    def handle_message(self, node: Any, message: Any) -> None:
        """Handle one Raft message from ``node``."""
        SyncObj._SyncObj__onMessageReceived(self, node, message)  # type: ignore[attr-defined]

    def apply_log_entries(self) -> bool:
        """Apply committed entries; True when followers should hear of the new commit index."""
        return SyncObj._SyncObj__applyLogEntries(self)  # type: ignore[attr-defined,no-any-return]

    # --- public names for pysyncobj's single-underscore internals ---------------------------------

    def raft_tick(self) -> None:
        """One pysyncobj tick: elections, commit index, applies, heartbeats, queued proposals."""
        self._onTick(0.0)

    def append_queued_commands(self) -> None:
        """Append (and send) the proposals waiting in pysyncobj's queue, now."""
        self._checkCommandsToApply()

    def is_leader(self) -> bool:
        return self._isLeader()  # type: ignore[no-any-return]

    def leader_node(self) -> Any:
        """The last known leader's node object, or None."""
        return self._getLeader()
