"""The operator commands' pure parts (no sockets): sizes, node ids and ports, cluster files that
grow and shrink, progress printing, what keeps a shape from being settled, argument handling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shoal.cli import main
from shoal.cli.cluster import cluster_group
from shoal.cluster.admin_client import ClusterShape
from shoal.cluster.config import ClusterConfig, NodeSpec, load_config
from shoal.cluster.launcher import write_cluster_file
from shoal.cluster.operator import (ProgressPrinter, balance_gaps, format_bytes, format_move, holdings, next_node_id,
                                    next_ports, parse_bytes, unsettled, with_node, without_node)
from shoal.cluster.registry import LEAVING, NodeEntry, Registry

# --- sizes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("1048576", 1048576), ("64MiB", 64 * 2**20), ("64MB", 64 * 2**20), ("64m", 64 * 2**20),
    ("512KiB", 512 * 1024), ("1.5GiB", int(1.5 * 2**30)), ("2 GiB", 2 * 2**30), ("32MiB/s", 32 * 2**20),
    ("100B", 100),
])
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "fast", "-1MiB", "1PiB", "MiB", "1 2"])
def test_parse_bytes_refuses_what_is_no_size(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes(text)


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(64 * 2**20) == "64.0 MiB"
    assert format_bytes(None) == "-"


def test_format_move() -> None:
    streaming = {"partition": 3, "from": "n1", "to": "n4", "fromMember": "n1", "toMember": "n4",
                 "state": "catching up", "bytesSent": 2**20, "bytesTotal": 4 * 2**20, "rateBytesPerS": 512 * 1024,
                 "etaS": 6.0}
    assert format_move(streaming) == "p3 n1 → n4 catching up 1.0 MiB/4.0 MiB 512.0 KiB/s ETA 6s"
    by_log = {"partition": 0, "from": None, "to": "n2", "state": "catching up", "matchIndex": 7, "commitIndex": 9}
    assert format_move(by_log) == "p0 → n2 catching up log 7/9"
    replaced = {"partition": 1, "from": "n3", "to": "n3", "fromMember": "n3", "toMember": "n3/ab12",
                "state": "waiting"}
    assert format_move(replaced) == "p1 n3 → n3/ab12 waiting"
    leaving = {"partition": 2, "from": "n1", "to": None, "state": "removing"}
    assert format_move(leaving) == "p2 n1 → removing"


# --- node ids, ports, cluster files ------------------------------------------------------------------


def test_next_node_id_is_never_given_twice() -> None:
    assert next_node_id(["n1", "n2", "n3"]) == "n4"
    assert next_node_id(["n1", "n3", "n2"]) == "n4"
    assert next_node_id(["n2", "n5", "custom", "n5.replaced-2024"]) == "n6"  # a removed n5 keeps its number
    assert next_node_id([]) == "n1"


def test_next_ports_takes_the_node_slot_of_the_layout_or_the_next_free_one() -> None:
    first = NodeSpec("n1", "127.0.0.1", 6789, 6790, 6889)
    assert next_ports(first, "n4", set(), lambda p: True) == (6795, 6796, 6892)
    # n4's slot is taken (another process holds its HTTP port): the next slot.
    assert next_ports(first, "n4", set(), lambda p: p != 6796) == (6797, 6798, 6893)
    # a registry node already uses n4's raft port
    assert next_ports(first, "n4", {6892}, lambda p: True) == (6797, 6798, 6893)
    assert next_ports(first, "custom", set(), lambda p: True) == (6789, 6790, 6889)
    with pytest.raises(ValueError, match="no free ports"):
        next_ports(first, "n4", set(), lambda p: False)


def _config(n: int = 3, **kwargs: Any) -> ClusterConfig:
    nodes = tuple(NodeSpec(f"n{i + 1}", "127.0.0.1", 6789 + 2 * i, 6790 + 2 * i, 6889 + i) for i in range(n))
    return ClusterConfig(nodes=nodes, cluster_id="shoal-test", secret="s", **kwargs).validate()


def test_a_grown_then_shrunk_cluster_file_keeps_the_nodes_it_was_created_with(tmp_path: Path) -> None:
    config = _config()
    grown = with_node(config, NodeSpec("n4", "127.0.0.1", 6795, 6796, 6892), ("n1", "n2", "n3"))
    path = tmp_path / "cluster.toml"
    write_cluster_file(path, grown)
    back = load_config(path, env={})
    assert [n.id for n in back.nodes] == ["n1", "n2", "n3", "n4"]
    assert back.bootstrap_nodes == ("n1", "n2", "n3")
    shrunk = without_node(back, "n1", ("ignored",))
    write_cluster_file(path, shrunk)
    back = load_config(path, env={})
    assert [n.id for n in back.nodes] == ["n2", "n3", "n4"]
    assert back.bootstrap_nodes == ("n1", "n2", "n3")  # history: the file's own list wins
    assert path.stat().st_mode & 0o777 == 0o600


def test_without_node_drops_routes_to_it() -> None:
    config = _config()
    routed = tuple(NodeSpec(n.id, n.host, n.port, n.http_port, n.raft_port,
                            raft_routes=(("n1", "127.0.0.1:9999"),) if n.id != "n1" else ()) for n in config.nodes)
    shrunk = without_node(ClusterConfig(nodes=routed, cluster_id="shoal-test"), "n1", ("n1", "n2", "n3"))
    assert all(n.raft_routes == () for n in shrunk.nodes)
    shrunk.validate()


# --- shapes, progress --------------------------------------------------------------------------------


def _registry(states: dict[str, str] | None = None) -> Registry:
    states = states or {}
    reg = Registry("shoal-test", 2, bootstrap=("n1", "n2", "n3"), bootstrap_rf=2)
    for k, node in enumerate(["n1", "n2", "n3"]):
        reg = reg.with_entry(NodeEntry(node, "127.0.0.1", 6789 + 2 * k, 6790 + 2 * k, 6889 + k, incarnation=f"i{k}",
                                       original=f"i{k}", state=states.get(node, "active"), ordinal=k))
    return reg


def _shape(replicas: dict[int, list[str]], leaders: dict[int, str | None], placement: dict[int, list[str]],
           moves: list[dict[str, Any]] | None = None, memberships: dict[int, dict[str, Any]] | None = None,
           states: dict[str, str] | None = None) -> ClusterShape:
    topology = {"partitionMap": [{"id": p, "replicas": r, "leader": leaders.get(p), "term": 1}
                                 for p, r in sorted(replicas.items())]}
    return ClusterShape(_registry(states), placement, topology, moves or [], memberships)


def test_settled_compares_member_ids_where_leaders_report_them() -> None:
    placement = {0: ["n1", "n3/new"], 1: ["n2", "n1"]}
    replicas = {0: ["n1", "n3"], 1: ["n2", "n1"]}
    leaders = {0: "n1", 1: "n2"}
    assert _shape(replicas, leaders, placement).settled()  # node ids alone cannot tell n3 from n3/new
    old = {0: {"voters": ["n1", "n3"], "learners": [], "term": 1}, 1: {"voters": ["n1", "n2"], "learners": []}}
    shape = _shape(replicas, leaders, placement, memberships=old)
    assert not shape.settled()
    assert unsettled(shape) == ["p0: members n1,n3, target n1,n3/new"]
    new = {**old, 0: {"voters": ["n1", "n3/new"], "learners": []}}
    assert _shape(replicas, leaders, placement, memberships=new).settled()
    assert not _shape(replicas, leaders, placement, memberships={1: old[1]}).settled()  # p0 unreported
    learning = {**new, 1: {"voters": ["n1", "n2"], "learners": ["n3/new"]}}
    assert not _shape(replicas, leaders, placement, memberships=learning).settled()


def test_unsettled_and_balance_gaps_name_what_is_out_of_place() -> None:
    placement = {0: ["n1", "n2"], 1: ["n2", "n3"]}
    moves = [{"partition": 1, "from": "n1", "to": "n3", "state": "catching up"}]
    shape = _shape({0: ["n1", "n2"], 1: ["n1", "n2"]}, {0: "n2", 1: None}, placement, moves)
    assert unsettled(shape) == ["p1: no leader", "moves running: p1 n1 → n3 catching up"]
    assert balance_gaps(shape) == ["p0: led by n2, preferred n1", "p1: led by nobody, preferred n2"]


def test_holds_sees_replicas_leadership_moves_and_memberships() -> None:
    placement = {0: ["n2", "n3"], 1: ["n2", "n3"]}
    base = {0: ["n2", "n3"], 1: ["n2", "n3"]}
    assert not _shape(base, {0: "n2", 1: "n3"}, placement).holds("n1")
    assert _shape({**base, 1: ["n1", "n3"]}, {0: "n2", 1: "n3"}, placement).holds("n1")
    assert _shape(base, {0: "n1", 1: "n3"}, placement).holds("n1")
    assert _shape(base, {0: "n2", 1: "n3"}, placement,
                  moves=[{"partition": 0, "from": "n1", "to": None, "state": "removing"}]).holds("n1")
    assert _shape(base, {0: "n2", 1: "n3"}, placement,
                  memberships={0: {"voters": ["n2", "n3"], "learners": ["n1/x"]}}).holds("n1")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_prints_a_line_per_change_and_a_heartbeat_while_moves_run() -> None:
    lines: list[str] = []
    clock = Clock()
    printer = ProgressPrinter(lines.append, clock=clock, heartbeat_s=10.0)
    placement = {0: ["n2", "n3"], 1: ["n2", "n3"]}
    joining = {"partition": 0, "from": "n1", "to": "n3", "fromMember": "n1", "toMember": "n3", "state": "waiting"}
    start = _shape({0: ["n1", "n2"], 1: ["n2", "n3"]}, {0: "n2", 1: "n2"}, placement, [joining],
                   states={"n1": LEAVING})
    printer(start)
    assert lines == ["[    0s] n1 (leaving): 1 replicas, leads 0 | n2: 2 replicas, leads 2 | n3: 1 replicas, leads 0",
                     "[    0s] started 1 move: p0 n1 → n3"]
    lines.clear()
    clock.now += 1
    printer(start)  # nothing changed: nothing printed
    assert lines == []
    streaming = {**joining, "state": "catching up", "bytesSent": 1024, "bytesTotal": 4096, "rateBytesPerS": 512,
                 "etaS": 6}
    clock.now += 1
    printer(_shape({0: ["n1", "n2"], 1: ["n2", "n3"]}, {0: "n2", 1: "n2"}, placement, [streaming],
                   states={"n1": LEAVING}))
    assert lines == ["[    2s] p0 n1 → n3 catching up 1.0 KiB/4.0 KiB 512 B/s ETA 6s"]
    lines.clear()
    clock.now += 5
    more = {**streaming, "bytesSent": 2048}
    shape = _shape({0: ["n1", "n2"], 1: ["n2", "n3"]}, {0: "n2", 1: "n2"}, placement, [more], states={"n1": LEAVING})
    printer(shape)  # bytes alone changed, no heartbeat due yet
    assert lines == []
    clock.now += 6
    printer(shape)
    assert lines == ["[   13s] 1 move running: p0 n1 → n3 catching up 2.0 KiB/4.0 KiB 512 B/s ETA 6s"]
    lines.clear()
    # n3 votes now, n1 leaves: the same move (still named n1 → n3), in a new state
    removing = {"partition": 0, "from": "n1", "to": None, "fromMember": "n1", "toMember": None, "state": "removing"}
    clock.now += 1
    printer(_shape({0: ["n1", "n2", "n3"], 1: ["n2", "n3"]}, {0: "n2", 1: "n2"}, placement, [removing],
                   states={"n1": LEAVING}))
    assert lines == ["[   14s] n1 (leaving): 1 replicas, leads 0 | n2: 2 replicas, leads 2 | n3: 2 replicas, leads 0",
                     "[   14s] p0 n1 → n3 removing"]
    lines.clear()
    clock.now += 1
    printer(_shape({0: ["n2", "n3"], 1: ["n2", "n3"]}, {0: "n2", 1: "n2"}, placement, [], states={"n1": LEAVING}))
    assert lines == ["[   15s] n1 (leaving): 0 replicas, leads 0 | n2: 2 replicas, leads 2 | n3: 2 replicas, leads 0",
                     "[   15s] finished 1 move: p0 n1 → n3"]


def test_progress_says_when_a_snapshot_stream_begins() -> None:
    lines: list[str] = []
    clock = Clock()
    printer = ProgressPrinter(lines.append, clock=clock)
    by_log = {"partition": 0, "from": None, "to": "n3", "state": "catching up", "matchIndex": 0, "commitIndex": 80}
    placement = {0: ["n1", "n2", "n3"]}
    printer(_shape({0: ["n1", "n2"]}, {0: "n1"}, placement, [by_log]))
    lines.clear()
    clock.now += 1
    stream = {"partition": 0, "from": None, "to": "n3", "state": "catching up", "bytesSent": 4 * 2**20,
              "bytesTotal": 8 * 2**20, "rateBytesPerS": 2**20, "etaS": 4.0}
    printer(_shape({0: ["n1", "n2"]}, {0: "n1"}, placement, [stream]))
    assert lines == ["[    1s] p0 → n3 catching up 4.0 MiB/8.0 MiB 1.0 MiB/s ETA 4s"]


def test_progress_lists_many_moves_on_one_line() -> None:
    lines: list[str] = []
    printer = ProgressPrinter(lines.append, clock=Clock())
    moves = [{"partition": p, "from": None, "to": "n3", "state": "waiting"} for p in range(7)]
    placement = {p: ["n3"] for p in range(7)}
    printer(_shape({p: ["n1"] for p in range(7)}, {p: "n1" for p in range(7)}, placement, moves))
    assert lines[-1] == "[    0s] started 7 moves: p0 → n3, p1 → n3, p2 → n3, p3 → n3 and 3 more"


def test_holdings_counts_replicas_and_leaders_of_live_nodes() -> None:
    shape = _shape({0: ["n1", "n2"], 1: ["n2", "n3"]}, {0: "n1", 1: "n2"}, {0: [], 1: []},
                   states={"n3": "removed"})
    assert holdings(shape) == "n1: 1 replicas, leads 1 | n2: 2 replicas, leads 1"


# --- argument handling (nothing is contacted) ----------------------------------------------------------


#: The commands that change a running cluster's shape.
OPERATOR_COMMANDS = ["add-node", "remove-node", "replace-node", "rebalance", "settings", "status"]


def test_cluster_help_lists_the_operator_commands() -> None:
    result = CliRunner().invoke(main, ["cluster", "--help"])
    assert result.exit_code == 0, result.output
    for name in ["up", "down", *OPERATOR_COMMANDS]:
        assert name in result.output
    assert cluster_group.list_commands(None) == sorted(["up", "down", *OPERATOR_COMMANDS])  # type: ignore[arg-type]


def test_remote_add_node_needs_the_new_node_described() -> None:
    result = CliRunner().invoke(main, ["cluster", "add-node", "--url", "http://127.0.0.1:1", "--id", "n4",
                                       "--port", "7000"])
    assert result.exit_code == 2
    assert "--host, --http-port, --raft-port" in result.output


def test_remote_replace_needs_the_incarnation() -> None:
    result = CliRunner().invoke(main, ["cluster", "replace-node", "--url", "http://127.0.0.1:1", "n2"])
    assert result.exit_code == 2 and "--incarnation" in result.output


@pytest.mark.parametrize("args,message", [
    (["settings", "--move-rate", "fast"], "not a size"),
    (["settings", "--replication", "9"], "--replication"),
    (["add-node", "--timeout", "0"], "--timeout"),
    (["remove-node"], "NODE_ID"),
])
def test_bad_arguments_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["cluster", *args])
    assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.parametrize("command", [["status"], ["add-node"], ["remove-node", "n1"], ["rebalance"], ["settings"]])
def test_a_directory_without_a_cluster_is_a_clear_error(tmp_path: Path, command: list[str]) -> None:
    result = CliRunner().invoke(main, ["cluster", *command, "--data", str(tmp_path)])
    assert result.exit_code == 1
    assert f"no cluster at {tmp_path}" in result.output
