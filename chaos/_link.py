"""One proxied TCP connection and its two links (directions).

Theory of operation: each link has a *reader* task that reads chunks from its
source socket, stamps them with the arrival time and puts them on a bounded
queue (backpressure: a full queue stops the reads, the kernel buffers fill,
the sender's TCP window closes), and a *pump* task that takes one chunk at a
time through the link's effects and writes what comes out to the destination,
awaiting ``drain()``. End of stream is a ``None`` on the queue; the pump runs
the effects' ``on_eof`` and then half-closes the destination. When both pumps
have finished, or anything closes or resets the connection, both sockets go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from collections.abc import Callable, Iterable
from typing import Optional

from shoal.chaos.toxics import Effect, ToxicSpec, make_effect

__all__ = ["Connection", "Link", "CHUNK_BYTES", "QUEUE_CHUNKS_MAX"]

CHUNK_BYTES = 32 * 1024
# Per direction at most QUEUE_CHUNKS_MAX * CHUNK_BYTES bytes wait in the proxy
# (plus the transport's own write buffer).
QUEUE_CHUNKS_MAX = 8
# A closed connection whose peer does not read its last bytes is aborted after
# this long, so a stalled peer cannot pin a socket forever.
CLOSE_FLUSH_S = 5.0

_Item = Optional[tuple[float, bytes]]
_log = logging.getLogger("shoal.chaos.proxy")


def _abort_with_rst(writer: asyncio.StreamWriter) -> None:
    # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Link:
    """One direction of a connection: ``source`` → effects → ``dest``."""

    def __init__(
        self,
        conn: Connection,
        stream: str,
        source: asyncio.StreamReader,
        dest: asyncio.StreamWriter,
    ) -> None:
        self.conn = conn
        self.stream = stream
        self.rng = conn.rng
        self._source = source
        self._dest = dest
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=QUEUE_CHUNKS_MAX)
        # name -> effect, or None when the toxicity draw left this link alone.
        # Insertion order is the order toxics were added: the chain order.
        self._effects: dict[str, Effect | None] = {}
        self.pump_done = False

    # LinkControl, for effects.
    def close(self) -> None:
        self.conn.close()

    def reset(self) -> None:
        self.conn.reset()

    # Toxic management, called by the proxy on the loop thread.
    def attach(self, spec: ToxicSpec) -> None:
        """Add (or replace, keeping its place) the effect of ``spec``."""
        self.detach(spec.name, keep_slot=True)
        # The toxicity draw happens once per link and toxic, as in Toxiproxy.
        effect = make_effect(spec, self) if self.rng.random() < spec.toxicity else None
        self._effects[spec.name] = effect
        if effect is not None:
            effect.start()

    def detach(self, name: str, *, keep_slot: bool = False) -> None:
        effect = self._effects.get(name)
        if effect is not None:
            effect.stop()
        if not keep_slot:
            self._effects.pop(name, None)

    def detach_all(self) -> None:
        for name in list(self._effects):
            self.detach(name)

    # Tasks.
    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self._source.read(CHUNK_BYTES)
                if not data:
                    await self._queue.put(None)
                    return
                await self._queue.put((loop.time(), data))
        except (ConnectionResetError, BrokenPipeError):
            # The peer reset its side: pass the reset on to the other peer.
            self.conn.reset()
        except OSError:
            self.conn.close()

    async def pump_loop(self) -> None:
        try:
            while not self.conn.closing:
                item = await self._queue.get()
                chain = [e for e in self._effects.values() if e is not None]
                if item is None:
                    await self._finish(chain)
                    return
                stamp, data = item
                await self._through(chain, 0, stamp, data)
        except (ConnectionResetError, BrokenPipeError):
            self.conn.reset()
        except OSError:
            self.conn.close()
        except Exception:
            # A bug in an effect must not leave a half-dead connection behind.
            _log.exception("chaos proxy: %s link failed", self.stream)
            self.conn.close()
        finally:
            self.pump_done = True
            self.conn.link_finished()

    async def _through(self, chain: list[Effect], index: int, stamp: float, data: bytes) -> None:
        if self.conn.closing:
            return
        if index == len(chain):
            self._dest.write(data)
            await self._dest.drain()
            return
        effect = chain[index]
        # Skip an effect whose toxic was removed while the chunk was on its way.
        if self._effects.get(effect.spec.name) is not effect:
            await self._through(chain, index + 1, stamp, data)
            return

        async def forward(next_stamp: float, next_data: bytes) -> None:
            await self._through(chain, index + 1, next_stamp, next_data)

        await effect.on_chunk(stamp, data, forward)

    async def _finish(self, chain: list[Effect]) -> None:
        for effect in chain:
            if self.conn.closing:
                return
            await effect.on_eof()
        if self.conn.closing:
            return
        if self._dest.can_write_eof():
            self._dest.write_eof()
        else:
            self.conn.close()


class Connection:
    """A client socket, an upstream socket and the two links between them."""

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        rng: random.Random,
        on_closed: Callable[[Connection], None],
    ) -> None:
        self.rng = rng
        self.closing = False
        self._writers = (client[1], upstream[1])
        self._on_closed = on_closed
        self.links = {
            "upstream": Link(self, "upstream", client[0], upstream[1]),
            "downstream": Link(self, "downstream", upstream[0], client[1]),
        }
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = asyncio.Event()

    def start(self, toxics: Iterable[ToxicSpec]) -> None:
        """Attach the proxy's current toxics and start moving bytes."""
        for spec in toxics:
            self.links[spec.stream].attach(spec)
        for link in self.links.values():
            self._tasks.append(asyncio.ensure_future(link.read_loop()))
            self._tasks.append(asyncio.ensure_future(link.pump_loop()))

    def link_finished(self) -> None:
        if all(link.pump_done for link in self.links.values()):
            self.close()

    def close(self) -> None:
        """Close both sockets after their pending bytes (FIN); idempotent."""
        if self._begin_close():
            loop = asyncio.get_running_loop()
            for writer in self._writers:
                writer.close()
                # transport.abort() on a closed transport is a no-op.
                loop.call_later(CLOSE_FLUSH_S, writer.transport.abort)

    def reset(self) -> None:
        """Abort both sockets with a TCP RST; idempotent."""
        if self._begin_close():
            for writer in self._writers:
                _abort_with_rst(writer)

    def _begin_close(self) -> bool:
        if self.closing:
            return False
        self.closing = True
        for link in self.links.values():
            link.detach_all()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self._closed.set()
        self._on_closed(self)
        return True

    async def wait_closed(self) -> None:
        """Wait until the connection is closed and its tasks have ended."""
        await self._closed.wait()
        current = asyncio.current_task()
        await asyncio.gather(*(t for t in self._tasks if t is not current), return_exceptions=True)
