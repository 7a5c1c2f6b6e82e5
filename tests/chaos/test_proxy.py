"""The Toxiproxy-compatible proxy, driven by toxiproxy-python itself.

One in-process ``ProxyServer`` (its own loop in a thread, port 0) serves the
module; one test runs ``shoal chaos proxy`` as a subprocess (on uvloop) and
kills it by pid. Behind the proxies sits a blocking-socket echo server on
loopback. Every socket has a timeout and every loop a bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists
from toxiproxy.proxy import Proxy

from shoal.chaos.proxy import ProxyServer
from shoal.chaos.toxics import ToxicSpec

pytestmark = pytest.mark.chaos

IO_TIMEOUT_S = 5.0


class EchoServer:
    """A loopback echo server; each connection in a daemon thread."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._conns: list[socket.socket] = []

    def __enter__(self) -> EchoServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()
        for conn in self._conns:
            conn.close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self._conns.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        try:
            while not self._stop.is_set():
                data = conn.recv(65536)
                if not data:
                    break
                conn.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()


def connect(proxy: Proxy) -> socket.socket:
    host, port = proxy.listen.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=IO_TIMEOUT_S)
    sock.settimeout(IO_TIMEOUT_S)
    return sock


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    deadline = time.monotonic() + IO_TIMEOUT_S
    while got < size and time.monotonic() < deadline:
        data = sock.recv(size - got)
        if not data:
            break
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def recv_until_eof(sock: socket.socket, limit_bytes: int = 10_000_000) -> bytes:
    chunks: list[bytes] = []
    got = 0
    deadline = time.monotonic() + IO_TIMEOUT_S
    while got < limit_bytes and time.monotonic() < deadline:
        data = sock.recv(65536)
        if not data:
            break
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


#: An event loop's timers fire on its own clock, rounded to the millisecond (uvloop): a delay of
#: d seconds can measure a little under d on time.monotonic().
TIMER_SLACK_S = 0.005


def round_trip_s(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


@pytest.fixture(scope="module")
def server() -> Iterator[ProxyServer]:
    with ProxyServer("127.0.0.1", 0, seed=1234).run_in_thread() as srv:
        yield srv


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    with EchoServer() as srv:
        yield srv


@pytest.fixture()
def toxiproxy(server: ProxyServer) -> Iterator[Toxiproxy]:
    """A toxiproxy-python client pointed at the in-process server, left clean."""
    client = Toxiproxy()
    client.update_api_consumer("127.0.0.1", server.port)
    client.destroy_all()
    yield client
    client.update_api_consumer("127.0.0.1", server.port)
    client.destroy_all()


@pytest.fixture()
def proxy(toxiproxy: Toxiproxy, echo: EchoServer) -> Proxy:
    return toxiproxy.create(upstream=echo.address, name="echo")


# --- API -------------------------------------------------------------------


def test_version_and_running(toxiproxy: Toxiproxy) -> None:
    assert toxiproxy.running()
    assert json.loads(toxiproxy.version())["version"].startswith("2.")


def test_create_list_get_delete(toxiproxy: Toxiproxy, echo: EchoServer) -> None:
    created = toxiproxy.create(upstream=echo.address, name="a")
    assert created.enabled is True
    host, port = created.listen.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0  # port 0 resolved
    toxiproxy.create(upstream=echo.address, name="b", enabled=False)

    proxies = toxiproxy.proxies()
    assert set(proxies) == {"a", "b"}
    assert proxies["b"].enabled is False
    shown = APIConsumer.get("/proxies/a").json()
    assert shown == {"name": "a", "listen": created.listen, "upstream": echo.address, "enabled": True, "toxics": []}

    assert toxiproxy.get_proxy("a").destroy() is True
    assert toxiproxy.get_proxy("a") is None
    with pytest.raises(NotFound):
        APIConsumer.get("/proxies/a")
    with pytest.raises(NotFound):
        APIConsumer.delete("/proxies/a")


def test_create_status_codes(toxiproxy: Toxiproxy, echo: EchoServer) -> None:
    body = {"name": "dup", "upstream": echo.address, "listen": "127.0.0.1:0"}
    assert APIConsumer.post("/proxies", json=body).status_code == 201
    with pytest.raises(ProxyExists):
        APIConsumer.post("/proxies", json=body)  # the server's 409
    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream=echo.address, name="dup")
    with pytest.raises(InvalidToxic):  # 400: missing upstream
        APIConsumer.post("/proxies", json={"name": "x"})
    with pytest.raises(InvalidToxic):  # 400: not JSON
        APIConsumer.post("/proxies", data=b"{nope")
    response = APIConsumer.post("/proxies/dup", json={"enabled": False})
    assert response.status_code == 200 and response.json()["enabled"] is False


def test_toxic_api(proxy: Proxy) -> None:
    proxy.add_toxic(type="latency", attributes={"latency": 10, "jitter": 2})
    proxy.add_toxic(type="bandwidth", stream="upstream", name="bw", toxicity=0.5, attributes={"rate": 100})
    toxics = proxy.toxics()
    assert set(toxics) == {"latency_downstream", "bw"}
    assert toxics["bw"].stream == "upstream" and toxics["bw"].toxicity == 0.5
    assert toxics["latency_downstream"].attributes == {"latency": 10, "jitter": 2}
    assert APIConsumer.get("/proxies/echo/toxics/bw").json()["attributes"] == {"rate": 100}
    assert [t["name"] for t in APIConsumer.get("/proxies/echo").json()["toxics"]] == ["latency_downstream", "bw"]

    updated = APIConsumer.post("/proxies/echo/toxics/bw", json={"attributes": {"rate": 7}}).json()
    assert updated["attributes"] == {"rate": 7} and updated["toxicity"] == 0.5

    with pytest.raises(ProxyExists):  # 409 on a duplicate toxic name
        proxy.add_toxic(type="latency", attributes={"latency": 1})
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="nope")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", stream="sideways")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", name="neg", attributes={"latency": -5})
    with pytest.raises(NotFound):
        proxy.destroy_toxic("missing")
    with pytest.raises(NotFound):
        APIConsumer.get("/proxies/missing/toxics")
    with pytest.raises(NotFound):
        APIConsumer.post("/proxies/missing/toxics", json={"type": "latency"})

    assert proxy.destroy_toxic("bw") is True
    assert set(proxy.toxics()) == {"latency_downstream"}


def test_populate(toxiproxy: Toxiproxy, echo: EchoServer) -> None:
    specs = [
        {"name": "p1", "listen": "127.0.0.1:0", "upstream": echo.address},
        {"name": "p2", "listen": "127.0.0.1:0", "upstream": echo.address, "enabled": False},
    ]
    response = APIConsumer.post("/populate", json=specs)
    assert response.status_code == 201
    listed = response.json()["proxies"]
    assert [p["name"] for p in listed] == ["p1", "p2"]
    # Same listen and upstream: kept as is; a changed upstream replaces it.
    again = [{"name": "p1", "listen": listed[0]["listen"], "upstream": echo.address}]
    assert APIConsumer.post("/populate", json=again).json()["proxies"][0]["listen"] == listed[0]["listen"]
    moved = [{"name": "p1", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:1"}]
    assert APIConsumer.post("/populate", json=moved).json()["proxies"][0]["upstream"] == "127.0.0.1:1"
    with pytest.raises(InvalidToxic):
        APIConsumer.post("/populate", json=[{"name": "bad"}])
    # toxiproxy-python's own populate goes through GET /proxies and POST /proxies.
    made = toxiproxy.populate([{"name": "p3", "listen": "127.0.0.1:0", "upstream": echo.address}])
    assert [p.name for p in made] == ["p3"]


def test_browsers_refused(server: ProxyServer) -> None:
    import requests

    response = requests.get(f"{server.api_url}/proxies", headers={"User-Agent": "Mozilla/5.0"}, timeout=5)
    assert response.status_code == 403


# --- data path ---------------------------------------------------------------


def test_bytes_pass_through(proxy: Proxy) -> None:
    payload = os.urandom(1 << 20)
    with connect(proxy) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
        sender.start()
        assert recv_exactly(sock, len(payload)) == payload
        sender.join(IO_TIMEOUT_S)
    assert APIConsumer.get("/proxies/echo").json()["enabled"] is True


def test_latency(proxy: Proxy) -> None:
    with connect(proxy) as sock:
        assert round_trip_s(sock) < 0.1
        proxy.add_toxic(type="latency", attributes={"latency": 150})  # applies to a live connection
        assert round_trip_s(sock) >= 0.15 - TIMER_SLACK_S
        proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 100, "jitter": 20})
        assert round_trip_s(sock) >= 0.15 + 0.08 - TIMER_SLACK_S
        proxy.destroy_toxic("latency_downstream")
        proxy.destroy_toxic("latency_upstream")
        assert round_trip_s(sock) < 0.1


def test_latency_is_not_cumulative(proxy: Proxy) -> None:
    # Ten back-to-back chunks under 100 ms latency arrive after ~100 ms, not ~1 s.
    proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 100})
    with connect(proxy) as sock:
        start = time.monotonic()
        for _ in range(10):
            sock.sendall(b"x" * 100)
            time.sleep(0.005)
        assert recv_exactly(sock, 1000) == b"x" * 1000
        assert 0.1 <= time.monotonic() - start < 0.6


def test_toxicity_zero_leaves_connections_alone(proxy: Proxy) -> None:
    proxy.add_toxic(type="latency", toxicity=0.0, attributes={"latency": 1000})
    with connect(proxy) as sock:
        assert round_trip_s(sock) < 0.5


def test_bandwidth(proxy: Proxy) -> None:
    proxy.add_toxic(type="bandwidth", attributes={"rate": 50})  # 50 KB/s downstream
    payload = os.urandom(50_000)
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(payload)
        assert recv_exactly(sock, len(payload)) == payload
        elapsed = time.monotonic() - start
    assert 0.8 <= elapsed < 3.0


def test_timeout_closes_after_delay(proxy: Proxy) -> None:
    with connect(proxy) as sock:
        assert round_trip_s(sock) < 0.5
        proxy.add_toxic(type="timeout", attributes={"timeout": 300})
        start = time.monotonic()
        sock.sendall(b"lost")
        assert recv_until_eof(sock) == b""  # nothing gets through, then EOF
        assert 0.25 <= time.monotonic() - start < 2.0


def test_timeout_zero_drops_until_removed(proxy: Proxy) -> None:
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    with connect(proxy) as sock:
        sock.sendall(b"dropped")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(100)
        sock.settimeout(IO_TIMEOUT_S)
        proxy.destroy_toxic("timeout_upstream")
        assert round_trip_s(sock, b"flows") < 0.5


def test_reset_peer(proxy: Proxy) -> None:
    proxy.add_toxic(type="reset_peer", stream="upstream", attributes={"timeout": 100})
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"boom")
        with pytest.raises(ConnectionResetError):
            recv_until_eof(sock)
        assert time.monotonic() - start >= 0.1 - TIMER_SLACK_S


def test_slicer(proxy: Proxy) -> None:
    proxy.add_toxic(type="slicer", attributes={"average_size": 100, "size_variation": 0, "delay": 20_000})
    with connect(proxy) as sock:
        sock.sendall(b"s" * 1000)
        pieces: list[int] = []
        deadline = time.monotonic() + IO_TIMEOUT_S
        while sum(pieces) < 1000 and time.monotonic() < deadline:
            pieces.append(len(sock.recv(4096)))
    assert sum(pieces) == 1000
    assert max(pieces) <= 100 and len(pieces) >= 5


def test_limit_data(proxy: Proxy) -> None:
    proxy.add_toxic(type="limit_data", attributes={"bytes": 500})
    with connect(proxy) as sock:
        sock.sendall(b"d" * 2000)
        assert recv_until_eof(sock) == b"d" * 500


def test_slow_close(proxy: Proxy) -> None:
    proxy.add_toxic(type="slow_close", attributes={"delay": 300})
    with connect(proxy) as sock:
        sock.sendall(b"bye")
        assert recv_exactly(sock, 3) == b"bye"
        start = time.monotonic()
        sock.shutdown(socket.SHUT_WR)  # the echo server closes, the close is held back
        assert recv_until_eof(sock) == b""
        assert time.monotonic() - start >= 0.28 - TIMER_SLACK_S


def test_disable_cuts_and_refuses(proxy: Proxy) -> None:
    with connect(proxy) as sock:
        assert round_trip_s(sock) < 0.5
        with proxy.down():
            assert recv_until_eof(sock) == b""  # the live connection is cut
            with pytest.raises(ConnectionRefusedError):
                connect(proxy)
            assert APIConsumer.get("/proxies/echo").json()["enabled"] is False
    with connect(proxy) as sock:  # same port again after enable
        assert round_trip_s(sock) < 0.5


def test_reset_restores(toxiproxy: Toxiproxy, proxy: Proxy) -> None:
    proxy.add_toxic(type="latency", attributes={"latency": 1000})
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    proxy.disable()
    assert toxiproxy.reset() is True
    assert toxiproxy.get_proxy("echo").enabled is True
    assert proxy.toxics() == {}
    with connect(proxy) as sock:
        assert round_trip_s(sock) < 0.5


def test_delete_proxy_closes_connections(toxiproxy: Toxiproxy, proxy: Proxy) -> None:
    with connect(proxy) as sock:
        assert round_trip_s(sock) < 0.5
        proxy.destroy()
        assert recv_until_eof(sock) == b""


def test_upstream_down_closes_client(toxiproxy: Toxiproxy) -> None:
    dead = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{dead.getsockname()[1]}"
    dead.close()
    proxy = toxiproxy.create(upstream=address, name="dead")
    with connect(proxy) as sock:
        assert recv_until_eof(sock) == b""


# --- Python API, uvloop, CLI --------------------------------------------------


def test_python_api_on_uvloop(echo: EchoServer) -> None:
    with ProxyServer("127.0.0.1", 0, seed=1).run_in_thread(use_uvloop=True) as srv:
        proxy = srv.call(srv.create_proxy, "raft", echo.address)
        spec = srv.call(proxy.add_toxic, ToxicSpec("lat", "latency", "upstream", 1.0, {"latency": 100, "jitter": 0}))
        assert spec.to_json()["attributes"] == {"latency": 100, "jitter": 0}
        host, port = proxy.listen.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=IO_TIMEOUT_S) as sock:
            sock.settimeout(IO_TIMEOUT_S)
            assert round_trip_s(sock) >= 0.1 - TIMER_SLACK_S
            srv.call(proxy.remove_toxic, "lat")
            srv.call(proxy.add_toxic, {"type": "reset_peer", "stream": "downstream"})
            sock.sendall(b"x")
            with pytest.raises(ConnectionResetError):
                recv_until_eof(sock)
        assert srv.call(lambda: proxy.connection_count) == 0


def test_python_api_async() -> None:
    async def scenario() -> None:
        server = ProxyServer("127.0.0.1", 0)
        await server.start()
        try:
            upstream = await asyncio.start_server(_async_echo, "127.0.0.1", 0)
            port = upstream.sockets[0].getsockname()[1]
            proxy = await server.create_proxy("p", f"127.0.0.1:{port}")
            reader, writer = await asyncio.open_connection(*proxy.listen.rsplit(":", 1))
            writer.write(b"hi")
            assert await asyncio.wait_for(reader.readexactly(2), IO_TIMEOUT_S) == b"hi"
            await server.update_proxy("p", enabled=False)
            assert await asyncio.wait_for(reader.read(), IO_TIMEOUT_S) == b""
            writer.close()
            upstream.close()
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(scenario(), 10))


async def _async_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise TimeoutError("the proxy did not announce its port")
    return proc.stdout.readline().decode()


def test_cli_subprocess(echo: EchoServer, server: ProxyServer) -> None:
    cmd = [sys.executable, "-c", "from shoal.cli import main; main()", "chaos", "proxy", "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = _read_line(proc, 10)
        assert "loop=uvloop" in line
        port = int(line.split("http://127.0.0.1:", 1)[1].split()[0])
        client = Toxiproxy()
        client.update_api_consumer("127.0.0.1", port)
        proxy = client.create(upstream=echo.address, name="cli")
        with connect(proxy) as sock:
            assert round_trip_s(sock) < 0.5
            proxy.add_toxic(type="reset_peer", stream="upstream")
            sock.sendall(b"x")
            with pytest.raises(ConnectionResetError):
                recv_until_eof(sock)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        APIConsumer.port = server.port  # the client's address is class-global
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
