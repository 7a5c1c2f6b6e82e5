"""A tiny synchronous protocol driver for node tests: raw frames over a socket.

Deliberately not ``shoal.client``: node tests check the wire protocol itself.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.partitioning import partition_for
from shoal.cluster.topology import Topology

# TIMEOUT (outcome unknown) is retried too: the pushes these tests send carry idempotency keys.
RETRYABLE = {"NOT_LEADER", "NO_LEADER", "SHUTTING_DOWN", "OVERLOADED", "TIMEOUT"}


class RawConn:
    """One socket; ``call`` sends a frame and waits for the reply with the same reqId."""

    def __init__(self, address: str, timeout_s: float = 10.0, hello: bool = True) -> None:
        host, port = address.rsplit(":", 1)
        self.address = address
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.decoder = FrameDecoder(requests=False)
        self.next_id = 1
        self.pending: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.hello: dict[str, Any] | None = (
            self.call({"cmd": "Hello", "protocolVersion": 2, "capabilities": ["pipelining", "routing"]}, timeout_s)
            if hello else None)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawConn":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, frame: dict[str, Any]) -> int:
        req_id = self.next_id
        self.next_id += 1
        self.sock.sendall(encode({**frame, "reqId": req_id}))
        return req_id

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The next frame in arrival order (replies and events)."""
        if self.pending:
            return self.pending.pop(0)
        return self._read_new(time.monotonic() + timeout_s)

    def wait_reply(self, req_id: int, timeout_s: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        for i, f in enumerate(self.pending):
            if f.get("reqId") == req_id:
                return self.pending.pop(i)
        while time.monotonic() < deadline:
            frame = self._read_new(deadline)
            if frame.get("reqId") == req_id:
                return frame
            if "event" in frame and "reqId" not in frame:
                self.events.append(frame)
            else:
                self.pending.append(frame)
        raise TimeoutError(f"no reply to {req_id}")

    def _read_new(self, deadline: float) -> dict[str, Any]:
        while True:
            frame = next(self.decoder, None)
            if frame is not None:
                return frame
            if time.monotonic() >= deadline:
                raise TimeoutError("no frame")
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by node")
            self.decoder.feed(data)

    def call(self, frame: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
        return self.wait_reply(self.send(frame), timeout_s)


class Router:
    """Routes commands to partition leaders over RawConns, retrying on leader changes."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.conns: dict[str, RawConn] = {}
        self.topology: Topology | None = None

    def close(self) -> None:
        for c in self.conns.values():
            c.close()
        self.conns.clear()

    def _conn(self, address: str) -> RawConn:
        conn = self.conns.get(address)
        if conn is None:
            conn = self.conns[address] = RawConn(address, timeout_s=3.0)
            topo = Topology.from_wire(conn.hello["topology"])  # type: ignore[index]
            self.topology = topo if self.topology is None else self.topology.merge(topo)
        return conn

    def refresh(self) -> None:
        for address in self.addresses:
            try:
                conn = RawConn(address, timeout_s=1.0)
            except OSError:
                continue
            with conn:
                topo = Topology.from_wire(conn.hello["topology"])  # type: ignore[index]
                self.topology = topo if self.topology is None else self.topology.merge(topo)

    def leader_address(self, partition: int) -> str | None:
        if self.topology is None:
            self.refresh()
        node = self.topology.leader_of(partition) if self.topology else None
        return f"{node.host}:{node.port}" if node else None

    def call(self, frame: dict[str, Any], partition: int | None = None, timeout_s: float = 20.0,
             attempt_s: float = 1.0) -> dict[str, Any]:
        """Send to the leader of the frame's partition; retry on routing errors and dead nodes.

        Each attempt waits ``attempt_s`` at most (a paused leader accepts TCP but never answers);
        a command that must not be repeated on a new connection (an ACK of a lease the dropped
        connection's session held) is given a longer one."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            if partition is None and "queue" in frame:
                assert self.topology is not None or self.refresh() is None
                partition = partition_for(frame["queue"], self.topology.partitions)  # type: ignore[union-attr]
            address = self.leader_address(partition if partition is not None else 0)
            if address is None:
                time.sleep(0.1)
                self.refresh()
                continue
            try:
                # A short attempt timeout: a paused (SIGSTOP) leader accepts TCP but never answers.
                reply = self._conn(address).call(frame, timeout_s=max(0.2, min(attempt_s, deadline - time.monotonic())))
            except (OSError, TimeoutError, ConnectionError) as exc:
                last = exc
                self.conns.pop(address, None)
                time.sleep(0.1)
                self.refresh()
                continue
            if not reply.get("ok") and reply.get("code") in RETRYABLE:
                last = reply
                time.sleep(0.05)
                self.refresh()
                continue
            return reply
        raise TimeoutError(f"no successful reply within {timeout_s}s (last: {last})")


def leader_seen_by(address: str, partition: int = 0) -> str | None:
    """The leader of ``partition`` in the topology the node at ``address`` answers Hello with
    (None when it knows none, or cannot be reached)."""
    try:
        with RawConn(address, timeout_s=2.0) as conn:
            topo = Topology.from_wire(conn.hello["topology"])  # type: ignore[index]
    except OSError:
        return None
    return topo.partition_map[partition].leader
