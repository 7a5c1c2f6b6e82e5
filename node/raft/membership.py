"""A Raft group's membership: who votes, who only learns, and how it changes.

Voters elect the leader and count toward the commit; learners receive the log but
neither vote nor count, which is how a new replica catches up before it can
affect availability (Raft thesis §4.2.1). Membership changes one server at a time
(thesis §4.1): each change is a replicated :data:`~.messages.ENTRY_CONFIG` entry
that takes effect when it commits, and a leader proposes the next change only once
the previous one is applied and it has committed an entry of its own term (the
fix of thesis §4.1's single-server bug).

The changes are: add a learner, promote a learner to voter, demote a voter to
learner, remove a member. Adding a voter directly is refused: a voter that lacks
the log makes every commit wait for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from .messages import ENTRY_CONFIG

__all__ = ["Membership", "ConfigChange", "ConfigError", "encode_change", "decode_change",
           "CHANGE_KINDS", "MEMBERS_MAX"]

#: Most members (voters and learners) a group may have.
MEMBERS_MAX = 9
CHANGE_KINDS = ("add_learner", "promote", "demote", "remove")


class ConfigError(ValueError):
    """A membership change that cannot be applied to the current membership."""


@dataclass(frozen=True, slots=True)
class Membership:
    """Voters and learners of one group (sorted tuples: equal memberships compare equal)."""

    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()

    @classmethod
    def of(cls, voters: list[str] | tuple[str, ...], learners: list[str] | tuple[str, ...] = ()) -> "Membership":
        v, lr = tuple(sorted(set(voters))), tuple(sorted(set(learners)))
        if set(v) & set(lr):
            raise ConfigError(f"members both voter and learner: {sorted(set(v) & set(lr))}")
        return cls(v, lr)

    @property
    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners

    def is_voter(self, node: str) -> bool:
        return node in self.voters

    def quorum(self) -> int:
        """Votes (or acknowledgements) that make a majority of the voters."""
        return len(self.voters) // 2 + 1

    def apply(self, change: "ConfigChange") -> "Membership":
        """The membership after ``change``; :class:`ConfigError` if it does not apply."""
        node, kind = change.node, change.kind
        voters, learners = set(self.voters), set(self.learners)
        if kind == "add_learner":
            if node in voters or node in learners:
                raise ConfigError(f"{node} is already a member")
            if len(voters) + len(learners) >= MEMBERS_MAX:
                raise ConfigError(f"a group has at most {MEMBERS_MAX} members")
            learners.add(node)
        elif kind == "promote":
            if node not in learners:
                raise ConfigError(f"{node} is not a learner")
            learners.discard(node)
            voters.add(node)
        elif kind == "demote":
            if node not in voters:
                raise ConfigError(f"{node} is not a voter")
            if len(voters) == 1:
                raise ConfigError("cannot demote the last voter")
            voters.discard(node)
            learners.add(node)
        elif kind == "remove":
            if node not in voters and node not in learners:
                raise ConfigError(f"{node} is not a member")
            if voters == {node}:
                raise ConfigError("cannot remove the last voter")
            voters.discard(node)
            learners.discard(node)
        else:
            raise ConfigError(f"unknown change {kind!r}")
        return Membership.of(sorted(voters), sorted(learners))

    def to_wire(self) -> list[list[str]]:
        return [list(self.voters), list(self.learners)]

    @classmethod
    def from_wire(cls, value: list[list[str]]) -> "Membership":
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ConfigError(f"bad membership {value!r}")
        return cls.of([str(v) for v in value[0]], [str(v) for v in value[1]])


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One single-server change: ``kind`` (one of :data:`CHANGE_KINDS`) of ``node``.

    ``result`` is the whole membership after the change: a config entry carries it, so a
    replica that joined the group after its first membership (and never saw it) applies the
    entry to the right membership all the same.
    """

    kind: str
    node: str
    result: Membership | None = None


def encode_change(change: ConfigChange) -> bytes:
    """The payload of the config entry carrying ``change`` (its ``result`` must be set)."""
    if change.result is None:
        raise ConfigError("a config entry carries the membership after its change")
    return bytes([ENTRY_CONFIG]) + msgpack.packb([change.kind, change.node, change.result.to_wire()])


def decode_change(payload: bytes) -> ConfigChange:
    """The change a config entry's payload carries; :class:`ConfigError` if it is malformed."""
    try:
        kind, node, result = msgpack.unpackb(payload[1:], raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ConfigError(f"malformed config entry: {exc}") from exc
    if kind not in CHANGE_KINDS or not isinstance(node, str):
        raise ConfigError(f"malformed config entry: {kind!r} {node!r}")
    return ConfigChange(kind, node, Membership.from_wire(result))
