"""Deterministic multi-replica simulation: engines fed one seeded command log, restarted from
snapshots at random points, with the leader role moving, end with equal digests.

Each replica applies the committed log in order, as Raft replicas do: the leader with
``replies=True, events=True`` (its replies drive the simulated clients: the jobs a pull leased
are acked, failed or released later), the others with both off. A restart replaces a
replica's engine by one restored from the last snapshot it took and re-applies the log after
it. Everything comes from ``random.Random(seed)``: a failing seed replays exactly.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from shoal.cluster.codec import raw_of
from shoal.cluster.errors import CommandError
from shoal.node.state import Command, PartitionEngine, PushRun, SessionPull

REPLICAS = 3
COMMANDS = 600
QUEUES = ("std", "ut", "ttl")


class Replica:
    """One engine, its last snapshot and how much of the log it has applied."""

    def __init__(self) -> None:
        self.engine = PartitionEngine(0)
        self.applied = 0
        self.snapshot = self.engine.snapshot()
        self.snapshot_at = 0

    def catch_up(self, log: list[tuple[Command, int]], leader: bool) -> Any:
        """Apply the log from ``applied`` on; the last command's reply (or error)."""
        out: Any = None
        while self.applied < len(log):
            cmd, now = log[self.applied]
            self.applied += 1
            try:
                out = self.engine.apply(copy.deepcopy(cmd), now, replies=leader, events=leader).result
            except CommandError as exc:
                out = exc
        return out

    def take_snapshot(self) -> None:
        self.snapshot, self.snapshot_at = self.engine.snapshot(), self.applied

    def restart(self, log: list[tuple[Command, int]]) -> None:
        self.engine = PartitionEngine.restore(self.snapshot)
        self.applied = self.snapshot_at
        self.catch_up(log, leader=False)


class Clients:
    """Simulated producers and consumers: the next command, from what the leader answered."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.pushed = 0
        self.leased: list[tuple[list[str], list[str]]] = []  # (ids, tokens) per pull

    def next_command(self) -> Command:
        rng = self.rng
        queue = rng.choice(QUEUES)
        kind = rng.random()
        if kind < 0.15:
            n = rng.randint(1, 40)
            items = [{"data": raw_of(self.pushed + i)} for i in range(n)]
            if rng.random() < 0.2:
                for item in items:
                    item["idempotencyKey"] = f"k{rng.randint(0, 50)}"
            self.pushed += n
            return {"cmd": "PUSHB", "queue": queue, "jobs": items}
        if kind < 0.3:
            self.pushed += 1
            # What queue.add() sends: a priority and a delay only when given (such adds to one
            # queue become segment slots); a TTL or a group takes the per-job path.
            cmd = {"cmd": "PUSH", "queue": queue, "data": raw_of(self.pushed)}
            for field, value in (("priority", rng.randint(0, 3)), ("delay", rng.choice([0, 0, 0, 700])),
                                 ("ttl", rng.choice([0, 0, 0, 3_000]))):
                if value:
                    cmd[field] = value
            if rng.random() < 0.3:
                cmd["idempotencyKey"] = f"a{rng.randint(0, 50)}"
            if queue == "ut" and rng.random() < 0.7:
                cmd["group"] = f"g{rng.randint(0, 4)}"
            return cmd
        if kind < 0.35:
            n = rng.randint(1, 5)
            self.pushed += n
            return PushRun(queue, [raw_of(self.pushed + i).packed for i in range(n)],
                           [rng.choice([None, f"m{rng.randint(0, 9)}"]) for _ in range(n)])
        if kind < 0.55:
            return SessionPull({"cmd": "PULLB", "queue": queue, "count": rng.randint(1, 30),
                                "ttr": rng.choice([500, 5_000])}, rng.choice(["s1", "s2", "s3"]))
        if kind < 0.75 and self.leased:
            ids, tokens = self.leased.pop(rng.randrange(len(self.leased)))
            action = rng.random()
            if action < 0.6:
                return {"cmd": "ACKB", "ids": ids, "tokens": tokens}
            name = "FAIL" if action < 0.8 else "Release"
            return {"cmd": name, "id": ids[0], "token": tokens[0]}
        if kind < 0.85:
            return {"cmd": "_Tick"}
        if kind < 0.88:
            return {"cmd": "_ReleaseSession", "session": rng.choice(["s1", "s2", "s3"])}
        if kind < 0.92:
            return {"cmd": "Cancel", "id": f"0-{rng.randint(1, self.pushed + 1)}"}
        if kind < 0.95:
            return {"cmd": "Kick", "queue": queue, "count": 10}
        if kind < 0.96:
            return {"cmd": "Clean", "queue": queue, "grace": 0, "limit": 20}
        if kind < 0.975:
            job_id = f"0-{rng.randint(1, self.pushed + 1)}"
            return rng.choice([{"cmd": "ChangePriority", "id": job_id, "priority": rng.randint(0, 3)},
                               {"cmd": "MoveToDelayed", "id": job_id, "delay": rng.choice([200, 900])},
                               {"cmd": "Promote", "id": job_id},
                               {"cmd": "PromoteJobs", "queue": queue, "count": rng.randint(1, 3)}])
        return {"cmd": "GetJob", "id": f"0-{rng.randint(1, self.pushed + 1)}"}  # materializes a segment job

    def answered(self, cmd: Command, reply: Any) -> None:
        if type(cmd) is SessionPull and isinstance(reply, dict) and reply["jobs"]:
            self.leased.append(([j["id"] for j in reply["jobs"]], list(reply["tokens"])))


@pytest.mark.parametrize("seed", range(6))
def test_replicas_restarted_from_snapshots_end_equal(seed: int) -> None:
    rng = random.Random(seed)
    replicas = [Replica() for _ in range(REPLICAS)]
    reference = Replica()  # never restarts: the state every replica must reach
    clients = Clients(rng)
    log: list[tuple[Command, int]] = [
        ({"cmd": "CreateQueue", "queue": "ut", "type": "utube"}, 1_000),
        ({"cmd": "CreateQueue", "queue": "ttl", "type": "fifottl",
          "options": {"ttl": 4_000, "attempts": 3, "backoff": 100, "maxDeliveries": 2, "historyMax": 50}}, 1_000),
        ({"cmd": "CreateQueue", "queue": "std", "options": {"historyMax": 100, "attempts": 2, "backoff": 0}}, 1_000),
    ]
    leader = 0
    now = 1_000
    restarts = 0
    for _ in range(COMMANDS):
        now += rng.choice([0, 0, 1, 50, 400])
        cmd = clients.next_command()
        log.append((cmd, now))
        reply = replicas[leader].catch_up(log, leader=True)
        clients.answered(cmd, reply)
        for r in rng.sample(range(REPLICAS), rng.randint(0, REPLICAS)):
            replicas[r].catch_up(log, leader=False)  # followers lag by a random amount
        event = rng.random()
        if event < 0.05:
            r = rng.randrange(REPLICAS)
            replicas[r].catch_up(log, leader=r == leader)
            replicas[r].take_snapshot()
        elif event < 0.08:
            r = rng.randrange(REPLICAS)
            replicas[r].restart(log)
            restarts += 1
        elif event < 0.10:
            leader = rng.randrange(REPLICAS)
            replicas[leader].catch_up(log, leader=False)  # a new leader first applies what is committed
    reference.catch_up(log, leader=False)
    for replica in replicas:
        replica.catch_up(log, leader=False)
    digests = {replica.engine.digest() for replica in replicas}
    assert digests == {reference.engine.digest()}, f"seed {seed}: replicas differ"
    restored = PartitionEngine.restore(reference.engine.snapshot())
    assert restored.digest() == reference.engine.digest()
    assert restarts > 0 and reference.engine.job_count() > 0
