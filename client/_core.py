"""The client's non-I/O core, shared by :class:`AsyncClient` and the sync :class:`Client`.

Theory of operation. A command is a plain frame ``{cmd, ...fields}``. The
:class:`Router` holds the freshest :class:`~shoal.cluster.topology.Topology`
(from ``Hello`` replies, topology events and ``NOT_LEADER`` hints) and says which
node should get a frame: the leader of the partition of its queue, or of the
partition written in its job id (``cluster.commands.route_key``). When a send
fails, :func:`retry_action` decides from the error and the command's spec whether
to refresh the topology and send again (before the frame's deadline, from
:func:`budget_s`) or to raise:

- ``NOT_LEADER``, ``NO_LEADER``, ``OVERLOADED``, ``SHUTTING_DOWN``: the command was
  never applied, so it is always sent again;
- ``ConnectionLost``, a command timeout, the node's ``TIMEOUT``: the outcome is
  unknown, so only commands marked safe to repeat (reads, idempotent writes,
  pushes that carry an ``idempotencyKey``) are sent again;
- anything else is the answer and is raised.

Nothing here does I/O, sleeps or reads a clock: time comes in as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import enum
import itertools
import os
from collections.abc import Iterable, Mapping
from typing import Any

from shoal.cluster.commands import COMMANDS, route_key
from shoal.cluster.errors import RETRYABLE_CODES
from shoal.cluster.errors import CommandError as WireCommandError
from shoal.cluster.jobid import partition_of_job
from shoal.cluster.partitioning import shard_queue_name, stable_hash
from shoal.cluster.topology import NodeAddress, Topology

from .exceptions import (CommandError, CommandTimeout, ConnectionLost, InvalidCommand, NoLeader, NotLeader,
                         ShoalError)

__all__ = ["ms", "job_fields", "IdempotencyKeys", "Action", "retry_action", "is_retry_safe", "budget_s",
           "KeyedPackedPush", "retry_pause_s", "exhausted_error", "Router", "address_of", "ShardPicker", "group_by_partition",
           "Dedupe", "Debounce"]

_RETRYABLE = frozenset(code.value for code in RETRYABLE_CODES)
_LONG_POLL = frozenset({"PULL", "PULLB", "PUSH"})  # commands whose ``timeout`` field is a wait on the node
_RETRY_PAUSE_S_MIN = 0.02
_RETRY_PAUSE_S_MAX = 0.5

_JOB_OPTIONS = {"priority": "priority", "custom_id": "customId", "attempts": "attempts", "group": "group",
                "tag": "tag"}
_TIME_OPTIONS = {"delay": "delay", "ttl": "ttl", "ttr": "ttr", "backoff": "backoff"}


def ms(seconds: float | None) -> int | None:
    """Python seconds → wire milliseconds (``None`` stays ``None``)."""
    return None if seconds is None else int(round(seconds * 1000))


@dataclass(frozen=True, slots=True)
class Dedupe:
    """Add a job only if no add with the same ``id`` happened in the last ``ttl`` seconds
    (else the add answers the existing job's id); ``extend`` restarts the TTL with each such
    add, ``replace`` swaps the existing job's data while it has not started."""

    id: str
    ttl: float
    extend: bool = False
    replace: bool = False

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "ttlMs": ms(self.ttl), "extend": self.extend, "replace": self.replace}


@dataclass(frozen=True, slots=True)
class Debounce:
    """Run a burst of adds with the same ``id`` once: ``delay`` seconds after the last add
    (with its data), but no later than ``max_wait`` seconds after the first."""

    id: str
    delay: float
    max_wait: float | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "delayMs": ms(self.delay)}
        if self.max_wait is not None:
            out["maxWaitMs"] = ms(self.max_wait)
        return out


def job_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """Python job options (``priority``, ``delay`` in seconds, ``custom_id``, …) → wire fields."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key in _JOB_OPTIONS:
            out[_JOB_OPTIONS[key]] = value
        elif key in ("dedupe", "debounce"):
            out[key] = value.wire() if isinstance(value, (Dedupe, Debounce)) else value
        elif key in _TIME_OPTIONS:
            out[_TIME_OPTIONS[key]] = ms(value)
        else:
            raise TypeError(f"unknown job option {key!r}")
    return out


class IdempotencyKeys:
    """Keys for pushes: a random per-client prefix and a counter, so a retried push never enqueues twice."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or os.urandom(8).hex()
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self.prefix}-{next(self._counter)}"


# --- retry policy ---------------------------------------------------------------------------------

class Action(enum.Enum):
    """What to do after a failed send."""

    RETRY = "retry"   # refresh routing and send again within the deadline
    RAISE = "raise"   # the error is the answer


class KeyedPackedPush(dict[str, Any]):
    """A ``PUSHB`` frame whose ``jobs`` is one pre-encoded MessagePack array (a codec ``Raw``), built
    column-wise by a bulk producer (the Spark connector) that gives every item an ``idempotencyKey``.

    The items cannot be inspected here, so the type is the producer's word that re-sending is safe.
    """


def is_retry_safe(frame: Mapping[str, Any]) -> bool:
    """May ``frame`` be sent again after an unknown outcome without a second effect?"""
    if isinstance(frame, KeyedPackedPush):
        return True
    spec = COMMANDS.get(frame.get("cmd", ""))
    if spec is None:
        return False
    if frame["cmd"] in ("PUSH", "PushFlow"):
        return frame.get("idempotencyKey") is not None
    if frame["cmd"] == "PUSHB":
        return all(isinstance(j, Mapping) and j.get("idempotencyKey") is not None for j in frame.get("jobs") or ())
    return spec.read_only or spec.retry_safe


def retry_action(error: BaseException, frame: Mapping[str, Any]) -> Action:
    """Retry or raise after ``error`` on ``frame`` (see the module docstring)."""
    if isinstance(error, CommandError) and error.code in _RETRYABLE:
        return Action.RETRY
    if isinstance(error, (ConnectionLost, CommandTimeout)):
        return Action.RETRY if is_retry_safe(frame) else Action.RAISE
    return Action.RAISE


def budget_s(frame: Mapping[str, Any], command_timeout_s: float) -> float:
    """Seconds ``frame`` may take, retries included: the command timeout plus any long-poll wait."""
    wait_ms = frame.get("timeout") if frame.get("cmd") in _LONG_POLL else None
    return command_timeout_s + (wait_ms / 1000 if isinstance(wait_ms, int) else 0.0)


def retry_pause_s(attempt: int, jitter01: float = 0.5) -> float:
    """Pause before retry ``attempt`` (1-based): 20 ms doubling to 500 ms, scaled by 0.5..1.5 × jitter."""
    nominal = min(_RETRY_PAUSE_S_MAX, _RETRY_PAUSE_S_MIN * 2 ** min(max(0, attempt - 1), 16))
    return nominal * (0.5 + min(max(jitter01, 0.0), 1.0))


def exhausted_error(frame: Mapping[str, Any], last: BaseException | None, budget: float) -> ShoalError:
    """The error to raise when ``frame``'s deadline passed while retrying after ``last``."""
    what = f"{frame.get('cmd')}: gave up after {budget:.1f}s"
    if isinstance(last, NoLeader):
        return NoLeader(f"{what}: no leader elected ({last})", last.code, last.reply)
    if isinstance(last, CommandError):
        return NotLeader(f"{what}: the leader did not answer ({last})", last.code, last.reply)
    if isinstance(last, ConnectionLost):
        return ConnectionLost(f"{what}: {last}")
    return CommandTimeout(f"{what} without a reply" + (f" ({last})" if last else ""))


# --- routing ---------------------------------------------------------------------------------------

def address_of(node: NodeAddress) -> str:
    """``host:port`` of a node's client port."""
    host = f"[{node.host}]" if ":" in node.host else node.host
    return f"{host}:{node.port}"


class Router:
    """Which node gets a frame, from the freshest known topology.

    Views are merged per partition by Raft term, so an older view (a paused node's,
    a late event) never overrides a newer one.
    """

    def __init__(self, seeds: Iterable[str], topology: Topology | None = None) -> None:
        self.seeds = list(dict.fromkeys(seeds))
        if not self.seeds:
            raise ValueError("give at least one seed address host:port")
        self.topology = topology
        self._node_turn = itertools.count()

    @property
    def ready(self) -> bool:
        return self.topology is not None

    def learn(self, topology: Topology) -> bool:
        """Merge ``topology`` into the known view; ``True`` if routing changed."""
        if self.topology is None:
            self.topology = topology
            return True
        merged = self.topology.merge(topology)
        changed = merged is not self.topology
        self.topology = merged
        return changed

    def learn_wire(self, wire: Any) -> bool:
        """Merge a topology as sent in ``Hello`` replies and topology events."""
        return self.learn(Topology.from_wire(wire))

    def complete(self) -> bool:
        """Does every partition have a known leader?"""
        return self.topology is not None and all(p.leader for p in self.topology.partition_map)

    def partition_of(self, frame: Mapping[str, Any]) -> int | None:
        """The partition ``frame`` routes to, or ``None`` for a node-level command (or no partition given)."""
        assert self.topology is not None, "no topology yet: call connect()"
        try:
            key = route_key(frame)
        except WireCommandError as exc:
            raise InvalidCommand(str(exc), exc.code.value) from exc
        except KeyError as exc:
            raise InvalidCommand(f"{exc.args[0]}: required", "INVALID") from exc
        if isinstance(key, str):
            return self.topology.partition_of_queue(key)
        if isinstance(key, int):
            if not 0 <= key < self.topology.partitions:
                raise InvalidCommand(f"partition {key} does not exist (the cluster has "
                                     f"{self.topology.partitions})", "INVALID")
            return key
        return None

    def address_for(self, frame: Mapping[str, Any]) -> str | None:
        """Where to send ``frame``: its partition's leader, any node for node-level commands, or
        ``None`` when the partition has no known leader."""
        partition = self.partition_of(frame)
        if partition is None:
            return self.any_address()
        node = self.topology.leader_of(partition) if self.topology else None
        return address_of(node) if node else None

    def any_address(self) -> str:
        """A node for node-level commands, turning through the known nodes (then the seeds)."""
        addresses = self.addresses()
        return addresses[next(self._node_turn) % len(addresses)]

    def skip_node(self) -> None:
        """The node last picked by :meth:`any_address` failed: start from the next one."""
        next(self._node_turn)

    def addresses(self) -> list[str]:
        """Every known node, then the seeds not among them."""
        known = [address_of(n) for n in self.topology.nodes.values()] if self.topology else []
        return list(dict.fromkeys(known + self.seeds))

    def leader_addresses(self) -> list[str]:
        """Distinct addresses of every partition's known leader."""
        if self.topology is None:
            return []
        return list(dict.fromkeys(address_of(n) for p in self.topology.partition_map
                                  if (n := self.topology.leader_of(p.id)) is not None))

    def apply_hint(self, frame: Mapping[str, Any], reply: Mapping[str, Any]) -> bool:
        """Follow a ``NOT_LEADER`` reply's ``leader`` hint; ``True`` if routing changed."""
        hint = reply.get("leader")
        if not isinstance(hint, Mapping) or self.topology is None or "nodeId" not in hint:
            return False
        partition = self.partition_of(frame)
        if partition is None:
            return False
        node_id = str(hint["nodeId"])
        topology = self.topology
        if node_id not in topology.nodes and hint.get("host") and hint.get("port"):
            nodes = {**topology.nodes, node_id: NodeAddress(node_id, str(hint["host"]), int(hint["port"]))}
            topology = Topology(topology.cluster_id, topology.partitions, nodes, topology.partition_map,
                                topology.epoch + 1)
        info = topology.partition_map[partition]
        if info.leader == node_id:
            return False
        # Take the hint at our own term (or the hint's, when it names one): it may be stale, so it
        # must never outrank a real election, whose term is higher and wins on the next refresh.
        term = hint.get("term")
        term = term if isinstance(term, int) and not isinstance(term, bool) else info.term
        updated = topology.with_leader(partition, node_id, term)
        changed = updated is not self.topology
        self.topology = updated
        return changed


# --- request building --------------------------------------------------------------------------------

class ShardPicker:
    """Sub-queues of a sharded queue and which one a job goes to.

    A job with a ``group`` or ``custom_id`` goes to ``stable_hash(that) mod k`` (so a
    group stays FIFO on one shard and a custom id dedupes on one shard); others go
    round-robin.
    """

    def __init__(self, queue: str, shards: int | None) -> None:
        if shards is not None and not 1 <= shards <= 1024:
            raise ValueError("shards must be in 1..1024")
        self.queue = queue
        self.shards = shards
        self.names = [shard_queue_name(queue, i) for i in range(shards)] if shards else [queue]
        self._turn = itertools.count()

    @property
    def sharded(self) -> bool:
        return self.shards is not None

    def pick(self, group: str | None = None, custom_id: str | None = None) -> str:
        """The (sub-)queue a job with this ``group``/``custom_id`` goes to."""
        if len(self.names) == 1:
            return self.names[0]
        key = group if group is not None else custom_id
        if key is not None:
            return self.names[stable_hash(key) % len(self.names)]
        return self.names[next(self._turn) % len(self.names)]

    def rotation(self) -> list[str]:
        """Every (sub-)queue, starting from a new one each call (fair pulls across shards)."""
        start = next(self._turn) % len(self.names)
        return self.names[start:] + self.names[:start]

    def owns(self, queue: str | None) -> bool:
        """Is ``queue`` this queue or one of its sub-queues?"""
        return queue in self.names or queue == self.queue


def group_by_partition(ids: Iterable[str]) -> dict[int, list[int]]:
    """Indexes of ``ids`` per partition (ACKB needs every id of a batch on one partition)."""
    groups: dict[int, list[int]] = {}
    for i, job_id in enumerate(ids):
        groups.setdefault(partition_of_job(job_id), []).append(i)
    return groups
