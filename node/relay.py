"""Forwarding: any node serves any command of a client that does not route for itself.

bunqueue's client knows one address. A command it sends for a partition this node
does not lead is forwarded to that partition's leader over the node-to-node link
(the Raft port's authenticated link, side channel ``relay`` of
:class:`~shoal.node.raft.transport.RaftNetwork`), and the leader's reply comes back
the same way and goes to the client as it was encoded there. Nothing here is read
from an unauthenticated peer: the network hands a channel only what arrived on a
link whose handshake proved the cluster secret.

Messages (MessagePack arrays on the link):

- ``["q", rid, session, body]`` request: ``body`` is the client's frame as the client sent it
  (checked only by the leader), or as this node encoded it (a command of its own, a command
  for a custom id it looked up; job data stays raw); ``session`` the client connection's
  session, so leases a forwarded pull takes belong to it and go back when it ends; ``rid``
  numbers the request at the forwarding node;
- ``["r", rid, body, code, ids]`` reply: ``body`` the encoded reply frame (with the
  client's ``reqId``), ``code`` its error code (None when ok), ``ids`` the custom job
  ids of the jobs it holds (for the forwarding node's :class:`JobLocator`), or None;
- ``["b", rid, session, [queue, datas, keys, names]]`` a block of plain PUSHes to one queue
  (``datas`` the jobs' data, encoded; ``keys`` every push's idempotency key, one given by this
  node where the client gave none; ``names`` bunqueue's job names, or None): the leader checks
  and commits it as one run, as it would a block its own client sent, and answers
  ``["B", rid, results]``, per push its result (``{"id": ...}``) or its error reply;
- ``["k", rid, session, body, key_base, dialect]`` a client's ``PUSHB`` or ``PUSH`` for the
  leader, sent on as the client sent it (``body``, checked only by the leader): the leader gives
  each job that has neither a key nor a custom id the key ``key_base`` + its index in hex (this
  node's, in its first-send form or, sent again, its again form), reads it in bunqueue's dialect
  when ``dialect``, and answers ``["r", ...]`` as a ``q``;
- ``["c", rid]`` the client went away: a parked long poll is dropped;
- ``["x", session, how?]`` the client's session ended at the forwarding node: after the
  node's grace (no ``how``), ``"now"`` (its leases go back at once: a REST client that went
  away mid-request) or ``"kept"`` (its leases live to their ttr: a REST request's);
- ``["s", queue]`` / ``["u", queue]`` subscribe / unsubscribe to bunqueue's events of
  ``queue``; ``["e", queue, body]`` encoded event frames (one or more);
- ``["w", aid, sessions, False]`` a partition leader's session audit asks which of
  ``sessions`` this node holds; ``["w", aid, held, True]`` the answer (:mod:`.audits`);
- ``["n", nid, name, arg]`` a node-level call (:meth:`Relay.ask_node`): the peer runs what it
  registered under ``name`` (:meth:`Relay.serve_node_calls`), such as the dashboard's view of
  a node or its moves for the admin API, and answers ``["m", nid, ok, value]`` (``value``
  the result, or the error's text when not ``ok``).

A forwarded command that meets ``NOT_LEADER``/``NO_LEADER`` (the leader moved: it was
not proposed) is sent again to the new leader until its deadline, so a failover is
invisible to the client; a lost link, or a ``TIMEOUT`` answer (the leader lost its
leadership with the command in flight), sends commands that are safe to repeat again the
same way, and answers the others ``TIMEOUT`` (their outcome is unknown).

A leader can also freeze (a paused process, a stalled host) with its link up: nothing
answers, and no link is lost. So the forwarding node follows its own view of the
partition's leader (its replica of the partition, its topology): when that names
another node while a command safe to repeat waits at the old one, the command is sent to
the new leader, and the old one's answer, if it ever comes, is ignored. An add is made
safe to repeat before its first send: a ``PUSH``, and each ``PUSHB`` job, that carries
neither ``idempotencyKey`` nor ``customId`` gets a key naming this node, its process and
the request (:data:`~.state._model.FORWARDED_KEY_PREFIX`; each push of a ``b`` block, which is
therefore always safe to repeat), and every later send of it the
same key in the form of a copy sent again (:data:`~.state._model.FORWARDED_AGAIN_PREFIX`), so
the new leader answers an add the frozen one had replicated with the job it made. The engine
records first sends cheaply and looks up only copies sent again (``node/state/_forwarded.py``),
for :data:`~.state._model.FORWARDED_KEY_WINDOW_MS`: longer than any copy can come (the
forwarding deadline plus a margin), shorter than the idempotency window.

Limits: at most :data:`FORWARDED_MAX` commands in flight from a node and
:data:`SERVED_MAX` served for its peers (``OVERLOADED`` beyond), every forwarded command
has a deadline; at most :data:`NODE_CALLS_MAX` node-level calls in flight each way.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from shoal.cluster import limits as L
from shoal.cluster.codec import (PlainPush, decode_forwarded, decode_request, decode_response, encode_body,
                                 item_fields)
from shoal.cluster.commands import COMMANDS
from shoal.cluster.errors import CommandError, ErrorCode, ProtocolError
from shoal.cluster.partitioning import partition_for

from .ports import DecodingReplier, answer_guarded, error_of, error_of_reply
from .audits import AUDIT_ANSWER_TIMEOUT_S, AUDIT_INTERVAL_S, AUDIT_SESSIONS_MAX, SCAN_SESSIONS_MAX, SessionAudit
from .sessions import KEPT_SESSION_PREFIX, SESSION_CHARS_MAX
from .state._model import FORWARDED_AGAIN_PREFIX, FORWARDED_KEY_PREFIX, FORWARDED_KEY_WINDOW_MS

if TYPE_CHECKING:
    from .ports import CommandHandler, NodeInfo, Replier

__all__ = ["Relay", "CHANNEL", "FORWARDED_MAX", "SERVED_MAX", "FORWARD_TIMEOUT_S"]

log = logging.getLogger(__name__)

CHANNEL = "relay"
#: Commands this node may have forwarded and not yet answered.
FORWARDED_MAX = 20_000
#: Commands this node may serve for its peers at once.
SERVED_MAX = 40_000
#: Data bytes of the plain pushes one ``b`` message carries (a larger block goes as several).
BLOCK_BYTES_MAX = 1024 * 1024
#: A forwarded command's time to be answered, beyond its own long-poll wait.
FORWARD_TIMEOUT_S = 30.0
#: How soon a command that met a moving leader is sent again.
RETRY_DELAY_S = 0.05
#: How often deadlines, subscriptions and leaders are checked.
SWEEP_INTERVAL_S = 0.25
#: Queues a node subscribes to for its clients (bunqueue's events) at the leaders.
SUBSCRIBED_QUEUES_MAX = 10_000
#: Node-level calls (:meth:`Relay.ask_node`) in flight from a node, and served for its peers.
NODE_CALLS_MAX = 256
#: How long a node-level call waits for its answer unless told otherwise.
NODE_CALL_TIMEOUT_S = 5.0
#: How often the same nodes' silence in session audits is logged again.
AUDIT_SILENT_LOG_S = 60.0
#: Characters of a node id in the idempotency keys the node attaches (the key's limit is 256).
_KEY_NODE_CHARS_MAX = 64
#: The longest key base a ``k`` message may carry: a job's key is it and up to 8 hex digits.
_KEY_BASE_CHARS_MAX = 240
_RETRY_CODES = frozenset({ErrorCode.NOT_LEADER.value, ErrorCode.NO_LEADER.value, ErrorCode.SHUTTING_DOWN.value})
#: Answered by a leader that lost its leadership with the command in flight: its outcome is
#: unknown, so only a command safe to repeat goes again.
_UNKNOWN_OUTCOME = ErrorCode.TIMEOUT.value
# A re-send of a keyed add leaves before its deadline; the engine must still know the key when
# it applies it (a margin for the new leader's queue and the leaders' clocks).
assert FORWARD_TIMEOUT_S * 1000 + 15_000 <= FORWARDED_KEY_WINDOW_MS


class _Pending:
    """A command forwarded for a client, until its reply reaches the client."""

    __slots__ = ("conn", "req_id", "body", "p", "retry_safe", "deadline", "peer", "future", "cmd", "away", "keyed",
                 "sent", "block", "started", "key_base", "dialect")

    def __init__(self, conn: Replier | None, req_id: Any, body: bytes, p: int, retry_safe: bool,
                 deadline: float, cmd: str, future: asyncio.Future[Any] | None = None) -> None:
        #: Refused here unproposed: not run here again until the leader was looked up once more.
        self.away = False
        #: Carries keys this node gave it, in their first-send form (see ``Relay._sent_again``).
        self.keyed = False
        #: Dispatched before: any later dispatch may repeat an add that took effect.
        self.sent = False
        #: A block of plain pushes (``body`` unused): what the ``b`` message carries.
        self.block: _Block | None = None
        #: A ``PUSHB`` sent as its client sent it (``k``): the leader keys its jobs with this
        #: base (in its first-send form until sent again), reading them in bunqueue's dialect
        #: when ``dialect``.
        self.key_base: str | None = None
        self.dialect = False
        self.started = 0.0
        self.conn = conn
        self.req_id = req_id
        self.body = body
        self.p = p
        self.retry_safe = retry_safe
        self.deadline = deadline
        self.peer = ""
        self.future = future
        self.cmd = cmd


class _Block:
    """A block of plain PUSHes to one queue forwarded as one message (``b``), until answered.

    Every push carries a key (``keys``), so the block is safe to send again: after a lost
    link, a frozen leader or a ``TIMEOUT``, the new leader answers the pushes that took effect
    with the jobs they made."""

    __slots__ = ("queue", "req_ids", "datas", "keys", "names")

    def __init__(self, queue: str, req_ids: list[Any], datas: list[bytes], keys: list[str],
                 names: list[str | None] | None) -> None:
        assert len(req_ids) == len(datas) == len(keys) and (names is None or len(names) == len(datas))
        self.queue = queue
        self.req_ids = req_ids
        self.datas = datas
        self.keys = keys
        self.names = names

    def only(self, keep: list[int]) -> None:
        """Keep the pushes at indexes ``keep`` (the others were answered)."""
        self.req_ids = [self.req_ids[i] for i in keep]
        self.datas = [self.datas[i] for i in keep]
        self.keys = [self.keys[i] for i in keep]
        if self.names is not None:
            self.names = [self.names[i] for i in keep]

    def payload(self) -> list[Any]:
        return [self.queue, self.datas, self.keys, self.names]


class _Call(DecodingReplier):
    """A command a peer forwarded, as the dispatcher sees its connection (a Replier).

    It never wants forwarding: a forwarded command is answered here or refused, never
    forwarded again; and it has no events of its own."""

    __slots__ = ("relay", "peer", "rid", "session", "conn_id", "closed", "req_id", "bunqueue_subscriptions")

    authed = True
    protocol_version = 1
    subscriptions = None

    def __init__(self, relay: "Relay", peer: str, rid: int, session: str, conn_id: int, req_id: Any) -> None:
        self.relay = relay
        self.peer = peer
        self.rid = rid
        self.session = session
        self.conn_id = conn_id
        self.closed = False
        self.req_id = req_id
        self.bunqueue_subscriptions: set[str] | None = None

    @property
    def peer_host(self) -> str:
        return self.peer

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        frame = {"ok": True, **body}
        if req_id is not None:
            frame["reqId"] = req_id
        self.relay._answer(self, frame, None, body)

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        frame = exc.to_reply()
        if req_id is not None:
            frame["reqId"] = req_id
        self.relay._answer(self, frame, exc.code.value, None)

    def reply_many(self, req_ids: list[Any], results: list[Any], cmd: str, seconds: float) -> None:
        for req_id, result in zip(req_ids, results):
            if isinstance(result, CommandError):
                self.reply_error(req_id, result)
            else:
                self.reply(req_id, result)

    def send_frame(self, frame: dict[str, Any]) -> None:
        pass  # a forwarded command has no events of its own

    def upgrade(self, version: int) -> None:
        pass


class _DialectCall(_Call):
    """A ``PUSHB`` a peer sent on as a client of bunqueue's dialect sent it: its jobs are read
    as bunqueue's server reads them (a job's name from its data's envelope)."""

    __slots__ = ()

    bunqueue_envelope = True


class _BlockCall(_Call):
    """A block of pushes a peer forwarded (``b``), as the dispatcher sees its connection: the
    pushes' reqIds are their indexes in the block, and the block is answered (``B``) once each
    push is."""

    __slots__ = ("results", "left")

    def __init__(self, relay: "Relay", peer: str, rid: int, session: str, conn_id: int, n: int) -> None:
        super().__init__(relay, peer, rid, session, conn_id, None)
        self.results: list[Any] = [None] * n
        self.left = n

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        self._one(req_id, body)

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        self._one(req_id, exc.to_reply())

    def reply_many(self, req_ids: list[Any], results: list[Any], cmd: str, seconds: float) -> None:
        for req_id, result in zip(req_ids, results):
            self._one(req_id, result.to_reply() if isinstance(result, CommandError) else result)

    def _one(self, i: Any, result: dict[str, Any]) -> None:
        if type(i) is not int or not 0 <= i < len(self.results) or self.results[i] is not None:
            log.warning("a forwarded block from %s was answered twice or out of range at %r", self.peer, i)
            return
        self.results[i] = result
        self.left -= 1
        if not self.left:
            self.relay._answer_block(self)


class Relay:
    """Forwards commands to their partition's leader and serves the commands peers forward."""

    def __init__(self, dispatcher: "CommandHandler", info: "NodeInfo", loop: asyncio.AbstractEventLoop,
                 send: Callable[[str, Any], bool] | None) -> None:
        """``dispatcher`` answers the commands peers forward here (the node's ``Dispatcher``, which
        holds this relay in turn); ``send(peer, message)`` puts a message on the relay channel."""
        self.dispatcher = dispatcher
        self.info = info
        self.loop = loop
        self._send_to = send
        #: The dispatcher's: ids learned from forwarded replies route the next command directly.
        self.locator = dispatcher.locator
        self._rids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._by_conn: dict[int, set[int]] = {}
        self._conn_peers: dict[int, set[str]] = {}  # client connection -> peers it forwarded to
        self._served: dict[tuple[str, int], _Call] = {}
        self._remote_sessions: dict[tuple[str, str], int] = {}
        self._session_ids = itertools.count(-1, -1)  # connection ids of peers' sessions: never a client's
        # bunqueue events: queue -> this node's connections subscribed, and where each queue is subscribed
        self._subscribers: dict[str, set[Replier]] = {}
        self._conn_queues: dict[int, set[str]] = {}  # client connection -> the queues it subscribed to here
        self._subscribed_at: dict[str, str] = {}
        # at the leader: peer -> queues it wants events of
        self.peer_subscriptions: dict[str, set[str]] = {}
        #: Client commands sent to another node's leader (a block's pushes one by one), those
        #: sent again (the leader moved or did not answer), and those sent on after a leader
        #: that froze; commands peers forwarded that this node took to serve.
        self.forwarded = 0
        self.retried = 0
        self.followed = 0
        self.served = 0
        # Keys of the adds this process forwards: node, process (random) and request number.
        origin = f"{info.node_id[:_KEY_NODE_CHARS_MAX]}.{secrets.token_hex(6)}:"
        self._key_prefix = FORWARDED_KEY_PREFIX + origin
        self._again_prefix = FORWARDED_AGAIN_PREFIX + origin
        self._task: asyncio.Task[None] | None = None
        #: Node-level calls: this node's awaiting answers (nid -> (peer, future)), what it serves.
        self._node_calls: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self._node_handlers: dict[str, Callable[[Any], Awaitable[Any]]] = {}
        self._node_serving = 0
        self._node_tasks: set[asyncio.Task[None]] = set()
        #: Internal commands peers send each other (flows): name -> handler(conn, frame).
        self._peer_commands: dict[str, Callable[[Any, dict[str, Any]], None]] = {}
        dispatcher.sessions.gone = self._session_gone
        self.audit = SessionAudit(dispatcher.config.session_grace_ms)
        self._audit_next = 0.0
        self._audit_silent: tuple[str, ...] = ()
        self._audit_silent_next = 0.0
        self.sessions_adopted = 0
        self.sessions_released = 0

    # --- wiring ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = self.loop.create_task(self._sweep_loop())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        err = CommandError(ErrorCode.SHUTTING_DOWN, "the node is shutting down; retry on another node")
        for rid in list(self._pending):
            self._fail(rid, err)
        for nid in list(self._node_calls):
            self._node_call_ended(nid, err)

    def _send(self, peer: str, message: list[Any]) -> bool:
        return self._send_to is not None and self._send_to(peer, message)

    def _leader_of(self, p: int) -> str | None:
        info = self.info.topology.partition_map[p]
        return info.leader

    # --- forwarding a client's command ---------------------------------------------------------------

    def forward(self, conn: "Replier", frame: dict[str, Any], p: int, away: bool = False) -> None:
        """Send ``frame`` (for partition ``p``, led elsewhere) to its leader; its reply goes to
        ``conn`` when it comes. Raises ``CommandError`` when it cannot be sent at all.

        ``away``: this node refused it unproposed as it stopped leading ``p`` (a leadership
        transfer): it goes to the next leader, and runs here only if this node still leads
        ``p`` a retry later."""
        self._check_room()
        cmd = frame["cmd"]
        spec = COMMANDS.get(cmd)
        rid = next(self._rids)
        keyed = (cmd == "PUSH" or cmd == "PUSHB") and self._key_adds(frame, rid)
        try:
            body = encode_body(frame)
        except ProtocolError as exc:
            raise CommandError(ErrorCode.INVALID, str(exc)) from exc
        wait_s = _long_poll_s(frame)
        pending = _Pending(conn, frame.get("reqId"), body, p, _safe_to_repeat(frame, spec),
                           self.loop.time() + FORWARD_TIMEOUT_S + wait_s, cmd)
        pending.away = away
        pending.keyed = keyed
        self.forwarded += 1
        self._learn_request(frame, p)
        self._send_first(rid, pending, conn)

    def forward_pushes(self, conn: "Replier", frames: "list[PlainPush]", p: int, away: bool = False) -> None:
        """Send a block of plain PUSHes to one queue of partition ``p`` (led elsewhere) to its
        leader as one message per :data:`BLOCK_BYTES_MAX` of data; the replies go to ``conn``.
        Nothing is checked here but what the caller routed by: the leader checks each push
        as it checks its own client's. A part that cannot be sent at all (``OVERLOADED``) is
        answered with the error, push by push."""
        start = 0
        n = len(frames)
        while start < n:
            end, size = start, 0
            while end < n and (end == start or size + len(frames[end].data) <= BLOCK_BYTES_MAX):
                size += len(frames[end].data)
                end += 1
            try:
                self._forward_block(conn, frames[start:end], p, away)
            except CommandError as exc:
                for frame in frames[start:end]:
                    conn.reply_error(frame.reqId, exc)
            start = end

    def _forward_block(self, conn: "Replier", frames: "list[PlainPush]", p: int, away: bool) -> None:
        self._check_room()
        rid = next(self._rids)
        own = self._key_prefix
        keys: list[str] = []
        keyed = False
        names: list[str | None] | None = None
        base = self._job_keys_base(rid)
        for i, frame in enumerate(frames):
            key = frame.idempotencyKey
            if key is None:
                keys.append(f"{base}{i:x}")
                keyed = True
            else:
                keys.append(key)
                keyed = keyed or key.startswith(own)
            if frame.name is not None and names is None:
                names = [f.name for f in frames]
        block = _Block(frames[0].queue, [f.reqId for f in frames], [bytes(f.data) for f in frames], keys, names)
        now = self.loop.time()
        pending = _Pending(conn, None, b"", p, True, now + FORWARD_TIMEOUT_S, "PUSH")
        pending.block = block
        pending.away = away
        pending.keyed = keyed
        pending.started = now
        self.forwarded += len(frames)
        self._send_first(rid, pending, conn)

    def forward_received(self, conn: "Replier", frame: dict[str, Any], body: bytes, p: int,
                         custom_ids: bool) -> None:
        """Send a client's command for partition ``p`` (led elsewhere) to its leader as the
        client sent it (``body``; ``frame`` its decoded form, normalized at most, unchecked
        here): the leader checks it once. An add's jobs without a key or custom id get this
        node's key for the request there, so it is safe to send again. ``custom_ids``: some
        job may carry a custom id (Shoal's name or bunqueue's), whose partition this node
        learns now. Raises ``CommandError`` (``OVERLOADED``) when it cannot be sent at all."""
        self._check_room()
        cmd = frame["cmd"]
        rid = next(self._rids)
        adds = cmd == "PUSH" or cmd == "PUSHB"
        pending = _Pending(conn, frame.get("reqId"), body, p, adds or _safe_to_repeat(frame, COMMANDS.get(cmd)),
                           self.loop.time() + FORWARD_TIMEOUT_S + _long_poll_s(frame), cmd)
        if adds:
            pending.key_base = self._job_keys_base(rid)
            pending.keyed = True
        pending.dialect = conn.bunqueue_envelope
        self.forwarded += 1
        if custom_ids:
            self._learn_request(frame, p)
        self._send_first(rid, pending, conn)

    def _check_room(self) -> None:
        """Refuse a client's command when this node forwards as many as it may already."""
        if len(self._pending) >= FORWARDED_MAX:
            raise CommandError(ErrorCode.OVERLOADED, f"this node already forwards {FORWARDED_MAX} commands; "
                                                     "retry, or connect to the partition's leader")

    def _send_first(self, rid: int, pending: _Pending, conn: "Replier") -> None:
        """Hold ``pending`` (a client's) until it is answered, and send it."""
        self._pending[rid] = pending
        self._by_conn.setdefault(conn.conn_id, set()).add(rid)
        self._dispatch(rid, pending)

    def _job_keys_base(self, rid: int) -> str:
        """This node's keys for the jobs of forwarded request ``rid``, in their first-send form,
        are this and the job's index in hex."""
        return f"{self._key_prefix}{rid:x}."

    def _again_form(self, key: str) -> str:
        """``key`` in the form of a copy sent again when this node gave it (the engine looks such
        a key up; a first send it only records, as no earlier copy can exist); else ``key``."""
        first = self._key_prefix
        return self._again_prefix + key[len(first):] if key.startswith(first) else key

    def _key_adds(self, frame: dict[str, Any], rid: int) -> bool:
        """Give a forwarded add without a key or custom id this node's key for request ``rid``,
        so that sending it again (to a new leader) can never add it twice. True when it carries
        such a key in its first-send form (given now, or before: refused here, forwarded anew)."""
        own = self._key_prefix
        if frame["cmd"] == "PUSH":
            key = frame.get("idempotencyKey")
            if key is None and frame.get("customId") is None:
                frame["idempotencyKey"] = f"{own}{rid:x}"
                return True
            return type(key) is str and key.startswith(own)
        keyed = False
        base = self._job_keys_base(rid)
        for i, job in enumerate(frame["jobs"]):
            key = job.get("idempotencyKey")
            if key is None and job.get("customId") is None:
                job["idempotencyKey"] = f"{base}{i:x}"
                keyed = True
            elif type(key) is str and key.startswith(own):
                keyed = True
        return keyed

    def _sent_again(self, body: bytes) -> bytes:
        """``body`` with the keys this node gave it in the form of a copy sent again
        (:meth:`_again_form`)."""
        frame = decode_request(body, raw_data=True)
        items = frame["jobs"] if frame["cmd"] == "PUSHB" else [frame]
        for item in items:
            key = item.get("idempotencyKey")
            if type(key) is str:
                item["idempotencyKey"] = self._again_form(key)
        return encode_body(frame)

    async def call(self, p: int, frame: dict[str, Any], timeout_s: float = FORWARD_TIMEOUT_S) -> dict[str, Any]:
        """Send a command of this node's own (``Locate``, a fan-out's part) to ``p``'s leader
        and return its reply (raises its ``CommandError``)."""
        if len(self._pending) >= FORWARDED_MAX:
            raise CommandError(ErrorCode.OVERLOADED, "too many forwarded commands in flight")
        future: asyncio.Future[Any] = self.loop.create_future()
        spec = COMMANDS.get(frame["cmd"])
        rid = next(self._rids)
        pending = _Pending(None, None, encode_body(frame), p, bool(spec and spec.read_only),
                           self.loop.time() + timeout_s, frame["cmd"], future)
        self._pending[rid] = pending
        self._dispatch(rid, pending)
        reply = await future
        if isinstance(reply, CommandError):
            raise reply
        return reply  # type: ignore[no-any-return]

    def _dispatch(self, rid: int, pending: _Pending) -> None:
        """Send ``pending`` to its partition's leader now, or fail it when it cannot be."""
        if not pending.sent:
            pending.sent = True
        elif pending.keyed:
            if pending.block is not None:
                pending.block.keys = [self._again_form(key) for key in pending.block.keys]
            elif pending.key_base is not None:
                pending.key_base = self._again_form(pending.key_base)
            else:
                pending.body = self._sent_again(pending.body)
            pending.keyed = False
        leader = self._leader_of(pending.p)
        me = self.info.node_id
        if leader == me and not self.dispatcher.directory.leads(pending.p):
            # The topology still names this node, whose replica no longer leads (or not yet): run
            # here, the dispatcher would hand the command straight back. Wait to learn who leads.
            leader = None
        if leader is None or leader == me:
            # No leader known yet, or this node became it: wait a moment (or answer locally).
            if leader == me and pending.conn is not None and not pending.conn.closed and not pending.away:
                self._answer_here(rid, pending)
                return
            pending.away = False
            self._retry_later(rid, CommandError(ErrorCode.NO_LEADER, f"partition {pending.p} has no leader yet"))
            return
        session = pending.conn.session if pending.conn is not None else None
        if pending.block is not None:
            message = ["b", rid, session, pending.block.payload()]
        elif pending.key_base is not None:
            message = ["k", rid, session, pending.body, pending.key_base, pending.dialect]
        else:
            message = ["q", rid, session, pending.body]
        if not self._send(leader, message):
            self._retry_later(rid, CommandError(ErrorCode.NO_LEADER, f"no link to {leader}, partition "
                                                                     f"{pending.p}'s leader"))
            return
        pending.peer = leader
        if pending.conn is not None:
            self._conn_peers.setdefault(pending.conn.conn_id, set()).add(leader)

    def _answer_here(self, rid: int, pending: _Pending) -> None:
        """Leadership came to this node while the command waited: run it here."""
        self._forget(rid)
        conn = pending.conn
        assert conn is not None
        block = pending.block
        if block is not None:
            self.dispatcher.handle_pushes(conn, _pushes_of(block.queue, block.req_ids, block.datas, block.keys,
                                                           block.names))
            return
        try:
            frame = decode_forwarded(pending.body)
            if pending.key_base is not None:
                key_jobs(frame, pending.key_base)
            if pending.req_id is not None:
                frame["reqId"] = pending.req_id  # the client's bytes lack one its connection gave it
            self.dispatcher.handle(conn, frame)
        except CommandError as exc:
            conn.reply_error(pending.req_id, exc)
        except ProtocolError as exc:  # bytes this node decoded once already: not expected
            conn.reply_error(pending.req_id, CommandError(ErrorCode.INVALID, str(exc)))

    def _retry_later(self, rid: int, why: CommandError) -> None:
        pending = self._pending.get(rid)
        if pending is None:
            return
        if self.loop.time() + RETRY_DELAY_S >= pending.deadline:
            self._fail(rid, why)
            return
        pending.peer = ""
        self.retried += 1
        self.loop.call_later(RETRY_DELAY_S, self._resend, rid)

    def _resend(self, rid: int) -> None:
        pending = self._pending.get(rid)
        if pending is None:
            return
        if pending.conn is not None and pending.conn.closed:
            self._forget(rid)
            return
        self._dispatch(rid, pending)

    def _fail(self, rid: int, exc: CommandError) -> None:
        pending = self._forget(rid)
        if pending is None:
            return
        if pending.future is not None:
            if not pending.future.done():
                pending.future.set_result(exc)
        elif pending.conn is not None:
            if pending.block is not None:
                req_ids = pending.block.req_ids
                pending.conn.reply_many(req_ids, [exc] * len(req_ids), "PUSH", self.loop.time() - pending.started)
            else:
                pending.conn.reply_error(pending.req_id, exc)

    def _forget(self, rid: int) -> _Pending | None:
        pending = self._pending.pop(rid, None)
        if pending is not None and pending.conn is not None:
            rids = self._by_conn.get(pending.conn.conn_id)
            if rids is not None:
                rids.discard(rid)
                if not rids:
                    del self._by_conn[pending.conn.conn_id]
        return pending

    def _replied(self, peer: str, rid: int, body: bytes, code: str | None, ids: Any) -> None:
        pending = self._pending.get(rid)
        if pending is None or pending.peer != peer:
            return  # answered already (a deadline, a retry sent elsewhere)
        if code in _RETRY_CODES or (code == _UNKNOWN_OUTCOME and pending.retry_safe):
            self._retry_later(rid, error_of_reply(body))  # not proposed there, or safe to repeat: the new leader takes it
            return
        self._forget(rid)
        if type(ids) is list:
            for job_id in ids:
                if type(job_id) is str:
                    self.locator.learn(job_id, pending.p)
        if pending.future is not None:
            if not pending.future.done():
                pending.future.set_result(error_of_reply(body) if code is not None else decode_response(body))
            return
        conn = pending.conn
        assert conn is not None
        conn.reply_encoded(pending.req_id, body)

    def _replied_block(self, peer: str, rid: int, results: Any) -> None:
        pending = self._pending.get(rid)
        if pending is None or pending.peer != peer:
            return  # answered already (a deadline, a retry sent elsewhere)
        block = pending.block
        if block is None or type(results) is not list or len(results) != len(block.req_ids):
            log.warning("malformed answer from %s to forwarded block %d; waiting for its deadline", peer, rid)
            return
        done_ids: list[Any] = []
        done: list[Any] = []
        again: list[int] = []
        retry_why: CommandError | None = None
        for i, result in enumerate(results):
            if type(result) is not dict:
                result = {"ok": False, "code": ErrorCode.INTERNAL.value, "error": "malformed answer from the leader"}
            if result.get("ok") is False:
                error = error_of(result)
                if error.code.value in _RETRY_CODES or error.code.value == _UNKNOWN_OUTCOME:
                    # not proposed there, or keyed (every push of a block is): the new leader takes it
                    again.append(i)
                    retry_why = error
                    continue
                result = error
            done_ids.append(block.req_ids[i])
            done.append(result)
        conn = pending.conn
        assert conn is not None
        if again:
            assert retry_why is not None
            if done_ids:
                block.only(again)
            self._retry_later(rid, retry_why)
        else:
            self._forget(rid)
        if done_ids:
            conn.reply_many(done_ids, done, "PUSH", self.loop.time() - pending.started)

    def _learn_request(self, frame: dict[str, Any], p: int) -> None:
        """Learn that the custom ids of a request's jobs live in partition ``p``: Shoal's
        ``customId``, or bunqueue's ``jobId`` in a frame sent on as its client sent it."""
        custom = _custom_id_of(frame)
        if type(custom) is str:
            self.locator.learn(custom, p)
        jobs = frame.get("jobs")
        if type(jobs) is list:
            for job in jobs:
                if type(job) is dict and type(custom := _custom_id_of(job)) is str:
                    self.locator.learn(custom, p)

    def connection_closed(self, conn: "Replier", how: str | None = None) -> None:
        """A client went away: drop what waits for it, tell the leaders, end its subscriptions.

        ``how`` says how its session ends at the leaders: after the grace (None), ``"now"`` or
        ``"kept"`` (leases to their ttr); see the ``x`` message."""
        rids = self._by_conn.pop(conn.conn_id, set())
        for rid in rids:
            pending = self._pending.pop(rid, None)
            if pending is not None and pending.peer:
                self._send(pending.peer, ["c", rid])
        # The session's leases at the leaders go back (after its grace) as if it had been here.
        for peer in self._conn_peers.pop(conn.conn_id, set()):
            self._send(peer, ["x", conn.session] if how is None else ["x", conn.session, how])
        for queue in self._conn_queues.pop(conn.conn_id, ()):
            conns = self._subscribers.get(queue)
            if conns is None:
                continue
            conns.discard(conn)
            if not conns:
                del self._subscribers[queue]
                where = self._subscribed_at.pop(queue, None)
                if where is not None:
                    self._send(where, ["u", queue])

    # --- bunqueue events of queues led elsewhere -------------------------------------------------------

    def subscribe(self, conn: "Replier", queue: str) -> None:
        """``conn`` wants bunqueue's events of ``queue``: from the leader of its partition, wherever it is."""
        conns = self._subscribers.get(queue)
        if conns is None:
            if len(self._subscribers) >= SUBSCRIBED_QUEUES_MAX:
                raise CommandError(ErrorCode.OVERLOADED, f"this node relays events of {SUBSCRIBED_QUEUES_MAX} "
                                                         "queues already")
            conns = self._subscribers[queue] = set()
        conns.add(conn)
        self._conn_queues.setdefault(conn.conn_id, set()).add(queue)
        self._place_subscription(queue)

    def _place_subscription(self, queue: str) -> None:
        p = partition_for(queue, self.info.topology.partitions)
        leader = self._leader_of(p)
        where = self._subscribed_at.get(queue)
        if leader == where:
            return
        if where is not None:
            self._send(where, ["u", queue])
            del self._subscribed_at[queue]
        if leader is not None and leader != self.info.node_id and self._send(leader, ["s", queue]):
            self._subscribed_at[queue] = leader

    def _event(self, queue: str, data: bytes) -> None:
        """Event frames (length-prefixed bytes, one or more) for this node's subscribers of ``queue``."""
        for conn in list(self._subscribers.get(queue, ())):
            conn.send_encoded(data)

    def publish_to_peers(self, queue: str, build: Callable[[], bytes]) -> None:
        """At the leader: send ``queue``'s event frames (encoded once, by ``build``) to every peer
        that subscribed to it for its clients."""
        body: bytes | None = None
        for peer, queues in self.peer_subscriptions.items():
            if queue in queues:
                if body is None:
                    body = build()
                self._send(peer, ["e", queue, body])

    def wants_events(self, queue: str) -> bool:
        return any(queue in queues for queues in self.peer_subscriptions.values())

    # --- serving peers --------------------------------------------------------------------------------

    def on_message(self, peer: str, message: Any) -> None:
        """One message of the ``relay`` channel from an authenticated peer."""
        if type(message) is not list or not message or type(message[0]) is not str:
            log.warning("relay message from %s is not a list with a kind; ignored", peer)
            return
        kind = message[0]
        try:
            if kind == "q":
                _, rid, session, body = message
                self._serve(peer, rid, session, body)
            elif kind == "k":
                _, rid, session, body, key_base, dialect = message
                if type(key_base) is not str or len(key_base) > _KEY_BASE_CHARS_MAX \
                        or not key_base.startswith((FORWARDED_KEY_PREFIX, FORWARDED_AGAIN_PREFIX)):
                    raise ValueError("not a forwarding node's key base")
                self._serve(peer, rid, session, body, key_base, dialect is True)
            elif kind == "r":
                _, rid, body, code, ids = message
                self._replied(peer, rid, body, code, ids)
            elif kind == "b":
                _, rid, session, block = message
                self._serve_block(peer, rid, session, block)
            elif kind == "B":
                _, rid, results = message
                self._replied_block(peer, rid, results)
            elif kind == "c":
                call = self._served.pop((peer, message[1]), None)
                if call is not None:
                    call.closed = True
            elif kind == "x":
                self._end_session(peer, message[1], message[2] if len(message) > 2 else None)
            elif kind == "s":
                queues = self.peer_subscriptions.setdefault(peer, set())
                if len(queues) < SUBSCRIBED_QUEUES_MAX:
                    queues.add(message[1])
                    self.info.events_wanted()
            elif kind == "u":
                self.peer_subscriptions.get(peer, set()).discard(message[1])
            elif kind == "e":
                self._event(message[1], message[2])
            elif kind == "n":
                _, nid, name, arg = message
                self._serve_node_call(peer, nid, name, arg)
            elif kind == "m":
                _, nid, ok, value = message
                call = self._node_calls.get(nid)
                if call is not None and call[0] == peer:
                    self._node_call_ended(nid, value if ok is True else CommandError(ErrorCode.INTERNAL, str(value)))
            elif kind == "w":
                _, aid, sessions, is_answer = message
                if is_answer is True:
                    self._audit_answered(peer, aid, sessions)
                else:
                    self._audit_asked(peer, aid, sessions)
            else:
                log.warning("relay message of unknown kind %r from %s; ignored", kind, peer)
        except (ValueError, TypeError, KeyError, ProtocolError) as exc:
            log.warning("malformed relay message %r from %s: %s", kind, peer, exc)

    def _serve(self, peer: str, rid: int, session: str | None, body: bytes, key_base: str | None = None,
               dialect: bool = False) -> None:
        """A peer's forwarded command (``q``), or a ``PUSHB`` as its client sent it (``k``: its
        jobs keyed with ``key_base``, read in bunqueue's dialect when ``dialect``)."""
        if type(body) is not bytes:
            raise ValueError("a forwarded command's body is not bytes")
        if len(self._served) >= SERVED_MAX:
            self._send(peer, ["r", rid, encode_body(CommandError(
                ErrorCode.OVERLOADED, "the leader serves too many forwarded commands").to_reply()),
                ErrorCode.OVERLOADED.value, None])
            return
        try:
            frame = decode_forwarded(body)
        except ProtocolError as exc:  # the forwarding node decoded it: a bug there, answered
            error = CommandError(ErrorCode.INVALID, str(exc))
            self._send(peer, ["r", rid, encode_body(error.to_reply()), error.code.value, None])
            return
        if key_base is not None:
            key_jobs(frame, key_base)
        req_id = frame.get("reqId")
        session, conn_id = self._session_of(peer, session)
        call = (_DialectCall if dialect else _Call)(self, peer, rid, session, conn_id, req_id)
        self._served[(peer, rid)] = call
        self.served += 1
        peer_command = self._peer_commands.get(frame.get("cmd"))  # type: ignore[arg-type]
        answer_guarded(peer_command or self.dispatcher.handle, call, frame, req_id)

    def _session_of(self, peer: str, session: str | None) -> tuple[str, int]:
        """The session a peer's forwarded command runs in, and its connection id here."""
        if session is None:
            return "", 0
        key = (peer, session)
        conn_id = self._remote_sessions.get(key, 0)
        if not conn_id:
            conn_id = self._remote_sessions[key] = next(self._session_ids)
            self.dispatcher.sessions.attach(session, conn_id)
        return session, conn_id

    def _serve_block(self, peer: str, rid: int, session: str | None, block: Any) -> None:
        """A peer's block of plain pushes (``b``): checked and committed as one run."""
        queue, datas, keys, names = block
        if type(queue) is not str or type(datas) is not list or not datas or type(keys) is not list \
                or len(keys) != len(datas) or not (names is None or (type(names) is list and len(names) == len(datas))) \
                or not all(type(data) is bytes for data in datas) or not (session is None or type(session) is str):
            raise ValueError("not a block of pushes")
        if len(self._served) >= SERVED_MAX:
            error = CommandError(ErrorCode.OVERLOADED, "the leader serves too many forwarded commands").to_reply()
            self._send(peer, ["B", rid, [error] * len(datas)])
            return
        frames = _pushes_of(queue, list(range(len(datas))), datas, keys, names)  # its fields: checked by the dispatcher
        session, conn_id = self._session_of(peer, session)
        call = _BlockCall(self, peer, rid, session, conn_id, len(datas))
        self._served[(peer, rid)] = call
        self.served += len(datas)
        try:
            self.dispatcher.handle_pushes(call, frames)
        except Exception as exc:
            log.exception("serving a forwarded block of %d PUSH failed", len(frames))
            error = CommandError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
            for i, result in enumerate(call.results):
                if result is None:
                    call.reply_error(i, error)

    def _answer_block(self, call: _BlockCall) -> None:
        self._served.pop((call.peer, call.rid), None)
        if not call.closed:
            self._send(call.peer, ["B", call.rid, call.results])

    def _answer(self, call: _Call, frame: dict[str, Any], code: str | None, body: dict[str, Any] | None) -> None:
        self._served.pop((call.peer, call.rid), None)
        if call.closed:
            return
        ids = _custom_ids_of(body) if body is not None else None
        try:
            data = encode_body(frame)
        except ProtocolError as exc:
            frame = {"ok": False, "error": f"reply could not be sent: {exc}", "code": exc.code.value,
                     "reqId": frame.get("reqId")}
            data, code = encode_body(frame), exc.code.value
        self._send(call.peer, ["r", call.rid, data, code, ids])

    def _end_session(self, peer: str, session: Any, how: Any = None) -> None:
        conn_id = self._remote_sessions.pop((peer, session), None)
        if conn_id is None:
            return
        sessions = self.dispatcher.sessions
        if how == "now":
            sessions.end_now(session, conn_id)
        elif how == "kept":
            sessions.forget(session, conn_id)
        else:
            sessions.detach(session, conn_id)

    def serve_peer_commands(self, names: frozenset[str], handler: Callable[[Any, dict[str, Any]], None]) -> None:
        """Hand the internal commands ``names`` that peers send over this link (never accepted
        from a client) to ``handler(conn, frame)``, which answers through ``conn``."""
        for name in names:
            self._peer_commands[name] = handler

    # --- node-level calls ----------------------------------------------------------------------------

    def serve_node_calls(self, name: str, handler: Callable[[Any], Awaitable[Any]]) -> None:
        """Answer peers' :meth:`ask_node` calls named ``name`` with ``await handler(arg)`` (a value
        MessagePack can carry; an exception becomes the caller's error)."""
        self._node_handlers[name] = handler

    async def ask_node(self, peer: str, name: str, arg: Any = None,
                       timeout_s: float = NODE_CALL_TIMEOUT_S) -> Any:
        """Run ``name`` at node ``peer`` (registered there with :meth:`serve_node_calls`) and
        return its result; raises ``CommandError`` (``NO_LEADER`` without a link, ``TIMEOUT``,
        ``OVERLOADED``, or the peer's error as ``INTERNAL``)."""
        if len(self._node_calls) >= NODE_CALLS_MAX:
            raise CommandError(ErrorCode.OVERLOADED, f"{NODE_CALLS_MAX} calls to other nodes in flight")
        nid = next(self._rids)
        future: asyncio.Future[Any] = self.loop.create_future()
        if not self._send(peer, ["n", nid, name, arg]):
            raise CommandError(ErrorCode.NO_LEADER, f"no link to node {peer}")
        self._node_calls[nid] = (peer, future)
        try:
            async with asyncio.timeout(timeout_s):
                result = await future
        except TimeoutError:
            raise CommandError(ErrorCode.TIMEOUT, f"node {peer} did not answer {name} in {timeout_s:g} s") from None
        finally:
            self._node_calls.pop(nid, None)
        if isinstance(result, CommandError):
            raise result
        return result

    def _node_call_ended(self, nid: int, result: Any) -> None:
        call = self._node_calls.pop(nid, None)
        if call is not None and not call[1].done():
            call[1].set_result(result)

    def _serve_node_call(self, peer: str, nid: Any, name: Any, arg: Any) -> None:
        handler = self._node_handlers.get(name) if type(name) is str else None
        if handler is None:
            self._send(peer, ["m", nid, False, f"unknown node call {name!r}"])
            return
        if self._node_serving >= NODE_CALLS_MAX:
            self._send(peer, ["m", nid, False, f"{NODE_CALLS_MAX} node calls are being served"])
            return
        self._node_serving += 1

        async def run() -> None:
            try:
                value = await handler(arg)
            except Exception as exc:  # the caller gets the error; this node keeps serving
                log.warning("node call %s from %s failed: %s", name, peer, exc)
                self._send(peer, ["m", nid, False, f"{type(exc).__name__}: {exc}"])
            else:
                self._send(peer, ["m", nid, True, value])
            finally:
                self._node_serving -= 1

        task = self.loop.create_task(run())
        self._node_tasks.add(task)
        task.add_done_callback(self._node_tasks.discard)

    def peer_lost(self, peer: str) -> None:
        """The link to ``peer`` is gone: what it forwarded here ends; what went to it goes again
        (or, when repeating could do it twice, is answered TIMEOUT)."""
        for nid in [nid for nid, (where, _) in self._node_calls.items() if where == peer]:
            self._node_call_ended(nid, CommandError(ErrorCode.NO_LEADER, f"the link to node {peer} was lost"))
        for key in [k for k in self._served if k[0] == peer]:
            self._served.pop(key).closed = True
        for key in [k for k in self._remote_sessions if k[0] == peer]:
            self.dispatcher.sessions.detach(key[1], self._remote_sessions.pop(key))
        self.dispatcher.sessions.unwatch_peer(peer)  # it ended what it adopted from here, as above
        self.peer_subscriptions.pop(peer, None)
        for queue in [q for q, where in self._subscribed_at.items() if where == peer]:
            del self._subscribed_at[queue]
        for rid, pending in list(self._pending.items()):
            if pending.peer != peer:
                continue
            if pending.retry_safe:
                self._retry_later(rid, CommandError(ErrorCode.NO_LEADER, f"the link to {peer} was lost"))
            else:
                self._fail(rid, CommandError(ErrorCode.TIMEOUT, f"the link to {peer}, partition {pending.p}'s "
                                                                "leader, was lost: the outcome is unknown"))

    # --- housekeeping ---------------------------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                self._sweep(self.loop.time())
                for queue in list(self._subscribers):
                    self._place_subscription(queue)
                self._audit_step(self.loop.time())
            except Exception:  # the sweep must outlive a bug in one of its steps
                log.exception("relay sweep failed")

    def _sweep(self, now: float) -> None:
        """Answer what is past its deadline; send what waits at a node that no longer leads its
        partition (a frozen leader keeps its link up) to the new leader, when safe to repeat."""
        leaders: dict[int, str | None] = {}
        for rid, pending in list(self._pending.items()):
            if pending.deadline <= now:
                self._fail(rid, CommandError(ErrorCode.TIMEOUT, f"no answer from partition {pending.p}'s "
                                                                "leader in time: the outcome is unknown"))
                continue
            old = pending.peer
            if not old or not pending.retry_safe:
                continue  # not sent yet (a retry is due), or it could take effect twice
            p = pending.p
            leader = leaders[p] if p in leaders else leaders.setdefault(p, self._leader_of(p))
            if leader is None or leader == old:
                continue
            self._send(old, ["c", rid])  # the old leader drops the command if it still waits there
            pending.peer = ""  # its answer from there, if any, is ignored from now on
            self.followed += 1
            log.debug("partition %d's leader is now %s: request %d goes there from %s", p, leader, rid, old)
            self._dispatch(rid, pending)

    # --- session audits (see audits.py) -------------------------------------------------------------

    def _audit_step(self, now: float) -> None:
        """Finish the round under way when due, and begin one every AUDIT_INTERVAL_S."""
        now_ms = int(now * 1000)
        audit = self.audit
        if audit.round is not None:
            if audit.due(now_ms, int(AUDIT_ANSWER_TIMEOUT_S * 1000)):
                self._audit_finish(now_ms)
            return
        if now < self._audit_next:
            return
        self._audit_next = now + AUDIT_INTERVAL_S
        candidates = self._audit_candidates()
        me = self.info.node_id
        nodes = [n for n in self.info.topology.nodes if n != me]
        rnd = audit.begin(now_ms, candidates, nodes)
        if rnd is None:
            return
        sessions = rnd.sessions
        for node in nodes:
            if not self._send(node, ["w", rnd.aid, sessions, False]):
                log.debug("session audit %d: no link to %s", rnd.aid, node)
        if rnd.complete:  # no other node to ask
            self._audit_finish(now_ms)

    def _audit_candidates(self) -> dict[int, list[str]]:
        """Per partition led here (and caught up): the sessions holding leases that this node does
        not account for; one held by a client connection here is accounted for on the spot."""
        table = self.dispatcher.sessions
        out: dict[int, list[str]] = {}
        for p, part in self.dispatcher.directory.partitions.items():
            replica = part.replica
            if not replica.is_leader() or not replica.read_ready():
                continue
            found = []
            for session in replica.application.view.lease_sessions(SCAN_SESSIONS_MAX):
                if not session or session.startswith(KEPT_SESSION_PREFIX) or table.accounts(session, p):
                    continue
                if table.held_here(session):
                    table.used_partition(session, p)
                    self.sessions_adopted += 1
                    continue
                found.append(session)
            if found:
                out[p] = found
        return out

    def _audit_asked(self, peer: str, aid: Any, sessions: Any) -> None:
        """A leader's audit asks which of ``sessions`` this node holds: answer, and watch those."""
        if type(aid) is not int or type(sessions) is not list or len(sessions) > AUDIT_SESSIONS_MAX:
            log.warning("malformed session audit from %s; ignored", peer)
            return
        table = self.dispatcher.sessions
        held = [s for s in sessions
                if type(s) is str and len(s) <= SESSION_CHARS_MAX and table.held_here(s) and table.watch(s, peer)]
        self._send(peer, ["w", aid, held, True])

    def _audit_answered(self, peer: str, aid: Any, held: Any) -> None:
        if self.audit.answer(peer, aid, held):
            self._audit_finish(int(self.loop.time() * 1000))

    def _audit_finish(self, now_ms: int) -> None:
        """Act on a finished round: adopt what a node holds, release what none holds."""
        aid = self.audit.round.aid if self.audit.round is not None else 0
        verdict = self.audit.finish(now_ms)
        table = self.dispatcher.sessions
        hosted = self.dispatcher.directory.partitions
        for p, session, node in verdict.adopt:
            part = hosted.get(p)
            if part is None or not part.replica.is_leader():
                continue
            key = (node, session)
            if key not in self._remote_sessions:
                self._remote_sessions[key] = next(self._session_ids)
                table.attach(session, self._remote_sessions[key])
            table.used_partition(session, p)
            self.sessions_adopted += 1
        released = 0
        for p, session in verdict.release:
            part = hosted.get(p)
            # Still led here, still unaccounted for, still holding leases (not released meanwhile).
            if part is None or not part.replica.is_leader() or table.accounts(session, p) \
                    or table.held_here(session) or not part.replica.application.view.holds_leases(session):
                continue
            # a session id is a bearer secret (Identify takes it over): only its head is logged
            log.info("partition %d: session %s… holds leases and no node holds it; released", p, session[:6])
            table.release(session, {p})
            released += 1
        self.sessions_released += released
        if verdict.silent:
            now = self.loop.time()
            if verdict.silent != self._audit_silent or now >= self._audit_silent_next:  # not every round
                self._audit_silent, self._audit_silent_next = verdict.silent, now + AUDIT_SILENT_LOG_S
                log.info("session audit %d: no answer from %s; %d sessions adopted, the ones no node that "
                         "answered holds are kept until an audit every node answers", aid,
                         ", ".join(verdict.silent), len(verdict.adopt))
        elif verdict.adopt or released or verdict.waiting:
            log.info("session audit %d: %d adopted (held by other nodes), %d released, %d within their grace",
                     aid, len(verdict.adopt), released, verdict.waiting)

    def _session_gone(self, session: str, peers: set[str]) -> None:
        """``session``'s last client connection here is gone: tell the leaders that adopted it."""
        for peer in peers:
            self._send(peer, ["x", session])

    def stats(self) -> dict[str, int]:
        return {"forwarding": len(self._pending), "serving": len(self._served), "forwarded": self.forwarded,
                "served": self.served,
                "retried": self.retried, "followed": self.followed, "sessionsAdopted": self.sessions_adopted,
                "sessionsReleased": self.sessions_released}


def key_jobs(frame: dict[str, Any], base: str) -> None:
    """Give each job of a forwarded ``PUSHB`` (as its client sent it), or a forwarded ``PUSH``,
    that has neither a key nor a custom id (Shoal's ``customId`` or bunqueue's ``jobId``) the
    forwarding node's key: ``base`` and the job's index in hex (in place). Anything else is the
    schema's to refuse."""
    if frame.get("cmd") == "PUSH":
        if frame.get("idempotencyKey") is None and frame.get("customId") is None and frame.get("jobId") is None:
            frame["idempotencyKey"] = base + "0"
        return
    jobs = frame.get("jobs")
    if frame.get("cmd") != "PUSHB" or type(jobs) is not list:
        return
    fields = item_fields(jobs)  # in C: which names any job holds (None: a job that is not a map)
    if fields is not None and len(jobs) <= L.batch_jobs_max and fields.isdisjoint(_KEYED_FIELDS):
        # The usual bulk add: no job has a key or a custom id of its own.
        for job, suffix in zip(jobs, _hex_suffixes(len(jobs))):
            job["idempotencyKey"] = base + suffix
        return
    for i, job in enumerate(jobs):
        if type(job) is dict and job.get("idempotencyKey") is None and job.get("customId") is None \
                and job.get("jobId") is None:
            job["idempotencyKey"] = f"{base}{i:x}"


def _custom_id_of(job: dict[str, Any]) -> Any:
    """A job's custom id: ``customId``, else bunqueue's ``jobId`` (what normalizing renames)."""
    custom = job.get("customId")
    return job.get("jobId") if custom is None else custom


#: The fields that give a job an identity of its own: such a job gets no key of the node's.
_KEYED_FIELDS = frozenset({"idempotencyKey", "customId", "jobId"})
_HEX_SUFFIXES: list[str] = []


def _hex_suffixes(n: int) -> list[str]:
    """``["0", "1", ..., f"{n - 1:x}"]`` (at least; ``n`` at most a bulk add's limit): made once,
    as bulk adds reach a new size."""
    if len(_HEX_SUFFIXES) < n:
        _HEX_SUFFIXES.extend(f"{i:x}" for i in range(len(_HEX_SUFFIXES), n))
    return _HEX_SUFFIXES


def _long_poll_s(frame: dict[str, Any]) -> float:
    """How long a forwarded command may wait at its leader beyond the forwarding deadline: a
    ``PULL``'s or ``PULLB``'s long poll. The frame may be unchecked here: a wait the leader will
    refuse counts for no more than the longest it would take."""
    timeout = frame.get("timeout") if frame["cmd"] in ("PULL", "PULLB") else None
    if type(timeout) not in (int, float) or timeout <= 0:
        return 0.0
    return min(timeout, L.timeout_ms_max) / 1000


def _safe_to_repeat(frame: dict[str, Any], spec: Any) -> bool:
    """May ``frame`` be sent again after its outcome became unknown (a lost link)? Reads and
    retry-safe commands may; an add only with an idempotency key (bunqueue's client sets none,
    and a custom id makes a repeat a duplicate that adds nothing)."""
    if spec is None or not spec.retry_safe:
        return False
    cmd = frame["cmd"]
    if cmd == "PUSH":
        return frame.get("idempotencyKey") is not None or frame.get("customId") is not None
    if cmd == "PUSHB":
        return all(job.get("idempotencyKey") is not None or job.get("customId") is not None
                   for job in frame["jobs"])
    return True




def _pushes_of(queue: str, req_ids: list[Any], datas: list[Any], keys: list[Any],
               names: list[Any] | None) -> "list[PlainPush]":
    """A forwarded block as the plain pushes a client's connection hands the dispatcher."""
    return [PlainPush(queue=queue, data=msgspec.Raw(datas[i]), reqId=req_ids[i], idempotencyKey=keys[i],
                      name=None if names is None else names[i]) for i in range(len(datas))]


def _custom_ids_of(body: dict[str, Any]) -> list[str] | None:
    """The custom ids of the jobs a pull's reply holds (the forwarding node learns where they are)."""
    jobs = body.get("jobs")
    if jobs is None:
        job = body.get("job")
        jobs = [job] if type(job) is dict else None
    if not jobs:
        return None
    return [job["id"] for job in jobs if type(job) is dict and "customId" in job and type(job.get("id")) is str] or None
