"""The job state diagram (tarantool's queue states, plus FAIL with retries) as one table.

    (new)        --push--------------------> waiting (r)
    (new)        --push with a delay-------> delayed (~)
    waiting  (r) --pull--------------------> active (t)
    waiting  (r) --bury--------------------> failed (!)
    waiting  (r) --move to delayed---------> delayed (~)
    delayed  (~) --due / promote-----------> waiting (r)
    delayed  (~) --bury--------------------> failed (!)
    active   (t) --ack---------------------> completed (-)
    active   (t) --release / lease lapse---> waiting (r)
    active   (t) --release(delay) / fail
                   with attempts left------> delayed (~)
    active   (t) --fail, no attempts left /
                   bury / max deliveries---> failed (!)
    failed   (!) --kick / retry DLQ--------> waiting (r)
    completed(-) --retry completed---------> waiting (r)
    (new)        --push of a flow parent---> waiting-children
    waiting-children --children done-------> waiting (r)
    waiting-children --a child failed------> failed (!)
    active   (t) --cancel------------------> cancelled (x)
    any state    --cancel, drain, clean,
                   TTL, trim, purge--------> (removed)

``(new)`` and ``(removed)`` are not states a job is in: the job does not exist yet or any
more. Every move of a job, a segment slot's included, is checked against
:data:`TRANSITIONS`; a move the table lacks is an engine bug and fails loudly with
``INTERNAL`` before anything changes. A move whose both ends are fixed where it is made
(a push making a waiting job) is checked once when its module loads; a move from a job's
current state is checked each time. A new state is one entry in :data:`STATES` and
:data:`TARANTOOL_CODES` plus its moves here.
"""

from __future__ import annotations

from shoal.cluster.errors import CommandError, ErrorCode

__all__ = ["WAITING", "DELAYED", "ACTIVE", "COMPLETED", "FAILED", "WAITING_CHILDREN", "CANCELLED", "NEW", "REMOVED", "STATES", "TRANSITIONS",
           "TARANTOOL_CODES", "check_transition"]

WAITING = "waiting"
DELAYED = "delayed"
ACTIVE = "active"
COMPLETED = "completed"
FAILED = "failed"
#: A flow's parent until its children are done (see ``_flows``); no tarantool letter.
WAITING_CHILDREN = "waiting-children"
CANCELLED = "cancelled"  # a running job stopped by Cancel: terminal, kept like a completed one
STATES = (WAITING, DELAYED, ACTIVE, COMPLETED, FAILED, WAITING_CHILDREN, CANCELLED)
#: Pseudo-states at the two ends of a job's life (never a job's ``state``).
NEW = "new"
REMOVED = "removed"
#: tarantool's one-letter task states.
TARANTOOL_CODES = {WAITING: "r", DELAYED: "~", ACTIVE: "t", COMPLETED: "-", FAILED: "!", WAITING_CHILDREN: "w",
                   CANCELLED: "x"}

#: Every allowed move, named by what causes it.
TRANSITIONS: dict[tuple[str, str], str] = {
    (NEW, WAITING): "push",
    (NEW, DELAYED): "push with a delay",
    (WAITING, ACTIVE): "pull",
    (WAITING, FAILED): "bury",
    (WAITING, DELAYED): "move to delayed",
    (DELAYED, WAITING): "due or promoted",
    (DELAYED, FAILED): "bury",
    (ACTIVE, COMPLETED): "ack",
    (ACTIVE, WAITING): "release or lease lapse",
    (ACTIVE, DELAYED): "release with a delay, or fail with attempts left",
    (ACTIVE, FAILED): "fail, bury or too many deliveries",
    (FAILED, WAITING): "kick or retry from the DLQ",
    (COMPLETED, WAITING): "retry completed",
    (NEW, WAITING_CHILDREN): "push of a flow parent",
    (WAITING_CHILDREN, WAITING): "every child done",
    (WAITING_CHILDREN, FAILED): "a child failed (onFailure: fail)",
    (ACTIVE, CANCELLED): "cancel a running job",
    **{(state, REMOVED): "removed" for state in STATES},
}


#: The same moves by where they start: a check builds no tuple.
_NEXT: dict[str, frozenset[str]] = {
    state: frozenset(new for prev, new in TRANSITIONS if prev == state) for state in (NEW, *STATES)}
_NOWHERE: frozenset[str] = frozenset()


def check_transition(prev: str, new: str) -> None:
    """Refuse a move the table does not allow: an engine bug, since commands check states first."""
    if new not in _NEXT.get(prev, _NOWHERE):
        raise CommandError(ErrorCode.INTERNAL, f"internal error: a job cannot go from {prev} to {new}")
