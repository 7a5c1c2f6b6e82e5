"""A full disk under real nodes: NO_SPACE for new data, pulls/acks/reads served, no crash, recovery.

The cluster's data directory is a small tmpfs mounted by the test (needs root; skipped
otherwise). A filler file takes the space; nodes notice within their free-space
recheck period (1 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.client import AsyncClient, NoSpace
from shoal.cluster.launcher import LocalCluster, free_base_port

from conftest import NODE_COMMAND, http_url
from waiting import eventually, eventually_async

FS_BYTES = 96 * 1024 * 1024
FREE_MIN_BYTES = 24 * 1024 * 1024
WAIT_S = 15.0


@contextlib.contextmanager
def tmpfs(path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(path)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(path: Path, leave_bytes: int) -> None:
    """Write ``path`` until at most ``leave_bytes`` are free (or the disk is full)."""
    chunk = b"\0" * (1024 * 1024)
    try:
        f = open(path, "ab")
    except OSError as exc:  # the disk is full already: not even the new file's directory entry fits
        assert exc.errno == errno.ENOSPC
        return
    with f:
        for _ in range(FS_BYTES // len(chunk) + 1):  # bounded by the file system's size
            st = os.statvfs(path.parent)
            free = st.f_bavail * st.f_frsize
            if free <= leave_bytes:
                return
            try:
                f.write(chunk[:max(4096, min(len(chunk), free - leave_bytes))])
                f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return


def ready(cluster: LocalCluster, node_id: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(http_url(cluster, node_id) + "/ready", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def metrics(cluster: LocalCluster, node_id: str) -> str:
    with urllib.request.urlopen(http_url(cluster, node_id) + "/prometheus", timeout=5) as r:
        return r.read().decode()


def test_a_full_disk_refuses_new_data_serves_the_rest_and_recovers(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs") as fs, LocalCluster(
            nodes=3, partitions=2, data_dir=fs / "c", base_port=free_base_port(3, 2), node_command=NODE_COMMAND,
            extra_env={"SHOAL_DISK_FREE_MIN_BYTES": str(FREE_MIN_BYTES)}) as cluster:
        cluster.wait_balanced()
        pids = dict(cluster.pids)

        async def scenario() -> None:
            async with AsyncClient(cluster.addresses) as client:
                q = client.queue("df")
                for k in range(40):
                    await q.add(b"before-%d" % k)
                held = await q.pull_many(10)
                assert len(held) == 10

                fill(fs / "filler", FREE_MIN_BYTES // 2)

                async def refused() -> bool:
                    try:
                        await q.add(b"probe")
                    except NoSpace:
                        return True
                    return False

                await eventually_async(refused, "a PUSH refused with NO_SPACE", WAIT_S, poll_s=0.2)
                with pytest.raises(NoSpace):
                    await q.add_bulk([b"x"] * 10)
                # What the partition holds is still served: acks, pulls, reads.
                assert await q.ack_many(held) == 10
                more = await q.pull_many(5)
                assert len(more) == 5
                await q.ack(more[0])
                assert await q.get_job(held[0].id) is not None

                # Each node notices the low space on its own watch; the refusal came from the leader.
                async def not_ready() -> bool:
                    status, body = ready(cluster, cluster.node_ids[0])
                    return status == 503 and body["diskSpaceLow"] and "disk_free_min_bytes" in body["reason"]

                await eventually_async(not_ready, "/ready to report the low disk space", WAIT_S, poll_s=0.2)
                assert "shoal_disk_space_low 1.0" in metrics(cluster, cluster.node_ids[0])

                # Every last byte taken: ENOSPC on the journals themselves.
                fill(fs / "filler2", 0)
                with contextlib.suppress(Exception):
                    await q.ack_many(more[1:])
                with pytest.raises(NoSpace):
                    await q.add(b"full")
                await asyncio.sleep(1.5)
                assert cluster.pids == pids, "a node died of the full disk"

                os.unlink(fs / "filler2")
                os.unlink(fs / "filler")

                async def accepted() -> bool:
                    try:
                        await q.add(b"after")
                    except NoSpace:
                        return False
                    return True

                await eventually_async(accepted, "writes accepted once space is back", WAIT_S, poll_s=0.2)
                await q.add_bulk([b"y"] * 100)
                assert cluster.pids == pids

        asyncio.run(scenario())

        eventually(lambda: all(ready(cluster, n)[0] == 200 for n in cluster.node_ids), "every node ready again",
                   WAIT_S, poll_s=0.2)
        for node_id in cluster.node_ids:  # refusals are handled, never thrown through pysyncobj
            text = cluster.log_file(node_id).read_text(errors="replace")
            assert "raft tick failed" not in text and "failed\nTraceback" not in text, text[-3000:]
