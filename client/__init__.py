"""Shoal's client: partition-aware, pipelined, self-healing.

    from shoal.client import Client, AsyncClient, ConnectionOptions, Worker, ShoalError
"""

from ._async import AsyncClient
from ._connection import ConnState
from ._sync import Client
from .exceptions import (AuthError, ClientClosed, CommandError, CommandTimeout, ConnectionLost, InvalidCommand,
                         InvalidState, LeaseMismatch, NotFound, NotLeader, Overloaded, Paused, ProtocolError,
                         QueueFull, ShoalError)
from .job import Job, JobState
from .options import ConnectionOptions, RetryPolicy
from .queue import AsyncQueue
from .tube import AsyncTube
from .worker import Retry, Worker

__all__ = ["Client", "AsyncClient", "ConnectionOptions", "RetryPolicy", "ConnState", "Worker", "Retry", "Job",
           "JobState", "AsyncQueue", "AsyncTube", "ShoalError", "ProtocolError", "ConnectionLost",
           "CommandTimeout", "CommandError", "InvalidCommand", "NotFound", "InvalidState", "LeaseMismatch",
           "QueueFull", "Paused", "AuthError", "NotLeader", "Overloaded", "ClientClosed"]
