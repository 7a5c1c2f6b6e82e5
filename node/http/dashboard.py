"""The web dashboard: its static files and the HTTP endpoints it needs beyond the job API.

The page (``node/dashboard/``) talks only to public endpoints, all in ``openapi.yaml``:

- ``GET /node``: this node's health, its replicas (term, commit/applied index, leader), the
  moves it runs as a leader and, for every queue of a partition it hosts, counts, totals,
  rates and a short history;
- ``GET /cluster``: ``/node`` of every node of the registry merged (each queue and each move
  from its partition's leader, nodes with their registry state and incarnation, the cluster's
  settings), and ``GET /cluster/stream``: the same as Server-Sent Events, once a second;
- ``GET /queues/{queue}``, ``/queues/{queue}/list``, ``/queues/{queue}/search``,
  ``GET /jobs/{id}/detail``: a queue's settings and history, jobs by state, search, a job's detail
  (with the ``traceId`` of the trace it was added in, when it carries one);
- actions (``POST /jobs/{id}/retry|promote|cancel|release``, ``DELETE /jobs/{id}``,
  ``POST /queues/{queue}/pause|resume|drain|clean|dlq/retry|dlq/purge``), each one command of
  the binary protocol run through the dispatcher, forwarded to the partition's leader;
- the worker simulation (``/simulation``, :mod:`shoal.node.simulation`).

**Counts history and rates are kept by each node, not replicated.** Every replica (leader or
follower) samples its applied counters once a second, so a queue's history survives a restart
of the page (unlike Flower, which keeps it in the UI process) and a change of leader (the new
leader sampled the same applied state); it starts over when the node restarts. Replicating
samples would put a Raft entry per partition per second on every cluster for a chart.

**Job timelines** are the job's own time fields (``createdAt``, ``runAt``, lease deadline,
``finishedAt``) plus the state changes its leader records while someone has the job's detail
open (:class:`Timelines`: recording job events costs the leader's hot path, so only then). They
live in memory (bounded) and are lost on failover.

With ``dashboard_read_only`` the actions and the simulation answer 403 ``READ_ONLY`` and the
page hides them. The static files are served without a token (they hold no data); every API
call the page makes carries ``Authorization: Bearer``, so before a valid token it shows only
its login form.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from shoal.cluster.errors import CommandError

from .util import STATUS_BY_CODE, dumps, error_response, json_response, sse

if TYPE_CHECKING:
    from ..view import NodeView

__all__ = ["Dashboard", "DashboardApi", "add_dashboard_routes", "DASHBOARD_OPEN_PATHS", "STATIC_DIR"]


class DashboardApi(Protocol):
    """What the dashboard uses of the node's HTTP API (:class:`~shoal.node.http.api.HttpApi`
    implements it; a protocol, so this module does not import the API that mounts it)."""

    node: "NodeView"
    started: float

    def readiness(self) -> dict[str, Any]:
        """The body of ``/ready``."""
        ...

    async def command(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Run one command; the reply frame."""
        ...

    async def answer(self, request: web.Request, reply: dict[str, Any],
                     frame: dict[str, Any] | None = None) -> web.StreamResponse:
        """The HTTP response to a reply frame."""
        ...

    def led_elsewhere(self, frame: dict[str, Any]) -> str | None:
        """The leader of ``frame``'s partition when another node leads it (else None)."""
        ...

    async def body(self, request: web.Request) -> dict[str, Any]:
        """The request's JSON object."""
        ...

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent.parent / "dashboard"
_STATIC = {"app.js": "application/javascript", "style.css": "text/css", "icon.svg": "image/svg+xml"}
#: Paths served without a token: the page shell, which only shows a login form until it has one.
DASHBOARD_OPEN_PATHS = frozenset({"/", *(f"/dashboard/{name}" for name in _STATIC)})

SAMPLE_INTERVAL_S = 1.0
HISTORY_SAMPLES = 600            # ten minutes at one sample a second
OVERVIEW_SPARK_SAMPLES = 120     # the overview's small charts: the last two minutes
RATE_WINDOW_SAMPLES = 5          # rates are averaged over the last five seconds
OVERVIEW_QUEUES_MAX = 500
PEER_TIMEOUT_S = 2.0
#: A relayed action waits for the other node to carry it out (stopping a simulation cancels its
#: workers and closes its client), which on a busy machine takes longer than a read of its view.
PEER_ACTION_TIMEOUT_S = 30.0
OVERVIEW_SHARED_S = 0.25
STREAM_INTERVAL_MS = (500, 10_000)
TIMELINE_ACTIVE_S = 30.0
TIMELINE_WATCHED_MAX = 100
TIMELINE_JOBS_MAX = 10_000
TIMELINE_ENTRIES_MAX = 32
LIST_LIMIT_MAX = 200
#: Dashboard actions: path (under /queues/{queue}/ or /jobs/{id}/) -> the protocol command it runs.
QUEUE_ACTIONS = {"pause": "Pause", "resume": "Resume", "drain": "Drain", "clean": "Clean",
                 "dlq/retry": "RetryDlq", "dlq/purge": "PurgeDlq"}
JOB_ACTIONS = {"retry": "RetryDlq or RetryCompleted", "promote": "Promote", "cancel": "Bury", "release": "Release"}
_STATES = ("waiting", "delayed", "active", "completed", "failed")
_TOTALS = ("enqueued", "completed", "failed")


class QueueSampler:
    """Once a second, the counters of every queue on every replica this node hosts."""

    def __init__(self, node: "NodeView") -> None:
        self.node = node
        # queue -> deque of (time ms, counts tuple in _STATES order, totals tuple in _TOTALS order)
        self.samples: dict[str, collections.deque[tuple[int, tuple[int, ...], tuple[int, ...]]]] = {}
        self.sampled_at: dict[int, int] = {}        # partition -> time of its last sample
        self.partition_of: dict[str, int] = {}

    def read(self, now: int) -> dict[int, dict[str, Any]]:
        """Every hosted replica's queue metrics (``Stats``) from its applied state, now."""
        out = {}
        for p, part in list(self.node.partitions.items()):
            try:
                out[p] = part.replica.application.view.read({"cmd": "Stats"}, now)["stats"]["queues"]
            except Exception:  # a replica still restoring: skip it this time
                log.debug("partition %d: no stats", p, exc_info=True)
        return out

    def sample(self) -> None:
        now = self.node.now_ms()
        read = self.read(now)
        seen = {q for q, p in self.partition_of.items() if p not in read}  # unread: keep their history
        for p, queues in read.items():
            for name, m in queues.items():
                seen.add(name)
                self.partition_of[name] = p
                counts = tuple(int(m["counts"].get(s, 0)) for s in _STATES)
                totals = tuple(int(m["totals"].get(t, 0)) for t in _TOTALS)
                ring = self.samples.get(name)
                if ring is None:
                    ring = self.samples[name] = collections.deque(maxlen=HISTORY_SAMPLES)
                    if p in self.sampled_at:
                        # Born since the partition's last sample: everything it counted happened
                        # in between, so a zero baseline then gives its first rates.
                        zero = (0,) * len(_STATES)
                        ring.append((self.sampled_at[p], zero, (0,) * len(_TOTALS)))
                ring.append((now, counts, totals))
            self.sampled_at[p] = now
        for gone in set(self.samples) - seen:  # obliterated, or this node no longer hosts it
            del self.samples[gone]
            self.partition_of.pop(gone, None)

    def history(self, queue: str, last: int = HISTORY_SAMPLES) -> dict[str, Any]:
        """Samples of ``queue`` as columns: ``t`` (ms), a list per state, and rates per second."""
        ring = list(self.samples.get(queue, ()))[-(last + 1):]
        out: dict[str, Any] = {"t": [s[0] for s in ring[1:]]}
        for i, state in enumerate(_STATES):
            out[state] = [s[1][i] for s in ring[1:]]
        for i, total in enumerate(_TOTALS):
            out[f"{total}Rate"] = [_per_s(a, b, i) for a, b in zip(ring, ring[1:])]
        return out

    def rates(self, queue: str) -> dict[str, float]:
        ring = self.samples.get(queue)
        if not ring or len(ring) < 2:
            return {t: 0.0 for t in _TOTALS}
        first, last = ring[max(0, len(ring) - 1 - RATE_WINDOW_SAMPLES)], ring[-1]
        return {t: _per_s(first, last, i) for i, t in enumerate(_TOTALS)}

    def views(self, spark: int, limit: int) -> dict[str, dict[str, Any]]:
        """Every queue hosted here: counts, totals and paused read now (a push shows up at the
        next look, not the next sample), rates and the last ``spark`` samples of history."""
        out: dict[str, dict[str, Any]] = {}
        for p, queues in sorted(self.read(self.node.now_ms()).items()):
            for name, m in queues.items():
                out[name] = {"partition": p, "paused": m["paused"], "type": m["type"],
                             "counts": dict(m["counts"]), "totals": dict(m["totals"]),
                             "rates": self.rates(name), "history": self.history(name, spark)}
        return {name: out[name] for name in sorted(out)[:limit]}


def _per_s(a: tuple[int, Any, tuple[int, ...]], b: tuple[int, Any, tuple[int, ...]], i: int) -> float:
    dt = (b[0] - a[0]) / 1000
    return round(max(0, b[2][i] - a[2][i]) / dt, 2) if dt > 0 else 0.0


class Timelines:
    """State changes with times of the jobs someone is looking at, recorded by their leader.

    Recording is on only while a job's detail is open (its drawer asks again every few
    seconds): the engine then builds an event for every job state change of the partitions
    this node leads, a cost on the hot path, so it is never on merely because a page is open.
    """

    def __init__(self, node: "NodeView") -> None:
        self.node = node
        self.jobs: collections.OrderedDict[str, list[tuple[int, str]]] = collections.OrderedDict()
        self.watched: collections.OrderedDict[str, float] = collections.OrderedDict()  # id -> until
        self.listening = False

    def touch(self, job_id: str) -> None:
        """Someone opened ``job_id``: record its changes for the next :data:`TIMELINE_ACTIVE_S` s."""
        self.watched[job_id] = time.monotonic() + TIMELINE_ACTIVE_S
        self.watched.move_to_end(job_id)
        while len(self.watched) > TIMELINE_WATCHED_MAX:
            self.watched.popitem(last=False)
        if not self.listening:
            self.listening = True
            self.node.event_listeners.append(self.on_events)
            self.node.events_wanted()

    def expire(self) -> None:
        now = time.monotonic()
        for job_id in [j for j, until in self.watched.items() if until < now]:
            del self.watched[job_id]
        if self.listening and not self.watched:
            self.listening = False
            self.node.event_listeners.remove(self.on_events)

    def on_events(self, events: list[dict[str, Any]]) -> None:
        watched, jobs = self.watched, self.jobs
        now = self.node.now_ms()
        for ev in events:
            job_id = ev.get("id")
            if job_id not in watched or ev.get("event") != "job":
                continue
            entries = jobs.get(job_id)
            if entries is None:
                entries = jobs[job_id] = []
                if len(jobs) > TIMELINE_JOBS_MAX:
                    jobs.popitem(last=False)
            else:
                jobs.move_to_end(job_id)
            entries.append((now, str(ev.get("state"))))
            if len(entries) > TIMELINE_ENTRIES_MAX:
                del entries[0]

    def of(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The job's timeline: fields the engine keeps, then what the leader saw, by time."""
        out = [{"time": job.get("createdAt"), "state": "created", "source": "job"}]
        if job.get("runAt") and job["runAt"] > job.get("createdAt", 0):
            out.append({"time": job["runAt"], "state": "due", "source": "job"})
        for t, state in self.jobs.get(str(job.get("id")), ()):
            out.append({"time": t, "state": state, "source": "leader"})
        if job.get("leaseDeadline"):
            out.append({"time": job["leaseDeadline"], "state": "lease ends", "source": "job"})
        if job.get("finishedAt"):
            out.append({"time": job["finishedAt"], "state": job.get("state"), "source": "job"})
        out.sort(key=lambda e: e["time"] or 0)
        return out


class Dashboard:
    """The dashboard's endpoints, bound to one node's HTTP API."""

    def __init__(self, api: DashboardApi) -> None:
        self.api = api
        self.node = api.node
        self.read_only = bool(getattr(self.node.config, "dashboard_read_only", False))
        self.sampler = QueueSampler(self.node)
        self.timelines = Timelines(self.node)
        self._task: asyncio.Task[None] | None = None
        self._overview_cache: tuple[float, str, dict[str, Any]] | None = None
        self.simulation: Any = None

    # --- lifecycle ------------------------------------------------------------------------------

    async def on_startup(self, _: web.Application) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample_loop())
        relay = self.node.dispatcher.relay
        if relay is not None:  # other nodes' dashboards ask this one over the node-to-node link
            relay.serve_node_calls("dashboard.node", self._node_view_call)
            relay.serve_node_calls("simulation.stop", self._simulation_stop_call)
            relay.serve_node_calls("dashboard.job", self._job_detail_call)

    async def on_cleanup(self, _: web.Application) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.simulation is not None:
            await self.simulation.stop()

    async def _sample_loop(self) -> None:
        while True:
            try:
                self.sampler.sample()
                self.timelines.expire()
            except Exception:  # never let the chart sampler die with the node still up
                log.exception("dashboard sampler failed")
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    # --- static files ---------------------------------------------------------------------------

    async def index(self, _: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers={
            "Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-cache",
            # The page loads nothing from elsewhere: say so to the browser too.
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'",
            "X-Frame-Options": "DENY"})

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        kind = _STATIC.get(name)
        if kind is None:
            return error_response("NOT_FOUND", f"no dashboard file {name}")
        return web.FileResponse(STATIC_DIR / name, headers={"Content-Type": kind, "Cache-Control": "no-cache"})

    # --- overview -------------------------------------------------------------------------------

    def node_view(self) -> dict[str, Any]:
        """This node's part of the overview."""
        node = self.node
        health = self.api.readiness()
        rss = None
        try:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * _page_size()
        except (OSError, ValueError, IndexError):
            pass
        # Not node.local_stats(): its digest hashes a snapshot of the whole state, far too much
        # to do once a second for a chart.
        replicas = {}
        for p, part in sorted(node.partitions.items()):
            r = part.replica
            replicas[str(p)] = {"isLeader": r.is_leader(), "term": r.term(), "commitIndex": r.commit_index(),
                                "appliedIndex": r.applied_index(), "pendingCommands": part.group_commit.pending}
        queues = self.sampler.views(OVERVIEW_SPARK_SAMPLES, OVERVIEW_QUEUES_MAX)
        return {"nodeId": node.node_id, "incarnation": node.incarnation, "ready": health["ready"],
                "stopping": node.stopping, "moves": node.moves.moves(),
                "uptimeS": round(time.time() - self.api.started, 1), "rssBytes": rss,
                "connections": len(node.dispatcher.connections), "httpStreams": dict(node.metrics.http_streams),
                "sessions": node.dispatcher.sessions.active, "commandsTotal": node.dispatcher.commands_total,
                "replicas": replicas, "queues": queues,
                "simulation": self.simulation.status() if self.simulation is not None else None}

    async def node_endpoint(self, _: web.Request) -> web.Response:
        return json_response({"ok": True, **self.node_view()})

    async def _node_view_call(self, _: Any) -> dict[str, Any]:
        return self.node_view()

    async def _peer_view(self, node_id: str) -> dict[str, Any]:
        """Another node's part of the overview, asked over the node-to-node link."""
        relay = self.node.dispatcher.relay
        if relay is None:
            return {"nodeId": node_id, "reachable": False, "error": "no link to other nodes"}
        try:
            body = await relay.ask_node(node_id, "dashboard.node", None, PEER_TIMEOUT_S)
        except CommandError as exc:
            return {"nodeId": node_id, "reachable": False, "error": str(exc)}
        if not isinstance(body, dict):
            return {"nodeId": node_id, "reachable": False, "error": "a malformed answer"}
        return {**body, "reachable": True}

    async def overview(self, authorization: str | None) -> dict[str, Any]:
        """Every node's view merged: nodes, partitions (leader's figures), queues (from leaders)."""
        cached = self._overview_cache
        if cached is not None and cached[1] == (authorization or "") and time.monotonic() - cached[0] < OVERVIEW_SHARED_S:
            return cached[2]  # several viewers of one node share one fan-out
        async def local() -> dict[str, Any]:
            return self.node_view()

        registry = self.node.cluster_map.registry
        ids = [n.id for n in registry.live()]
        views = await asyncio.gather(*(local() if i == self.node.node_id else self._peer_view(i)
                                       for i in ids))
        for v in views:
            if v.get("nodeId") == self.node.node_id:
                v["reachable"] = True
        partitions: dict[int, dict[str, Any]] = {}
        for info in self.node.topology.partition_map:
            partitions[info.id] = {"id": info.id, "replicas": list(info.replicas), "leader": info.leader,
                                   "term": info.term, "members": {}}
        queues: dict[str, dict[str, Any]] = {}
        best_term: dict[int, int] = {}
        for v in views:
            if not v.get("reachable"):
                continue
            for p_text, r in v.get("replicas", {}).items():
                part = partitions.setdefault(int(p_text), {"id": int(p_text), "replicas": [], "members": {}})
                part["members"][v["nodeId"]] = {k: r.get(k) for k in (
                    "isLeader", "term", "commitIndex", "appliedIndex", "pendingCommands")}
                if r.get("isLeader") and r.get("term", 0) >= best_term.get(int(p_text), -1):
                    best_term[int(p_text)] = r.get("term", 0)
                    part["leader"], part["term"] = v["nodeId"], r.get("term", 0)
                    part["commitIndex"], part["appliedIndex"] = r.get("commitIndex"), r.get("appliedIndex")
        for part in partitions.values():
            commit = max((m.get("commitIndex") or 0 for m in part["members"].values()), default=0)
            for m in part["members"].values():
                m["lag"] = max(0, commit - (m.get("appliedIndex") or 0))
        for v in views:  # each queue as its partition's leader sees it (a follower's if none answered)
            if not v.get("reachable"):
                continue
            for name, q in v.get("queues", {}).items():
                leads = partitions.get(q["partition"], {}).get("leader") == v["nodeId"]
                if leads or name not in queues:
                    queues[name] = {**q, "reportedBy": v["nodeId"]}
        nodes = [{k: v.get(k) for k in ("nodeId", "reachable", "error", "ready", "stopping", "uptimeS", "rssBytes",
                                        "connections", "httpStreams", "sessions", "commandsTotal")}
                 | {"leading": sorted(int(p) for p, r in v.get("replicas", {}).items() if r.get("isLeader")),
                    "hosting": sorted(int(p) for p in v.get("replicas", {})),
                    "state": registry.nodes[v["nodeId"]].state, "incarnation": registry.nodes[v["nodeId"]].incarnation,
                    "member": registry.nodes[v["nodeId"]].member()}
                 for v in views]
        # Each partition's moves as its leader reports them (a stale leader's are left out).
        moves = [m for v in views if v.get("reachable") for m in v.get("moves", ())
                 if partitions.get(m.get("partition"), {}).get("leader") == v["nodeId"]]
        moves.sort(key=lambda m: (m.get("partition", 0), m.get("to") or "", m.get("from") or ""))
        sims = [v["simulation"] | {"nodeId": v["nodeId"]} for v in views if v.get("simulation")]
        out = {"ok": True, "clusterId": self.node.config.cluster_id, "servedBy": self.node.node_id,
               "readOnly": self.read_only, "time": self.node.now_ms(), "nodes": nodes,
               "partitions": [partitions[p] for p in sorted(partitions)],
               "queues": dict(sorted(queues.items())), "simulations": sims, "moves": moves,
               "settings": {"replication": registry.settings.replication, "replicasPerPartition": registry.rf(),
                            "rebalanceAuto": registry.settings.rebalance_auto,
                            "moveRateBytesPerS": registry.settings.move_rate_bytes_per_s}}
        self._overview_cache = (time.monotonic(), authorization or "", out)
        return out

    async def cluster(self, request: web.Request) -> web.Response:
        return json_response(await self.overview(request.headers.get("Authorization")))

    async def cluster_stream(self, request: web.Request) -> web.StreamResponse:
        """The overview as Server-Sent Events (``event: overview``) every ``interval`` ms."""
        try:
            interval = int(request.query.get("interval", "1000"))
        except ValueError:
            return error_response("INVALID", "interval: must be an integer (ms)")
        if not STREAM_INTERVAL_MS[0] <= interval <= STREAM_INTERVAL_MS[1]:
            return error_response("INVALID", f"interval: must be {STREAM_INTERVAL_MS[0]}..{STREAM_INTERVAL_MS[1]} ms")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        metrics = self.node.metrics
        metrics.http_streams["cluster"] = metrics.http_streams.get("cluster", 0) + 1
        seq = 0
        try:
            await response.write(b"retry: 2000\n\n")
            while not self.node.stopping:
                seq += 1
                await response.write(sse("overview", await self.overview(request.headers.get("Authorization")),
                                         event_id=seq))
                await asyncio.sleep(interval / 1000)
        except ConnectionResetError:
            pass
        finally:
            metrics.http_streams["cluster"] -= 1
        return response

    # --- queue and job reads --------------------------------------------------------------------

    async def queue_info(self, request: web.Request) -> web.StreamResponse:
        """A queue's settings, counts, totals, calls (``Metrics``) plus this leader's history."""
        queue = request.match_info["queue"]
        reply = await self.api.command({"cmd": "Metrics", "queue": queue})
        if reply.get("ok"):
            reply["history"] = self.sampler.history(queue)
            reply["rates"] = self.sampler.rates(queue)
            reply["readOnly"] = self.read_only
        return await self.api.answer(request, reply)

    async def list_jobs(self, request: web.Request) -> web.StreamResponse:
        """Jobs of a queue by state, ``offset``/``limit`` paged (``GetJobs``), optionally by ``tag``."""
        frame: dict[str, Any] = {"cmd": "GetJobs", "queue": request.match_info["queue"]}
        try:
            for name in ("offset", "limit"):
                if name in request.query:
                    frame[name] = int(request.query[name])
        except ValueError:
            return error_response("INVALID", "offset and limit: must be integers")
        if frame.get("limit", 1) > LIST_LIMIT_MAX:
            return error_response("INVALID", f"limit: must be at most {LIST_LIMIT_MAX}")
        for name in ("state", "tag"):
            if request.query.get(name):
                frame[name] = request.query[name]
        return await self.api.answer(request, await self.api.command(frame))

    async def search(self, request: web.Request) -> web.StreamResponse:
        """Jobs of a queue whose id, custom id or tag is ``q`` (exact matches)."""
        queue = request.match_info["queue"]
        text = request.query.get("q", "").strip()
        if not text:
            return error_response("INVALID", "q: required (a job id, custom id or tag)")
        if len(text) > 256:
            return error_response("INVALID", "q: at most 256 characters")
        by_custom = await self.api.command({"cmd": "GetJobByCustomId", "queue": queue, "customId": text})
        if not by_custom.get("ok"):
            return await self.api.answer(request, by_custom)  # a bad name, or forwarded to the leader
        found: dict[str, dict[str, Any]] = {}
        matched: dict[str, list[str]] = {}

        def add(job: dict[str, Any] | None, how: str) -> None:
            if job and job.get("queue") == queue:
                found.setdefault(str(job["id"]), job)
                matched.setdefault(str(job["id"]), []).append(how)

        # Not an id (INVALID), or one of another partition (NOT_LEADER): no job of this queue.
        by_id = await self.api.command({"cmd": "GetJob", "id": text})
        if by_id.get("ok"):
            add(by_id.get("job"), "id")
        add(by_custom.get("job"), "customId")
        by_tag = await self.api.command({"cmd": "GetJobs", "queue": queue, "tag": text, "limit": LIST_LIMIT_MAX})
        tagged_total = 0
        if by_tag.get("ok"):
            tagged_total = by_tag.get("total", 0)
            for job in by_tag.get("jobs", ()):
                add(job, "tag")
        jobs = [{**job, "matched": matched[i]} for i, job in found.items()]
        return json_response({"ok": True, "jobs": jobs, "taggedTotal": tagged_total})

    async def job_detail(self, request: web.Request) -> web.StreamResponse:
        """A job with its logs, progress message and timeline (``GetJob``, ``GetLogs``, ``GetProgress``),
        from the leader of its partition: the leader records the timeline while the job is looked at."""
        job_id = request.match_info["id"]
        leader = self.api.led_elsewhere({"cmd": "GetJob", "id": job_id})
        relay = self.node.dispatcher.relay
        if leader is not None and relay is not None:
            try:
                status, text = await relay.ask_node(leader, "dashboard.job", job_id, PEER_TIMEOUT_S)
            except (CommandError, ValueError, TypeError) as exc:  # no answer, or not (status, JSON text)
                return error_response("NOT_LEADER", f"node {leader}, the job's leader, did not answer: {exc}", 503)
            return web.Response(text=text, status=status, content_type="application/json")
        reply = await self.api.command({"cmd": "GetJob", "id": job_id})
        if not reply.get("ok"):
            return await self.api.answer(request, reply)
        status, text = await self._job_detail_call(job_id, reply)
        return web.Response(text=text, status=status, content_type="application/json")

    async def _job_detail_call(self, job_id: Any, reply: dict[str, Any] | None = None) -> tuple[int, str]:
        """(HTTP status, JSON text) of a job's detail, its timeline recorded here from now on."""
        if type(job_id) is not str:
            return 400, dumps({"ok": False, "code": "INVALID", "error": "id: must be a string"})
        if reply is None:
            reply = await self.api.command({"cmd": "GetJob", "id": job_id})
            if not reply.get("ok"):
                return STATUS_BY_CODE.get(str(reply.get("code")), 500), dumps(reply)
        job = reply.get("job")
        if job is None:
            return 404, dumps({"ok": False, "code": "NOT_FOUND", "error": f"no job {job_id}"})
        self.timelines.touch(job_id)  # the job's events are recorded here while it is looked at
        logs = await self.api.command({"cmd": "GetLogs", "id": job_id})
        progress = await self.api.command({"cmd": "GetProgress", "id": job_id})
        return 200, dumps({"ok": True, "job": job, "logs": logs.get("logs", []),
                           "progressMessage": progress.get("message"), "traceId": trace_id_of(job),
                           "timeline": self.timelines.of(job), "readOnly": self.read_only})

    # --- actions --------------------------------------------------------------------------------

    def _refused(self) -> web.Response | None:
        if self.read_only:
            return error_response("READ_ONLY", "the dashboard is read-only on this cluster (dashboard_read_only)",
                                  403)
        return None

    async def job_action(self, request: web.Request) -> web.StreamResponse:
        """retry (DLQ or completed), promote, cancel (to the DLQ), release, delete: one command each."""
        refused = self._refused()
        if refused is not None:
            return refused
        job_id = request.match_info["id"]
        action = "delete" if request.method == "DELETE" else _route(request).removeprefix("/jobs/{id}/")
        if action == "retry":
            got = await self.api.command({"cmd": "GetJob", "id": job_id})
            if not got.get("ok"):
                return await self.api.answer(request, got)
            job = got.get("job")
            if job is None:
                return error_response("NOT_FOUND", f"no job {job_id}")
            cmd = {"failed": "RetryDlq", "completed": "RetryCompleted"}.get(job["state"])
            if cmd is None:
                return error_response("INVALID_STATE", f"job {job_id} is {job['state']}: only failed or "
                                      "completed jobs can be retried")
            frame: dict[str, Any] = {"cmd": cmd, "queue": job["queue"], "id": job_id}
        elif action == "cancel":
            frame = {"cmd": "Bury", "id": job_id, "error": "cancelled from the dashboard"}
        else:
            frame = {"cmd": {"promote": "Promote", "release": "Release", "delete": "Cancel"}[action], "id": job_id}
        return await self.api.answer(request, await self.api.command(frame))

    async def queue_action(self, request: web.Request) -> web.StreamResponse:
        """pause, resume, drain, clean ``{state?, grace?, limit?}``, dlq/retry, dlq/purge."""
        refused = self._refused()
        if refused is not None:
            return refused
        queue = request.match_info["queue"]
        action = _route(request).removeprefix("/queues/{queue}/")
        frame: dict[str, Any] = {"cmd": QUEUE_ACTIONS[action], "queue": queue}
        if action == "clean":
            body = await self.api.body(request)
            unknown = set(body) - {"state", "grace", "limit"}
            if unknown:
                return error_response("INVALID", f"{sorted(unknown)[0]}: unknown field (state, grace, limit)")
            frame.update({"grace": 0, **body})
        return await self.api.answer(request, await self.api.command(frame))

    # --- simulation -----------------------------------------------------------------------------

    async def simulation_status(self, _: web.Request) -> web.Response:
        sim = self.simulation
        return json_response({"ok": True, "simulation": sim.status() if sim is not None else None,
                              "readOnly": self.read_only})

    async def simulation_start(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused()
        if refused is not None:
            return refused
        from ..simulation import Simulation, SimulationParams  # deferred: the client library
        body = await self.api.body(request)
        try:
            params = SimulationParams.from_body(body)
        except CommandError as exc:
            return error_response(exc.code.value, str(exc))
        if self.simulation is not None and self.simulation.running:
            return error_response("INVALID_STATE", "a simulation is already running on this node; stop it first")
        token = None
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            token = header[7:].strip()
        self.simulation = Simulation(self.node, params, token)
        self.simulation.start()
        return json_response({"ok": True, "simulation": self.simulation.status()})

    async def simulation_stop(self, request: web.Request) -> web.StreamResponse:
        """Stop this node's simulation, or with ``?node=<id>`` the one another node runs."""
        refused = self._refused()
        if refused is not None:
            return refused
        other = request.query.get("node")
        if other and other != self.node.node_id:
            live = {n.id for n in self.node.cluster_map.registry.live()}
            relay = self.node.dispatcher.relay
            if other not in live or relay is None:
                return error_response("INVALID", f"node: {other!r} is not a node of this cluster")
            try:
                status, body = await relay.ask_node(other, "simulation.stop", None, PEER_ACTION_TIMEOUT_S)
            except (CommandError, ValueError, TypeError) as exc:  # no answer, or not (status, body)
                return error_response("NOT_LEADER", f"node {other} did not answer: {exc}", 503)
            return json_response(body, status)
        status, body = await self._simulation_stop_call(None)
        return json_response(body, status)

    async def _simulation_stop_call(self, _: Any) -> tuple[int, dict[str, Any]]:
        """Stop this node's simulation: (HTTP status, body)."""
        if self.simulation is None:
            return 404, {"ok": False, "code": "NOT_FOUND", "error": "no simulation on this node"}
        await self.simulation.stop()
        return 200, {"ok": True, "simulation": self.simulation.status()}


def trace_id_of(job: dict[str, Any]) -> str | None:
    """The trace a job was added in: the trace id of the W3C ``traceparent`` in its
    ``traceContext`` (which the client's OpenTelemetry hooks write), or None."""
    carrier = job.get("traceContext")
    value = carrier.get("traceparent") if isinstance(carrier, dict) else None
    if not isinstance(value, str):
        return None
    parts = value.split("-")
    if len(parts) < 4 or [len(p) for p in parts[:4]] != [2, 32, 16, 2] or (parts[0] == "00" and len(parts) != 4):
        return None
    if not all(_is_hex(p) for p in parts[:4]) or parts[0] == "ff" or set(parts[1]) == {"0"}:
        return None
    return parts[1]


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _route(request: web.Request) -> str:
    """The matched route's pattern (``/jobs/{id}/retry``), never the client's spelling of the path."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else ""


def _page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def add_dashboard_routes(app: web.Application, api: DashboardApi) -> Dashboard:
    """Register the dashboard's files and endpoints on ``app``; returns the bound handlers."""
    d = Dashboard(api)
    app.on_startup.append(d.on_startup)
    app.on_cleanup.append(d.on_cleanup)
    r = app.router
    r.add_get("/", d.index)
    r.add_get("/dashboard/{name}", d.static)
    r.add_get("/node", d.node_endpoint)
    r.add_get("/cluster", d.cluster)
    r.add_get("/cluster/stream", d.cluster_stream)
    r.add_get("/queues/{queue}", d.queue_info)
    r.add_get("/queues/{queue}/list", d.list_jobs)
    r.add_get("/queues/{queue}/search", d.search)
    for action in QUEUE_ACTIONS:
        r.add_post(f"/queues/{{queue}}/{action}", d.queue_action)
    r.add_get("/jobs/{id}/detail", d.job_detail)
    for action in JOB_ACTIONS:
        r.add_post(f"/jobs/{{id}}/{action}", d.job_action)
    r.add_delete("/jobs/{id}", d.job_action)
    r.add_get("/simulation", d.simulation_status)
    r.add_post("/simulation", d.simulation_start)
    r.add_delete("/simulation", d.simulation_stop)
    return d
