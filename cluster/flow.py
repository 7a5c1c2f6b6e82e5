"""Flows on the wire: ``PushFlow``'s tree of jobs, its checks and its flattened form.

``PushFlow {parent: {queue, data, ...job options}, children: [{queue, data, ...job options,
children?, onFailure?}, ...], idempotencyKey?}``. Node and client share this module: the
node checks a tree with the checkers of :func:`parent_checker` / :func:`children_checker`
(which the command schema builds from PUSH's job options) and creates it level by level from :func:`flatten`, whose order is also the order
of the ids in the reply (depth first, the parent first).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import _fields as F
from . import limits as L

__all__ = ["ON_FAILURE", "FLOW_JOBS_MAX", "FLOW_DEPTH_MAX", "FlowNode", "parent_checker", "children_checker",
           "flatten", "item_key", "FLOW_KEY_CHARS_MAX"]

#: A child's failure policy (``onFailure``); the first is the default.
ON_FAILURE = ("fail", "ignore", "remove")
#: Jobs in one flow, the parent included.
FLOW_JOBS_MAX = 1_000
#: Levels below the parent.
FLOW_DEPTH_MAX = 16

#: Characters of a PushFlow's ``idempotencyKey``: room is left for ``/<path>`` of its deepest job.
FLOW_KEY_CHARS_MAX = L.key_chars_max - 4 * (FLOW_DEPTH_MAX + 1)
_one_of_policy = F.one_of(ON_FAILURE)


@dataclass(frozen=True, slots=True)
class FlowNode:
    """One job of a flow: its place (index in depth-first order, its parent's index, its
    depth), its job fields (``queue``, ``data``, options) and how it treats a failure."""

    index: int
    parent: int | None
    depth: int
    path: str
    job: Mapping[str, Any]
    children: int
    on_failure: str


def _job_checks(job_options: Mapping[str, F.Checker]) -> dict[str, F.Checker]:
    return {"queue": F.queue, "data": F.data, **job_options}


def parent_checker(job_options: Mapping[str, F.Checker]) -> F.Checker:
    """The checker of ``parent``: a job (``queue``, ``data`` and ``job_options``); no ``delay``.

    ``job_options`` is PUSH's (:data:`~shoal.cluster.commands.JOB_OPTION_FIELDS`), handed in by
    the command schema so a flow's jobs take exactly what a PUSH takes.
    """
    checks = _job_checks(job_options)

    def check_parent(field: str, v: Any) -> None:
        F.fields_map(field, v, checks, "job field", required=("queue", "data"))
        if v.get("delay"):
            raise F.bad(f"{field}.delay", "a parent waits for its children; it takes no delay")

    return check_parent


def children_checker(job_options: Mapping[str, F.Checker]) -> F.Checker:
    """The checker of ``children``: a non-empty list of jobs (``queue``, ``data`` and
    ``job_options``), each with optional ``children`` and ``onFailure``."""
    checks = {**_job_checks(job_options), "children": lambda _f, _v: None, "onFailure": _one_of_policy}

    def check_children(field: str, v: Any) -> None:
        total = [1]

        def walk(name: str, items: Any, depth: int) -> None:
            if type(items) is not list or not items:
                raise F.bad(name, "must be a non-empty list of jobs")
            if depth > FLOW_DEPTH_MAX:
                raise F.bad(name, f"a flow is at most {FLOW_DEPTH_MAX} levels deep")
            for i, item in enumerate(items):
                total[0] += 1
                if total[0] > FLOW_JOBS_MAX:
                    raise F.bad(field, f"a flow holds at most {FLOW_JOBS_MAX} jobs")
                where = f"{name}[{i}]"
                F.fields_map(where, item, checks, "job field", required=("queue", "data"))
                sub = item.get("children")
                if sub is not None:
                    if item.get("delay"):
                        raise F.bad(f"{where}.delay", "a parent waits for its children; it takes no delay")
                    walk(f"{where}.children", sub, depth + 1)

        walk(field, v, 1)

    return check_children


def flatten(parent: Mapping[str, Any], children: list[Mapping[str, Any]]) -> list[FlowNode]:
    """The tree of a checked PushFlow in depth-first order, the parent first."""
    out: list[FlowNode] = []

    def add(item: Mapping[str, Any], parent_index: int | None, depth: int, path: str) -> None:
        subs = item.get("children") or []
        job = {k: v for k, v in item.items() if k not in ("children", "onFailure") and v is not None}
        node = FlowNode(len(out), parent_index, depth, path, job, len(subs), item.get("onFailure") or ON_FAILURE[0])
        out.append(node)
        for i, sub in enumerate(subs):
            add(sub, node.index, depth + 1, f"{path}.{i}")

    add({**parent, "children": children}, None, 0, "0")
    return out


def item_key(flow_key: str | None, node: FlowNode) -> str | None:
    """The idempotency key of one job of a flow sent with ``flow_key``: the job's own key,
    else ``flow_key/path`` (None without either). A re-sent PushFlow with the same key
    finds every job it already created."""
    own = node.job.get("idempotencyKey")
    if own is not None or flow_key is None:
        return own
    return f"{flow_key}/{node.path}"
