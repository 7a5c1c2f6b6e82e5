"""Shoal's client: partition-aware, pipelined, self-healing.

    from shoal.client import Client, AsyncClient, ConnectionOptions, Worker, ShoalError

    with Client(["127.0.0.1:6789"], options=ConnectionOptions(command_timeout=5.0)) as client:
        q = client.queue("emails")
        job_id = q.add({"to": "a@example.com"}, priority=1, delay=2.5)
        job = q.pull(timeout=1.0)
        q.ack(job, result={"sent": True})

``AsyncClient`` has the same methods, awaited. See ``docs/client.md``.
"""

from ._async import AsyncClient
from ._connection import ConnState
from ._core import Debounce, Dedupe
from ._sync import Client
from .batch import Batch, BatchOptions, BatchWorker
from .exceptions import (AuthError, Cancelled, ClientClosed, CommandError, CommandTimeout, ConnectionLost,
                         InvalidCommand, InvalidState, LeaseMismatch, NodeTimeout, NoLeader, NotFound, NotLeader, NoSpace, Overloaded, Paused,
                         ProtocolError, QueueFull, ShoalError)
from .job import Job, JobState
from .options import ConnectionOptions, RetryPolicy
from .queue import AsyncQueue, Queue
from .tube import AsyncTube, Tube
from .worker import Retry, Worker

__all__ = ["Client", "AsyncClient", "ConnectionOptions", "RetryPolicy", "ConnState", "Worker", "Retry", "Job",
           "JobState", "Queue", "AsyncQueue", "Tube", "AsyncTube", "ShoalError", "ProtocolError", "ConnectionLost",
           "CommandTimeout", "CommandError", "InvalidCommand", "NotFound", "InvalidState", "LeaseMismatch",
           "QueueFull", "Paused", "NoSpace", "AuthError", "NotLeader", "NoLeader", "Overloaded", "NodeTimeout", "ClientClosed",
           "Cancelled", "Dedupe", "Debounce", "BatchWorker", "BatchOptions", "Batch"]
