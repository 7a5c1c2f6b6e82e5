"""Job ids: ``"{partition}-{seq}"``, routable without a lookup."""

from __future__ import annotations

from .errors import CommandError, ErrorCode

__all__ = ["format_job_id", "parse_job_id", "partition_of_job"]


def format_job_id(partition: int, seq: int) -> str:
    """The id of the ``seq``-th job of ``partition``."""
    return f"{partition}-{seq}"


def parse_job_id(job_id: object) -> tuple[int, int]:
    """Split a job id into ``(partition, seq)``; ``INVALID`` names the field on a bad id."""
    if not isinstance(job_id, str):
        raise CommandError(ErrorCode.INVALID, "id: must be a string like '3-17'")
    head, sep, tail = job_id.partition("-")
    # isascii: str.isdigit() accepts digits such as "²" that int() refuses
    if not sep or not job_id.isascii() or not head.isdigit() or not tail.isdigit() or len(job_id) > 40:
        raise CommandError(ErrorCode.INVALID, f"id: {job_id!r} is not a job id like '3-17'")
    return int(head), int(tail)


def partition_of_job(job_id: object) -> int:
    """The partition a job id routes to."""
    return parse_job_id(job_id)[0]
