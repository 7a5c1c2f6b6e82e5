"""Column-wise packing of PUSHB items: every item decodes to what the row-by-row path would send."""

from __future__ import annotations

from typing import Any

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.client.spark._options import parse_write
from shoal.client.spark._pack import ColumnPacker, array_header, encode_column, pack_items, packable

pytestmark = pytest.mark.spark

_TYPES = {
    "i64": (pa.int64(), st.integers(-2**63, 2**63 - 1)), "i32": (pa.int32(), st.integers(-2**31, 2**31 - 1)),
    "i8": (pa.int8(), st.integers(-128, 127)), "u64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "f64": (pa.float64(), st.floats(allow_nan=False)), "b": (pa.bool_(), st.booleans()),
    "s": (pa.string(), st.text(max_size=300)), "bin": (pa.binary(), st.binary(max_size=70_000)),
    "ls": (pa.large_string(), st.text(max_size=40)),
}


@st.composite
def _tables(draw: Any) -> tuple[pa.Schema, list[dict[str, Any]]]:
    names = draw(st.lists(st.sampled_from(sorted(_TYPES)), min_size=1, max_size=5, unique=True))
    rows = draw(st.lists(st.fixed_dictionaries({n: st.none() | _TYPES[n][1] for n in names}), max_size=12))
    return pa.schema([(n, _TYPES[n][0]) for n in names]), rows


@settings(max_examples=60, deadline=None)
@given(_tables(), st.integers(0, 10**12))
def test_whole_rows_pack_to_their_maps_with_keys(table: tuple[pa.Schema, list[dict[str, Any]]], first: int) -> None:
    schema, rows = table
    options = parse_write({"seeds": "h:1", "queue": "q"}, "w")
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    assert packable(options, schema)
    items = pack_items(options, batch, "w:7:", first).to_pylist()
    assert [msgpack.unpackb(i, raw=False) for i in items] == \
        [{"data": row, "idempotencyKey": f"w:7:{first + n}"} for n, row in enumerate(rows)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.none() | st.binary(max_size=300), max_size=20), st.sampled_from(["value", "msgpack"]))
def test_a_data_column_packs_as_a_value_or_verbatim(values: list[bytes | None], fmt: str) -> None:
    options = parse_write({"seeds": "h:1", "queue": "q", "dataColumn": "d", "dataFormat": fmt}, "w")
    stored = [msgpack.packb(v) if v is not None and fmt == "msgpack" else v for v in values]
    batch = pa.RecordBatch.from_pydict({"d": pa.array(stored, pa.binary()), "other": pa.array([1] * len(values))})
    items = [msgpack.unpackb(i, raw=False) for i in pack_items(options, batch, "w:0:", 0).to_pylist()]
    assert [i["data"] for i in items] == values


def test_shapes_it_cannot_pack_take_the_row_path() -> None:
    nested = pa.schema([("m", pa.list_(pa.int64()))])
    assert not packable(parse_write({"seeds": "h:1", "queue": "q"}, "w"), nested)
    assert encode_column(pa.array([1], pa.timestamp("us"))) is None
    flat = pa.schema([("a", pa.string())])
    assert not packable(parse_write({"seeds": "h:1", "queue": "q", "priorityColumn": "a"}, "w"), flat)
    assert not packable(parse_write({"seeds": "h:1", "queue": "q", "dataColumn": "a", "dataFormat": "json"}, "w"),
                        flat)


@pytest.mark.parametrize("shards,partition", [(1, 0), (3, 1), (4, 6)])
def test_the_packer_cuts_batches_and_routes_rows_like_the_row_path(shards: int, partition: int) -> None:
    options = parse_write({"seeds": "h:1", "queue": "q"}, "w")
    names = options.connect.queue_names(shards if shards > 1 else None)
    packer = ColumnPacker(names, partition, batch_size=7)
    out = []
    first = 0
    for size in (10, 3, 25):  # several Arrow batches; items continue the row numbering
        batch = pa.RecordBatch.from_pydict({"x": pa.array(range(first, first + size), pa.int64())})
        out += packer.add(pack_items(options, batch, f"w:{partition}:", first), first)
        first += size
    out += packer.rest()
    seen = []
    for target, count, packed in out:
        assert packed.startswith(array_header(count)) and 1 <= count <= 7
        items = msgpack.unpackb(packed, raw=False)
        assert len(items) == count
        for item in items:
            index = int(item["idempotencyKey"].rsplit(":", 1)[1])
            assert item["data"] == {"x": index}
            assert target == names[(partition + index) % len(names)]
            seen.append(index)
    assert sorted(seen) == list(range(38))
