"""The index of custom ids against a dict, and the column that keeps a segment's custom ids."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shoal.cluster.codec import raw_of
from shoal.node.state import PartitionEngine
from shoal.node.state._custom_ids import SMALL_MAX, CustomIds
from shoal.node.state._str_column import StrColumn

KEYS = st.text(min_size=0, max_size=6)


class IndexAgainstDict(RuleBasedStateMachine):
    """Adds, removals, lookups and listings of the index give what a dict of held jobs gives.

    ``held`` is the engine's side (which job holds which custom id); ``ref`` is the dict the index
    stands for. A job may also go without its entry being discarded (``lose``): a new job may then
    take its id. ``small_max`` 4 moves the entries between a dict and the tables both ways.
    """

    small_max = 4

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[int, str] = {}
        self.ref: dict[str, int] = {}
        self.seq = 0
        self.index = CustomIds(self.held.get, small_max=self.small_max)

    @rule(key=KEYS)
    def add(self, key: str) -> None:
        if key in self.ref and self.ref[key] in self.held:
            return  # the engine answers the job that holds it
        self.seq += 1
        self.held[self.seq] = key
        self.index[key] = self.seq
        self.ref[key] = self.seq

    @rule(key=KEYS)
    def move(self, key: str) -> None:
        """The id passes to a newer job while the older is still held (a restore's order)."""
        old = self.ref.get(key)
        if old is None or old not in self.held:
            return
        del self.held[old]
        self.seq += 1
        self.held[self.seq] = key
        self.index[key] = self.seq
        self.ref[key] = self.seq

    @rule(key=KEYS)
    def remove(self, key: str) -> None:
        seq = self.ref.pop(key, None)
        if seq is not None:
            self.index.discard(key, seq)
            self.held.pop(seq, None)

    @rule(key=KEYS)
    def lose(self, key: str) -> None:
        seq = self.ref.pop(key, None)
        if seq is not None:
            self.held.pop(seq, None)

    @rule(key=KEYS, seq=st.integers(1, 50))
    def discard_other(self, key: str, seq: int) -> None:
        """A discard naming another job's seq leaves the entry."""
        if self.ref.get(key) != seq:
            self.index.discard(key, seq)

    @rule(key=KEYS)
    def get(self, key: str) -> None:
        got = self.index.get(key)
        # an entry whose job went without a discard may still answer; the engine asks whether
        # it holds the job it names
        assert got == self.ref.get(key) or (got is not None and got not in self.held)

    @invariant()
    def lists_the_same(self) -> None:
        listed = {k: s for k, s in self.index.as_dict().items() if s in self.held}
        assert list(listed.items()) == sorted(self.ref.items(), key=lambda kv: kv[1])


class DictIndexAgainstDict(IndexAgainstDict):
    small_max = 10_000  # never leaves the dict


class TablesAgainstDict(IndexAgainstDict):
    small_max = 0  # tables from the first entry on (a quarter of 0: never a dict again)


for machine in (IndexAgainstDict, DictIndexAgainstDict, TablesAgainstDict):
    machine.TestCase.settings = settings(max_examples=100, stateful_step_count=60, deadline=None)
TestIndexAgainstDict = IndexAgainstDict.TestCase
TestDictIndexAgainstDict = DictIndexAgainstDict.TestCase
TestTablesAgainstDict = TablesAgainstDict.TestCase


def test_a_large_index_keeps_every_entry_through_its_growth() -> None:
    held = {seq: f"order-{seq:012d}" for seq in range(1, 50_001)}
    index = CustomIds(held.get)  # a dict, then tables from the 16,385th id on
    for seq, key in held.items():
        index[key] = seq
    for seq in range(1, 50_001, 2):
        index.discard(held.pop(seq), seq)
    assert len(index) == 25_000
    assert all(index.get(f"order-{seq:012d}") == (seq if seq % 2 == 0 else None) for seq in range(1, 50_001))
    index.load([(f"x{seq}", seq) for seq in range(60_000, 61_000)])
    held.update({seq: f"x{seq}" for seq in range(60_000, 61_000)})
    assert index["x60500"] == 60_500 and len(index) == 26_000


class _Colliding(str):
    """A str whose hash() is one number for all: every entry lands in one probe run."""

    def __hash__(self) -> int:
        return 0x1234_5678_9ABC


def test_equal_hashes_are_told_apart_by_the_jobs_own_ids() -> None:
    held = {seq: f"k{seq}" for seq in range(1, 41)}
    index = CustomIds(held.get, small_max=0)
    for seq in range(1, 41):
        index[_Colliding(f"k{seq}")] = seq
    assert [index.get(_Colliding(f"k{seq}")) for seq in range(1, 41)] == list(range(1, 41))
    assert index.get(_Colliding("k41")) is None
    for seq in range(1, 41, 3):
        index.discard(_Colliding(held.pop(seq)), seq)
    index[_Colliding("k99")] = 99  # takes a tombstone of the run
    held[99] = "k99"
    assert index.as_dict() == {key: seq for seq, key in sorted(held.items())}


_COLUMNS = st.lists(st.one_of(st.none(), st.text(max_size=8)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(_COLUMNS, st.integers(0, 5), _COLUMNS)
def test_a_column_reads_back_what_it_was_given(first: list[str | None], nones: int, more: list[str | None]) -> None:
    column = StrColumn(first)
    column.extend_nones(nones)
    column.extend(more)
    expected = first + [None] * nones + more
    assert list(column) == expected and len(column) == len(expected)
    assert [column[i] for i in range(-len(expected), 0)] == expected
    nones_first = StrColumn.nones(nones)
    nones_first.extend(more)
    assert list(nones_first) == [None] * nones + more


def test_a_column_keeps_lone_surrogates_and_the_empty_string() -> None:
    column = StrColumn(["\ud800x", "", None, "é"])
    assert list(column) == ["\ud800x", "", None, "é"]


def _engine_with_custom_ids(n: int) -> PartitionEngine:
    e = PartitionEngine(0)
    for first in range(0, n, 1_000):
        jobs = [{"data": raw_of(i), "customId": f"order-{i:07d}"} for i in range(first, min(n, first + 1_000))]
        e.apply({"cmd": "PUSHB", "queue": "q", "jobs": jobs}, 1_000)
    return e


def test_an_engine_past_the_dict_answers_by_custom_id_as_before_and_after_a_restore() -> None:
    n = SMALL_MAX + 1_500  # the index's entries are in its tables
    e = _engine_with_custom_ids(n)
    again = e.apply({"cmd": "PUSHB", "queue": "q", "jobs": [
        {"data": raw_of(0), "customId": "order-0000007"}, {"data": raw_of(0), "customId": "new"}]}, 2_000).result
    assert again["ids"] == ["order-0000007", "new"]
    assert e.apply({"cmd": "GetJobCounts", "queue": "q"}, 2_000).result["counts"]["waiting"] == n + 1
    found = e.apply({"cmd": "GetJobByCustomId", "queue": "q", "customId": f"order-{n - 1:07d}"}, 2_000).result
    assert found["job"]["id"] == f"order-{n - 1:07d}"
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    for engine in (e, restored):
        taken = engine.apply({"cmd": "PULLB", "queue": "q", "count": 3, "ttr": 60_000}, 3_000).result
        ids = [job["id"] for job in taken["jobs"]]
        assert ids == ["order-0000000", "order-0000001", "order-0000002"]
        engine.apply({"cmd": "ACKB", "ids": ids, "tokens": taken["tokens"]}, 3_000)
        assert engine.apply({"cmd": "GetState", "id": "order-0000001"}, 3_000).result["state"] == "completed"
    assert restored.digest() == e.digest()


def test_an_obliterated_queue_frees_its_custom_ids() -> None:
    e = _engine_with_custom_ids(SMALL_MAX + 10)
    e.apply({"cmd": "Obliterate", "queue": "q"}, 2_000)
    assert e.apply({"cmd": "GetJobByCustomId", "queue": "q", "customId": "order-0000003"}, 2_000).result == {"job": None}
    added = e.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(1), "customId": "order-0000003"}, 2_000).result
    assert added == {"id": "order-0000003"}
