"""The next membership change toward a target: :func:`plan_change`, pure, used by the node's moves
(:mod:`shoal.node.moves`, through :meth:`~.replica.PartitionReplica.plan_change`) and by the
seeded simulation alike.

The order of the changes, one at a time (Raft's single-server changes, :mod:`.membership`):

1. a learner the target does not name is removed;
2. a target member the group lacks joins as a learner;
3. a voter the target does not name and the leader has not heard from for
   :data:`DEAD_AFTER_S` (a dead node) is removed, once a majority of the voters left is caught up;
4. a learner the target names that is caught up (replicating, within :data:`PROMOTE_LAG_MAX`
   entries of the commit index) is promoted to voter;
5. a voter the target does not name is removed once every target member votes and a majority of
   the voters left is caught up; the leader itself first hands leadership over (:data:`HAND_OVER`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core import REPLICATE
from .membership import ConfigChange

if TYPE_CHECKING:
    from .core import RaftCore

__all__ = ["plan_change", "HAND_OVER", "DEAD_AFTER_S", "PROMOTE_LAG_MAX"]

#: A voter the leader has not heard from for this long counts as dead (removed first when it
#: leaves the target, so the group never waits for it).
DEAD_AFTER_S = 5.0
#: A learner is promoted once it replicates within this many entries of the commit index (under
#: steady writes a leader that commits alone is always a round trip ahead of it).
PROMOTE_LAG_MAX = 100

#: :func:`plan_change`'s answer when the leader must hand leadership over before the next change.
HAND_OVER = "hand over"


def plan_change(core: "RaftCore", member: str, target: list[str], now: float) -> "ConfigChange | str | None":
    """The next single-server change that moves the group ``core`` leads toward ``target`` (its
    member ids, preferred leader first), in the order of the module docstring: a
    :class:`ConfigChange` to propose, :data:`HAND_OVER` when this leader (``member``) is the voter
    to remove next, or None while nothing can be done (a change pending, no entry of its term
    committed yet, a learner still catching up, or the group on target). Pure: the node's moves
    and the seeded simulation decide alike (``now`` is the leader's clock)."""
    members = core.membership
    voters, learners = set(members.voters), set(members.learners)
    wanted = set(target)
    if (voters == wanted and not learners) or core.change_pending or not core.read_ready:
        return None
    progress = core.progress
    for m in sorted(learners - wanted):
        return ConfigChange("remove", m)
    for m in target:
        if m not in voters and m not in learners:
            return ConfigChange("add_learner", m)
    for m in sorted(voters - wanted):
        pr = progress.get(m)
        if m != member and (pr is None or now - pr.last_heard > DEAD_AFTER_S) \
                and _caught_up_majority(core, member, voters - {m}, now):
            return ConfigChange("remove", m)
    for m in target:
        pr = progress.get(m)
        if m in learners and pr is not None and pr.state == REPLICATE and pr.match + PROMOTE_LAG_MAX >= core.commit:
            return ConfigChange("promote", m)
    if wanted <= voters:
        extra = sorted(voters - wanted)
        if extra:
            if member in extra:
                return HAND_OVER
            if _caught_up_majority(core, member, voters - {extra[0]}, now):
                return ConfigChange("remove", extra[0])
    return None


def _caught_up_majority(core: "RaftCore", member: str, voters: set[str], now: float) -> bool:
    """Would a majority of ``voters`` (the leader ``member`` among them) hold the log and answer?

    A voter is removed only then: the group left could otherwise need a voter that is down or
    still being brought back (a repaired replica neither votes nor campaigns until it holds every
    committed entry), and, losing its leader, elect nobody."""
    progress = core.progress
    caught_up = 0
    for v in voters:
        pr = progress.get(v)
        # Answered in this term (replicating, not merely given a new leader's grace period),
        # lately, and near the commit index.
        if v == member or (pr is not None and pr.state == REPLICATE and pr.match + PROMOTE_LAG_MAX >= core.commit
                           and now - pr.answered_at <= DEAD_AFTER_S):
            caught_up += 1
    return caught_up >= len(voters) // 2 + 1
