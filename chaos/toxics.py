"""Toxics: what they are (``ToxicSpec``) and what they do to a link (effects).

A ``ToxicSpec`` is the API object of Toxiproxy 2.x: ``name``, ``type``,
``stream`` (``upstream`` = client→server, ``downstream`` = server→client),
``toxicity`` (probability that the toxic applies to a given connection) and
``attributes``. Times are milliseconds except the slicer's ``delay``, which is
microseconds, as in Toxiproxy.

An *effect* is one toxic's state on one direction of one connection. The link
runs each chunk of bytes through its effects in the order the toxics were
added: ``on_chunk(stamp, data, forward)`` may delay, split, drop or truncate
the chunk and calls ``forward`` for what goes on; ``on_eof()`` runs before the
half-close is passed on. ``stamp`` is the loop time at which the bytes were
read, so a latency is measured from arrival and does not add up over a
backlog of chunks.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from shoal.chaos.errors import BadRequest

__all__ = [
    "STREAMS",
    "TOXIC_TYPES",
    "ToxicSpec",
    "LinkControl",
    "Effect",
    "make_effect",
]

STREAMS: tuple[str, ...] = ("upstream", "downstream")

#: type -> attribute defaults; every attribute is a non-negative integer.
TOXIC_TYPES: dict[str, dict[str, int]] = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
}

# Bound attribute values so a typo cannot schedule a timer for centuries.
_ATTRIBUTE_MAX = 2**31 - 1

Forward = Callable[[float, bytes], Awaitable[None]]


def _int_attribute(name: str, value: Any) -> int:
    # JSON numbers may arrive as floats (e.g. from JavaScript clients); accept
    # integral ones, reject everything else with the attribute's name.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"bad request body: attribute {name!r} must be an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise BadRequest(f"bad request body: attribute {name!r} must be an integer")
        value = int(value)
    if not 0 <= value <= _ATTRIBUTE_MAX:
        raise BadRequest(f"bad request body: attribute {name!r} out of range")
    return value


def _toxicity(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest("bad request body: toxicity must be a number")
    if not 0.0 <= float(value) <= 1.0:
        raise BadRequest("bad request body: toxicity must be between 0 and 1")
    return float(value)


@dataclass(slots=True)
class ToxicSpec:
    """One toxic as the API shows it."""

    name: str
    type: str
    stream: str = "downstream"
    toxicity: float = 1.0
    attributes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: Any) -> ToxicSpec:
        """Validate a create-toxic body; defaults follow Toxiproxy."""
        if not isinstance(body, Mapping):
            raise BadRequest("bad request body: expected a JSON object")
        toxic_type = body.get("type")
        if toxic_type not in TOXIC_TYPES:
            raise BadRequest("invalid toxic type")
        stream = body.get("stream") or "downstream"
        if stream not in STREAMS:
            raise BadRequest("stream was invalid, can be either upstream or downstream")
        name = body.get("name") or f"{toxic_type}_{stream}"
        if not isinstance(name, str):
            raise BadRequest("bad request body: name must be a string")
        toxicity = _toxicity(body.get("toxicity", 1.0))
        attributes = cls._merge_attributes(toxic_type, dict(TOXIC_TYPES[toxic_type]), body.get("attributes"))
        return cls(name=name, type=toxic_type, stream=stream, toxicity=toxicity, attributes=attributes)

    def updated(self, body: Any) -> ToxicSpec:
        """A copy with ``toxicity`` and ``attributes`` changed by an update body."""
        if not isinstance(body, Mapping):
            raise BadRequest("bad request body: expected a JSON object")
        toxicity = _toxicity(body["toxicity"]) if "toxicity" in body else self.toxicity
        attributes = self._merge_attributes(self.type, dict(self.attributes), body.get("attributes"))
        return ToxicSpec(self.name, self.type, self.stream, toxicity, attributes)

    @staticmethod
    def _merge_attributes(toxic_type: str, base: dict[str, int], given: Any) -> dict[str, int]:
        if given is None:
            return base
        if not isinstance(given, Mapping):
            raise BadRequest("bad request body: attributes must be an object")
        # Unknown attributes are ignored, as Toxiproxy's JSON decoding does.
        for key in TOXIC_TYPES[toxic_type]:
            if key in given:
                base[key] = _int_attribute(key, given[key])
        return base

    def to_json(self) -> dict[str, Any]:
        """The API's JSON object for this toxic."""
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


class LinkControl(Protocol):
    """What an effect may do to the connection it sits on."""

    rng: random.Random

    def close(self) -> None:
        """Close both sides of the connection (FIN after pending data)."""

    def reset(self) -> None:
        """Abort both sides with a TCP RST."""


class Effect:
    """One toxic's behaviour on one link; the default passes data through."""

    kind: ClassVar[str] = ""

    def __init__(self, spec: ToxicSpec, link: LinkControl) -> None:
        self.spec = spec
        self.link = link
        self.attrs = spec.attributes

    def start(self) -> None:
        """Called when the effect is attached to a live link."""

    def stop(self) -> None:
        """Called when the toxic is removed or the link closes; cancel timers."""

    async def on_chunk(self, stamp: float, data: bytes, forward: Forward) -> None:
        await forward(stamp, data)

    async def on_eof(self) -> None:
        """Runs before the end of the stream is passed on."""


async def _sleep_until(deadline: float) -> None:
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


class _Latency(Effect):
    kind = "latency"

    async def on_chunk(self, stamp: float, data: bytes, forward: Forward) -> None:
        jitter_ms = self.attrs["jitter"]
        offset_ms = self.link.rng.uniform(-jitter_ms, jitter_ms) if jitter_ms else 0.0
        delay_s = max(0.0, self.attrs["latency"] + offset_ms) / 1000.0
        # Wait from the arrival stamp; pass the later stamp on so that two
        # latency toxics in a row add up.
        await _sleep_until(stamp + delay_s)
        await forward(stamp + delay_s, data)


class _Bandwidth(Effect):
    kind = "bandwidth"
    # Pieces of at most 100 ms worth of bytes keep the output smooth.
    _piece_s = 0.1

    def __init__(self, spec: ToxicSpec, link: LinkControl) -> None:
        super().__init__(spec, link)
        self._next_free = 0.0

    async def on_chunk(self, stamp: float, data: bytes, forward: Forward) -> None:
        rate_bytes_s = self.attrs["rate"] * 1000
        if rate_bytes_s <= 0:
            await forward(stamp, data)
            return
        loop = asyncio.get_running_loop()
        piece_bytes = max(1, int(rate_bytes_s * self._piece_s))
        for start in range(0, len(data), piece_bytes):
            piece = data[start : start + piece_bytes]
            # A virtual clock: the link is busy until _next_free; an idle link
            # earns no credit, so bursts after a pause are not faster.
            self._next_free = max(self._next_free, loop.time()) + len(piece) / rate_bytes_s
            await _sleep_until(self._next_free)
            await forward(stamp, piece)


class _SlowClose(Effect):
    kind = "slow_close"

    async def on_eof(self) -> None:
        await asyncio.sleep(self.attrs["delay"] / 1000.0)


class _Timeout(Effect):
    kind = "timeout"

    def __init__(self, spec: ToxicSpec, link: LinkControl) -> None:
        super().__init__(spec, link)
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        timeout_ms = self.attrs["timeout"]
        if timeout_ms > 0:
            self._timer = asyncio.get_running_loop().call_later(timeout_ms / 1000.0, self.link.close)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def on_chunk(self, stamp: float, data: bytes, forward: Forward) -> None:
        return  # data is dropped while the toxic is active

    async def on_eof(self) -> None:
        self.link.close()


class _ResetPeer(Effect):
    kind = "reset_peer"

    async def _reset_later(self) -> None:
        await asyncio.sleep(self.attrs["timeout"] / 1000.0)
        self.link.reset()

    async def on_chunk(self, stamp: float, data: bytes, forward: Forward) -> None:
        # The first bytes through the toxic trigger the reset; they are lost.
        await self._reset_later()

    async def on_eof(self) -> None:
        await self._reset_later()


class _Slicer(Effect):
    kind = "slicer"

    async def on_chunk(self, stamp: float, data: bytes, forward: Forward) -> None:
        average = self.attrs["average_size"]
        if average <= 0:
            await forward(stamp, data)
            return
        variation = min(self.attrs["size_variation"], average - 1)
        delay_s = self.attrs["delay"] / 1_000_000.0
        start = 0
        while start < len(data):
            size = average + (self.link.rng.randint(-variation, variation) if variation else 0)
            piece = data[start : start + size]
            start += len(piece)
            await forward(stamp, piece)
            if delay_s > 0 and start < len(data):
                await asyncio.sleep(delay_s)


class _LimitData(Effect):
    kind = "limit_data"

    def __init__(self, spec: ToxicSpec, link: LinkControl) -> None:
        super().__init__(spec, link)
        self._passed_bytes = 0

    async def on_chunk(self, stamp: float, data: bytes, forward: Forward) -> None:
        remaining = self.attrs["bytes"] - self._passed_bytes
        if remaining > 0:
            piece = data[:remaining]
            self._passed_bytes += len(piece)
            await forward(stamp, piece)
        if self._passed_bytes >= self.attrs["bytes"]:
            self.link.close()


_EFFECTS: dict[str, type[Effect]] = {
    cls.kind: cls for cls in (_Latency, _Bandwidth, _SlowClose, _Timeout, _ResetPeer, _Slicer, _LimitData)
}
assert set(_EFFECTS) == set(TOXIC_TYPES)


def make_effect(spec: ToxicSpec, link: LinkControl) -> Effect:
    """The effect of ``spec`` on ``link`` (not started)."""
    return _EFFECTS[spec.type](spec, link)
