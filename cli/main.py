"""``shoal`` — one console command, with a subcommand for each part of the project.

Every click command of the project lives in this package, one module per subcommand, over the
library code of the other packages (which never import click). Subcommands are imported lazily
from the registry below, so ``shoal --help`` stays fast and one subcommand that cannot load
leaves the others working.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

import click

__all__ = ["main", "SUBCOMMANDS"]

#: name -> "module:attribute" of a click command or group.
SUBCOMMANDS: dict[str, str] = {
    "node": "shoal.cli.node:node_command",
    "cluster": "shoal.cli.cluster:cluster_group",
    "chaos": "shoal.cli.chaos:chaos",
    "pod": "shoal.cli.pod:pod_group",
    "queue": "shoal.cli.queue:queue_group",
    "job": "shoal.cli.job:job_group",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(name)
        if target is None:
            return super().get_command(ctx, name)
        module_name, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            # One package that cannot load (a missing optional dependency, a broken
            # checkout) must not take `shoal --help` and every other subcommand with it.
            return _unavailable(name, f"{type(exc).__name__}: {exc}")


def _unavailable(name: str, reason: str) -> click.Command:
    def run() -> None:
        raise click.ClickException(f"`shoal {name}` cannot load: {reason}")
    return click.Command(name, callback=run, help=f"(unavailable: {reason})",
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


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
