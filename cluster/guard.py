"""What a node lets one client hold, and its TLS settings: the ``[limits]`` and ``[tls]`` tables.

Every limit has a default that suits a production node; each is set in the
cluster file or by its ``SHOAL_*`` variable (the variable wins)::

    [limits]
    frame_timeout_ms = 30000            # a frame must arrive whole this long after its first byte
    unauthenticated_idle_ms = 10000     # with tokens: close a connection this idle before Auth
    connections_max = 10000             # client connections per node
    connections_per_address_max = 1000  # client connections per client IP address
    output_high_bytes = 4194304         # unsent replies of a connection: stop reading it above this
    output_max_bytes = 268435456        # ... and close it above this (a reader that never reads)
    unfinished_bytes_max = 0            # all connections' unfinished frames; 0: a quarter of the budget
    memory_max_bytes = 0                # 0: 70 % of the cgroup limit, else of physical memory
    memory_high_ratio = 0.9             # new jobs get OVERLOADED above ratio * memory_max_bytes
    http_connections_max = 4096         # HTTP connections per node; past it: 503 OVERLOADED and a close
    http_header_timeout_ms = 10000      # an HTTP request line and headers must arrive whole this long
                                        # after their first byte (408 TIMEOUT and a close)
    http_keepalive_timeout_ms = 75000   # close an HTTP connection idle this long between requests

    [tls]                               # client and HTTP ports, Raft link (mutual); none = plain TCP
    cert = "node.pem"                   # certificate chain (PEM)
    key = "node.key"                    # its private key (PEM)
    ca = "ca.pem"                       # CA that signs client (with client_certs) and peer certificates
    client_certs = "none"               # none | optional | required

=====================================  =========================================
SHOAL_FRAME_TIMEOUT_MS                 ``frame_timeout_ms``
SHOAL_UNAUTHENTICATED_IDLE_MS          ``unauthenticated_idle_ms``
SHOAL_CONNECTIONS_MAX                  ``connections_max``
SHOAL_CONNECTIONS_PER_ADDRESS_MAX      ``connections_per_address_max``
SHOAL_OUTPUT_HIGH_BYTES                ``output_high_bytes``
SHOAL_OUTPUT_MAX_BYTES                 ``output_max_bytes``
SHOAL_UNFINISHED_BYTES_MAX             ``unfinished_bytes_max``
SHOAL_MEMORY_MAX_BYTES                 ``memory_max_bytes``
SHOAL_HTTP_CONNECTIONS_MAX             ``http_connections_max``
SHOAL_HTTP_HEADER_TIMEOUT_MS           ``http_header_timeout_ms``
SHOAL_HTTP_KEEPALIVE_TIMEOUT_MS        ``http_keepalive_timeout_ms``
SHOAL_TLS_CERT / _KEY / _CA            ``[tls] cert`` / ``key`` / ``ca``
SHOAL_TLS_CLIENT_CERTS                 ``[tls] client_certs``
=====================================  =========================================
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["NodeLimits", "TlsSettings", "LIMITS_ENV_VARS", "TLS_ENV_VARS", "parse_limits", "parse_tls",
           "memory_total_bytes", "PRE_AUTH_FRAME_BYTES_MAX", "AUTH_FAILURES_MAX",
           "AUTH_FAIL_DELAYS_S"]

#: Largest frame a connection may send before it authenticates (when tokens are configured).
PRE_AUTH_FRAME_BYTES_MAX = 64 * 1024
#: Wrong tokens one connection may send; the last one closes it.
AUTH_FAILURES_MAX = 3
#: Wrong-token delays (seconds) before AUTH_FAILED is answered, by failure count (binary and /ws).
AUTH_FAIL_DELAYS_S = (0.25, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class NodeLimits:
    """Per-node limits on what clients can make a node hold (see the module docstring)."""

    frame_timeout_ms: int = 30_000
    unauthenticated_idle_ms: int = 10_000
    connections_max: int = 10_000
    connections_per_address_max: int = 1_000
    output_high_bytes: int = 4 * 1024 * 1024
    output_max_bytes: int = 256 * 1024 * 1024
    unfinished_bytes_max: int = 0
    memory_max_bytes: int = 0
    memory_high_ratio: float = 0.9
    http_connections_max: int = 4096
    http_header_timeout_ms: int = 10_000
    http_keepalive_timeout_ms: int = 75_000

    def validate(self) -> "NodeLimits":
        """Raise ValueError for a limit out of range."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "memory_high_ratio":
                if not 0.1 <= value <= 1.0:
                    raise ValueError("limits.memory_high_ratio must be 0.1 .. 1.0")
            elif f.name in ("memory_max_bytes", "unfinished_bytes_max"):
                if value < 0:
                    raise ValueError(f"limits.{f.name} must be ≥ 0 (0: the default share of the memory)")
            elif value < 1:
                raise ValueError(f"limits.{f.name} must be ≥ 1")
        if self.output_max_bytes < self.output_high_bytes:
            raise ValueError("limits.output_max_bytes must be ≥ limits.output_high_bytes")
        return self

    def memory_budget_bytes(self) -> int:
        """``memory_max_bytes``, or 70 % of the cgroup limit / physical memory when it is 0."""
        return self.memory_max_bytes or int(memory_total_bytes() * 0.7)

    def unfinished_budget_bytes(self) -> int:
        """``unfinished_bytes_max``, or a quarter of the memory budget when it is 0."""
        return self.unfinished_bytes_max or self.memory_budget_bytes() // 4

    def to_table(self) -> dict[str, Any]:
        """The settings that differ from the defaults (for the cluster file)."""
        default = NodeLimits()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


LIMITS_ENV_VARS = {
    "SHOAL_FRAME_TIMEOUT_MS": "frame_timeout_ms",
    "SHOAL_UNAUTHENTICATED_IDLE_MS": "unauthenticated_idle_ms",
    "SHOAL_CONNECTIONS_MAX": "connections_max",
    "SHOAL_CONNECTIONS_PER_ADDRESS_MAX": "connections_per_address_max",
    "SHOAL_OUTPUT_HIGH_BYTES": "output_high_bytes",
    "SHOAL_OUTPUT_MAX_BYTES": "output_max_bytes",
    "SHOAL_UNFINISHED_BYTES_MAX": "unfinished_bytes_max",
    "SHOAL_MEMORY_MAX_BYTES": "memory_max_bytes",
    "SHOAL_HTTP_CONNECTIONS_MAX": "http_connections_max",
    "SHOAL_HTTP_HEADER_TIMEOUT_MS": "http_header_timeout_ms",
    "SHOAL_HTTP_KEEPALIVE_TIMEOUT_MS": "http_keepalive_timeout_ms",
}


def parse_limits(table: Mapping[str, Any], env: Mapping[str, str]) -> NodeLimits:
    """The ``[limits]`` table with ``SHOAL_*`` overrides; ValueError when malformed."""
    known = {f.name for f in fields(NodeLimits)}
    unknown = set(table) - known
    if unknown:
        raise ValueError(f"[limits] has unknown keys {sorted(unknown)}")
    values: dict[str, Any] = {}
    for name, value in table.items():
        if name == "memory_high_ratio":
            values[name] = float(value)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"[limits] {name} must be an integer")
        else:
            values[name] = value
    for var, name in LIMITS_ENV_VARS.items():
        text = env.get(var)
        if text not in (None, ""):
            try:
                values[name] = int(text)  # type: ignore[arg-type]
            except ValueError as exc:
                raise ValueError(f"{var}={text!r} is not an integer") from exc
    return NodeLimits(**values).validate()


_CLIENT_CERTS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """TLS of a node's client and HTTP ports, and mutual TLS on its Raft link."""

    cert: str
    key: str
    ca: str | None = None
    client_certs: str = "none"

    def server_context(self) -> ssl.SSLContext:
        """A server-side context (TLS 1.2+), verifying client certificates when asked to.

        Client certificates are checked against ``ca`` alone: the system's certificate
        authorities would let any publicly issued certificate pass ``client_certs = "required"``.
        """
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.ca:
            ctx.load_verify_locations(self.ca)
        ctx.verify_mode = _CLIENT_CERTS[self.client_certs]
        return ctx

    def peer_server_context(self) -> ssl.SSLContext:
        """The Raft port's side of mutual TLS: every peer presents a certificate that ``ca`` (or,
        without one, the node certificate itself) verifies, whatever ``client_certs`` says.
        Only that anchor is trusted, never the system's certificate authorities."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.verify_mode = ssl.CERT_REQUIRED
        self._peer_trust_and_identity(ctx)
        return ctx

    def peer_client_context(self) -> ssl.SSLContext:
        """The dialling side of the Raft link's mutual TLS: presents the node certificate and
        checks the peer's against the same single anchor and the peer's configured host."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the certificate and the host name
        self._peer_trust_and_identity(ctx)
        return ctx

    def _peer_trust_and_identity(self, ctx: ssl.SSLContext) -> None:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        ctx.load_verify_locations(self.ca or self.cert)
        if not self.ca:
            ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the certificate itself is the anchor

    def client_context(self) -> ssl.SSLContext:
        """A context for calls to the nodes (peers, the launcher): trusts ``ca`` or, without
        one, the nodes' own certificate; presents that certificate."""
        ctx = ssl.create_default_context(cafile=self.ca)
        if not self.ca:
            ctx.load_verify_locations(self.cert)
            ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the certificate itself is the anchor
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def to_table(self) -> dict[str, Any]:
        table: dict[str, Any] = {"cert": self.cert, "key": self.key, "client_certs": self.client_certs}
        if self.ca:
            table["ca"] = self.ca
        return table


TLS_ENV_VARS = ("SHOAL_TLS_CERT", "SHOAL_TLS_KEY", "SHOAL_TLS_CA", "SHOAL_TLS_CLIENT_CERTS")


def parse_tls(table: Mapping[str, Any], env: Mapping[str, str]) -> TlsSettings | None:
    """The ``[tls]`` table with ``SHOAL_TLS_*`` overrides; None when neither sets a certificate."""
    values = {k: str(v) for k, v in table.items()}
    unknown = set(values) - {"cert", "key", "ca", "client_certs"}
    if unknown:
        raise ValueError(f"[tls] has unknown keys {sorted(unknown)}")
    for var in TLS_ENV_VARS:
        if env.get(var):
            values[var[len("SHOAL_TLS_"):].lower()] = env[var]
    if not values:
        return None
    if not values.get("cert") or not values.get("key"):
        raise ValueError("TLS needs both a certificate and its key ([tls] cert/key, SHOAL_TLS_CERT/KEY)")
    mode = values.get("client_certs", "none")
    if mode not in _CLIENT_CERTS:
        raise ValueError("[tls] client_certs must be none, optional or required")
    if mode != "none" and not values.get("ca"):
        raise ValueError("[tls] client_certs needs a ca to verify them with")
    for name in ("cert", "key", "ca"):
        if values.get(name) and not Path(values[name]).is_file():
            raise ValueError(f"[tls] {name}: {values[name]} is not a file")
    return TlsSettings(values["cert"], values["key"], values.get("ca"), mode)


def memory_total_bytes() -> int:
    """The cgroup's memory limit when it has one, else the machine's physical memory."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max" or a huge number: no limit
            return int(text)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30
