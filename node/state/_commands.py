"""The engine's typed commands: the compact forms the node replicates for its fast paths.

A client's command reaches the engine as the validated dict it sent. Where the node
replicates something more compact or adds what only it knows (a connection's session,
its frame limit), the command is one of these frozen values instead of a dict with
private fields: the group-committed run of plain PUSHes, a plain PUSHB, an ACKB of one
pull's consecutive jobs, and a pull stamped with its session. The log stores each as a
tagged array of its fields (:mod:`shoal.node.partition.log_format`), with no Python object per job.
:mod:`shoal.node.partition.pushes` decides when a command takes one of these forms.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

__all__ = ["PushRun", "PushBatch", "AckRun", "SessionPull", "TypedCommand", "Command", "command_name",
           "command_queue"]


class PushRun(msgspec.Struct, frozen=True, gc=False):
    """Consecutive plain PUSHes to one queue (data, maybe an idempotency key), each with its
    own outcome: the reply is ``{"results": [...]}``, per push its PUSH reply or error."""

    name: ClassVar[str] = "PushRun"
    queue: str
    datas: list[bytes]
    keys: list[str | None] | None = None
    names: list[str | None] | None = None  # the jobs' names (bunqueue's), None when none has one


class PushBatch(msgspec.Struct, frozen=True, gc=False):
    """A PUSHB whose items carry only data (and maybe an idempotency key): one atomic batch
    stored as one segment; the reply is the PUSHB reply ``{"ids": [...]}``."""

    name: ClassVar[str] = "PUSHB"
    queue: str
    datas: list[bytes]
    keys: list[str | None] | None = None
    names: list[str | None] | None = None  # the jobs' names (bunqueue's), None when none has one


class AckRun(msgspec.Struct, frozen=True, gc=False):
    """An ACKB of ``count`` consecutive jobs from seq ``first`` (leases numbered from ``lease``,
    -1 when no tokens were given): how a consumer acks one PULLB. Applied as that ACKB."""

    name: ClassVar[str] = "ACKB"
    first: int
    count: int
    lease: int = -1


class SessionPull(msgspec.Struct, frozen=True, gc=False):
    """A PULL or PULLB (``cmd``, as validated) leased to ``session`` (its leases go back when the
    session ends), its reply held to ``bytes_max`` bytes (0: no bound) so every replica stops
    at the same job."""

    name: ClassVar[str] = "Pull"
    cmd: dict[str, Any]
    session: str | None = None
    bytes_max: int = 0


TypedCommand = PushRun | PushBatch | AckRun | SessionPull
#: What :meth:`~._engine.PartitionEngine.apply` takes: a validated command dict or a typed form.
Command = dict[str, Any] | TypedCommand


def command_name(cmd: Command) -> str:
    """The name of ``cmd``: a dict's ``cmd``, a typed command's ``name`` (``PushRun``, ``PUSHB``, …)."""
    if type(cmd) is dict:
        return cmd["cmd"]  # type: ignore[no-any-return]
    if type(cmd) is SessionPull:
        return cmd.cmd["cmd"]  # type: ignore[no-any-return]
    return cmd.name  # type: ignore[union-attr]


def command_queue(cmd: Command) -> str | None:
    """The queue ``cmd`` writes to, if it names one (an ACKB names jobs, not a queue)."""
    if type(cmd) is dict:
        return cmd.get("queue")
    if type(cmd) is SessionPull:
        return cmd.cmd.get("queue")
    return getattr(cmd, "queue", None)
