"""Every node loses power in the middle of a stream of commands; acknowledged ones survive.

Three pysyncobj 0.3.17 SyncObj in this process (own transport on loopback, tick
threads), each on Shoal's journal over its own simulated disk with
``sync_every_append``. Commands stream in; at a random moment every node stops
dead (no clean flush) and its disk loses everything not synced, with random torn
tails. Restarted on the same disks, every node re-applies every command that
was acknowledged before the cut, in one order.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import pysyncobj.syncobj as pso
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from shoal.node.raft._io import SimIO
from shoal.node.raft.journal import Journal

from _pysyncobj_helpers import free_ports, wait_for


class Log(SyncObj):
    def __init__(self, self_addr: str, others: list[str], journal_dir: str) -> None:
        conf = SyncObjConf(journalFile=journal_dir, autoTick=True, logCompactionMinEntries=1_000_000,
                           logCompactionMinTime=1_000_000, dynamicMembershipChange=False)
        super().__init__(self_addr, others, conf)
        self.items: list[int] = []

    @replicated
    def push(self, n: int) -> int:
        self.items.append(n)
        return n


class DiesWithoutFlush(Journal):
    """A machine losing power does not get to sync or close anything on the way down."""

    def _destroy(self) -> None:
        pass


@pytest.mark.parametrize("seed", [1, 2])
def test_power_cut_of_every_node_keeps_every_acknowledged_command(monkeypatch, seed) -> None:
    rng = random.Random(seed)
    disks = {f"/n{k}": SimIO() for k in range(3)}
    monkeypatch.setattr(
        pso, "createJournal",
        lambda path: DiesWithoutFlush(disks[path], path, segment_bytes=16 * 1024, sync_every_append=True),
    )
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]

    def start() -> list[Log]:
        return [Log(a, [o for o in addrs if o != a], f"/n{k}") for k, a in enumerate(addrs)]

    acked: set[int] = set()
    lock = threading.Lock()

    def on_done(n: int):
        def callback(result, error) -> None:
            if error == FAIL_REASON.SUCCESS:
                with lock:
                    acked.add(n)
        return callback

    nodes = start()
    try:
        assert wait_for(lambda: any(o._isLeader() for o in nodes), 20), "no leader"
        for n in range(1, 301):
            nodes[n % 3].push(n, callback=on_done(n))
            if n % 50 == 0:
                time.sleep(rng.uniform(0, 0.05))
        time.sleep(rng.uniform(0.0, 0.3))  # the cut lands somewhere in the stream
    finally:
        for o in nodes:
            o.destroy_synchronous()
    with lock:
        acked_before_cut = set(acked)
    for disk in disks.values():
        disk.power_cut(rng)
    assert acked_before_cut, "nothing was acknowledged before the cut"

    nodes = start()
    try:
        def recovered() -> bool:
            return all(acked_before_cut <= set(o.items) for o in nodes)

        assert wait_for(recovered, 30), [len(acked_before_cut - set(o.items)) for o in nodes]
        nodes[0].push(10_000, sync=True, timeout=10)
        assert wait_for(lambda: all(o.items and o.items[-1] == 10_000 for o in nodes), 20)
        assert nodes[0].items == nodes[1].items == nodes[2].items
    finally:
        for o in nodes:
            o.destroy_synchronous()
