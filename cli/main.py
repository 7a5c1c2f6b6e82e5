"""``shoal`` — one console command; each package contributes its subcommands.

Subcommands are imported lazily from the registry below, so ``shoal --help``
stays fast and ``shoal.cluster`` never has to import ``shoal.node`` or
``shoal.chaos`` (see DESIGN §1's dependency direction).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

import click

__all__ = ["main", "SUBCOMMANDS"]

#: name -> "module:attribute" of a click command or group.
SUBCOMMANDS: dict[str, str] = {
    "node": "shoal.node.cli:node_command",
    "cluster": "shoal.cluster.launcher:cluster_group",
    "chaos": "shoal.chaos.cli:chaos",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(name)
        if target is None:
            return super().get_command(ctx, name)
        module_name, _, attr = target.partition(":")
        return getattr(importlib.import_module(module_name), attr)


def _version() -> str:
    try:
        return version("shoal")
    except PackageNotFoundError:
        return "0+unknown"


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", "-V", prog_name="shoal")
def main() -> None:
    """Shoal: a Raft-replicated, partitioned job queue.

    Run a local cluster with `shoal cluster up`; see `shoal COMMAND --help`.
    """
