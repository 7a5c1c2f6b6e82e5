"""Hostile clients against a 3-node cluster with tokens: nothing a client sends can
take a node's memory, its event loop or another client's session.

Each test is an attack as a client with a socket would run it; the node's peak or current
resident memory is read from ``/proc/<pid>/status`` of the real node process.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import msgpack
import pytest

from conftest import NODE_COMMAND, leader_of
from rawproto import RawConn
from waiting import eventually
from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.launcher import LocalCluster, free_base_port

pytestmark = pytest.mark.integration

TOKEN = "hostile-test-token"
PER_ADDRESS_MAX = 40
LIMITS_ENV = {
    "SHOAL_FRAME_TIMEOUT_MS": "1000",
    "SHOAL_UNAUTHENTICATED_IDLE_MS": "1500",
    "SHOAL_CONNECTIONS_PER_ADDRESS_MAX": str(PER_ADDRESS_MAX),
    "SHOAL_OUTPUT_HIGH_BYTES": str(1 << 20),
    "SHOAL_OUTPUT_MAX_BYTES": str(8 << 20),
    "SHOAL_UNFINISHED_BYTES_MAX": str(64 << 20),
}
MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path_factory.mktemp("hostile"),
                      base_port=free_base_port(3, 4), tokens=(TOKEN,), extra_env=LIMITS_ENV,
                      node_command=NODE_COMMAND) as cl:
        cl.wait_balanced()
        yield cl


def proc_status_kib(pid: int, field: str) -> int:
    """``VmRSS``/``VmHWM`` of a process, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def authed(address: str, timeout_s: float = 10.0) -> RawConn:
    """A v2 connection that has sent Auth (then Hello)."""
    conn = RawConn(address, timeout_s, hello=False)
    assert conn.call({"cmd": "Auth", "token": TOKEN})["ok"]
    conn.hello = conn.call({"cmd": "Hello", "protocolVersion": 2})
    return conn


def raw_socket(address: str, timeout_s: float = 10.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout_s)


def read_until_closed(sock: socket.socket, timeout_s: float) -> list[dict[str, Any]]:
    """Every frame the node sends until it closes the connection; TimeoutError if it does not."""
    decoder = FrameDecoder(requests=False)
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            data = sock.recv(1 << 16)
        except socket.timeout:
            break
        except ConnectionResetError:
            return frames
        if not data:
            return frames
        decoder.feed(data)
        frames.extend(decoder)
    raise TimeoutError(f"the node kept the connection open for {timeout_s} s (frames: {frames})")


def ping_s(conn: RawConn) -> float:
    started = time.monotonic()
    assert conn.call({"cmd": "Ping"}, timeout_s=5.0)["ok"]
    return time.monotonic() - started


# --- 1. nothing is decoded before Auth -------------------------------------------------------------

def test_unauthenticated_8mb_frame_is_refused_from_its_header(cluster: LocalCluster) -> None:
    node = cluster.node_ids[0]
    pid = cluster.pids[node]
    address = cluster.address_of(node)
    with authed(address) as bystander:
        hwm_before = proc_status_kib(pid, "VmHWM")
        count = 8 * MiB
        body = b"\xdd" + struct.pack(">I", count) + b"\x80" * count   # an array of 8M empty maps
        with raw_socket(address) as sock:
            try:
                sock.sendall(struct.pack(">I", len(body)) + body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the node closed as soon as it saw the length
            frames = read_until_closed(sock, 5.0)
        assert frames and frames[0]["code"] == "AUTH_REQUIRED"
        assert "65536" in frames[0]["error"]
        assert ping_s(bystander) < 1.0
        grown_kib = proc_status_kib(pid, "VmHWM") - hwm_before
        assert grown_kib < 32 * 1024, f"peak RSS grew {grown_kib} KiB on one unauthenticated frame"


def test_before_auth_only_hello_auth_ping_and_no_topology(cluster: LocalCluster) -> None:
    address = cluster.addresses[0]
    with RawConn(address, hello=False) as c:
        hello = c.call({"cmd": "Hello", "protocolVersion": 2})
        assert hello["ok"] and hello["authRequired"] is True
        assert "topology" not in hello and "session" not in hello
        assert c.call({"cmd": "Ping"})["ok"]
        for frame in ({"cmd": "PUSH", "queue": "q", "data": 1}, {"cmd": "Identify", "session": "x"},
                      {"cmd": "Stats"}, {"cmd": "Subscribe"}):
            assert c.call(frame)["code"] == "AUTH_REQUIRED"
        auth = c.call({"cmd": "Auth", "token": TOKEN})
        assert auth["ok"] and auth["topology"]["partitions"] == 4 and len(auth["session"]) == 32
        assert "topology" in c.call({"cmd": "Hello", "protocolVersion": 2})


def test_wrong_tokens_are_slowed_down_and_the_third_closes(cluster: LocalCluster) -> None:
    with RawConn(cluster.addresses[0], hello=False) as c:
        started = time.monotonic()
        for token in ("x", "y" * 4000):  # lengths differ: both just AUTH_FAILED
            assert c.call({"cmd": "Auth", "token": token})["code"] == "AUTH_FAILED"
        c.send({"cmd": "Auth", "token": "z"})
        frames = read_until_closed(c.sock, 10.0)
        assert frames[-1]["code"] == "AUTH_FAILED"
        assert time.monotonic() - started >= 1.5  # 0.25 + 0.5 + 1 s of delays


# --- 2. bounded decoding ----------------------------------------------------------------------

def _deep_push(depth: int, req_id: int) -> bytes:
    body = (b"\x84\xa3cmd\xa4PUSH\xa5queue\xa4deep\xa5reqId" + msgpack.packb(req_id)
            + b"\xa4data" + b"\x91" * depth + b"\x00")
    return struct.pack(">I", len(body)) + body


def test_deep_nesting_is_invalid_and_the_connection_stays_usable(cluster: LocalCluster) -> None:
    with authed(cluster.address_of(leader_of(cluster, "deep"))) as c:
        for depth, req_id in ((10**6, 900), (600, 901)):
            c.send_raw(_deep_push(depth, req_id))
            reply = c.wait_reply(req_id)
            assert reply["code"] == "INVALID" and "512" in reply["error"], reply
            assert c.call({"cmd": "Ping"})["ok"]
        c.send_raw(_deep_push(100, 902))
        assert c.wait_reply(902)["ok"]


def test_deep_nesting_over_http_and_websocket_is_invalid(cluster: LocalCluster) -> None:
    n = cluster.config.node(leader_of(cluster, "deep"))
    base = f"http://{n.host}:{n.http_port}"

    async def main() -> None:
        deep_json = '{"data":' + "[" * 100_000 + "]" * 100_000 + "}"
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
            async with s.post(base + "/queues/deep/jobs", data=deep_json,
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400
                body = await r.json()
                assert body["code"] == "INVALID" and "512" in body["error"]
            async with s.ws_connect(base + "/ws") as ws:
                await ws.send_str('{"cmd":"PUSH","queue":"deep","reqId":1,"data":' + "[" * 700 + "]" * 700 + "}")
                reply = await ws.receive_json(timeout=10)
                assert reply["code"] == "INVALID" and "512" in reply["error"]
                await ws.send_bytes(_deep_push(10**6, 2)[4:])
                reply = msgpack.unpackb((await ws.receive(timeout=10)).data)
                assert reply["code"] == "INVALID" and reply["reqId"] == 2
                await ws.send_str('{"cmd":"Ping","reqId":3}')
                assert (await ws.receive_json(timeout=10))["ok"]

    asyncio.run(main())


# --- 3. timeouts and connection limits --------------------------------------------------------

def test_unfinished_frame_and_slow_sender_are_closed(cluster: LocalCluster) -> None:
    address = cluster.addresses[1]
    with authed(address) as c:  # 10 bytes of a 1,000-byte frame, then nothing
        c.send_raw(struct.pack(">I", 1000) + b"\x80" * 10)
        frames = read_until_closed(c.sock, 6.0)
        assert frames and frames[-1]["code"] == "TIMEOUT"
    with authed(address) as c:  # one byte every 0.2 s: never a whole frame in time
        c.send_raw(struct.pack(">I", 100))
        closed = False
        for _ in range(40):
            try:
                c.sock.sendall(b"\xc0")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.2)
        if not closed:
            read_until_closed(c.sock, 3.0)


def test_unfinished_frames_share_one_node_budget(cluster: LocalCluster) -> None:
    node = cluster.node_ids[1]
    pid, address = cluster.pids[node], cluster.address_of(node)
    rss_before = proc_status_kib(pid, "VmRSS")
    with contextlib.ExitStack() as stack:
        holders = [stack.enter_context(authed(address)) for _ in range(3)]
        refused = []
        for conn in holders:  # 40 MiB of a 60 MiB frame each: the budget (64 MiB) holds one
            try:
                conn.send_raw(struct.pack(">I", 60 << 20) + b"\x00" * (40 << 20))
            except (BrokenPipeError, ConnectionResetError):
                pass
        time.sleep(0.5)
        for conn in holders[1:]:
            frames = read_until_closed(conn.sock, 5.0)
            refused += [f for f in frames if f.get("code") == "OVERLOADED"]
        assert len(refused) == 2 and "unfinished_bytes_max" in refused[0]["error"]
        grown_kib = proc_status_kib(pid, "VmRSS") - rss_before
        assert grown_kib < 100 * 1024, f"RSS grew {grown_kib} KiB"
        with authed(address) as other:
            assert other.call({"cmd": "Ping"})["ok"]


def test_silent_unauthenticated_connection_is_closed(cluster: LocalCluster) -> None:
    with raw_socket(cluster.addresses[2]) as sock:
        frames = read_until_closed(sock, 6.0)
        assert frames and frames[-1]["code"] == "AUTH_REQUIRED"


def test_connections_per_address_are_limited(cluster: LocalCluster) -> None:
    address = cluster.addresses[0]
    socks: list[socket.socket] = []
    try:
        for _ in range(PER_ADDRESS_MAX + 5):
            socks.append(raw_socket(address))
        refused = 0
        for sock in socks[-5:]:
            frames = read_until_closed(sock, 5.0)
            assert frames and frames[0]["code"] == "OVERLOADED" and "connections_per_address_max" in frames[0]["error"]
            refused += 1
        assert refused == 5
    finally:
        for sock in socks:
            sock.close()

    def ping() -> bool:
        with authed(address) as c:
            return bool(c.call({"cmd": "Ping"})["ok"])

    # the closed ones free their places
    eventually(ping, "a Ping on a new connection", 10, poll_s=0.1, ignoring=(OSError, AssertionError))


# --- 4. backpressure ---------------------------------------------------------------------------

def test_a_client_that_never_reads_costs_bounded_memory(cluster: LocalCluster) -> None:
    queue = "never-reads"
    leader = leader_of(cluster, queue)
    pid = cluster.pids[leader]
    address = cluster.address_of(leader)
    with authed(address) as c:
        job = c.call({"cmd": "PUSH", "queue": queue, "data": b"x" * MiB})["id"]
    rss_before = proc_status_kib(pid, "VmRSS")
    with authed(address) as bystander, authed(address) as hog:
        hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        frames = b"".join(encode({"cmd": "GetJob", "id": job, "reqId": 10_000 + i}) for i in range(200))
        hog.sock.sendall(frames)
        time.sleep(3.0)
        grown_kib = proc_status_kib(pid, "VmRSS") - rss_before
        assert ping_s(bystander) < 1.0
        assert grown_kib < 48 * 1024, f"RSS grew {grown_kib} KiB for 200 unread 1 MiB replies"
        # Reading again drains it: every reply arrives.
        got = 0
        deadline = time.monotonic() + 30
        while got < 200 and time.monotonic() < deadline:
            if hog.read_frame(timeout_s=10.0).get("ok"):
                got += 1
        assert got == 200


def test_a_subscriber_that_never_reads_is_cut_off(cluster: LocalCluster) -> None:
    queue = "unread-events"
    address = cluster.address_of(leader_of(cluster, queue))
    with authed(address) as pusher, authed(address) as sub:
        sub.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        assert sub.call({"cmd": "Subscribe", "queue": queue})["ok"]
        for _ in range(30):  # 300,000 events of ~60 bytes: ~18 MB for a reader that never reads
            assert pusher.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": 1}] * 10_000})["ok"]
        assert ping_s(pusher) < 1.0
        received = 0
        sub.sock.settimeout(10.0)
        for _ in range(100_000):  # now read: the stream ends (the node closed it) before the last event
            try:
                data = sub.sock.recv(1 << 20)
            except ConnectionResetError:
                break
            if not data:
                break
            received += len(data)
        assert received < 16 << 20


# --- sessions ------------------------------------------------------------------------------------

def _neighbours(session: str) -> list[str]:
    """Ids next to ``session``: its trailing number (or the whole id as hex) plus or minus 1..3."""
    head, _, tail = session.rpartition(".")
    if tail.isdigit():
        return [f"{head}.{int(tail) + d}" for d in (-3, -2, -1, 1, 2, 3) if int(tail) + d > 0]
    return [f"{int(session, 16) + d:0{len(session)}x}" for d in (-3, -2, -1, 1, 2, 3)]


def test_session_ids_are_128_random_bits(cluster: LocalCluster) -> None:
    with authed(cluster.addresses[0]) as a, authed(cluster.addresses[0]) as b:
        ids = [a.hello["session"], b.hello["session"]]
    for session in ids:
        assert len(session) == 32 and int(session, 16) >= 0
    assert ids[0] != ids[1]


def test_identify_cannot_adopt_a_guessed_session(cluster: LocalCluster) -> None:
    queue = "sessions"
    address = cluster.address_of(leader_of(cluster, queue))
    with contextlib.ExitStack() as stack, authed(address) as victim, authed(address) as attacker:
        mine = attacker.hello["session"]
        job = victim.call({"cmd": "PUSH", "queue": queue, "data": 1})["id"]
        assert victim.call({"cmd": "PULL", "queue": queue, "ttr": 600_000})["job"]["id"] == job
        # The guesses an attacker makes from its own id: its neighbours, each held on a connection
        # of its own. None may be the victim's, whose lease would then outlive its connection.
        guessers = [stack.enter_context(authed(address)) for _ in _neighbours(mine)]
        for conn, guess in zip(guessers, _neighbours(mine)):
            assert conn.call({"cmd": "Identify", "session": guess})["session"] == guess
        victim.close()
        # the victim's session ended: its lease went back
        eventually(lambda: attacker.call({"cmd": "GetJob", "id": job})["job"]["state"] == "waiting",
                   "the victim's job waiting again", 10, poll_s=0.1)


# --- 5. the memory budget ----------------------------------------------------------------------

def test_memory_budget_refuses_new_jobs_while_consumers_drain(tmp_path_factory: pytest.TempPathFactory) -> None:
    budget = 200 * MiB  # high-water mark 180 MiB: a node starts well under it
    env = {"SHOAL_MEMORY_MAX_BYTES": str(budget)}
    with LocalCluster(nodes=1, partitions=2, data_dir=tmp_path_factory.mktemp("budget"),
                      base_port=free_base_port(1, 2), tokens=(TOKEN,), extra_env=env,
                      node_command=NODE_COMMAND) as cl, authed(cl.addresses[0]) as c:
        queue, payload = "budget", b"x" * MiB
        pushed: list[str] = []
        refusal: dict[str, Any] | None = None
        # Job data lives in payload files, not in memory; a completed job's result does not: every
        # other job is taken and completed with a 1 MiB result. Bounded: ~2-3 MiB of RSS per such
        # result crosses the mark well before 400 jobs.
        for _ in range(400):
            reply = c.call({"cmd": "PUSH", "queue": queue, "data": 1})
            if not reply["ok"]:
                refusal = reply
                break
            pushed.append(reply["id"])
            if len(pushed) % 2 == 0:
                got = c.call({"cmd": "PULL", "queue": queue})
                assert got["ok"] and got["job"] is not None, got
                assert c.call({"cmd": "ACK", "id": got["job"]["id"], "token": got["token"], "result": payload})["ok"]
            if len(pushed) % 10 == 0:
                time.sleep(0.15)  # let the watchdog sample (every 0.1 s)
        assert refusal is not None and refusal["code"] == "OVERLOADED", refusal
        assert "memory_max_bytes" in refusal["error"] and pushed
        assert c.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": 1}]})["code"] == "OVERLOADED"
        # Consumers keep working: pull and ack, delete.
        for _ in range(3):
            got = c.call({"cmd": "PULL", "queue": queue})
            assert got["ok"] and got["job"] is not None
            assert c.call({"cmd": "ACK", "id": got["job"]["id"], "token": got["token"]})["ok"]
        assert c.call({"cmd": "Cancel", "id": pushed[-1]})["ok"]
        n = cl.config.nodes[0]

        async def http() -> None:
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
                base = f"http://{n.host}:{n.http_port}"
                async with s.post(base + f"/queues/{queue}/jobs", json={"data": 1}) as r:
                    assert r.status == 503 and r.headers["Retry-After"]
                    assert (await r.json())["code"] == "OVERLOADED"
                async with s.get(base + "/health") as r:
                    memory = (await r.json())["memory"]
                    assert memory["budgetBytes"] == budget and memory["refusingNewJobs"] is True
                    assert memory["usedBytes"] > memory["highWaterBytes"]
                async with s.get(base + "/prometheus") as r:
                    text = await r.text()
                    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                              if line and not line.startswith("#")}
                    assert values["shoal_memory_budget_bytes"] == budget and values["shoal_memory_refusing"] == 1
                    assert "shoal_event_loop_lag_seconds_bucket" in text

        asyncio.run(http())


def test_websocket_without_a_header_is_held_to_the_pre_auth_rules(cluster: LocalCluster) -> None:
    n = cluster.config.nodes[0]

    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(f"http://{n.host}:{n.http_port}/ws") as ws:   # a big message before Auth
                await ws.send_bytes(b"\x80" * (1 << 20))
                msg = await ws.receive(timeout=10)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
            async with s.ws_connect(f"http://{n.host}:{n.http_port}/ws") as ws:   # silent before Auth
                msg = await ws.receive(timeout=10)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            async with s.ws_connect(f"http://{n.host}:{n.http_port}/ws") as ws:   # three wrong tokens
                for i in range(3):
                    await ws.send_str(f'{{"cmd":"Auth","token":"wrong","reqId":{i}}}')
                    assert (await ws.receive_json(timeout=10))["code"] == "AUTH_FAILED"
                msg = await ws.receive(timeout=10)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)

    asyncio.run(main())
