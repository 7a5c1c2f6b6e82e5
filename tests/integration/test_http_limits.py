"""The HTTP port's own limits, against a real node process over raw sockets: a slow-header
client is cut off on time, idle keep-alive connections are closed, a body that never arrives is
answered ``408``, and a connection flood past ``http_connections_max`` is refused with ``503``
``OVERLOADED`` (a normal client arriving during the flood is refused the same way, clearly) while
requests on connections already open keep working.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from conftest import NODE_COMMAND, http_url
from waiting import eventually
from shoal.cluster.launcher import LocalCluster, free_base_port

pytestmark = pytest.mark.integration

CONNECTIONS_MAX = 16
HEADER_TIMEOUT_S = 1.0
KEEPALIVE_TIMEOUT_S = 3.0
BODY_TIMEOUT_S = 1.0
BODY_BYTES_MAX = 1 << 20
LIMITS_ENV = {
    "SHOAL_HTTP_CONNECTIONS_MAX": str(CONNECTIONS_MAX),
    "SHOAL_HTTP_HEADER_TIMEOUT_MS": str(int(HEADER_TIMEOUT_S * 1000)),
    "SHOAL_HTTP_KEEPALIVE_TIMEOUT_MS": str(int(KEEPALIVE_TIMEOUT_S * 1000)),
    "SHOAL_FRAME_TIMEOUT_MS": str(int(BODY_TIMEOUT_S * 1000)),
    "SHOAL_FRAME_BYTES_MAX": str(BODY_BYTES_MAX),
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(nodes=1, partitions=2, data_dir=tmp_path_factory.mktemp("http-limits"),
                      base_port=free_base_port(1, 2), extra_env=LIMITS_ENV, node_command=NODE_COMMAND) as cl:
        cl.wait_ready()
        yield cl


def _url(node: LocalCluster) -> str:
    return http_url(node, "n1")


def _address(node: LocalCluster) -> tuple[str, int]:
    spec = node.config.node("n1")
    return spec.host, spec.http_port


def get(node: LocalCluster, path: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """Status and body of one GET on a connection of its own (urllib closes it afterwards)."""
    try:
        with urllib.request.urlopen(_url(node) + path, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def refusals(node: LocalCluster, reason: str) -> float:
    status, text = get(node, "/prometheus")
    assert status == 200
    found = re.search(rf'^shoal_http_refusals_total{{reason="{reason}"}} (\S+)$', text, re.M)
    assert found, text
    return float(found.group(1))


def read_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the node sends until it closes the connection; TimeoutError if it does not."""
    data = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    raise TimeoutError(f"still open after {timeout_s} s; received {data[:200]!r}")


def test_slow_header_client_is_cut_off_while_normal_requests_are_served(node: LocalCluster) -> None:
    before = refusals(node, "header_timeout")
    sock = socket.create_connection(_address(node), timeout=5)
    try:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: shoal\r\n")
        closed_after = None
        for i in range(40):  # one header line every 0.1 s, never the blank line that ends them
            time.sleep(0.1)
            assert get(node, "/healthz", timeout_s=2.0)[0] == 200  # other clients are served meanwhile
            try:
                sock.sendall(f"X-Slow-{i}: 1\r\n".encode())
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            sock.settimeout(0.01)
            try:
                if not sock.recv(65536, socket.MSG_PEEK):
                    closed_after = time.monotonic() - started
                    break
            except TimeoutError:
                pass
            else:
                answer = read_until_closed(sock, 2.0)
                closed_after = time.monotonic() - started
                assert answer.startswith(b"HTTP/1.1 408"), answer
                assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["code"] == "TIMEOUT"
                break
        assert closed_after is not None, "a slow-header client was never cut off"
        assert HEADER_TIMEOUT_S * 0.9 <= closed_after < HEADER_TIMEOUT_S + 2.0
    finally:
        sock.close()
    assert refusals(node, "header_timeout") == before + 1


def test_each_request_on_a_kept_alive_connection_gets_its_own_header_deadline(node: LocalCluster) -> None:
    sock = socket.create_connection(_address(node), timeout=5)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: shoal\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(HEADER_TIMEOUT_S / 2)  # the second request starts half-way through the first's deadline
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: shoal\r\n")
        answer = read_until_closed(sock, HEADER_TIMEOUT_S + 30.0)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        # the deadline ran from the second request's start (a loaded machine only answers later)
        assert HEADER_TIMEOUT_S * 0.9 <= time.monotonic() - started < HEADER_TIMEOUT_S + 30.0
    finally:
        sock.close()


def test_idle_connections_are_closed_after_the_keepalive_timeout(node: LocalCluster) -> None:
    silent = socket.create_connection(_address(node), timeout=5)
    reused = socket.create_connection(_address(node), timeout=5)
    try:
        started = time.monotonic()
        reused.sendall(b"GET /healthz HTTP/1.1\r\nHost: shoal\r\n\r\n")
        reused.settimeout(5)
        assert reused.recv(65536).startswith(b"HTTP/1.1 200")
        # A connection that never sends a request and one idle after a response: both closed.
        assert read_until_closed(silent, KEEPALIVE_TIMEOUT_S + 5.0) == b""
        assert read_until_closed(reused, 2.0) == b""
        assert time.monotonic() - started >= KEEPALIVE_TIMEOUT_S * 0.9
    finally:
        silent.close()
        reused.close()


def test_a_body_that_never_arrives_is_answered_timeout(node: LocalCluster) -> None:
    before = refusals(node, "body_timeout")
    sock = socket.create_connection(_address(node), timeout=5)
    try:
        sock.sendall(b"POST /queues/slow/jobs HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"data\": ")
        started = time.monotonic()
        answer = read_until_closed(sock, BODY_TIMEOUT_S + 5.0)
        assert BODY_TIMEOUT_S * 0.9 <= time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["code"] == "TIMEOUT"
    finally:
        sock.close()
    assert refusals(node, "body_timeout") == before + 1
    assert get(node, "/stats")[0] == 200


def test_a_body_over_the_size_limit_is_refused(node: LocalCluster) -> None:
    body = json.dumps({"data": "x" * BODY_BYTES_MAX}).encode()
    request = urllib.request.Request(_url(node) + "/queues/big/jobs", data=body,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 413
    assert json.loads(refused.value.read())["code"] == "FRAME_TOO_LARGE"
    assert get(node, "/healthz")[0] == 200


def test_a_connection_flood_past_the_limit_is_refused(node: LocalCluster) -> None:
    before = refusals(node, "connections_max")
    # A connection opened before the flood keeps working through it (keep-alive).
    kept = socket.create_connection(_address(node), timeout=5)
    flood: list[socket.socket] = []
    try:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: shoal\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        extra = 4
        for _ in range(CONNECTIONS_MAX - 1 + extra):  # `kept` holds one slot
            flood.append(socket.create_connection(_address(node), timeout=5))
        # The node answers the connections past its limit as it accepts them: read until the
        # expected refusals came (a loaded machine only makes them later), then once more.
        answers: list[bytes | None] = [None] * len(flood)
        deadline = time.monotonic() + 20.0
        for last_pass in (False, True):
            while True:
                for i, sock in enumerate(flood):
                    if answers[i] is None:
                        sock.settimeout(0.01)
                        try:
                            answers[i] = sock.recv(65536)
                        except TimeoutError:
                            pass
                if last_pass or sum(a is not None for a in answers) >= extra or time.monotonic() > deadline:
                    break
        refused = [a for a in answers if a is not None]
        assert len(refused) == extra, answers
        assert answers[:CONNECTIONS_MAX - 1] == [None] * (CONNECTIONS_MAX - 1)  # first come, first served
        for answer in refused:
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert b"Retry-After: 1" in answer
            body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert body["code"] == "OVERLOADED" and "http_connections_max" in body["error"]
        # A new client during the flood is refused clearly; the open connection is still served.
        status, text = get(node, "/healthz")
        assert status == 503 and json.loads(text)["code"] == "OVERLOADED"
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: shoal\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        for sock in flood:
            sock.close()
        kept.close()
    # Once the flood goes, new clients get in again.
    eventually(lambda: get(node, "/healthz")[0] == 200, "a new client served once the flood closed", 5.0, poll_s=0.1)
    assert refusals(node, "connections_max") >= before + extra + 1
    status, text = get(node, "/health")
    assert status == 200 and json.loads(text)["httpConnections"] >= 1
