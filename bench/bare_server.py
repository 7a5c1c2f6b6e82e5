"""A reference server for the node benchmark: uvloop + msgpack that only answers frames.

No Raft, no engine, no validation, one process: it splits length-prefixed frames, decodes
each request and answers ``{ok, id, reqId}``. What a driver gets from it on this machine, in
the same run as the cluster phases, says how fast the machine is at that moment (this
shared VM's speed swings by ±30 % and more between runs), so Shoal's figures can be read
against it.

    python bench/bare_server.py PORT
"""

from __future__ import annotations

import asyncio
import sys

import msgpack
import uvloop
from frame_split import split_frames  # bench/ is this script's sys.path[0]


class _Answerer(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.seq = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        out = []
        for request in split_frames(self.buf):
            req = msgpack.unpackb(request)
            self.seq += 1
            body = msgpack.packb({"ok": True, "id": f"0-{self.seq}", "reqId": req.get("reqId")})
            out.append(len(body).to_bytes(4, "big") + body)
        if out:
            self.transport.write(b"".join(out))  # type: ignore[attr-defined]


async def _serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Answerer, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(_serve(int(sys.argv[1])))
