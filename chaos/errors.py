"""Errors of the fault-injection proxy.

Every error carries the HTTP status the Toxiproxy API answers with, so the
HTTP layer converts them at one place and the Python API raises the same
exceptions::

    ChaosProxyError (500)
    ├── BadRequest (400)      malformed body, missing field, invalid toxic
    ├── NotFound (404)        ProxyNotFound, ToxicNotFound
    └── AlreadyExists (409)   ProxyExists, ToxicExists
"""

from __future__ import annotations

__all__ = [
    "ChaosProxyError",
    "BadRequest",
    "NotFound",
    "AlreadyExists",
    "ProxyNotFound",
    "ToxicNotFound",
    "ProxyExists",
    "ToxicExists",
]


class ChaosProxyError(Exception):
    """Root of the proxy's errors; ``status`` is the HTTP status to answer."""

    status: int = 500


class BadRequest(ChaosProxyError):
    """The request body or one of its fields is invalid."""

    status = 400


class NotFound(ChaosProxyError):
    """A named proxy or toxic does not exist."""

    status = 404


class AlreadyExists(ChaosProxyError):
    """A proxy or toxic with that name exists already."""

    status = 409


class ProxyNotFound(NotFound):
    def __init__(self, name: str = "") -> None:
        super().__init__("proxy not found")
        self.name = name


class ToxicNotFound(NotFound):
    def __init__(self, name: str = "") -> None:
        super().__init__("toxic not found")
        self.name = name


class ProxyExists(AlreadyExists):
    def __init__(self, name: str = "") -> None:
        super().__init__("proxy already exists")
        self.name = name


class ToxicExists(AlreadyExists):
    def __init__(self, name: str = "") -> None:
        super().__init__("toxic already exists")
        self.name = name
