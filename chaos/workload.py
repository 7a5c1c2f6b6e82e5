"""Producers, consumers and readers that record every operation in a :class:`History`.

Producers push unique values (``"p<k>-<n>"``) one at a time with the real client,
which adds an idempotency key and retries across leader changes. Consumers pull
with a short lease and ack. Outcomes: ``ok``; ``fail`` when the node refused for
certain (invalid, lease mismatch, not found); ``info`` when it is unknown (timeouts,
lost connections after the client's own retries).

Readers ask, one read at a time, for the job whose push was acknowledged last
(GetJob), the job whose ack was acknowledged last (GetState), an older acknowledged
job (GetJob), and the queue's counts (GetJobCounts, Count): one reader through the
routing client, and one per node over a plain connection to that node alone (protocol
v1, no ``routing`` capability), which the node answers itself when it believes it
leads the partition and forwards to the leader it knows otherwise. A paused, isolated
or just-resumed node is where a stale read shows. The checker holds every read to
the facts acknowledged before it began (:mod:`.checker`).

The workload creates its queue with a completed-job history longer than any run, so no
job leaves the queue during a run and those facts never expire.

Steps may hold the producers and consumers for a moment (:meth:`Workload.hold`: a quiet
partition) and fire reads at one node at once (:meth:`Workload.probe`) over connections it
accepted at the start of the run, from their thread: sent while the node is paused, they wait
in its sockets beside its Raft traffic and are read in the same loop iteration when it resumes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from shoal.client import AsyncClient, ConnectionOptions, RetryPolicy
from shoal.client.exceptions import (AuthError, InvalidCommand, InvalidState, LeaseMismatch, NotFound,
                                     ShoalError)
from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.errors import ProtocolError

from .history import FAIL, INFO, INVOKE, OK, History

__all__ = ["Workload", "WorkloadConfig", "NodeLink"]

DEFINITE_PUSH_FAILURES = (InvalidCommand, AuthError)
DEFINITE_ACK_FAILURES = (LeaseMismatch, InvalidState, NotFound, InvalidCommand)
#: Completed jobs the workload's queue keeps: more than any run acknowledges, so none is trimmed.
HISTORY_MAX = 10_000_000
#: Acknowledged job ids kept for reads of older jobs.
KNOWN_IDS_MAX = 1_000
#: Replies a plain connection reads past (topology events) before giving up on its answer.
REPLY_FRAMES_MAX = 1_000
RECV_BYTES = 1 << 16
CREATE_ATTEMPTS = 5
HOLD_POLL_S = 0.01
#: Connections per node kept open for :meth:`Workload.probe` (one read each), and how long a probe
#: read may wait (it is sent to a paused node, which must resume first).
PROBE_LINKS = 3
PROBE_TIMEOUT_S = 5.0


@dataclass
class WorkloadConfig:
    queue: str = "chaos"
    producers: int = 2
    consumers: int = 2
    lease_s: float = 3.0            # a lapsed lease redelivers: keep it short for the drain
    command_timeout_s: float = 5.0
    push_interval_s: float = 0.002  # pause between one producer's pushes
    drain_timeout_s: float = 45.0
    read_interval_s: float = 0.05   # pause between one reader's reads; 0 = no readers
    read_timeout_s: float = 1.0     # a read to a paused node gives up after this long


class ReadRefused(Exception):
    """A node answered a read with an error (the read certainly did not happen)."""


class NodeLink:
    """One plain connection to one node (protocol v1: no Hello, so the node forwards what it does
    not lead); one command at a time. Any error closes it; the next call connects again."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._decoder = FrameDecoder(requests=False)
        self._req_id = 0

    async def call(self, frame: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``frame`` and return the node's reply (``ok`` or not) within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                if self._writer is None:
                    self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
                    self._decoder = FrameDecoder(requests=False)
                assert self._reader is not None
                self._req_id += 1
                self._writer.write(encode({**frame, "reqId": self._req_id}))
                await self._writer.drain()
                for _ in range(REPLY_FRAMES_MAX):
                    for reply in self._decoder:
                        if reply.get("reqId") == self._req_id:
                            return reply
                    data = await self._reader.read(RECV_BYTES)
                    if not data:
                        raise ConnectionError(f"{self.host}:{self.port} closed the connection")
                    self._decoder.feed(data)
                raise ProtocolError(f"no reply among {REPLY_FRAMES_MAX} frames")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


class Workload:
    """Runs producers for the producing time, consumers and readers until the queue is drained.

    ``nodes`` maps node ids to the client addresses the per-node readers use (none: no per-node
    readers).
    """

    def __init__(self, addresses: list[str], history: History, config: WorkloadConfig | None = None,
                 nodes: dict[str, str] | None = None) -> None:
        self.addresses = addresses
        self.history = history
        self.config = config or WorkloadConfig()
        self.nodes = dict(nodes or {})
        self._producing = True
        self._consuming = True
        self.client: AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open: asyncio.Event | None = None   # cleared while a step holds the workload
        self._busy = 0                            # producer and consumer operations in flight
        self._last_pushed: str | None = None
        self._last_acked: str | None = None
        self._known: deque[str] = deque(maxlen=KNOWN_IDS_MAX)
        self._probe_links: dict[str, list[NodeLink]] = {}
        self._probes = 0

    def _options(self) -> ConnectionOptions:
        c = self.config
        # Reconnects at least once a second: the time until writes are back after a heal is the
        # cluster's, not the client's backoff (its default doubles to 6.4 s after a few seconds
        # of every node down, past the recovery bound a full restart is held to).
        return ConnectionOptions(command_timeout=c.command_timeout_s, ping_interval=1.0, max_ping_failures=2,
                                 max_command_timeouts=2, connect_timeout=1.0, pool_size=1,
                                 reconnect=RetryPolicy(base_s=0.1, factor=2.0, max_s=1.0))

    async def run(self, produce_s: float, until: "asyncio.Future[Any] | None" = None, overrun_s: float = 0.0) -> None:
        """Produce for ``produce_s`` seconds (faults happen meanwhile), and on while ``until`` is not
        done (at most ``overrun_s`` longer: a membership change that takes its time), then drain."""
        self._loop = asyncio.get_running_loop()
        self._open = asyncio.Event()
        self._open.set()
        async with AsyncClient(self.addresses, options=self._options()) as client:
            self.client = client
            queue = client.queue(self.config.queue)
            await self._create(queue)
            tasks = [asyncio.create_task(self._produce(queue, f"p{i}")) for i in range(self.config.producers)]
            others = [asyncio.create_task(self._consume(queue, f"c{i}")) for i in range(self.config.consumers)]
            links = {node: NodeLink(address) for node, address in self.nodes.items()}
            await self._open_probe_links()
            if self.config.read_interval_s > 0:
                others.append(asyncio.create_task(self._read_loop("r-client", "client", self._client_reader(queue))))
                others += [asyncio.create_task(self._read_loop(f"r-{node}", node, self._node_reader(link)))
                           for node, link in links.items()]
            try:
                await asyncio.sleep(produce_s)
                if until is not None and not until.done():
                    await asyncio.wait([until], timeout=overrun_s)
                self._producing = False
                self._open.set()   # a step that failed while holding must not hold the drain
                await asyncio.gather(*tasks)
                await self._drain(queue)
            finally:
                self._producing = self._consuming = False
                self._open.set()
                await asyncio.gather(*others)
                for link in [*links.values(), *(k for ks in self._probe_links.values() for k in ks)]:
                    link.close()

    async def _create(self, queue: Any) -> None:
        """Create the queue with a history no run outgrows (bounded attempts; a fresh cluster may
        still be electing)."""
        for attempt in range(CREATE_ATTEMPTS):
            try:
                await queue.create(history_max=HISTORY_MAX)
                return
            except (ShoalError, OSError, asyncio.TimeoutError):
                if attempt == CREATE_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.5)

    # --- holding the workload (called from a step's thread) --------------------------------------

    def hold(self, timeout_s: float = 5.0) -> bool:
        """Stop producers and consumers between operations; True once none is in flight (within
        ``timeout_s``). Readers go on: reads change nothing."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._hold(timeout_s), self._loop)
        return future.result(timeout_s + 1.0)

    async def _hold(self, timeout_s: float) -> bool:
        assert self._open is not None
        self._open.clear()
        deadline = time.monotonic() + timeout_s
        while self._busy and time.monotonic() < deadline:
            await asyncio.sleep(HOLD_POLL_S)
        return self._busy == 0

    def release(self) -> None:
        """Let producers and consumers go on."""
        assert self._loop is not None and self._open is not None
        self._loop.call_soon_threadsafe(self._open.set)

    async def _open_probe_links(self) -> None:
        """Connect the probe links (a node accepts them now; a paused node could not)."""
        for node, address in self.nodes.items():
            links = self._probe_links[node] = [NodeLink(address) for _ in range(PROBE_LINKS)]
            for link in links:
                try:
                    await link.call({"cmd": "Ping"}, self.config.read_timeout_s)
                except (OSError, ProtocolError, TimeoutError):
                    pass   # it connects again when a probe needs it

    def probe(self, node: str) -> "concurrent.futures.Future[None]":
        """Send reads to ``node`` at once, one on each of its probe links (the freshest facts: the
        job pushed last, the job acked last, the counts), recorded like every read. Returns at once;
        the future is done when they are answered (or timed out after the read timeout)."""
        assert self._loop is not None
        self._probes += 1
        return asyncio.run_coroutine_threadsafe(self._probe(node, f"probe{self._probes}-{node}"), self._loop)

    async def _probe(self, node: str, process: str) -> None:
        kinds = [("job", self._last_pushed), ("state", self._last_acked), ("counts", self.config.queue)]
        await asyncio.gather(*(self._read(f"{process}-{i}", node, self._node_reader(link, PROBE_TIMEOUT_S), kind,
                                          arg, PROBE_TIMEOUT_S)
                               for i, (link, (kind, arg)) in enumerate(zip(self._probe_links[node], kinds))
                               if arg is not None))

    # --- producers and consumers -------------------------------------------------------------------

    async def _produce(self, queue: Any, process: str) -> None:
        n = 0
        add = self.history.add
        assert self._open is not None
        while self._producing:
            await self._open.wait()
            if not self._producing:
                break
            n += 1
            value = f"{process}-{n}"
            self._busy += 1
            add(process, INVOKE, "push", value)
            try:
                job_id = await queue.add(value)
            except DEFINITE_PUSH_FAILURES:
                add(process, FAIL, "push", value)
            except (ShoalError, OSError, asyncio.TimeoutError):
                add(process, INFO, "push", value)
            else:
                add(process, OK, "push", (value, job_id))
                self._last_pushed = job_id
                self._known.append(job_id)
            finally:
                self._busy -= 1
            await asyncio.sleep(self.config.push_interval_s)

    async def _consume(self, queue: Any, process: str) -> None:
        add = self.history.add
        assert self._open is not None
        while self._consuming:
            await self._open.wait()
            self._busy += 1
            try:
                await self._consume_one(queue, process, add)
            finally:
                self._busy -= 1

    async def _consume_one(self, queue: Any, process: str, add: Callable[..., None]) -> None:
        add(process, INVOKE, "pull", None)
        try:
            job = await queue.pull(timeout=0.5, ttr=self.config.lease_s)
        except (ShoalError, OSError, asyncio.TimeoutError):
            add(process, INFO, "pull", None)
            await asyncio.sleep(0.05)
            return
        if job is None:
            add(process, OK, "pull", None)
            return
        add(process, OK, "pull", (job.id, job.data, job.token))
        add(process, INVOKE, "ack", (job.id, job.token))
        try:
            await queue.ack(job)
        except DEFINITE_ACK_FAILURES:
            add(process, FAIL, "ack", (job.id, job.token))
        except (ShoalError, OSError, asyncio.TimeoutError):
            add(process, INFO, "ack", (job.id, job.token))
        else:
            add(process, OK, "ack", (job.id, job.token))
            self._last_acked = job.id

    # --- readers -----------------------------------------------------------------------------------

    def _next_read(self, i: int) -> tuple[str, Any]:
        """The i-th read of a reader: the freshest facts first, where a stale answer shows."""
        step = i % 5
        if step == 0 and self._last_pushed is not None:
            return "job", self._last_pushed
        if step == 2 and self._last_acked is not None:
            return "state", self._last_acked
        if step == 3:
            return "count", self.config.queue
        if step == 4 and self._known:
            return "job", random.choice(self._known)
        return "counts", self.config.queue

    async def _read_loop(self, process: str, where: str, reader: Callable[[str, Any], Awaitable[Any]]) -> None:
        i = 0
        while self._consuming:
            kind, arg = self._next_read(i)
            i += 1
            await self._read(process, where, reader, kind, arg)
            await asyncio.sleep(self.config.read_interval_s)

    async def _read(self, process: str, where: str, reader: Callable[[str, Any], Awaitable[Any]],
                    kind: str, arg: Any, timeout_s: float | None = None) -> None:
        add = self.history.add
        add(process, INVOKE, "read", (kind, where, arg))
        try:
            async with asyncio.timeout(timeout_s or self.config.read_timeout_s):
                result = await reader(kind, arg)
        except ReadRefused:
            add(process, FAIL, "read", (kind, where, arg))
        except (ShoalError, OSError, ProtocolError, TimeoutError):
            add(process, INFO, "read", (kind, where, arg))
        else:
            add(process, OK, "read", (kind, where, arg, result))

    def _client_reader(self, queue: Any) -> Callable[[str, Any], Awaitable[Any]]:
        async def read(kind: str, arg: Any) -> Any:
            if kind == "job":
                job = await queue.get_job(arg)
                return job.state if job is not None else None
            if kind == "state":
                try:
                    return await queue.get_state(arg)
                except NotFound:
                    return None
            if kind == "counts":
                return await queue.counts()
            return await queue.count()
        return read

    def _node_reader(self, link: NodeLink, timeout_s: float | None = None) -> Callable[[str, Any], Awaitable[Any]]:
        frames = {"job": ("GetJob", "id"), "state": ("GetState", "id"), "counts": ("GetJobCounts", "queue"),
                  "count": ("Count", "queue")}

        async def read(kind: str, arg: Any) -> Any:
            cmd, key = frames[kind]
            reply = await link.call({"cmd": cmd, key: arg}, timeout_s or self.config.read_timeout_s)
            if not reply.get("ok"):
                if kind == "state" and reply.get("code") == "NOT_FOUND":
                    return None
                raise ReadRefused(str(reply.get("code")))
            if kind == "job":
                return reply["job"]["state"] if reply.get("job") else None
            return reply[{"state": "state", "counts": "counts", "count": "count"}[kind]]
        return read

    async def _drain(self, queue: Any) -> None:
        """Wait until nothing is waiting, delayed or leased (bounded by ``drain_timeout_s``)."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        quiet = 0
        while time.monotonic() < deadline:
            try:
                counts = await queue.counts()
            except (ShoalError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.5)
                continue
            if counts.get("waiting", 0) + counts.get("active", 0) + counts.get("delayed", 0) == 0:
                quiet += 1
                if quiet >= 2:   # twice in a row: no ack in flight will put one back
                    return
            else:
                quiet = 0
            await asyncio.sleep(0.5)
