"""Nesting-depth bounds for MessagePack and JSON input, checked without recursion.

msgspec and the ``json`` module recurse in C per nesting level and raise
``RecursionError`` near Python's recursion limit (about 1,000 levels); a
value nested deeper than :data:`DEPTH_MAX` is refused before it is decoded,
so no decoder (node, HTTP edge, client) ever meets it.

The check costs nothing for short input: nesting ``n`` levels takes at least
``n`` bytes. Up to 64 KiB, a C count of the bytes that could start a container
(``bytes.translate``) clears most input, and only input with more than
``DEPTH_MAX`` of them is walked (value headers only, strings and binaries
skipped by length). Larger input is walked for 2,048 values first (deep
nesting ends there), then counted.

What the count does not clear (a bulk add of a thousand jobs whose data are maps holds
thousands of container headers) is judged by msgspec in C: a decode with the interpreter's
recursion limit set to the current stack depth plus ``limit`` less a margin of 16 succeeds
only when nothing nests deeper than ``limit`` (msgspec enters one recursive call per container
level, which the module checks once at import; where that does not hold, as on interpreters
whose C recursion has a limit of its own, this step is skipped; the margin covers a stack
counted short). Only its success counts: input it does not clear (nested within the margin of
the limit or past it, larger than :data:`C_CHECK_BYTES_MAX`, or garbage msgspec refuses) is
walked up to :data:`WALK_VALUES_MAX` values, which gives the exact answer. The decode's objects
are dropped at once (their memory is bounded by the input's size), and it costs about a fifth
of the walk.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec

__all__ = ["DEPTH_MAX", "msgpack_too_deep", "json_too_deep", "msgpack_req_id", "depth_message"]

#: Deepest nesting of maps and arrays accepted in a request, job data included.
DEPTH_MAX = 512
#: Values the exact walk steps over at most (~15 ms of Python). Nesting past DEPTH_MAX that
#: only starts beyond them meets the decoders' own bound instead (msgspec's RecursionError near
#: 1,000 levels, answered INVALID too); this keeps the check's cost bounded per frame.
WALK_VALUES_MAX = 100_000
#: Input up to this size that the count does not clear is judged by a decode in C.
C_CHECK_BYTES_MAX = 1024 * 1024
_QUICK_WALK_VALUES = 2_048
# Levels short of the limit the C check clears (input nested closer to it is walked).
_C_CHECK_MARGIN = 16
_COUNT_FIRST_BYTES_MAX = 64 * 1024

# Every byte that cannot start a map or an array (fixmap, fixarray, array16/32, map16/32):
# deleting them leaves one byte per possible container header (~0.4 ns a byte, in C).
_NOT_CONTAINER = bytes(b for b in range(256) if not (0x80 <= b <= 0x9F or 0xDC <= b <= 0xDF))
# Payload bytes that follow each header byte (0xc4.. 0xdf), before any length-counted body.
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
          0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}   # bin8/16/32, str8/16/32: len bytes
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}                                # ext8/16/32: len bytes, then type byte


def depth_message(limit: int = DEPTH_MAX) -> str:
    """The error text of a refusal (names the limit)."""
    return f"nesting deeper than {limit} levels (depth limit {limit})"


def msgpack_too_deep(payload: bytes | memoryview, limit: int = DEPTH_MAX) -> bool:
    """True when the MessagePack in ``payload`` nests maps/arrays more than ``limit`` deep.

    Garbage is not judged here (the decoder reports it): a walk that runs off the end
    stops and answers from what it saw.
    """
    if len(payload) <= limit:
        return False
    data = bytes(payload)
    if len(data) > _COUNT_FIRST_BYTES_MAX:
        # Large: a short walk first (deep nesting ends it at once), because translate costs
        # ~7 ns a byte on input made mostly of container headers.
        verdict = _walk_depth(data, limit, _QUICK_WALK_VALUES)
        if verdict is not None:
            return verdict
    if len(data.translate(None, _NOT_CONTAINER)) <= limit:
        return False
    if _C_CHECK and len(data) <= C_CHECK_BYTES_MAX and _decode_fits(data, limit):
        return False
    return _walk_depth(data, limit, WALK_VALUES_MAX) is True


def _stack_depth() -> int:
    """Frames on the caller's stack; the interpreter's recursion depth is at least this (a call
    into Python from C, such as a generator resumed by ``all()``, counts once more)."""
    frame = sys._getframe(1)
    depth = 0
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth


def _decode_fits(data: bytes, limit: int) -> bool:
    """True when msgspec decodes ``data`` with ``limit`` levels of recursion to spare, which
    proves nothing in it nests deeper than ``limit``; False when it could not (too deep, or a
    stack deeper than its frames show, or garbage msgspec refuses): the walk then decides."""
    if limit <= _C_CHECK_MARGIN:
        return False
    old = sys.getrecursionlimit()
    try:
        # The stack up to this frame, then one call per level (checked at import), less a margin
        # in case the stack holds a frame the recursion depth does not count. The decode runs in
        # C and holds the GIL, so no other thread runs under the lowered limit.
        sys.setrecursionlimit(_stack_depth() + limit - _C_CHECK_MARGIN)
        _DECODE(data)
    except (RecursionError, msgspec.MsgspecError, TypeError, ValueError):
        return False
    finally:
        sys.setrecursionlimit(old)
    return True


def _c_check_holds() -> bool:
    """Does msgspec charge at least one call per level (so a success proves the bound), and does
    the check clear input well within the limit here?"""
    try:
        for level in (b"\x91", b"\x81\xa1k"):  # arrays, maps
            if not (_decode_fits(level + b"\x00", 64) and _decode_fits(level * 32 + b"\x00", 64)):
                return False
            if _decode_fits(level * 65 + b"\x00", 64) or _decode_fits(level * 128 + b"\x00", 64):
                return False
    except Exception:  # noqa: BLE001 - any surprise means the C check is not used
        return False
    return True


_DECODE = msgspec.msgpack.Decoder().decode
_C_CHECK = _c_check_holds()


def _walk_depth(data: bytes, limit: int, values_max: int) -> bool | None:
    """Walk value headers (skipping strings and binaries by their length); None when
    ``values_max`` values were stepped over without a verdict."""
    # A stack of remaining element counts per open container; maps count keys and values.
    stack: list[int] = []
    pos, end = 0, len(data)
    remaining = 1  # the top-level value
    while pos < end:
        while remaining == 0:
            if not stack:
                return False
            remaining = stack.pop()
        values_max -= 1
        if values_max < 0:
            return None
        remaining -= 1
        b = data[pos]
        pos += 1
        if b <= 0x7F or b >= 0xE0:
            continue
        if b <= 0x8F or 0xDE <= b <= 0xDF or 0x90 <= b <= 0x9F or 0xDC <= b <= 0xDD:
            if b <= 0x8F:
                n = (b & 0x0F) * 2
            elif b <= 0x9F:
                n = b & 0x0F
            else:
                width = 2 if b in (0xDC, 0xDE) else 4
                n = int.from_bytes(data[pos:pos + width], "big")
                pos += width
                if b >= 0xDE:
                    n *= 2
            if len(stack) >= limit:
                return True  # this container opens level len(stack) + 1
            if n:
                stack.append(remaining)
                remaining = n
            continue
        if 0xA0 <= b <= 0xBF:
            pos += b & 0x1F
        elif b in _FIXED:
            pos += _FIXED[b]
        elif b in _SIZED:
            width = _SIZED[b]
            pos += width + int.from_bytes(data[pos:pos + width], "big")
        elif b in _EXT:
            width = _EXT[b]
            pos += width + 1 + int.from_bytes(data[pos:pos + width], "big")
        else:
            return False  # 0xc1 (never used): garbage, the decoder says so
    return False


#: Values :func:`msgpack_req_id` steps over before it gives up (a ``reqId`` placed after a
#: million-element value must not cost a million Python steps).
REQ_ID_SCAN_VALUES_MAX = 4096


def msgpack_req_id(payload: bytes | memoryview) -> Any:
    """The top-level ``reqId`` of a request map (int or str), found without decoding other values.

    Used to answer a frame refused before decoding; None when absent, or not found within
    :data:`REQ_ID_SCAN_VALUES_MAX` values.
    """
    data = bytes(payload)
    if not data:
        return None
    b = data[0]
    if 0x80 <= b <= 0x8F:
        count, pos = b & 0x0F, 1
    elif b in (0xDE, 0xDF):
        width = 2 if b == 0xDE else 4
        count, pos = int.from_bytes(data[1:1 + width], "big"), 1 + width
    else:
        return None
    key = b"\xa5reqId"
    budget = [REQ_ID_SCAN_VALUES_MAX]
    for _ in range(count):
        if data[pos:pos + len(key)] == key:
            return _scalar_at(data, pos + len(key))
        pos = _skip(data, pos, budget)  # the key
        if pos < 0:
            return None
        pos = _skip(data, pos, budget)  # its value
        if pos < 0:
            return None
    return None


def _scalar_at(data: bytes, pos: int) -> Any:
    if pos >= len(data):
        return None
    b = data[pos]
    if b <= 0x7F:
        return b
    if b >= 0xE0:
        return b - 0x100
    if 0xA0 <= b <= 0xBF:
        return data[pos + 1:pos + 1 + (b & 0x1F)].decode("utf-8", "replace")
    if b in (0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD1, 0xD2, 0xD3):
        width = _FIXED[b]
        return int.from_bytes(data[pos + 1:pos + 1 + width], "big", signed=b >= 0xD0)
    if b in (0xD9, 0xDA, 0xDB):
        width = _SIZED[b]
        n = int.from_bytes(data[pos + 1:pos + 1 + width], "big")
        return data[pos + 1 + width:pos + 1 + width + n].decode("utf-8", "replace")
    return None


def _skip(data: bytes, pos: int, budget: list[int]) -> int:
    """The position after the value at ``pos`` (iterative: any depth); -1 past the end or once
    ``budget[0]`` values have been stepped over."""
    remaining = 1
    end = len(data)
    while remaining:
        if pos >= end or budget[0] <= 0:
            return -1
        budget[0] -= 1
        remaining -= 1
        b = data[pos]
        pos += 1
        if b <= 0x7F or b >= 0xE0:
            continue
        if b <= 0x8F:
            remaining += (b & 0x0F) * 2
        elif b <= 0x9F:
            remaining += b & 0x0F
        elif b <= 0xBF:
            pos += b & 0x1F
        elif b in (0xDC, 0xDD, 0xDE, 0xDF):
            width = 2 if b in (0xDC, 0xDE) else 4
            n = int.from_bytes(data[pos:pos + width], "big")
            pos += width
            remaining += n * 2 if b >= 0xDE else n
        elif b in _FIXED:
            pos += _FIXED[b]
        elif b in _SIZED:
            width = _SIZED[b]
            pos += width + int.from_bytes(data[pos:pos + width], "big")
        elif b in _EXT:
            width = _EXT[b]
            pos += width + 1 + int.from_bytes(data[pos:pos + width], "big")
        else:
            return -1
    return pos if pos <= end else -1


def json_too_deep(text: str, value: Any, limit: int = DEPTH_MAX) -> bool:
    """True when ``value`` (decoded from the JSON ``text``) nests lists/dicts more than ``limit`` deep.

    ``json.loads`` itself raises ``RecursionError`` near 1,000 levels (callers catch it);
    this walks the decoded value only when ``text`` holds more than ``limit`` brackets.
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if type(item) is dict:
            children: Any = item.values()
        elif type(item) is list:
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if type(child) in (dict, list))
    return False
