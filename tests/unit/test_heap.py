"""The C heap trimmer: when it trims, and that the process's own glibc answers it."""

from __future__ import annotations

from types import SimpleNamespace

from shoal.node.heap import HeapTrimmer, take_trim_soon, trim_soon


class FakeLibc:
    """``(mallinfo2, malloc_trim)`` over a free-byte figure the test sets."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.trims: list[int] = []

    def __getitem__(self, i: int):  # the trimmer indexes the pair
        return (self.mallinfo2, self.malloc_trim)[i]

    def mallinfo2(self) -> SimpleNamespace:
        return SimpleNamespace(fordblks=self.free)

    def malloc_trim(self, pad: int) -> int:
        self.trims.append(pad)
        self.free = 0
        return 1


class Resident:
    """A resident-bytes figure the test sets (and the fake trim lowers)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


def test_it_trims_past_its_threshold_and_then_only_when_something_changed() -> None:
    rss = Resident(1000)
    libc = FakeLibc(free=10)

    def trim(pad: int) -> int:
        libc.trims.append(pad)
        rss.value -= 100  # the pages go back; the chunks stay free
        return 1

    libc.malloc_trim = trim  # type: ignore[method-assign]
    trimmer = HeapTrimmer(rss, free_min_bytes=100, libc=libc)
    assert trimmer.maybe_trim() == 0 and libc.trims == []
    libc.free = 150
    assert trimmer.maybe_trim() == 100 and libc.trims == [0]
    assert (trimmer.trims, trimmer.released_bytes) == (1, 100)
    assert trimmer.maybe_trim() == 0 and len(libc.trims) == 1  # the same free chunks: no second trim
    rss.value += 100  # they were used again and freed again: resident again
    assert trimmer.maybe_trim() == 100 and len(libc.trims) == 2
    libc.free = 200  # more freed
    assert trimmer.maybe_trim() == 100 and len(libc.trims) == 3
    libc.free = 20
    assert trimmer.maybe_trim() == 0
    assert trimmer.maybe_trim(free_min_bytes=10) == 100  # the watchdog's lower bar before refusing


def test_nothing_free_is_never_trimmed() -> None:
    libc = FakeLibc(free=0)
    assert HeapTrimmer(Resident(0), free_min_bytes=0, libc=libc).maybe_trim() == 0 and libc.trims == []


def test_the_process_glibc_reports_and_trims() -> None:
    from shoal.node.guard import rss_bytes

    trimmer = HeapTrimmer(rss_bytes, free_min_bytes=1)
    assert trimmer.available  # the node runs on glibc here (Debian's Python)
    blocks = [bytearray(4096) for _ in range(20_000)]  # about 80 MB through malloc
    keep = blocks[::50]
    del blocks  # most of it freed, in holes below what is kept
    assert trimmer.free_bytes() > 40 * 1024 * 1024
    assert trimmer.maybe_trim() > 0 and trimmer.trims == 1
    assert len(keep) == 400


def test_a_trim_asked_for_soon_is_taken_once() -> None:
    take_trim_soon()
    assert not take_trim_soon()
    trim_soon()
    trim_soon()
    assert take_trim_soon() and not take_trim_soon()
