"""Options shared by the commands that talk to a running cluster (``shoal cluster add-node …``,
``shoal queue …``, ``shoal job …``): where the cluster is and how to authenticate.

The commands hand them to :func:`shoal.cluster.operator.connect` as they are: ``--url`` (or
``$SHOAL_ADMIN_URL``) names any node's HTTP address, else the local cluster at ``--data``;
``--token`` (or ``$SHOAL_TOKEN``, locally the cluster file's first); ``--ca``, ``--cert``,
``--key`` for an https ``--url``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

__all__ = ["cluster_options"]

F = TypeVar("F", bound=Callable[..., Any])

_CLUSTER_OPTIONS = (
    click.option("--data", "data_dir", default="./.shoal", show_default=True, type=click.Path(file_okay=False),
                 help="A local cluster's directory (of `shoal cluster up`)."),
    click.option("--url", default=None, envvar="SHOAL_ADMIN_URL", metavar="URL",
                 help="Any node's HTTP address (http[s]://host:port) for a remote cluster "
                      "(default: $SHOAL_ADMIN_URL); without it the local cluster at --data."),
    click.option("--token", default=None, envvar="SHOAL_TOKEN",
                 help="A client token of the cluster (default: $SHOAL_TOKEN; locally, the cluster file's first)."),
    click.option("--ca", default=None, type=click.Path(dir_okay=False, exists=True),
                 help="With an https --url: the CA certificate to trust (default: the system's)."),
    click.option("--cert", default=None, type=click.Path(dir_okay=False, exists=True),
                 help="With an https --url: a client certificate to present (nodes with client_certs)."),
    click.option("--key", default=None, type=click.Path(dir_okay=False, exists=True),
                 help="The key of --cert."),
)


def cluster_options(command: F) -> F:
    """Add ``--data --url --token --ca --cert --key`` (passed as ``data_dir, url, token, ca, cert, key``)."""
    for option in reversed(_CLUSTER_OPTIONS):
        command = option(command)
    return command
