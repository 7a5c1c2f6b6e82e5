"""Errors of the fault-injection proxy.

Every error carries the HTTP status the Toxiproxy API answers with, so the
HTTP layer converts them at one place and the Python API raises the same
exceptions::

    ChaosProxyError (500)
    ├── BadRequest (400)      malformed body, missing field, invalid toxic
    ├── NotFound (404)        ProxyNotFound, ToxicNotFound
    ├── AlreadyExists (409)   ProxyExists, ToxicExists
    └── PopulateError         the status of the error that stopped a populate
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = [
    "ChaosProxyError",
    "BadRequest",
    "NotFound",
    "AlreadyExists",
    "ProxyNotFound",
    "ToxicNotFound",
    "ProxyExists",
    "ToxicExists",
    "PopulateError",
    "ShownProxy",
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


class ShownProxy(Protocol):
    """What :class:`PopulateError` needs of a proxy (:class:`~shoal.chaos.proxy.Proxy`): its API JSON."""

    def to_json(self) -> dict[str, Any]:
        """The API's JSON object for the proxy."""


class PopulateError(ChaosProxyError):
    """``populate`` failed part-way; ``proxies`` are those created or kept."""

    def __init__(self, cause: ChaosProxyError, proxies: Sequence[ShownProxy]) -> None:
        super().__init__(str(cause))
        self.status = cause.status
        self.proxies = list(proxies)
