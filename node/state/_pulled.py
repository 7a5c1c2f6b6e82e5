"""A pull's reply jobs, with runs of a segment's jobs kept as one record until encoded.

A batch pull leases mostly runs of consecutive jobs that one bulk add made: the same queue,
times, attempts and deadline, each with its own id and data. Their wire maps differ only in
those two fields, so a run is held as a template and the run's data bytes
(:class:`JobRun`), and the frame encoder writes it as the template's bytes cut around the id
and data, joined with each job's (:meth:`JobRun.pack_into`, one ``join`` in C per thousand
ids). A consumer that reads the jobs as maps gets them built on first use, equal to what the
encoder writes. The node's engine replies so (:attr:`~._store.Store.pulled_runs`); the engine
as tests and tools run it builds the maps at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import chain, repeat
from typing import Any, overload

import msgpack
import msgspec

from shoal.cluster.codec import Prepacked

from ._decimal import decimal_pieces, decimal_run

__all__ = ["JobRun", "PulledJobs", "pulled_jobs", "loose_jobs"]

#: Average data bytes of a run's jobs from which its data are cut as views of the read bytes (a
#: view costs more to make than a copy of a small job's data).
_VIEWS_FROM = 512

_SUFFIXES = tuple(f"{i:03d}".encode() for i in range(1000))

# Map and array headers in their shortest form, as msgspec writes them too.
_headers = msgpack.Packer()


class JobRun:
    """``count`` consecutive jobs leased together: job ``i`` is ``template`` with ``id``
    ``id_prefix + str(first + i)`` and ``data`` the MessagePack bytes ``blob[cuts[i]:cuts[i+1]]``."""

    __slots__ = ("template", "id_prefix", "first", "count", "blob", "cuts")

    def __init__(self, template: dict[str, Any], id_prefix: str, first: int, blob: Any, cuts: list[int]) -> None:
        self.template = template
        self.id_prefix = id_prefix
        self.first = first
        self.count = len(cuts) - 1
        self.blob = blob
        self.cuts = cuts

    def _datas(self) -> list[bytes]:
        blob, cuts = self.blob, self.cuts
        if cuts[-1] - cuts[0] > _VIEWS_FROM * self.count:
            blob = memoryview(blob)  # large data: views, not copies
        return [blob[a:b] for a, b in zip(cuts, cuts[1:])]

    def expand(self) -> list[dict[str, Any]]:
        """The run's jobs as maps: copies of the template with their id and data (a ``msgspec.Raw``)."""
        copy = self.template.copy
        wire = [copy() for _ in range(self.count)]
        for job, job_id, data in zip(wire, decimal_run(self.id_prefix, self.first, self.count),
                                     map(msgspec.Raw, self._datas())):
            job["id"] = job_id
            job["data"] = data
        return wire

    def _pieces(self, encode: Callable[[Any], bytes]) -> tuple[bytes, bytes, bytes] | None:
        """The template's bytes before the id's value, between it and the data's, and after the
        data's; None when the template does not name the id before the data."""
        keys = list(self.template)
        if "id" not in keys or "data" not in keys or keys.index("id") > keys.index("data"):
            return None
        a, b = keys.index("id"), keys.index("data")

        def pairs(names: list[str]) -> bytes:
            return encode({k: self.template[k] for k in names})[len(_headers.pack_map_header(len(names))):]

        return (_headers.pack_map_header(len(keys)) + pairs(keys[:a]) + encode("id"),
                pairs(keys[a + 1:b]) + encode("data"), pairs(keys[b + 1:]))

    def pack_into(self, out: list[Any], encode: Callable[[Any], bytes]) -> None:
        """Append to ``out`` the pieces of the run's job maps, byte for byte what ``encode``
        writes of :meth:`expand`'s maps."""
        pieces = self._pieces(encode)
        if pieces is None:
            out += map(encode, self.expand())
            return
        head, mid, tail = pieces
        datas = self._datas()
        at = 0
        for high, low, take in decimal_pieces(self.first, self.count):
            chunk = datas[at:at + take]
            at += take
            if high < 0:  # numbers under 1000: no stem shared
                for k, data in zip(range(low, low + take), chunk):
                    out += (head, encode(self.id_prefix + str(k)), mid, data, tail)
                continue
            # the ids' header and stem: every id of the piece has the stem and three digits more
            lead = head + encode(f"{self.id_prefix}{high}000")[:-3]
            # per job: its id's last three digits, the bytes up to its data, its data, and its
            # tail with the next job's head and id stem; the last job's tail ends the piece
            out.append(lead)
            out += chain.from_iterable(zip(_SUFFIXES[low:low + take], repeat(mid), chunk, repeat(tail + lead)))
            out[-1] = tail


class PulledJobs(Prepacked, Sequence[dict[str, Any]]):
    """A pull's reply jobs: maps and :class:`JobRun`\\ s in the order leased, ``count`` jobs."""

    __slots__ = ("parts", "count", "_maps")

    def __init__(self, parts: list[Any], count: int) -> None:
        self.parts = parts
        self.count = count
        self._maps: list[dict[str, Any]] | None = None

    def maps(self) -> list[dict[str, Any]]:
        """The jobs as maps (built once)."""
        if self._maps is None:
            maps: list[dict[str, Any]] = []
            for part in self.parts:
                if type(part) is JobRun:
                    maps += part.expand()
                else:
                    maps.append(part)
            self._maps = maps
        return self._maps

    def __len__(self) -> int:
        return self.count

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> Any:
        return self.maps()[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.maps())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PulledJobs):
            return self.maps() == other.maps()
        return isinstance(other, list) and self.maps() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PulledJobs({self.maps()!r})"

    def pack(self, encode: Callable[[Any], bytes]) -> bytes:
        """The MessagePack array of the jobs, each map as ``encode`` writes it."""
        out: list[Any] = [_headers.pack_array_header(self.count)]
        for part in self.parts:
            if type(part) is JobRun:
                part.pack_into(out, encode)
            else:
                out.append(encode(part))
        return b"".join(out)


def pulled_jobs(parts: list[Any], count: int) -> list[Any]:
    """A pull's reply jobs from ``parts``: a :class:`PulledJobs` when a run is among them."""
    for part in parts:
        if type(part) is JobRun:
            return PulledJobs(parts, count)
    return parts


def loose_jobs(jobs: Sequence[Any]) -> Sequence[Any]:
    """The jobs of a pull's reply that are not in a run (a run's jobs have no custom id, tag or name)."""
    if type(jobs) is PulledJobs:
        return [part for part in jobs.parts if type(part) is not JobRun]
    return jobs
