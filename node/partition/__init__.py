"""One partition: what the node holds for it, and its queue engine on the application side of the Raft seam.

:class:`Partition` is what a node holds for one partition it hosts (its replica, its group
commit, the commands parked on it); :class:`RemotePartition` takes the same commands for a
partition another node leads, and sends them there. :class:`PartitionMachine` is the
:class:`~shoal.node.raft.application.Application` a :class:`~shoal.node.raft.replica.PartitionReplica`
drives: it owns the partition's :class:`~shoal.node.state.PartitionEngine`, writes and reads the payload of data entries
(:mod:`.log_format`), and hands the edge a read-only :class:`PartitionView` of the applied state.
"""

from .log_format import decode_batch, encode_batch
from .machine import SPACE_TAKING_COMMANDS, PartitionMachine, load_engine, snapshot_chunks
from .partition import Parked, Partition, Serving
from .remote import RemotePartition
from .view import FlowReport, PartitionView, QueueFigures

__all__ = ["Partition", "Parked", "RemotePartition", "Serving", "PartitionMachine", "PartitionView", "QueueFigures", "FlowReport",
           "SPACE_TAKING_COMMANDS", "encode_batch", "decode_batch", "snapshot_chunks", "load_engine"]
