"""A column of optional strings, one per segment slot, packed into one buffer.

A segment's slots keep their jobs' custom ids here: a list would hold a ``str`` object of
about 50 bytes plus the id's characters, and a list slot, for each of them. Here an id is its
UTF-8 bytes in one ``bytearray`` and the offset where it ends in an ``array`` of 4-byte ints
(8 once the column holds 2 GiB): about 4 bytes a slot beyond the id's own bytes. ``None`` (a
slot without one) is stored as the bitwise complement of the offset where the previous item
ends (a negative number), so it takes no bytes of the buffer and stays apart from the empty
string.

Items are read far less often than written (a pull of such a slot makes it a job object, which
keeps its string), so each read decodes a new ``str``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator

__all__ = ["StrColumn"]


class StrColumn:
    """An append-only sequence of ``str | None`` read by index; see the module docstring."""

    __slots__ = ("_buf", "_ends")

    def __init__(self, items: Iterable[str | None] = ()) -> None:
        self._buf = bytearray()
        self._ends = array("i")
        self.extend(items)

    @classmethod
    def nones(cls, n: int) -> "StrColumn":
        """A column of ``n`` items, all ``None``."""
        column = cls()
        column._ends = array("i", [-1]) * n  # ~0: nothing stored before any of them
        return column

    def append(self, item: str | None) -> None:
        """Add ``item`` at the end."""
        buf = self._buf
        if item is not None:
            buf += item.encode("utf-8", "surrogatepass")
        end = len(buf) if item is not None else ~len(buf)
        try:
            self._ends.append(end)
        except OverflowError:  # 2 GiB of ids in one column (beyond what validated adds reach)
            self._ends = array("q", self._ends)
            self._ends.append(end)

    def extend(self, items: Iterable[str | None]) -> None:
        """Add ``items`` at the end, in order."""
        for item in items:
            self.append(item)

    def extend_nones(self, n: int) -> None:
        """Add ``n`` items that are ``None``."""
        if n > 0:
            self._ends.extend(array(self._ends.typecode, [~len(self._buf)]) * n)

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> str | None:
        ends = self._ends
        end = ends[i]
        if end < 0:
            return None
        if i < 0:
            i += len(ends)
        start = ends[i - 1] if i else 0
        if start < 0:
            start = ~start
        return self._buf[start:end].decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str | None]:
        return map(self.__getitem__, range(len(self._ends)))

    def __repr__(self) -> str:
        return f"StrColumn({list(self)!r})"
