"""The client's exceptions: one root, typed leaves.

    ShoalError
    ├── ProtocolError          the node sent something that is not the protocol
    ├── ConnectionLost         the link died (closed, reset, or declared dead); in-flight commands fail at once
    ├── CommandTimeout         no reply within command_timeout (outcome unknown)
    ├── CommandError           the node refused the command (``code`` holds the wire code)
    │   ├── InvalidCommand     INVALID, UNKNOWN_COMMAND, PROTOCOL_ERROR, FRAME_TOO_LARGE
    │   ├── NotFound           NOT_FOUND
    │   ├── InvalidState       INVALID_STATE
    │   ├── LeaseMismatch      LEASE_MISMATCH (a superseded token)
    │   ├── Cancelled          CANCELLED (the job was cancelled while running: stop, ack nothing)
    │   ├── QueueFull          QUEUE_FULL
    │   ├── Paused             PAUSED
    │   ├── NoSpace            NO_SPACE
    │   ├── AuthError          AUTH_REQUIRED, AUTH_FAILED
    │   ├── NotLeader          NOT_LEADER (retried by the client; raised when retries run out)
    │   │   └── NoLeader       NO_LEADER: an election is under way (retried likewise)
    │   ├── Overloaded         OVERLOADED, SHUTTING_DOWN
    │   └── NodeTimeout        TIMEOUT: the node gave up on it (also a CommandTimeout; outcome unknown)
    └── ClientClosed           the client was closed
"""

from __future__ import annotations

from typing import Any

__all__ = ["ShoalError", "ProtocolError", "ConnectionLost", "CommandTimeout", "CommandError", "InvalidCommand",
           "NotFound", "InvalidState", "LeaseMismatch", "Cancelled", "QueueFull", "Paused", "NoSpace", "AuthError", "NotLeader",
           "Overloaded", "ClientClosed", "NoLeader", "NodeTimeout", "error_from_reply"]


class ShoalError(Exception):
    """Root of every error the client raises."""


class ProtocolError(ShoalError):
    """The node sent bytes that are not the protocol."""


class ConnectionLost(ShoalError):
    """The connection closed or was declared dead while the command was in flight."""


class CommandTimeout(ShoalError):
    """No reply within the command timeout; the command may or may not have been applied."""


class ClientClosed(ShoalError):
    """The client is closed."""


class CommandError(ShoalError):
    """The node refused the command; ``code`` is the wire error code, ``reply`` the whole frame."""

    code: str
    reply: dict[str, Any]

    def __init__(self, message: str, code: str = "INTERNAL", reply: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reply = reply or {}


class InvalidCommand(CommandError):
    """A field is missing, ill-typed or out of range, or the command does not exist."""


class NotFound(CommandError):
    """No such job, queue, cron or worker."""


class InvalidState(CommandError):
    """The job is not in a state that allows this."""


class LeaseMismatch(CommandError):
    """The token does not match the job's current lease (it lapsed and was re-leased)."""


class Cancelled(CommandError):
    """The job was cancelled while this worker ran it: stop its handler and ack nothing."""


class QueueFull(CommandError):
    """The queue is at its capacity."""


class Paused(CommandError):
    """The queue is paused."""


class NoSpace(CommandError):
    """The partition's disk is full: new data is refused (reads, pulls and acks still work)."""


class AuthError(CommandError):
    """Authentication is required or failed."""


class NotLeader(CommandError):
    """No leader could be reached for the partition within the command timeout."""


class NoLeader(NotLeader):
    """The partition has no leader (an election is under way) and none appeared in time."""


class Overloaded(CommandError):
    """The node is overloaded or shutting down."""


class NodeTimeout(CommandError, CommandTimeout):
    """The node answered ``TIMEOUT``: it could not finish the command in time; it may have been applied."""


_BY_CODE: dict[str, type[CommandError]] = {
    "INVALID": InvalidCommand, "UNKNOWN_COMMAND": InvalidCommand, "PROTOCOL_ERROR": InvalidCommand,
    "FRAME_TOO_LARGE": InvalidCommand, "NOT_FOUND": NotFound, "INVALID_STATE": InvalidState,
    "LEASE_MISMATCH": LeaseMismatch, "CANCELLED": Cancelled, "QUEUE_FULL": QueueFull, "PAUSED": Paused, "AUTH_REQUIRED": AuthError,
    "AUTH_FAILED": AuthError, "NOT_LEADER": NotLeader, "NO_LEADER": NoLeader, "TIMEOUT": NodeTimeout, "OVERLOADED": Overloaded,
    "SHUTTING_DOWN": Overloaded, "NO_SPACE": NoSpace,
}


def error_from_reply(reply: dict[str, Any]) -> CommandError:
    """The typed exception for an ``{ok: false}`` reply."""
    code = str(reply.get("code") or "INTERNAL")
    return _BY_CODE.get(code, CommandError)(str(reply.get("error") or code), code, reply)
