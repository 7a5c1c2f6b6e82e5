"""`shoal cluster up` in the foreground: Ctrl-C (SIGINT) or SIGTERM stops every node of its cluster,
the ones `shoal cluster add-node` started after it included. Real processes throughout."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.cluster.launcher import _is_our_node, _pids_in, free_base_port

from waiting import eventually

UP_READY_S = 90.0
STOP_S = 30.0


def _shoal(*args: str) -> list[str]:
    return [sys.executable, "-m", "shoal.cli", *args]


def _env() -> dict[str, str]:
    """This environment without SHOAL_* settings `shoal cluster up` would refuse (test switches stay), its
    output unbuffered so that lines arrive as printed."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SHOAL_") or k.startswith("SHOAL_TEST_")},
            "PYTHONUNBUFFERED": "1"}


def _read_until(proc: subprocess.Popen[bytes], text: str, timeout_s: float) -> str:
    """``proc``'s stdout (unbuffered, so select sees every byte) up to the first line holding ``text``;
    fails on its end or the deadline."""
    assert proc.stdout is not None
    lines: list[str] = []

    def line_with_text() -> bool:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            line = proc.stdout.readline().decode()  # type: ignore[union-attr]
            assert line, f"`shoal cluster up` ended ({proc.poll()}) before {text!r}:\n{''.join(lines)}"
            lines.append(line)
        return bool(lines) and text in lines[-1]

    eventually(line_with_text, f"{text!r} from `shoal cluster up`", timeout_s, poll_s=0)
    return "".join(lines)


def _running(pids: dict[str, int]) -> dict[str, int]:
    return {node: pid for node, pid in pids.items() if _is_our_node(pid)}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_foreground_up_stops_every_node_including_added_ones(tmp_path: Path, sig: signal.Signals) -> None:
    data = tmp_path / "c"
    up = subprocess.Popen(_shoal("cluster", "up", "--nodes", "3", "--partitions", "2", "--data", str(data),
                                 "--base-port", str(free_base_port(5, 2))),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, bufsize=0,
                          env=_env())
    pids: dict[str, int] = {}
    try:
        _read_until(up, "Press Ctrl-C to stop.", UP_READY_S)
        added = subprocess.run(_shoal("cluster", "add-node", "--data", str(data), "--no-wait", "--timeout", "60"),
                               capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL, env=_env())
        assert added.returncode == 0, added.stdout + added.stderr
        pids = {node: pid for node, pid, _ in _pids_in(data)}
        assert sorted(pids) == ["n1", "n2", "n3", "n4"] and _running(pids) == pids

        up.send_signal(sig)
        out = up.communicate(timeout=STOP_S)[0].decode()
        assert up.returncode == 0, out
        assert _running(pids) == {}, f"still running after `up` returned: {_running(pids)}\n{out}"
        assert "stopped n4" in out and not list(data.glob("*.pid"))
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
        for node, pid, _ in _pids_in(data):
            pids.setdefault(node, pid)
        for pid in _running(pids).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        eventually(lambda: not _running(pids), "every node process gone", STOP_S, poll_s=0.1)
