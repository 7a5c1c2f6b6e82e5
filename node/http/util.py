"""Small helpers of the HTTP layer: JSON bodies, error statuses, SSE messages."""

from __future__ import annotations

import base64
import json
from typing import Any

from aiohttp import web

from shoal.cluster._depth import DEPTH_MAX, depth_message, json_too_deep
from shoal.cluster.codec import Raw, unraw
from shoal.cluster.errors import ErrorCode, ProtocolError

__all__ = ["STATUS_BY_CODE", "dumps", "json_response", "error_response", "sse", "loads_bounded"]

#: HTTP status of each wire error code (the body always carries the code itself).
#: QUEUE_FULL is 429: the client should back off and retry, the node is not out of storage.
STATUS_BY_CODE: dict[str, int] = {
    "INVALID": 400, "UNKNOWN_COMMAND": 400, "PROTOCOL_ERROR": 400,
    "AUTH_REQUIRED": 401, "AUTH_FAILED": 403, "NOT_FOUND": 404,
    "LEASE_MISMATCH": 409, "INVALID_STATE": 409, "PAUSED": 409, "CANCELLED": 409,
    "FRAME_TOO_LARGE": 413, "QUEUE_FULL": 429,
    "INTERNAL": 500, "NO_SPACE": 507,
    # NOT_LEADER is normally forwarded; 503 only when the leader cannot be reached.
    "NOT_LEADER": 503, "NO_LEADER": 503, "OVERLOADED": 503, "SHUTTING_DOWN": 503,
    "TIMEOUT": 504,
}
#: Statuses after which the same request may be sent again shortly.
_RETRY_AFTER_S = {503: "1", 429: "1"}


def _json_default(value: Any) -> Any:
    # MessagePack bin has no JSON form: base64 in a marked object, so it is never mistaken for text.
    if isinstance(value, (bytes, bytearray)):
        return {"$base64": base64.b64encode(value).decode()}
    if isinstance(value, Raw):
        return unraw(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> str:
    """JSON text of a reply or event; job data and results (Raw MessagePack) decoded once here."""
    return json.dumps(unraw(value), default=_json_default, separators=(",", ":"))


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    retry = _RETRY_AFTER_S.get(status)
    if retry is not None:
        headers = {"Retry-After": retry, **(headers or {})}
    return web.Response(text=dumps(body), status=status, headers=headers, content_type="application/json")


def error_response(code: str, message: str, status: int | None = None) -> web.Response:
    """``{ok: false, error, code}`` with the code's status."""
    return json_response({"ok": False, "error": message, "code": code}, status or STATUS_BY_CODE.get(code, 500))


def sse(event: str | None, data: Any, *, event_id: int | None = None) -> bytes:
    """One Server-Sent Events message (data on a single line: JSON never contains a raw newline)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    if event:
        head += f"event: {event}\n"
    return f"{head}data: {dumps(data)}\n\n".encode()


def loads_bounded(text: str) -> Any:
    """``json.loads`` with the protocol's nesting limit: an ``INVALID`` ProtocolError naming the
    limit beyond :data:`~shoal.cluster._depth.DEPTH_MAX` levels (never a ``RecursionError``);
    ValueError for text that is not JSON."""
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise ProtocolError(depth_message(), ErrorCode.INVALID) from exc
    if json_too_deep(text, value, DEPTH_MAX):
        raise ProtocolError(depth_message(), ErrorCode.INVALID)
    return value
