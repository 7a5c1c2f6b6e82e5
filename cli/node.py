"""``shoal node``: run one node of a cluster."""

from __future__ import annotations

import errno
import logging
import sys

import click

from shoal.cluster.config import ConfigError, load_config

__all__ = ["node_command"]


@click.command("node")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Cluster TOML file (default: $SHOAL_CONFIG; SHOAL_* variables override it).")
@click.option("--id", "node_id", default=None, help="This node's id (default: $SHOAL_NODE_ID).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def node_command(config_path: str | None, node_id: str | None, log_level: str) -> None:
    """Run one Shoal node until SIGTERM (graceful: leadership is handed over first)."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(config_path, node_id=node_id)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    if not config.node_id:
        raise click.ClickException("no node id: pass --id or set SHOAL_NODE_ID")
    # Imported here: `shoal --help` stays free of the node's imports (uvloop, the engine).
    from shoal.node.identity import IdentityError
    from shoal.node.server import run_node
    try:
        code = run_node(config, config.node_id)
    except IdentityError as exc:
        raise click.ClickException(f"node {config.node_id}: {exc}") from exc
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        # One line a launcher can show as it is: which address, and that it is taken.
        raise click.ClickException(f"node {config.node_id}: cannot listen: {exc.strerror}") from exc
    sys.exit(code)
