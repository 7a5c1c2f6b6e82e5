"""The node's HTTP port: REST, streams, the dashboard and the port's guard (see :mod:`.api`).

Sits beside :mod:`shoal.node.connection` under the server: it answers requests through the
dispatcher and reads the node's state through the server's ``Node``; nothing below imports it.
"""

from .api import STATUS_BY_CODE, HttpApi, build_app, start_http

__all__ = ["start_http", "build_app", "STATUS_BY_CODE", "HttpApi"]
