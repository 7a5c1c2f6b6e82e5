"""pysyncobj 0.3.17 running on Shoal's journal instead of its mmap FileJournal.

Three SyncObj in this process on loopback ports, pysyncobj's own transport and
tick threads; each gets a :class:`Journal` where pysyncobj creates its journal.
Entries are replicated, every object is stopped, and a restarted cluster gets
its committed state back from the journals alone (no snapshot files).
"""

from __future__ import annotations


import pytest
import pysyncobj.syncobj as pso
from pysyncobj import SyncObj, SyncObjConf, replicated

from shoal.node.raft._io import RealIO
from shoal.node.raft.journal import Journal

from _pysyncobj_helpers import free_ports, wait_for


class Counter(SyncObj):
    def __init__(self, self_addr: str, others: list[str], journal_dir: str) -> None:
        conf = SyncObjConf(journalFile=journal_dir, autoTick=True, logCompactionMinEntries=1_000_000,
                           logCompactionMinTime=1_000_000, dynamicMembershipChange=False)
        super().__init__(self_addr, others, conf)
        self.total = 0
        self.items: list[int] = []

    @replicated
    def add(self, n: int) -> int:
        self.total += n
        self.items.append(n)
        return self.total


def start(addrs: list[str], root) -> list[Counter]:
    return [Counter(a, [o for o in addrs if o != a], str(root / f"n{k}")) for k, a in enumerate(addrs)]


def stop(objs: list[Counter]) -> None:
    for o in objs:
        o.destroy_synchronous()


@pytest.fixture
def shoal_journal(monkeypatch):
    made: list[Journal] = []

    def create(journal_file):
        j = Journal(RealIO(disk_free_min_bytes=0), journal_file, segment_bytes=64 * 1024, cache_entries_max=16)
        made.append(j)
        return j

    monkeypatch.setattr(pso, "createJournal", create)
    return made


def test_three_syncobj_replicate_and_restart_from_shoal_journals(tmp_path, shoal_journal) -> None:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    objs = start(addrs, tmp_path)
    try:
        assert wait_for(lambda: any(o._isLeader() for o in objs), 20), "no leader elected"
        for n in range(1, 201):
            objs[n % 3].add(n)  # queued; pysyncobj batches them into entries
        assert wait_for(lambda: all(o.total == 20100 for o in objs), 30), [o.total for o in objs]
        assert objs[0].items == objs[1].items == objs[2].items
    finally:
        stop(objs)
    before = [list(j) for j in shoal_journal]
    order = objs[0].items
    assert sorted(order) == list(range(1, 201))
    assert all(j.syncs >= 1 for j in shoal_journal)  # _destroy synced

    shoal_journal.clear()
    objs = start(addrs, tmp_path)
    try:
        # the journals come back with their entries; a new leader commits them and every object re-applies them
        assert [list(j)[: len(b)] for j, b in zip(shoal_journal, before)] == before
        assert wait_for(lambda: all(o.total == 20100 for o in objs), 30), [o.total for o in objs]
        assert all(o.items == order for o in objs)
        objs[0].add(1000, sync=True, timeout=10)
        assert wait_for(lambda: all(o.total == 21100 for o in objs), 20)
    finally:
        stop(objs)
