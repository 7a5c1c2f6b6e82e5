"""Replica digests for ``Stats``/``/stats`` without hashing a large state on the event loop.

A digest is the SHA-256 of a partition's state at an applied index, equal on
replicas that applied the same entries, read through the replica's
:class:`~.partition.view.PartitionView`. A small partition (at most
:data:`INLINE_JOBS_MAX` jobs, well under a millisecond per thousand jobs) is
hashed on the spot. A larger one is hashed in a forked child, which calls
``view.digest()`` on its copy-on-write image of every large partition as it was
at the moment of the fork and sends back ``(partition, applied index, digest)``
through a pipe; until it answers,
``Stats`` reports the last digest computed with the index it belongs to
(``digestIndex``), so a reader compares digests of equal ``digestIndex``. One
child serves every partition of the node, at most one runs at a time, and the next
starts no sooner than the last one took (a digest child uses at most half a core).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

import msgpack

from .raft.snapshots import become_background_child

if TYPE_CHECKING:
    from .partition.view import PartitionView

__all__ = ["ReplicaDigests", "INLINE_JOBS_MAX", "ENV_INLINE_JOBS_MAX", "RESULT_BYTES_MAX"]

log = logging.getLogger(__name__)


#: A partition with at most this many jobs is hashed on the loop (~5 ms at this size).
INLINE_JOBS_MAX = 1_000
ENV_INLINE_JOBS_MAX = "SHOAL_DIGEST_INLINE_JOBS_MAX"
#: The child's answer is cut off beyond this size (about 100 bytes per partition).
RESULT_BYTES_MAX = 1024 * 1024


class _Machine(Protocol):
    view: "PartitionView"


class _Replica(Protocol):
    application: _Machine

    def applied_index(self) -> int: ...


class ReplicaDigests:
    """The latest digest of each hosted replica, computed inline or in a forked child."""

    def __init__(self, loop: asyncio.AbstractEventLoop, inline_jobs_max: int | None = None) -> None:
        self.loop = loop
        if inline_jobs_max is None:
            inline_jobs_max = int(os.environ.get(ENV_INLINE_JOBS_MAX) or INLINE_JOBS_MAX)
        self.inline_jobs_max = inline_jobs_max
        #: partition -> (state id, applied index, digest); the state id changes when the replica
        #: replaces its state (a snapshot installed), which makes the digest stale.
        self._known: dict[int, tuple[int, int, str]] = {}
        self._pid = 0
        self._fd = -1
        self._buffer = bytearray()
        self._pending: dict[int, int] = {}  # partition -> state id, while a child hashes
        self._started = 0.0
        self._next_start = 0.0
        #: Children forked so far (for tests and metrics).
        self.forks = 0

    def get(self, partition: int, replica: _Replica, replicas: Mapping[int, _Replica]) -> tuple[str | None, int]:
        """``(digest, applied index it is of)``; digest None while the first one is being computed
        or when the replica's job data cannot be read.

        ``replicas`` are all the node's replicas: one child hashes every stale large one.
        """
        view, index = replica.application.view, replica.applied_index()
        state = view.state_id()
        known = self._known.get(partition)
        if known is not None and known[0] == state and known[1] == index:
            return known[2], index
        if view.job_count() <= self.inline_jobs_max:
            try:
                digest = view.digest()
            except OSError as exc:  # job data that cannot be read (a damaged payload file)
                log.warning("digest of partition %d: %s", partition, exc)
                return None, index
            self._known[partition] = (state, index, digest)
            return digest, index
        self._start(replicas)
        if known is None:
            return None, 0
        return known[2], known[1]

    def _start(self, replicas: Mapping[int, _Replica]) -> None:
        if self._pid or self.loop.time() < self._next_start:
            return
        stale: dict[int, tuple[PartitionView, int, int]] = {}
        for p, r in replicas.items():
            known = self._known.get(p)
            view = r.application.view
            state, index = view.state_id(), r.applied_index()
            if (known is None or known[0] != state or known[1] != index) and view.job_count() > self.inline_jobs_max:
                stale[p] = (view, state, index)
        if not stale:
            return
        read_fd, write_fd = os.pipe()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            pid = os.fork()
        except OSError:
            if gc_was_enabled:
                gc.enable()
            os.close(read_fd)
            os.close(write_fd)
            log.exception("digest: fork failed")
            return
        if pid == 0:
            os.close(read_fd)
            _child(write_fd, stale)
        if gc_was_enabled:
            gc.enable()
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        self.forks += 1
        self._started = self.loop.time()
        self._pid, self._fd, self._pending = pid, read_fd, {p: state for p, (_, state, _) in stale.items()}
        self._buffer.clear()
        self.loop.add_reader(read_fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data and len(self._buffer) + len(data) <= RESULT_BYTES_MAX:
            self._buffer += data
            return
        self._finish()

    def _finish(self) -> None:
        self.loop.remove_reader(self._fd)
        os.close(self._fd)
        pid, self._pid, self._fd = self._pid, 0, -1
        # Hashing a large state costs a core for a while: leave at least as long between children.
        self._next_start = 2 * self.loop.time() - self._started
        try:
            os.waitpid(pid, 0)  # the pipe closed: the child is exiting
        except ChildProcessError:
            pass
        try:
            results = msgpack.unpackb(bytes(self._buffer), raw=False)
        except ValueError:
            log.error("digest: child %d sent no complete answer", pid)
            return
        finally:
            self._buffer.clear()
        for p, index, digest in results:
            state = self._pending.get(p)
            if state is not None:
                self._known[p] = (state, index, digest)
        self._pending = {}

    def close(self) -> None:
        """Stop a running child."""
        if self._pid:
            self.loop.remove_reader(self._fd)
            os.close(self._fd)
            try:
                os.kill(self._pid, signal.SIGKILL)
                os.waitpid(self._pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self._pid, self._fd = 0, -1


def _child(fd: int, stale: Mapping[int, tuple["PartitionView", int, int]]) -> None:
    code = 1
    try:
        become_background_child()
        results = []
        for p, (view, _, index) in stale.items():
            try:
                results.append([p, index, view.digest()])
            except OSError:
                continue  # job data that cannot be read (a damaged payload file): no digest
        view = memoryview(msgpack.packb(results))
        while view:
            view = view[os.write(fd, view):]
        code = 0
    finally:
        os._exit(code)
