"""``shoal pod join`` and ``shoal pod leave``: the steps a Helm chart pod runs around ``shoal node``.

The steps themselves are :mod:`shoal.node.pod`'s; these commands read the node's configuration,
print what the steps say and turn a step that cannot go on into an error exit.
"""

from __future__ import annotations

import sys

import click

from shoal.cluster.config import ClusterConfig, ConfigError, load_config
from shoal.node.pod import (JOIN_TIMEOUT_S, LEAVE_TIMEOUT_S, SERVICE_ACCOUNT_DIR, PodError, join, leave,
                            statefulset_replicas)

__all__ = ["pod_group", "join_command", "leave_command"]


def _config() -> ClusterConfig:
    try:
        return load_config()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def _say(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()


@click.group("pod")
def pod_group() -> None:
    """Steps a Kubernetes pod runs around `shoal node` (the Helm chart's init container and preStop hook).

    Both read the node's SHOAL_* configuration, like `shoal node`.
    """


@pod_group.command("join")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 24 * 3600), default=JOIN_TIMEOUT_S,
              show_default=True, help="Seconds to wait for a peer's admin API.")
def join_command(timeout_s: float) -> None:
    """Make sure the cluster knows this node: register it, or replace it when its volume is new."""
    try:
        join(_config(), timeout_s, say=_say)
    except PodError as exc:
        raise click.ClickException(str(exc)) from exc


@pod_group.command("leave")
@click.option("--statefulset", default=None, help="Read the wanted replica count of this StatefulSet from "
              "the Kubernetes API (the pod's service account).")
@click.option("--replicas", type=click.IntRange(0), default=None, help="The wanted replica count, given.")
@click.option("--kube-api", default=None, help="Kubernetes API URL [default: from KUBERNETES_SERVICE_HOST].")
@click.option("--service-account", default=SERVICE_ACCOUNT_DIR, show_default=True,
              help="Directory of the service account's token, ca.crt and namespace.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 7 * 24 * 3600), default=LEAVE_TIMEOUT_S,
              show_default=True, help="Seconds the decommission may take before the pod stops anyway.")
def leave_command(statefulset: str | None, replicas: int | None, kube_api: str | None, service_account: str,
                  timeout_s: float) -> None:
    """Before the pod stops: leave the cluster if a scale-down takes this pod away, else nothing."""
    config = _config()
    if replicas is None and statefulset:
        try:
            replicas = statefulset_replicas(statefulset, kube_api, service_account)
        except PodError as exc:
            _say(f"{config.node_id}: {exc}; a plain stop")
    leave(config, replicas, timeout_s, say=_say)
