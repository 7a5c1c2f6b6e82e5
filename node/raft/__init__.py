"""Raft for Shoal: the only package that imports pysyncobj, and Shoal's own storage under it.

The node sees one :class:`PartitionReplica` per hosted partition (propose a
batch, read, leader / term / is-leader, commit and applied index, quorum,
leadership transfer, elections count) built on the node's one
:class:`RaftNetwork` (one authenticated link per peer, every partition
multiplexed) and ticked by its one :class:`TickScheduler`.
"""

from .replica import BatchResult, PartitionReplica, fail_reason_error, timing_scale
from .scheduler import TickScheduler
from .transport import RaftNetwork

__all__ = ["PartitionReplica", "BatchResult", "fail_reason_error", "RaftNetwork",
           "TickScheduler", "timing_scale"]
