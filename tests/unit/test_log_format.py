"""The data entry codec (:mod:`shoal.node.partition.log_format`): format 1 round trips, the reader of
release a0861d3's pickled entries runs nothing, and any other payload is a clear error."""

from __future__ import annotations

import math
import pickle  # only to write the legacy entries the reader must read or refuse
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.cluster.codec import Raw
from shoal.node.partition import log_format
from shoal.node.partition.log_format import (FORMAT_VERSION, LEGACY_PICKLE, LegacyEntryError, LogFormatError,
                                             decode_batch, encode_batch, payload_version, read_legacy_batch)
from shoal.node.state import AckRun, PushBatch, PushRun, SessionPull

pytestmark = pytest.mark.timeout(120)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- strategies -------------------------------------------------------------------------------------

def same(value: Any) -> Any:
    """``value`` with every type the engine tells apart kept and a tuple as a list (format 1
    writes both as arrays); floats by their bits, so NaN compares."""
    kind = type(value)
    if kind is Raw:
        return ("raw", value.packed)
    if kind is bytes:
        return ("bytes", value)
    if kind is msgpack.ExtType:
        return ("ext", value.code, value.data)
    if kind is msgpack.Timestamp:
        return ("ts", value.seconds, value.nanoseconds)
    if kind in (list, tuple):
        return ("list", [same(v) for v in value])
    if kind is dict:
        return ("dict", [(same(k), same(v)) for k, v in value.items()])
    if kind is float:
        return ("float", value.hex() if not math.isnan(value) else "nan")
    if isinstance(value, msgspec.Struct):
        return (type(value).__name__, [same(getattr(value, f)) for f in value.__struct_fields__])
    return (kind.__name__, value)


ints = st.integers(-(2**63), 2**64 - 1)
raws = st.builds(lambda v: Raw(msgpack.packb(v, use_bin_type=True)), st.one_of(st.text(max_size=10), ints))
exts = st.builds(msgpack.ExtType, st.integers(1, 127), st.binary(max_size=12))
timestamps = st.builds(msgpack.Timestamp, st.integers(0, 2**34 - 1), st.integers(0, 999_999_999))
keys = st.one_of(st.text(max_size=8), ints, st.binary(max_size=8), st.none(), exts, timestamps, raws)
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(), st.text(max_size=20), st.binary(max_size=20),
                    raws, exts, timestamps)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(keys, inner, max_size=4)), max_leaves=16)
names = st.text(min_size=1, max_size=12)
dict_commands = st.builds(lambda cmd, rest: {"cmd": cmd, **rest}, names, st.dictionaries(names, values, max_size=5))
opt_strs = st.none() | st.lists(st.none() | st.text(max_size=6), min_size=1, max_size=4)
datas = st.lists(st.binary(max_size=40), max_size=6)
typed = st.one_of(
    st.builds(PushRun, names, datas, opt_strs, opt_strs),
    st.builds(PushBatch, names, datas, opt_strs, opt_strs),
    st.builds(AckRun, st.integers(0, 2**62), st.integers(1, 10_000), st.integers(-1, 2**62)),
    st.builds(SessionPull, dict_commands, st.none() | st.text(max_size=8), st.integers(0, 2**40)),
)
commands = st.lists(dict_commands | typed, max_size=6)
stamps = st.integers(0, 2**63 - 1)


# --- format 1 -----------------------------------------------------------------------------------------

@SETTINGS
@given(stamps, commands)
def test_a_batch_round_trips(now_ms: int, cmds: list[Any]) -> None:
    payload = encode_batch(now_ms, cmds)
    assert payload[:2] == bytes([0, FORMAT_VERSION]) and payload_version(payload) == FORMAT_VERSION
    got_ms, got = decode_batch(payload)
    assert got_ms == now_ms
    assert [same(c) for c in got] == [same(c) for c in cmds]
    assert [type(c) for c in got] == [type(c) for c in cmds]
    assert encode_batch(now_ms, cmds) == payload  # the same batch, the same bytes


def test_job_data_stays_the_bytes_the_client_sent() -> None:
    packed = msgpack.packb({"to": "ana", "blob": bytes(range(256))})
    run = PushRun("q", [packed, b"\xc0"])
    cmd = {"cmd": "Update", "id": "3-1", "data": Raw(packed)}
    payload = encode_batch(5, [run, cmd])
    assert packed in payload  # spliced verbatim, never re-encoded
    _, (got_run, got_cmd) = decode_batch(payload)
    assert got_run.datas == [packed, b"\xc0"] and type(got_cmd["data"]) is Raw and got_cmd["data"].packed == packed


def test_a_clients_extension_values_keep_their_codes() -> None:
    result = {"at": msgpack.Timestamp(1, 999_999_999), "set": msgpack.ExtType(115, b"\x93\x01\x02\x03"),
              msgpack.ExtType(1, b"k"): [msgpack.ExtType(127, b"")]}
    _, [cmd] = decode_batch(encode_batch(1, [{"cmd": "ACK", "id": "3-1", "result": result}]))
    assert cmd["result"] == result
    assert cmd["result"]["at"].nanoseconds == 999_999_999


def test_the_callers_commands_are_not_changed() -> None:
    cmd = {"cmd": "ACK", "id": "3-1", "result": {"x": msgpack.ExtType(5, b"a")}}
    encode_batch(1, [cmd])
    assert type(cmd["result"]["x"]) is msgpack.ExtType


@pytest.mark.parametrize("command, row", list(log_format.ROWS.items()))
def test_each_row_mirrors_its_typed_command(command: type[msgspec.Struct], row: type[msgspec.Struct]) -> None:
    """A field added to a typed command must be added to its row (at the end, with a default)."""
    assert row is not command
    assert command.__struct_fields__ == row.__struct_fields__
    assert command.__struct_defaults__ == row.__struct_defaults__


def test_every_typed_command_has_a_row() -> None:
    from shoal.node.state import TypedCommand
    assert set(log_format.ROWS) == set(TypedCommand.__args__)


@pytest.mark.parametrize("cmds, problem", [
    ([object()], "object is not a command"),
    ([PushRun(5, [b"x"])], "PushRun with fields of the wrong types"),  # type: ignore[arg-type]
    ([AckRun(1, "2")], "AckRun with fields of the wrong types"),  # type: ignore[arg-type]
    ([{"cmd": "X", "v": object()}], "cannot write the batch"),
    ([{"cmd": "X", "v": 2**64}], "cannot write the batch"),
])
def test_what_format_1_cannot_carry_is_refused_when_written(cmds: list[Any], problem: str) -> None:
    with pytest.raises(LogFormatError, match=problem):
        encode_batch(1, cmds)


# --- hostile and unknown payloads ---------------------------------------------------------------------

def _decodes_or_refuses(payload: bytes) -> None:
    try:
        now_ms, cmds = decode_batch(payload, 77)
    except LogFormatError as exc:
        assert exc.index == 77 and str(exc).startswith("data entry 77")
        return
    assert type(now_ms) is int and type(cmds) is list


@SETTINGS
@given(st.binary(max_size=200))
def test_random_bytes_are_refused_clearly(body: bytes) -> None:
    _decodes_or_refuses(body)
    _decodes_or_refuses(bytes([0, FORMAT_VERSION]) + body)
    _decodes_or_refuses(bytes([0, LEGACY_PICKLE]) + body)


@SETTINGS
@given(stamps, commands, st.data())
def test_damaged_payloads_are_refused_clearly(now_ms: int, cmds: list[Any], data: st.DataObject) -> None:
    payload = bytearray(encode_batch(now_ms, cmds))
    cut = data.draw(st.integers(2, len(payload)))
    _decodes_or_refuses(bytes(payload[:cut]))
    at = data.draw(st.integers(2, len(payload) - 1))
    payload[at] ^= data.draw(st.integers(1, 255))
    _decodes_or_refuses(bytes(payload))


@pytest.mark.parametrize("version", [0, 2, 0x7F, 0x81, 0xFF])
def test_an_unknown_version_names_the_entry_and_the_version(version: int) -> None:
    with pytest.raises(LogFormatError, match=rf"data entry 12 \(format version {version:#04x}\): unknown format"):
        decode_batch(bytes([0, version]) + b"\x92\x01\x90", 12)


@pytest.mark.parametrize("payload", [b"", b"\x00", b"\x01\x01", b"\x02"])
def test_a_payload_without_kind_and_version_is_refused(payload: bytes) -> None:
    with pytest.raises(LogFormatError, match="not a data entry payload"):
        decode_batch(payload, 3)


@pytest.mark.parametrize("body, problem", [
    (msgpack.packb([1]), "Expected `array` of length 2"),
    (msgpack.packb(["x", []]), "Expected `int`, got `str`"),
    (msgpack.packb([1, [[9, "q"]]]), "Invalid value 9"),
    (msgpack.packb([1, [[1, 5, []]]]), "Expected `str`, got `int`"),
    (msgpack.packb([1, [{"d": msgpack.ExtType(9, b"")}]]), "unknown extension type 9"),
    (msgpack.packb([1, []]) + b"\x00", "trailing characters"),
])
def test_a_malformed_body_names_what_is_wrong(body: bytes, problem: str) -> None:
    with pytest.raises(LogFormatError, match=problem) as caught:
        decode_batch(bytes([0, FORMAT_VERSION]) + body, 4)
    assert caught.value.version == FORMAT_VERSION and caught.value.__cause__ is None


# --- release a0861d3's pickled entries ------------------------------------------------------------------

legacy_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=20),
              st.binary(max_size=20), raws, exts, timestamps),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple),
                            st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.binary(max_size=4), exts),
                                            inner, max_size=4)),
    max_leaves=16)
legacy_dicts = st.builds(lambda cmd, rest: {"cmd": cmd, **rest}, names,
                         st.dictionaries(names, legacy_values, max_size=5))
legacy_commands = st.lists(legacy_dicts | typed, max_size=6)


def legacy_same(value: Any) -> Any:
    """Like :func:`same`, but a tuple stays a tuple: the legacy reader gives back what was pickled."""
    if type(value) is tuple:
        return ("tuple", [legacy_same(v) for v in value])
    if type(value) is list:
        return ("list", [legacy_same(v) for v in value])
    if type(value) is dict:
        return ("dict", [(legacy_same(k), legacy_same(v)) for k, v in value.items()])
    if isinstance(value, msgspec.Struct):
        return (type(value).__name__, [legacy_same(getattr(value, f)) for f in value.__struct_fields__])
    return same(value)


def legacy_payload(now_ms: Any, cmds: Any) -> bytes:
    """A data entry as release a0861d3 wrote it."""
    return bytes([0]) + pickle.dumps((now_ms, cmds), protocol=5)


@SETTINGS
@given(stamps, legacy_commands)
def test_a_legacy_entry_reads_as_the_release_wrote_it(now_ms: int, cmds: list[Any]) -> None:
    payload = legacy_payload(now_ms, cmds)
    assert payload_version(payload) == LEGACY_PICKLE
    got_ms, got = decode_batch(payload)
    assert got_ms == now_ms
    assert [legacy_same(c) for c in got] == [legacy_same(c) for c in cmds]


def test_shared_values_in_a_legacy_entry_are_read_through_the_memo() -> None:
    shared = {"k": [1, 2]}
    stamp = msgpack.Timestamp(3, 4)
    cmds = [{"cmd": "A", "x": shared, "y": shared, "t": stamp, "u": stamp, "q": "same"}, {"cmd": "B", "z": shared}]
    _, got = decode_batch(legacy_payload(1, cmds))
    assert got == cmds and got[0]["x"] is got[0]["y"] is got[1]["z"] and got[0]["t"] is got[0]["u"]


CALLS: list[str] = []


def record(what: str) -> str:
    CALLS.append(what)
    return what


class Sneaky:
    """An object whose unpickling would call :func:`record`."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (record, ("ran",))


class Plain:
    """A class of this module: not a class a legacy entry may name."""


@pytest.mark.parametrize("cmds, problem", [
    ([Sneaky()], "refused class tests.unit.test_log_format.record|refused class test_log_format.record"),
    ([{"cmd": "X", "v": Sneaky()}], "refused class"),
    ([{"cmd": "X", "v": {1, 2}}], "refused opcode EMPTY_SET"),
    ([{"cmd": "X", "v": frozenset()}], "refused opcode"),
    ([{"cmd": "X", "v": bytearray(b"x")}], "refused opcode BYTEARRAY8"),
    ([Plain()], "refused class"),
    ([{"cmd": "X", "v": complex(1, 2)}], "refused class builtins.complex"),
    ([{"cmd": "X", "v": print}], "refused class builtins.print"),
])
def test_a_legacy_entry_outside_the_release_subset_is_refused_without_running(cmds: list[Any], problem: str) -> None:
    CALLS.clear()
    with pytest.raises(LogFormatError, match=problem) as caught:
        decode_batch(legacy_payload(1, cmds), 9)
    assert CALLS == []
    assert caught.value.index == 9 and caught.value.version == LEGACY_PICKLE


def test_a_legacy_entry_that_calls_os_system_runs_nothing(tmp_path: Any) -> None:
    flag = tmp_path / "ran"
    evil = b"cos\nsystem\n(V" + f"touch {flag}".encode() + b"\ntR."  # protocol 0: GLOBAL, MARK, REDUCE
    for proto in (2, 5):
        with pytest.raises(LogFormatError, match="refused opcode GLOBAL"):
            decode_batch(bytes([0, 0x80, proto]) + evil, 1)
    assert not flag.exists()


@pytest.mark.parametrize("body, problem", [
    (pickle.dumps([1, []], protocol=5), "expected \\(now_ms, \\[commands\\]\\)"),
    (pickle.dumps((1, [5]), protocol=5), "a int is not a command"),
    (pickle.dumps((1, []), protocol=5)[:-1], "no STOP opcode|not a readable pickle"),
    (b"\x80\x05K\x01K\x02.", "STOP with 2 values"),
    (b"\x80\x05a.", "a value missing|APPEND to a"),
])
def test_a_malformed_legacy_entry_names_what_is_wrong(body: bytes, problem: str) -> None:
    with pytest.raises(LegacyEntryError, match=problem):
        read_legacy_batch(body)


def test_typed_commands_in_a_legacy_entry_are_checked() -> None:
    bad = pickle.dumps((1, [PushRun(5, [b"x"])]), protocol=5)  # type: ignore[arg-type]
    with pytest.raises(LegacyEntryError, match="PushRun: Expected `str`, got `int`"):
        read_legacy_batch(bad)
