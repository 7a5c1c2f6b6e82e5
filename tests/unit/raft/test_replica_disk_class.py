"""Which durability class a leader writes an entry in (``writes_lazily``, the partition's policy),
decided from what is committed (finding 5).

A queue's class is its ``durable`` option, which a replicated ``CreateQueue``/``UpdateQueue``
sets. A new leader's applied state may not hold a committed ``UpdateQueue`` that made the queue
durable yet: until it has committed an entry of its own term and applied everything committed,
every entry it writes is of the fsync class, whatever its applied state says.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.node.partition.partition import writes_lazily
from shoal.node.raft.core import LEADER
from shoal.node.state import PushRun

from test_replica_log_matching import Follower


@pytest.fixture()
def replica(tmp_path: Path) -> Iterator[Follower]:
    f = Follower(str(tmp_path))
    try:
        yield f
    finally:
        f.close()


def lead(core: object, *, commit: int, applied: int, term_start: int) -> None:
    """Put the core in the leader's seat with the given marks (the rule reads only these)."""
    core.state = LEADER  # type: ignore[attr-defined]
    core.commit, core.applied, core._term_start_index = commit, applied, term_start  # type: ignore[attr-defined]


def test_the_disk_class_is_trusted_only_once_the_applied_state_holds_every_commit(replica: Follower) -> None:
    r = replica.replica
    r.application.engine.apply({"cmd": "CreateQueue", "queue": "lazy", "options": {"durable": False}}, 1000)
    push = [PushRun("lazy", [b"\x01"])]
    core = r.core

    # A new leader that has not committed an entry of its term: its applied state may lack a
    # committed UpdateQueue {durable: true}, so the entry is of the fsync class.
    lead(core, commit=5, applied=5, term_start=6)
    assert writes_lazily(r, r.application, push) is False

    # Its term's first entry committed, but committed entries still wait to be applied.
    lead(core, commit=8, applied=7, term_start=6)
    assert writes_lazily(r, r.application, push) is False

    # Everything committed is applied, in its own term: the applied state decides.
    lead(core, commit=8, applied=8, term_start=6)
    assert writes_lazily(r, r.application, push) is True
    assert writes_lazily(r, r.application, [PushRun("durable-or-unknown", [b"\x01"])]) is False


def test_commands_naming_jobs_take_the_class_of_the_jobs_queues(replica: Follower) -> None:
    """An ACKB (or FAIL, ...) names jobs, not a queue: it is of the disk class when every job it
    names is in a ``durable: false`` queue, and of the fsync class otherwise or when unknown."""
    from shoal.node.partition.pushes import replicated_form

    r = replica.replica
    engine = r.application.engine
    engine.apply({"cmd": "CreateQueue", "queue": "lazy", "options": {"durable": False}}, 1000)
    engine.apply({"cmd": "CreateQueue", "queue": "safe"}, 1000)
    for queue in ("lazy", "safe"):
        (batch,), _ = replicated_form([{"cmd": "PUSHB", "queue": queue, "jobs": [{"data": b"\x01"}] * 5}], 0)
        engine.apply(batch, 1000)
    pulled = {q: engine.apply({"cmd": "PULLB", "queue": q, "count": 5}, 1001).result for q in ("lazy", "safe")}
    lead(r.core, commit=1, applied=1, term_start=1)

    def ackb(*queues: str) -> list:
        ids = [j["id"] for q in queues for j in pulled[q]["jobs"]]
        tokens = [t for q in queues for t in pulled[q]["tokens"]]
        return replicated_form([{"cmd": "ACKB", "ids": ids, "tokens": tokens}], 0)[0]

    assert type(ackb("lazy")[0]).__name__ == "AckRun"  # one pull's run, checked by its segment
    assert writes_lazily(r, r.application, ackb("lazy")) is True
    assert writes_lazily(r, r.application, ackb("safe")) is False
    assert writes_lazily(r, r.application, ackb("lazy", "safe")) is False
    lazy_id = pulled["lazy"]["jobs"][0]["id"]
    assert writes_lazily(r, r.application, [{"cmd": "FAIL", "id": lazy_id, "error": "e"}]) is True
    assert writes_lazily(r, r.application, [{"cmd": "ACK", "id": "0-999"}]) is False  # gone: not known
    assert writes_lazily(r, r.application, [{"cmd": "ACK", "id": "my-custom-id"}]) is False
    assert writes_lazily(r, r.application, [{"cmd": "_Tick"}]) is False
