"""What must hold in every run of the simulation, checked while it runs and once it has settled.

While it runs (a failure stops the run at once, with the virtual time):

- **one leader per term**: no two replicas lead in the same term;
- **applied entries agree** (state machine safety): no two replicas apply different
  entries at the same index. A leader applies committed disk-class entries before they are
  durable (on stable storage on a majority): such an apply is *tentative* until the
  replica's durable index passes it, and is dropped if the replica takes its state machine
  back to its snapshot (a power cut lost the entries and a new leader wrote others there);
  every apply at or below the durable index must agree;
- **equal states at equal indexes**: replicas that applied up to the same index, nothing
  of it tentative, hold the same engine :meth:`~shoal.node.state.PartitionEngine.digest`
  (sampled);
- **bounded work**: no single loop callback makes a node send more than
  :data:`CALLBACK_MESSAGES_MAX` messages or :data:`CALLBACK_BYTES_MAX` bytes (a leader
  that spins while streaming a snapshot floods its links and stalls every partition);
- **a leader in one place**: no leader ever obeys another leader of its own term (it counts
  such messages), and none leads while it loads its snapshot (it could serve nothing);
- the workload's own checks (:mod:`.workload`): an idempotency key always maps to one
  job id, a job whose ACK was acknowledged is never delivered again, no take's token
  repeats an earlier one, and a read reflects every write acknowledged before it began.

After the faults stop (:meth:`Checkers.settled`): a leader exists, every replica runs
(none refused or stopped), none is loading, recovering, or behind the leader's commit
index, the leader counts every follower at its commit index and streams no snapshot, all
hold the leader's digest, every push was acknowledged, and every
acknowledged push is on the leader in a state that fits what was acknowledged of it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from typing import Any

from shoal.cluster.codec import raw_bytes
from shoal.cluster.errors import CommandError
from shoal.node.raft.replica import PartitionReplica

from .workload import Records

__all__ = ["Checkers", "Violation", "CALLBACK_MESSAGES_MAX", "CALLBACK_BYTES_MAX"]

#: Messages one loop callback may make a node send: a leader's answer-driven send to each
#: follower, heartbeats and a snapshot window, with room to spare.
CALLBACK_MESSAGES_MAX = 256
CALLBACK_BYTES_MAX = 8 * 1024 * 1024
#: Digests remembered per applied index (the oldest are forgotten).
DIGESTS_KEPT = 4096


class Violation(AssertionError):
    """A property of the simulation does not hold."""


class Checkers:
    """The invariants above, fed by the cluster as the run goes."""

    def __init__(self) -> None:
        self.leaders: dict[int, str] = {}
        self.applied: dict[int, tuple[int, int, str]] = {}
        #: node -> index -> (term, crc) of entries it applied ahead of its durable index.
        self.tentative: dict[str, dict[int, tuple[int, int]]] = {}
        self.digests: dict[int, tuple[str, str]] = {}
        self.callback_msgs_max = 0
        self.callback_bytes_max = 0
        self.now = 0.0
        #: Every failure, also those raised inside a replica's callback, which catches and logs
        #: its callbacks' exceptions: :meth:`raise_first` raises them after the callback.
        self.failures: list[str] = []

    def fail(self, message: str) -> None:
        self.failures.append(f"t={self.now:.3f}: {message}")
        raise Violation(self.failures[-1])

    def raise_first(self) -> None:
        if self.failures:
            raise Violation(self.failures[0])

    # --- while running -----------------------------------------------------------------------------

    def after_callback(self, replicas: Iterable[PartitionReplica], msgs: int, nbytes: int) -> None:
        self.raise_first()
        self.callback_msgs_max = max(self.callback_msgs_max, msgs)
        self.callback_bytes_max = max(self.callback_bytes_max, nbytes)
        if msgs > CALLBACK_MESSAGES_MAX or nbytes > CALLBACK_BYTES_MAX:
            self.fail(f"one loop callback sent {msgs} messages, {nbytes} bytes (at most {CALLBACK_MESSAGES_MAX}, "
                      f"{CALLBACK_BYTES_MAX})")
        for replica in replicas:
            if replica.is_leader():
                term = replica.term()
                leader = self.leaders.setdefault(term, replica.node_id)
                if leader != replica.node_id:
                    self.fail(f"two leaders in term {term}: {leader} and {replica.node_id}")
            if replica.core.foreign_leader_messages:
                self.fail(f"{replica.node_id} led term {replica.term()} and heard from another leader of it")
            if replica.is_leader() and replica.status()["loading"]:
                self.fail(f"{replica.node_id} leads term {replica.term()} while it loads its snapshot")
            tentative = self.tentative.get(replica.node_id)
            if tentative:
                self._confirm_durable(replica.node_id, tentative, replica.core.durable)

    def on_entries(self, node: str, entries: list[Any], durable: int) -> None:
        """``node`` applies ``entries`` (its durable index ``durable``): each must be what every
        other replica applied at its index, once it is durable."""
        for payload, index, term in entries:
            crc = zlib.crc32(payload)
            if index <= durable:
                self._applied(node, index, term, crc)
            else:
                self.tentative.setdefault(node, {})[index] = (term, crc)

    def _applied(self, node: str, index: int, term: int, crc: int) -> None:
        seen = self.applied.get(index)
        if seen is None:
            self.applied[index] = (term, crc, node)
        elif seen[:2] != (term, crc):
            self.fail(f"{node} applies entry {index} of term {term}, but {seen[2]} applied a different entry "
                      f"of term {seen[0]} there")

    def _confirm_durable(self, node: str, tentative: dict[int, tuple[int, int]], durable: int) -> None:
        for index in sorted(i for i in tentative if i <= durable):
            term, crc = tentative.pop(index)
            self._applied(node, index, term, crc)

    def rolled_back(self, node: str) -> None:
        """``node`` took its state machine back to its snapshot: its tentative applies are void."""
        self.tentative.pop(node, None)

    def restarted(self, node: str) -> None:
        """``node``'s process started again: what it applied tentatively died with the old one."""
        self.tentative.pop(node, None)

    def sample_digests(self, replicas: Iterable[PartitionReplica]) -> None:
        """Replicas at the same applied index must hold the same state (a digest is computed only
        where there is one to compare it with: two replicas at one index, or one seen before)."""
        by_index: dict[int, list[PartitionReplica]] = {}
        for replica in replicas:
            if not replica.status()["loading"] and replica.applied_index() <= replica.core.durable:
                by_index.setdefault(replica.applied_index(), []).append(replica)
        for index, group in sorted(by_index.items()):
            seen = self.digests.get(index)
            if seen is None and len(group) < 2:
                continue
            for replica in group:
                digest = replica.application.view.digest()
                if seen is None:
                    seen = self.digests[index] = (digest, replica.node_id)
                    if len(self.digests) > DIGESTS_KEPT:
                        del self.digests[min(self.digests)]
                elif seen[0] != digest:
                    self.fail(f"{replica.node_id} at applied index {index} holds digest {digest[:12]}, "
                              f"{seen[1]} held {seen[0][:12]} there")

    # --- once settled -------------------------------------------------------------------------------

    @staticmethod
    def converged(replicas: dict[str, PartitionReplica | None], pending_pushes: int, inflight: int) -> str | None:
        """None once the group has settled; else what it still waits for."""
        leaders = [r for r in replicas.values() if r is not None and r.is_leader() and r.read_ready()]
        if len(leaders) != 1:
            return f"{len(leaders)} ready leaders"
        leader = leaders[0]
        commit = leader.commit_index()
        status = leader.status()
        for peer, progress in sorted(status["progress"].items()):
            if progress["match"] != commit:
                return f"the leader counts {peer} at entry {progress['match']} ({progress['state']}), commit {commit}"
        if status["streams"]:
            return f"the leader still streams snapshots: {status['streams']}"
        for node, replica in sorted(replicas.items()):
            if replica is None:
                return f"{node} is not running"
            status = replica.status()
            if status["loading"] or replica.core.recovering:
                return f"{node} is loading or recovering"
            if replica.commit_index() != commit or replica.applied_index() != commit:
                return f"{node} at commit {replica.commit_index()} applied {replica.applied_index()}, leader {commit}"
        if pending_pushes:
            return f"{pending_pushes} pushes not acknowledged yet"
        if inflight:
            return f"{inflight} client commands not answered yet"
        return None

    def settled(self, replicas: dict[str, PartitionReplica], records: Records, now_ms: int,
                maybe_lost: Callable[[float | None, bool], bool] = lambda _at, _disk: False) -> None:
        """The checks once the group has settled (see the module docstring). ``maybe_lost(acked
        at, disk class)``: an acknowledged write that a power cut may have lost (a disk-class one)."""
        leader = next(r for r in replicas.values() if r.is_leader())
        digest = leader.application.view.digest()
        for node, replica in sorted(replicas.items()):
            if replica.application.view.digest() != digest:
                self.fail(f"{node} holds digest {replica.application.view.digest()[:12]}, its leader {leader.node_id} "
                          f"{digest[:12]} (both at applied index {replica.applied_index()})")
        for key, push in sorted(records.pushes.items()):
            if push.job_id is None:
                self.fail(f"push {key} was never acknowledged")
            lost_ok = maybe_lost(push.acked_at, push.disk)
            try:
                job = leader.application.read({"cmd": "GetJob", "id": push.job_id}, now_ms)["job"]
            except CommandError as exc:
                if not lost_ok:
                    self.fail(f"acknowledged push {key} (job {push.job_id}) is lost: {exc}")
                continue
            if raw_bytes(job["data"]) != push.data:
                if not lost_ok:
                    self.fail(f"job {push.job_id} holds other data than push {key} sent")
                continue
            done_at = records.completed.get(push.job_id)
            if done_at is not None and job["state"] != "completed" and not maybe_lost(done_at, push.disk):
                self.fail(f"job {push.job_id} was acked complete but is {job['state']}")
            if job["state"] == "completed" and push.job_id not in records.completed \
                    and push.job_id not in records.ack_unknown:
                self.fail(f"job {push.job_id} is completed but no ACK of it was sent with an unknown outcome "
                          "or acknowledged")
