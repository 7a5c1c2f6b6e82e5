"""The `shoal` console command: --version, --help, and the lazy subcommand registry."""

from __future__ import annotations

from importlib.metadata import version

from click.testing import CliRunner

from shoal.cli import main
from shoal.cli.main import SUBCOMMANDS


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert version("shoal") in result.output


def test_help_lists_every_registered_subcommand() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    assert "Raft-replicated" in result.output
    for name in SUBCOMMANDS:
        assert name in result.output


def test_a_subcommand_that_cannot_load_does_not_break_the_rest(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(SUBCOMMANDS, "broken", "shoal.no_such_module:cmd")
    runner = CliRunner()
    assert runner.invoke(main, ["--help"]).exit_code == 0
    result = runner.invoke(main, ["broken", "--flag"])
    assert result.exit_code != 0 and "cannot load" in result.output
