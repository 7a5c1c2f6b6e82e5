"""Plain jobs kept as slots of one record per run of adds until each is touched.

A ``PUSHB`` whose items carry nothing but ``data`` (the bulk-ingest case), and single
PUSHes to one queue that carry at most a priority, a delay, a name, a group, a custom id, a tag
and an idempotency key (what ``queue.add()`` sends), would otherwise build one :class:`~._model.Job` object and one
dict slot per job on every replica. A :class:`Segment` holds consecutive such jobs as a list
of data bytes plus the few fields its jobs share (queue and the queue's defaults at push
time) and, only where its jobs differ, their priorities, creation and run-at times in packed
arrays, their groups and tags in lists, and their custom ids in a
:class:`~._str_column.StrColumn`. The engine turns a segment's job into a real ``Job``
("materializes" it) the first time anything needs it as one: a pull reaching it out of its
segment's order, a command naming its id. Until then it is waiting (or delayed), exactly as
if it had been pushed on its own.

Segments cover disjoint, increasing seq ranges, so a seq is found by bisecting
the segments' first seqs. No I/O, clock or randomness: part of the engine.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

import msgspec

from shoal.cluster.codec import Raw

from ._decimal import joined_decimal_run
from ._payloads import PayloadSpace, Stored, data_ref
from ._str_column import StrColumn

__all__ = ["Segment", "SegmentStore", "split_plain", "ack_run_of", "SLOT_GONE", "SLOT_WAITING", "SLOT_ACTIVE",
           "SLOT_COMPLETED", "SLOT_READY", "SLOT_DELAYED", "SLOT_HELD", "SEGMENT_SLOTS_MAX"]

#: A segment slot's state: let go (materialized or removed), or the state of the job it holds.
#: ``SLOT_WAITING`` is a waiting job of priority 0, which the segment's one ready-heap entry (at
#: ``low``) covers; ``SLOT_READY`` a waiting job taken one at a time (one with a priority, a custom
#: id or a tag, or one that came due after a delay): the segment's cursor of its priority covers
#: it (``Segment.cursors``; a grouped one has an entry in its group's heap instead), and
#: ``SLOT_DELAYED`` a delayed job with its delayed-heap entry, as a job object has them.
SLOT_GONE, SLOT_WAITING, SLOT_ACTIVE, SLOT_COMPLETED, SLOT_READY, SLOT_DELAYED = 0, 1, 2, 3, 4, 5
#: Every code of a slot that holds a job.
SLOT_HELD = (SLOT_WAITING, SLOT_ACTIVE, SLOT_COMPLETED, SLOT_READY, SLOT_DELAYED)
#: Most slots later adds extend a segment to (a restore cuts its runs at the same size): a
#: segment's per-slot lease lists are made whole at its first lease.
SEGMENT_SLOTS_MAX = 10_000

_PLAIN_FIELDS = frozenset({"data", "idempotencyKey", "name"})


def split_plain(items: list[dict[str, Any]]) -> tuple[list[Any], list[str | None] | None,
                                                       list[str | None] | None] | None:
    """``(datas, keys, names)`` of PUSHB items that carry only ``data`` (and maybe
    ``idempotencyKey`` and ``name``, bunqueue's job name).

    ``keys`` / ``names`` are None when no item has one; the result is None when any item
    has another field (priority, delay, group, ...): such a batch's items are added one by
    one (as slots where a single add's would be, ``_push._push_batch``). A
    ``Raw`` data becomes its packed bytes (what the engine stores); any other value stays.
    """
    keyed = named = False
    for item in items:
        if len(item) != 1:
            if "data" not in item or len(item) > 3 or not item.keys() <= _PLAIN_FIELDS:
                return None
            keyed = keyed or "idempotencyKey" in item
            named = named or "name" in item
    datas = [d.packed if type(d) is Raw else d for d in [item["data"] for item in items]]
    return (datas, [item.get("idempotencyKey") for item in items] if keyed else None,
            [item.get("name") for item in items] if named else None)


def plain_ack(cmd: dict[str, Any]) -> bool:
    """True when an ACKB stores nothing beyond the completion: no result (bunqueue's client sends
    ``null`` for each job whose processor returned nothing) and no removeOnComplete."""
    results = cmd.get("results")
    if results and results.count(None) != len(results):
        return False
    removes = cmd.get("removeOnCompletes")
    return not removes or not any(removes)


def ack_run_of(partition: int, ids: list[Any], tokens: list[Any] | None) -> tuple[int, int, int] | None:
    """``(first seq, count, first lease number or -1)`` when an ACKB names ``partition``'s jobs
    ``first .. first+count-1`` in that order and ``tokens`` (if given) are their consecutive
    lease tokens: how a consumer acks what one PULLB gave it. None for any other batch.

    Checked as whole strings (``map(str)`` and ``join`` run in C): no string per job.
    """
    k = len(ids)
    if not k or (tokens is not None and len(tokens) != k):
        return None
    first = _number_after(f"{partition}-", ids)
    if first is None:
        return None
    lease = -1
    if tokens is not None:
        lease_first = _number_after(f"{partition}.", tokens)
        if lease_first is None:
            return None
        lease = lease_first
    return first, k, lease


def _number_after(prefix: str, texts: list[Any]) -> int | None:
    """N when ``texts`` are exactly ``prefix + str(N + i)`` for i = 0, 1, ..."""
    head = texts[0]
    if type(head) is not str or not head.startswith(prefix):
        return None
    digits = head[len(prefix):]
    if not (digits.isdigit() and digits.isascii() and len(digits) < 20):
        return None
    n = int(digits)
    try:
        joined = "\n".join(texts)
    except TypeError:
        return None
    if joined != joined_decimal_run(prefix, n, len(texts)):
        return None
    return n


class Segment:
    """Consecutive plain jobs of one queue still held as one record.

    Per slot ``i`` (job ``first + i``): ``states[i]`` is one of the ``SLOT_*`` codes
    (``SLOT_GONE`` once the job materialized or was removed); its data is the ``lens[i]``
    bytes at ``base + offs[i]`` of the partition's payload ``space`` (:mod:`._payloads`; 4-byte
    offsets from the segment's first, 8-byte ones once they span 4 GiB), or, in a
    segment whose jobs' data is not all bytes (tools and tests may push Python values),
    ``inline[i]``. ``priorities`` (4-byte ints: the schema keeps a priority within a million
    either way), ``createds`` and ``run_ats`` exist only once some slot's value differs from
    the common one (priority 0, ``created_ms``, its creation time),
    ``groups`` only once some slot's job has a group (a grouped waiting slot is ``SLOT_READY``:
    its heap entry is in its group's heap, never the queue's ready heap), and ``custom_ids`` and
    ``tags`` only once one has a custom id or a tag (such a slot is ``SLOT_READY`` too, and a
    pull makes it a job object before leasing it). A
    leased slot keeps its lease number, deadline and session, a completed one its finish time;
    those four lists exist only once the segment's first job is leased. Waiting slots are
    leased in place (``SLOT_WAITING`` ones as runs); a delayed slot comes due in place.

    ``cursors`` maps a priority to the seq of the one ready-heap entry the segment's
    ``SLOT_READY`` slots of that priority without a group share (None: no such entry): no
    slot after it of that priority waits unseen, and as the slot it names is taken the entry
    moves on to the next such slot (``_store.Store._next_cursor``). So a waiting job with a
    priority costs its slot, not an int in the heap.
    """

    __slots__ = ("first", "space", "base", "offs", "lens", "inline", "queue", "created_ms", "max_attempts", "backoff_ms",
                 "ttr_ms", "low", "left", "held", "states", "lease_nos", "deadlines", "sessions", "finished",
                 "names", "priorities", "createds", "run_ats", "groups", "custom_ids", "tags", "cursors")

    def __init__(self, first: int, datas: list[Any], queue: str, created_ms: int,
                 max_attempts: int, backoff_ms: int, ttr_ms: int, names: list[str | None] | None = None,
                 states: bytearray | None = None, priorities: array | None = None,
                 createds: array | None = None, run_ats: array | None = None, *, space: PayloadSpace,
                 groups: list[str | None] | None = None, custom_ids: list[str | None] | None = None,
                 tags: list[str | None] | None = None) -> None:
        self.first = first
        self.space = space
        self.base = 0
        self.offs: array | None = None
        self.lens: array | None = None
        self.inline: list[Any] | None = None
        self._place(datas)
        self.names = names         # per slot its job's name (bunqueue's), or None when none has one
        self.queue = queue
        self.created_ms = created_ms
        self.max_attempts = max_attempts
        self.backoff_ms = backoff_ms
        self.ttr_ms = ttr_ms
        self.priorities = priorities
        self.createds = createds
        self.run_ats = run_ats
        self.groups = groups       # per slot its job's group, or None when none has one
        # per slot its job's custom id, or None when none has one
        self.custom_ids = StrColumn(custom_ids) if custom_ids is not None else None
        self.tags = tags           # per slot its job's tag, or None when none has one
        self.cursors: dict[int, int] | None = None  # not replicated: a restore sets them anew
        n = len(datas)
        self.states = bytearray([SLOT_WAITING]) * n if states is None else states
        self.left = self.states.count(SLOT_WAITING) if states is not None else n   # SLOT_WAITING slots
        low = self.states.find(SLOT_WAITING) if states is not None else 0
        self.low = first + low if self.left else 0   # lowest SLOT_WAITING seq (0: none): the ready heap's entry
        self.held = n              # slots not gone
        self.lease_nos: list[int] = []
        self.deadlines: list[int] = []
        self.sessions: list[str | None] = []
        self.finished: list[int] = []

    def _place(self, datas: list[Any]) -> None:
        """Keep ``datas`` as the data of slots ``len(self.states) ..``: in one append to the
        space when they are all bytes and the segment keeps its data there."""
        if not datas:
            return
        if self.inline is None and type(datas[0]) is bytes:
            try:
                blob = b"".join(datas)  # a TypeError at the first item that is not bytes
            except TypeError:
                blob = None
            if blob is not None:
                start = self.space.append(blob)
                sizes = list(map(len, datas))  # lists and fromlist: a third cheaper than arrays of iterators
                if self.offs is None:
                    self.base = start
                starts = list(accumulate(sizes, initial=start - self.base))
                starts.pop()  # where the last one ends
                self._add(starts, sizes)
                return
        if self.inline is None and type(datas[0]) is Stored and all(
                type(d) is Stored and d.space is self.space for d in datas):
            # Data a job object held (``_push._segment_of``): the slot takes over its bytes.
            if self.offs is None:
                self.base = datas[0].start
            self._add([d.start - self.base for d in datas], [d.end - d.start for d in datas])
            return
        if self.inline is None:  # a value that is not bytes: every slot's data kept inline from now on
            held: list[Any] = []
            if self.offs is not None:
                for i, code in enumerate(self.states):
                    held.append(self.data(i) if code != SLOT_GONE else None)
                    if code != SLOT_GONE:
                        self.release(i, i + 1)
            self.inline, self.offs, self.lens = held, None, None
        self.inline.extend(d.packed if type(d) is Stored else d for d in datas)

    def _add(self, starts: list[int], sizes: list[int]) -> None:
        """Offsets (from ``base``) and lengths of more slots' data."""
        if self.offs is None:
            self.offs, self.lens = array("I"), array("I")
        try:
            self.offs.fromlist(starts)  # unchanged when a value does not fit
        except OverflowError:  # the segment's data spans 4 GiB of the space: 8-byte offsets
            self.offs = array("q", self.offs)
            self.offs.fromlist(starts)
        self.lens.fromlist(sizes)  # type: ignore[union-attr]

    @property
    def end(self) -> int:
        """The seq after the segment's last slot."""
        return self.first + len(self.states)

    def data(self, i: int) -> Any:
        """Slot ``i``'s data (read from the space)."""
        if self.inline is not None:
            return self.inline[i]
        start = self.base + self.offs[i]  # type: ignore[index]
        return self.space.read(start, start + self.lens[i])  # type: ignore[index]

    def job_data(self, i: int) -> Any:
        """Slot ``i``'s data as a job object made of the slot holds it: where it is stored (a
        :class:`Stored`), or the value itself in a segment that holds its data inline."""
        if self.inline is not None:
            return self.inline[i]
        start = self.base + self.offs[i]  # type: ignore[index]
        return Stored(self.space, start, start + self.lens[i])  # type: ignore[index]

    def stored(self, i: int) -> Raw:
        """Slot ``i``'s data as a reply carries it: where it is stored, read when encoded."""
        data = self.job_data(i)
        return data if self.inline is None else Raw(data)

    def run_data(self, i: int, j: int) -> list[Any]:
        """The data of slots ``i .. j-1`` as a pull's reply carries it: read at once where they
        are stored one after another (a batch's jobs are; each job's data a ``msgspec.Raw``
        over the run's bytes), else as references read when the reply is encoded. A read that
        fails gives references too: the pull is applied alike on every replica, and the
        failure is its reply's (the frame encoder's refusal)."""
        if self.inline is not None:
            return [Raw(d) for d in self.inline[i:j]]
        read = self.run_blob(i, j)
        if read is None:
            return [self.stored(k) for k in range(i, j)]
        blob, cuts = read
        # msgspec's own Raw over slices of one buffer: made in C, no copy, and the frame
        # encoder splices it without calling back into Python for each job.
        return list(map(msgspec.Raw, map(memoryview(blob).__getitem__, map(slice, cuts, cuts[1:]))))

    def run_blob(self, i: int, j: int) -> tuple[Any, list[int]] | None:
        """The data of slots ``i .. j-1`` read at once, and where each slot's begins in it (and
        the end): None unless they are stored one after another in the payload space and the
        read succeeds."""
        if self.inline is not None:
            return None
        offs, lens, at = self.offs, self.lens, self.base
        base = at + offs[i]  # type: ignore[index]
        end = at + offs[j - 1] + lens[j - 1]  # type: ignore[index]
        if end - base != sum(lens[i:j]):  # type: ignore[index]
            return None
        try:
            blob = self.space.read(base, end)
        except OSError:
            return None
        return blob, list(accumulate(lens[i:j], initial=0))  # type: ignore[index]

    def run_bytes(self, i: int, j: int) -> list[Any]:
        """The data of slots ``i .. j-1`` (all held) as values: bytes read at once where they are
        stored one after another, else one read each (a snapshot's; OSError if a read fails)."""
        if self.inline is not None:
            return self.inline[i:j]
        offs, lens, read = self.offs, self.lens, self.space.read
        base = self.base + offs[i]  # type: ignore[index]
        end = self.base + offs[j - 1] + lens[j - 1]  # type: ignore[index]
        if end - base != sum(lens[i:j]):  # type: ignore[index]
            starts = [self.base + offs[k] for k in range(i, j)]  # type: ignore[index]
            return [bytes(read(a, a + n)) for a, n in zip(starts, lens[i:j])]  # type: ignore[index]
        blob = bytes(read(base, end))
        cuts = list(accumulate(lens[i:j], initial=0))  # type: ignore[index]
        return list(map(blob.__getitem__, map(slice, cuts, cuts[1:])))

    def run_refs(self, i: int, j: int) -> list[Any]:
        """The data of slots ``i .. j-1`` (all held) as a snapshot that refers to the payload
        space writes them (:func:`~._payloads.data_ref`; values held inline as they are)."""
        if self.inline is not None:
            return self.inline[i:j]
        base, offs, lens = self.base, self.offs, self.lens
        return [data_ref(base + offs[k], base + offs[k] + lens[k]) for k in range(i, j)]  # type: ignore[index]

    def data_bytes(self, i: int, j: int) -> int:
        """Bytes of the data of slots ``i .. j-1``."""
        if self.inline is not None:
            return sum(map(len, self.inline[i:j]))  # type: ignore[arg-type]
        return sum(self.lens[i:j])  # type: ignore[index]

    def data_len(self, i: int) -> int:
        """Bytes of slot ``i``'s data."""
        return len(self.inline[i]) if self.inline is not None else self.lens[i]  # type: ignore[index]

    def release(self, i: int, j: int) -> None:
        """Slots ``i .. j-1``, all held until now, are gone: their data's bytes are released
        (neighbouring slots' bytes in one call)."""
        if self.inline is not None:
            self.inline[i:j] = [None] * (j - i)
            return
        offs, lens, space, at = self.offs, self.lens, self.space, self.base
        start = at + offs[i]  # type: ignore[index]
        end = at + offs[j - 1] + lens[j - 1]  # type: ignore[index]
        if end - start == sum(lens[i:j]):  # type: ignore[index]  # stored one after another
            space.release(start, end)
            return
        end = start
        for k in range(i, j):
            here = at + offs[k]  # type: ignore[index]
            if here != end:
                space.release(start, end)
                start = here
            end = here + lens[k]  # type: ignore[index]
        space.release(start, end)

    def priority(self, i: int) -> int:
        return self.priorities[i] if self.priorities is not None else 0

    def custom_id(self, i: int) -> str | None:
        """Slot ``i``'s custom id (its job's id on the wire), if it has one."""
        return self.custom_ids[i] if self.custom_ids is not None else None

    def leased_as_job(self, i: int) -> bool:
        """True when slot ``i``'s job has a custom id or a tag: a pull makes it a job object,
        whose reply carries them, instead of leasing it in place."""
        return ((self.custom_ids is not None and self.custom_ids[i] is not None)
                or (self.tags is not None and self.tags[i] is not None))

    def created(self, i: int) -> int:
        return self.createds[i] if self.createds is not None else self.created_ms

    def run_at(self, i: int) -> int:
        return self.run_ats[i] if self.run_ats is not None else self.created(i)

    def append(self, data: bytes, code: int, priority: int, created: int, run_at: int, name: str | None,
               group: str | None = None, custom_id: str | None = None, tag: str | None = None) -> None:
        """One more slot, the job ``end`` (see :meth:`SegmentStore.append`)."""
        n = len(self.states)
        if tag is not None and self.tags is None:
            self.tags = [None] * n
        if self.tags is not None:
            self.tags.append(tag)
        if group is not None and self.groups is None:
            self.groups = [None] * n
        if self.groups is not None:
            self.groups.append(group)
        if custom_id is not None and self.custom_ids is None:
            self.custom_ids = StrColumn.nones(n)
        if self.custom_ids is not None:
            self.custom_ids.append(custom_id)
        if priority and self.priorities is None:
            self.priorities = array("i", [0]) * n
        if created != self.created_ms and self.createds is None:
            self.createds = array("q", [self.created_ms]) * n
        if run_at != created and self.run_ats is None:
            self.run_ats = array("q", [self.created(i) for i in range(n)])
        if name is not None and self.names is None:
            self.names = [None] * n
        if self.priorities is not None:
            self.priorities.append(priority)
        if self.createds is not None:
            self.createds.append(created)
        if self.run_ats is not None:
            self.run_ats.append(run_at)
        if self.names is not None:
            self.names.append(name)
        if self.lease_nos:
            self.lease_nos.append(0)
            self.deadlines.append(0)
            self.sessions.append(None)
            self.finished.append(0)
        if self.offs is not None and type(data) is bytes:
            self._add([self.space.append(data) - self.base], [len(data)])
        else:
            self._place([data])
        self.states.append(code)
        self.held += 1
        if code == SLOT_WAITING:
            if not self.left:
                self.low = self.first + n
            self.left += 1

    def _lease_lists(self) -> None:
        if not self.lease_nos:
            n = len(self.states)
            self.lease_nos = [0] * n
            self.deadlines = [0] * n
            self.sessions = [None] * n
            self.finished = [0] * n

    def extend(self, datas: list[Any], created: int, names: list[str | None] | None) -> None:
        """``len(datas)`` more waiting priority-0 slots, jobs added at ``created`` (see
        :meth:`SegmentStore.extend`)."""
        n, k = len(self.states), len(datas)
        if created != self.created_ms and self.createds is None:
            self.createds = array("q", [self.created_ms]) * n
        if names is not None and self.names is None:
            self.names = [None] * n
        if self.priorities is not None:
            self.priorities.extend(array("i", [0]) * k)
        if self.createds is not None:
            self.createds.extend(array("q", [created]) * k)
        if self.run_ats is not None:
            self.run_ats.extend(array("q", [created]) * k)
        if self.names is not None:
            self.names.extend(names if names is not None else [None] * k)
        if self.groups is not None:
            self.groups.extend([None] * k)
        if self.custom_ids is not None:
            self.custom_ids.extend_nones(k)
        if self.tags is not None:
            self.tags.extend([None] * k)
        if self.lease_nos:
            self.lease_nos.extend([0] * k)
            self.deadlines.extend([0] * k)
            self.sessions.extend([None] * k)
            self.finished.extend([0] * k)
        self._place(datas)
        self.states.extend(bytes([SLOT_WAITING]) * k)
        self.held += k
        if not self.left:
            self.low = self.first + n
        self.left += k

    def lease_one(self, i: int, lease_no: int, deadline: int, session: str | None) -> bool:
        """Lease waiting slot ``i`` under lease number ``lease_no``; True when it was a
        ``SLOT_WAITING`` slot (``low`` then moved on to the next one, or to 0)."""
        if not self.lease_nos:
            self._lease_lists()
        states = self.states
        plain = states[i] == SLOT_WAITING
        states[i] = SLOT_ACTIVE
        self.lease_nos[i] = lease_no
        self.deadlines[i] = deadline
        self.sessions[i] = session
        if plain:
            self.left -= 1
            nxt = states.find(SLOT_WAITING, i + 1) if self.left else -1
            self.low = 0 if nxt < 0 else self.first + nxt
        return plain

    def lease_run(self, i: int, k: int, lease_base: int, deadline: int, session: str | None) -> None:
        """Lease ``SLOT_WAITING`` slots ``i .. i+k-1`` (lease numbers from ``lease_base + 1``);
        moves ``low`` on."""
        self._lease_lists()
        end = i + k
        self.states[i:end] = bytes([SLOT_ACTIVE]) * k
        self.lease_nos[i:end] = range(lease_base + 1, lease_base + k + 1)
        self.deadlines[i:end] = [deadline] * k
        self.sessions[i:end] = [session] * k
        self.left -= k
        nxt = self.states.find(SLOT_WAITING, end) if self.left else -1
        self.low = 0 if nxt < 0 else self.first + nxt

    def run_end(self, i: int, limit: int) -> int:
        """First index in ``i .. limit`` that is not a ``SLOT_WAITING`` slot (``limit`` if none)."""
        states = self.states
        for code in (SLOT_GONE, SLOT_ACTIVE, SLOT_COMPLETED, SLOT_READY, SLOT_DELAYED):
            j = states.find(code, i, limit)
            if j >= 0:
                limit = j
        return limit


class SegmentStore:
    """Every segment of one partition, by first seq, and the payload space holding their data."""

    __slots__ = ("_by_first", "_firsts", "jobs", "space", "custom_ids")

    def __init__(self, space: PayloadSpace) -> None:
        self.space = space
        self._by_first: dict[int, Segment] = {}
        self._firsts: list[int] = []   # ascending: seqs only grow
        self.jobs = 0                  # held jobs over all segments
        self.custom_ids = False        # whether any slot was given a custom id (never reset)

    def __bool__(self) -> bool:
        return bool(self._firsts)

    def __iter__(self) -> Iterator[Segment]:
        """Segments in seq order."""
        return self.since(0)

    def since(self, seq: int) -> Iterator[Segment]:
        """Segments in seq order from the one that may hold ``seq`` on (found by bisection)."""
        firsts = self._firsts
        by_first = self._by_first
        return (by_first[f] for f in firsts[max(0, bisect_right(firsts, seq) - 1):])

    def add(self, segment: Segment) -> None:
        if segment.custom_ids is not None:
            self.custom_ids = True
        self._by_first[segment.first] = segment
        self._firsts.append(segment.first)
        self.jobs += segment.held

    def last(self) -> Segment | None:
        """The segment holding the highest seqs, if any."""
        return self._by_first[self._firsts[-1]] if self._firsts else None

    def append(self, segment: Segment, data: bytes, code: int, priority: int, created: int, run_at: int,
               name: str | None, group: str | None = None, custom_id: str | None = None,
               tag: str | None = None) -> None:
        """Job ``segment.end`` as one more slot of ``segment``, the last segment (seqs stay disjoint)."""
        if custom_id is not None:
            self.custom_ids = True
        segment.append(data, code, priority, created, run_at, name, group, custom_id, tag)
        self.jobs += 1

    def extend(self, segment: Segment, datas: list[Any], created: int, names: list[str | None] | None) -> None:
        """Jobs ``segment.end ..`` as more waiting slots of ``segment``, the last segment."""
        segment.extend(datas, created, names)
        self.jobs += len(datas)

    def covering(self, seq: int) -> Segment | None:
        """The segment whose slots span ``seq``, whether or not it still holds it."""
        firsts = self._firsts
        if not firsts or seq < firsts[0]:
            return None
        segment = self._by_first[firsts[bisect_right(firsts, seq) - 1]]
        return segment if seq - segment.first < len(segment.states) else None

    def find(self, seq: int) -> Segment | None:
        """The segment still holding ``seq`` (in any state), if any."""
        firsts = self._firsts
        if not firsts or seq < firsts[0]:
            return None
        segment = self._by_first[firsts[bisect_right(firsts, seq) - 1]]
        i = seq - segment.first
        states = segment.states
        if i < len(states) and states[i] != SLOT_GONE:
            return segment
        return None

    def take(self, segment: Segment, seq: int) -> None:
        """Let go of slot ``seq``: its job materialized, and the job object made of it
        (:func:`~._model.slot_job`) holds its data now.

        A waiting slot that was ``low`` moves ``low`` to the next waiting one.
        """
        i = seq - segment.first
        states = segment.states
        assert states[i] != SLOT_GONE
        if segment.inline is not None:
            segment.inline[i] = None
        was_waiting = states[i] == SLOT_WAITING
        states[i] = SLOT_GONE
        self.gone(segment, 1)
        if was_waiting:
            segment.left -= 1
            if seq == segment.low:
                nxt = states.find(SLOT_WAITING, i + 1) if segment.left else -1
                segment.low = 0 if nxt < 0 else segment.first + nxt

    def gone(self, segment: Segment, n: int) -> None:
        """``n`` slots of ``segment`` were let go (their states already ``SLOT_GONE``, their data
        released)."""
        segment.held -= n
        self.jobs -= n
        if segment.held == 0:
            del self._by_first[segment.first]
            firsts = self._firsts
            del firsts[bisect_right(firsts, segment.first) - 1]
            segment.low = 0

    def clear(self) -> None:
        self._by_first.clear()
        self._firsts.clear()
        self.jobs = 0
