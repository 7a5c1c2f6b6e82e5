"""What a message to another process costs the sender on this machine, by whether it wakes it.

Every frame one Shoal node writes to another (and every reply to a client) is a ``send`` on a
loopback TCP socket. When the receiving process is asleep in ``epoll_wait``, the kernel wakes it
within that ``send``; on a virtual machine that wake-up (an interrupt to the other virtual CPU)
can cost the sender far more than copying the bytes. This measures both cases between two
processes: the sender's time inside ``send`` and its CPU time (user + system) per message, for
a receiver that is busy reading, and for one that sleeps in ``epoll_wait`` between messages.

    python bench/bench_wakeup.py
    python bench/bench_wakeup.py --messages 5000 --sizes 100,1000,10000
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import time


def _receiver(server: socket.socket) -> None:
    """In the child: read everything, sleeping in epoll_wait whenever nothing is there."""
    conn, _ = server.accept()
    poller = select.epoll()
    poller.register(conn.fileno(), select.EPOLLIN)
    while True:
        poller.poll()
        if not conn.recv(1 << 20):
            break


def _measure(sock: socket.socket | None, size: int, messages: int, pause_s: float) -> tuple[float, float]:
    """(µs inside send, CPU µs) per message; ``pause_s`` lets the receiver fall asleep first.
    Without ``sock``: the pauses alone (what the sender's own sleeps cost it)."""
    buf = b"x" * size
    inside = 0.0
    before = time.process_time()
    for _ in range(messages):
        if pause_s:
            time.sleep(pause_s)
        if sock is not None:
            start = time.perf_counter()
            sock.send(buf)
            inside += time.perf_counter() - start
    cpu = time.process_time() - before
    return inside / messages * 1e6, cpu / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--pause-ms", type=float, default=0.3,
                        help="sleep between messages to a sleeping receiver (it must reach epoll_wait)")
    args = parser.parse_args()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    pid = os.fork()
    if pid == 0:
        try:
            _receiver(server)
        finally:
            os._exit(0)
    try:
        sock = socket.create_connection(server.getsockname())
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pause_s = args.pause_ms / 1000
        _, own_sleep = _measure(None, 0, args.messages, pause_s)
        print("| message | receiver | µs inside send | sender CPU µs per message |")
        print("|---|---|---:|---:|")
        for size in (int(s) for s in args.sizes.split(",")):
            for label, pause in (("busy reading", 0.0), ("asleep in epoll_wait", pause_s)):
                inside, cpu = _measure(sock, size, args.messages, pause)
                if pause:
                    cpu = max(0.0, cpu - own_sleep)  # less what the sender's own sleeps cost it
                print(f"| {size:,} B | {label} | {inside:.1f} | {cpu:.1f} |", flush=True)
        sock.close()
    finally:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
