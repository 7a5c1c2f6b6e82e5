"""The job state diagram (tarantool's queue states, plus FAIL with retries) as one table.

    waiting  (r) --pull--------------------> active (t)
    waiting  (r) --bury--------------------> failed (!)
    delayed  (~) --due / promote-----------> waiting (r)
    delayed  (~) --bury--------------------> failed (!)
    active   (t) --ack---------------------> completed (-)
    active   (t) --release / lease lapse---> waiting (r)
    active   (t) --release(delay) / fail
                   with attempts left------> delayed (~)
    active   (t) --fail, no attempts left /
                   bury / max deliveries---> failed (!)
    waiting  (r) --move to delayed---------> delayed (~)
    failed   (!) --kick / retry DLQ--------> waiting (r)
    completed(-) --retry completed---------> waiting (r)

Removal (cancel, drain, clean, TTL, purge, obliterate) is not a state: the job is gone.
"""

from __future__ import annotations

from shoal.cluster.errors import CommandError, ErrorCode

__all__ = ["WAITING", "DELAYED", "ACTIVE", "COMPLETED", "FAILED", "STATES", "TRANSITIONS", "TARANTOOL_CODES",
           "check_transition"]

WAITING = "waiting"
DELAYED = "delayed"
ACTIVE = "active"
COMPLETED = "completed"
FAILED = "failed"
STATES = (WAITING, DELAYED, ACTIVE, COMPLETED, FAILED)
#: tarantool's one-letter task states.
TARANTOOL_CODES = {WAITING: "r", DELAYED: "~", ACTIVE: "t", COMPLETED: "-", FAILED: "!"}

TRANSITIONS: frozenset[tuple[str, str]] = frozenset({
    (WAITING, ACTIVE), (WAITING, FAILED), (WAITING, DELAYED),
    (DELAYED, WAITING), (DELAYED, FAILED),
    (ACTIVE, COMPLETED), (ACTIVE, WAITING), (ACTIVE, DELAYED), (ACTIVE, FAILED),
    (FAILED, WAITING),
    (COMPLETED, WAITING),
})


def check_transition(prev: str, new: str) -> None:
    """Refuse a move the diagram does not allow (a bug guard: commands check states first)."""
    if (prev, new) not in TRANSITIONS:
        raise CommandError(ErrorCode.INVALID_STATE, f"a job cannot go from {prev} to {new}")
