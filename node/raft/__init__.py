"""Raft for Shoal: a pure Raft core behind a Ready boundary, and the I/O around it.

The node sees one :class:`PartitionReplica` per hosted partition (propose a batch,
confirm reads, leader / term / is-leader, commit and applied index, quorum, leadership
transfer, elections count) built on the node's one :class:`RaftNetwork` (one
authenticated link per peer, every partition multiplexed) and ticked by its one
:class:`TickScheduler`. The replica drives :class:`~.core.RaftCore`
(:mod:`.core`), which does no I/O, and applies committed entries through an
:class:`Application` (:mod:`.application`): nothing in this package knows what a
command does or imports the queue engine.
"""

from .application import Application
from .replica import BatchResult, PartitionReplica, ReplicaDamaged, fail_reason_error, refuse_some, timing_scale
from .scheduler import TickScheduler
from .transport import RaftNetwork

__all__ = ["Application", "PartitionReplica", "BatchResult", "ReplicaDamaged", "fail_reason_error", "RaftNetwork",
           "TickScheduler", "refuse_some", "timing_scale"]
