"""Output written together: the connections holding replies or events not yet written."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["PendingWrites", "Writer"]


class Writer(Protocol):
    """A connection that writes what it holds on ``_flush``."""

    def _flush(self) -> None: ...


class PendingWrites:
    """Connections holding output, written at the end of the loop iteration, or at once by
    :meth:`write_now` once a Raft entry's answers are out: sooner than the next iteration,
    which first polls and reads every socket again.

    A lone replica's batch of writes is proposed before the iteration's output is written
    (:meth:`propose_first`): its proposal commits within the call (it syncs and applies it),
    so its answers leave in the same write as the replies to the frames that came with them,
    one send per connection rather than two. A replica with peers commits later: its batch
    waits for the output, whose replies would otherwise wait for the leader's own sync.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._writers: list[Writer] = []
        self._scheduled = False
        self._proposals: list[Callable[[], None]] = []

    def add(self, writer: Writer) -> None:
        """``writer`` holds output (it adds itself once until its ``_flush``)."""
        self._writers.append(writer)
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._run)

    def propose_first(self, flush: Callable[[], None]) -> None:
        """Call ``flush`` (a group commit's due batch) before this iteration's output is written."""
        self._proposals.append(flush)

    def _run(self) -> None:
        self._scheduled = False
        if self._proposals:
            proposals, self._proposals = self._proposals, []
            for flush in proposals:
                flush()
        self.write_now()

    def write_now(self) -> None:
        """Write every pending writer's output now."""
        while self._writers:
            writers, self._writers = self._writers, []
            for writer in writers:
                writer._flush()
