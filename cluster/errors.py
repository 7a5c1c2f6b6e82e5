"""Error codes shared by node and client, and the protocol error root.

The set of codes is closed: every error frame a node sends carries one of
``ErrorCode``'s values in its ``code`` field. Clients map codes to typed
exceptions; nodes raise :class:`CommandError` from validation and the engine.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["ErrorCode", "ProtocolError", "CommandError", "RETRYABLE_CODES"]


class ErrorCode(str, Enum):
    """Machine-readable error codes of the wire protocol (closed set)."""

    INVALID = "INVALID"                  # a field is missing, ill-typed or out of range
    NOT_FOUND = "NOT_FOUND"              # no such job, queue, cron or worker
    INVALID_STATE = "INVALID_STATE"      # the job is not in a state that allows this
    NOT_LEADER = "NOT_LEADER"            # this node does not lead the partition (leader hint attached)
    NO_LEADER = "NO_LEADER"              # election under way; retry
    LEASE_MISMATCH = "LEASE_MISMATCH"    # the token does not match the job's current lease
    QUEUE_FULL = "QUEUE_FULL"            # capacity reached (limfifottl, discard=reject)
    PAUSED = "PAUSED"                    # the queue is paused
    AUTH_REQUIRED = "AUTH_REQUIRED"      # the node has tokens and the connection has not authenticated
    AUTH_FAILED = "AUTH_FAILED"          # wrong token
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"  # length header over the maximum frame size
    PROTOCOL_ERROR = "PROTOCOL_ERROR"    # undecodable frame, not a map, bad cmd
    UNKNOWN_COMMAND = "UNKNOWN_COMMAND"  # cmd is not a command of the protocol
    OVERLOADED = "OVERLOADED"            # too many commands in flight; back off
    TIMEOUT = "TIMEOUT"                  # the command did not complete in time (outcome unknown)
    SHUTTING_DOWN = "SHUTTING_DOWN"      # the node is stopping; retry elsewhere
    NO_SPACE = "NO_SPACE"                # the partition's disk is full: new data refused, reads/pulls/acks served
    CANCELLED = "CANCELLED"              # the job was cancelled while running: stop, ack nothing
    INTERNAL = "INTERNAL"                # a bug: the node kept serving


#: Codes after which the same command may be sent again (to the same or a new leader).
RETRYABLE_CODES = frozenset(
    {ErrorCode.NOT_LEADER, ErrorCode.NO_LEADER, ErrorCode.OVERLOADED, ErrorCode.SHUTTING_DOWN}
)


class ProtocolError(Exception):
    """A frame could not be decoded or is not a valid request/response.

    ``code`` is ``PROTOCOL_ERROR`` or ``FRAME_TOO_LARGE``; ``fatal`` means the
    byte stream cannot be resynchronised and the connection must close.
    """

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL_ERROR, *, fatal: bool = False,
                 req_id: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.fatal = fatal
        self.req_id = req_id


class CommandError(Exception):
    """A command was refused; carries the wire ``code`` and optional extra reply fields."""

    def __init__(self, code: ErrorCode, message: str, **extra: object) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra

    def to_reply(self) -> dict[str, object]:
        """The error reply body (without ``reqId``)."""
        reply: dict[str, object] = {"ok": False, "error": str(self), "code": self.code.value}
        reply.update(self.extra)
        return reply
