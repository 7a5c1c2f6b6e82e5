// Shoal dashboard: plain JavaScript, no library, nothing loaded from elsewhere.
// It uses only the node's public HTTP API (see /openapi.yaml): /cluster/stream (SSE, read with
// fetch so it can carry Authorization), /queues/..., /jobs/..., /simulation.
"use strict";

const STATES = ["waiting", "delayed", "active", "completed", "failed", "waiting-children", "cancelled"];
const STATE_LABEL = { waiting: "Waiting", delayed: "Delayed", active: "Active", completed: "Completed", failed: "Failed (DLQ)",
  "waiting-children": "Waiting for children", cancelled: "Cancelled" };
const PAGE = 50;
const $ = (sel, root = document) => root.querySelector(sel);

const app = {
  token: sessionStorage.getItem("shoal.token") || "",
  overview: null,        // the last /cluster answer
  readOnly: false,
  route: { name: "overview" },
  stream: null,          // AbortController of the SSE reader
  queue: null,           // the queue page's state
  timers: [],
};

// ---------------------------------------------------------------------------------------------
// helpers

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function fmtNum(n) {
  if (n === null || n === undefined) return "–";
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(n >= 1e7 ? 0 : 1) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(n >= 1e5 ? 0 : 1) + "k";
  return Number.isInteger(n) ? n.toLocaleString("en-US") : n.toFixed(1);
}
function fmtRate(r) { return r ? (r >= 100 ? Math.round(r).toLocaleString("en-US") : r.toFixed(1)) : "0"; }
function fmtBytes(b) {
  if (!b && b !== 0) return "–";
  const u = ["B", "KB", "MB", "GB", "TB"]; let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return b.toFixed(b >= 100 || i === 0 ? 0 : 1) + " " + u[i];
}
function fmtDuration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.floor(s);
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  if (d) return `${d}d ${h}h`; if (h) return `${h}h ${m}m`; if (m) return `${m}m ${s % 60}s`; return `${s}s`;
}
function fmtTime(ms) {
  if (!ms) return "–";
  const d = new Date(ms);
  return d.toLocaleTimeString("en-GB", { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}
function fmtDate(ms) {
  if (!ms) return "–";
  const d = new Date(ms);
  return d.toLocaleDateString("en-CA") + " " + d.toLocaleTimeString("en-GB", { hour12: false });
}
function ago(ms) {
  if (!ms) return "–";
  const s = (Date.now() - ms) / 1000;
  if (s < 0) return "in " + fmtDuration(-s);
  return fmtDuration(s) + " ago";
}
function num(n, cls = "") { return `<td class="num ${cls} ${n ? "" : "zero"}">${fmtNum(n)}</td>`; }
function stateBadge(s) { return `<span class="badge s-${esc(s)}"><span class="dot ${esc(s)}"></span>${esc(s)}</span>`; }
function preview(v) { const t = JSON.stringify(v); return t === undefined ? "" : t.length > 120 ? t.slice(0, 120) + "…" : t; }

function jsonHtml(value) {
  // pretty JSON with light colouring; every piece escaped
  const text = JSON.stringify(value, null, 2) ?? "null";
  return esc(text).replace(/(&quot;(?:\\.|[^&]|&(?!quot;))*?&quot;)(\s*:)?|\b(true|false|null)\b|(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)/g,
    (m, str, colon, lit, n) => str ? `<span class="${colon ? "k" : "s"}">${str}</span>${colon || ""}`
      : lit ? `<span class="b">${lit}</span>` : `<span class="n">${n}</span>`);
}

function toast(text, bad = false) {
  const t = $("#toast");
  t.textContent = text; t.className = "toast" + (bad ? " bad" : ""); t.hidden = false;
  clearTimeout(toast.timer); toast.timer = setTimeout(() => { t.hidden = true; }, 3500);
}

// ---------------------------------------------------------------------------------------------
// API

class ApiError extends Error {
  constructor(status, body) { super(body?.error || `HTTP ${status}`); this.status = status; this.code = body?.code; }
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  if (app.token) headers.Authorization = "Bearer " + app.token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store" });
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  if (resp.status === 401 || resp.status === 403 && data?.code === "AUTH_FAILED") { showLogin(data?.error); throw new ApiError(resp.status, data); }
  if (!resp.ok || (data && data.ok === false)) throw new ApiError(resp.status, data);
  return data;
}

// Server-Sent Events read through fetch (EventSource cannot send Authorization).
async function readStream(path, onEvent, signal) {
  const headers = { Accept: "text/event-stream" };
  if (app.token) headers.Authorization = "Bearer " + app.token;
  const resp = await fetch(path, { headers, signal, cache: "no-store" });
  if (resp.status === 401 || resp.status === 403) { showLogin(); return; }
  if (!resp.ok || !resp.body) throw new Error(`stream: HTTP ${resp.status}`);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
      let event = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (data) { try { onEvent(event, JSON.parse(data)); } catch (e) { console.error(e); } }
    }
  }
}

function setLive(state, text) {
  const el = $("#live");
  el.className = "live " + state;
  el.lastElementChild.textContent = text;
}

function startStream() {
  if (app.stream) app.stream.abort();
  const ctl = new AbortController();
  app.stream = ctl;
  const loop = async () => {
    let backoff = 1000;
    while (!ctl.signal.aborted) {
      try {
        setLive("", "connecting");
        await readStream("/cluster/stream?interval=1000", (event, data) => {
          if (event === "overview") { backoff = 1000; onOverview(data); }
        }, ctl.signal);
      } catch (e) {
        if (ctl.signal.aborted) return;
      }
      if (ctl.signal.aborted) return;
      setLive("off", "reconnecting");
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(backoff * 2, 10000);
    }
  };
  loop();
}

function onOverview(data) {
  app.overview = data;
  app.readOnly = !!data.readOnly;
  document.body.classList.toggle("read-only", app.readOnly);
  $("#ro-badge").hidden = !app.readOnly;
  $("#cluster-name").textContent = `${data.clusterId} · via ${data.servedBy}`;
  setLive("on", "live " + fmtTime(data.time).slice(0, 8));
  renderLive();
}

// ---------------------------------------------------------------------------------------------
// login and boot

function showLogin(message) {
  if (app.stream) { app.stream.abort(); app.stream = null; }
  app.token = ""; sessionStorage.removeItem("shoal.token");
  $("#topbar").hidden = true; $("#view").hidden = true; $("#drawer").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message && !/send Authorization/.test(message) ? message : "";
  $("#token").focus();
}

async function tryStart() {
  try {
    const data = await api("/cluster");
    $("#login").hidden = true; $("#topbar").hidden = false; $("#view").hidden = false;
    $("#logout").hidden = !app.token;
    onOverview(data);
    startStream();
    route();
    return true;
  } catch (e) {
    if (e.status === 401 || e.status === 403) return false;
    $("#view").hidden = false; $("#topbar").hidden = false;
    $("#view").innerHTML = `<div class="card empty">The node did not answer: ${esc(e.message)}. Retrying…</div>`;
    setTimeout(tryStart, 2000);
    return false;
  }
}

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const token = $("#token").value.trim();
  if (!token) return;
  app.token = token;
  const headers = { Authorization: "Bearer " + token };
  const resp = await fetch("/cluster", { headers, cache: "no-store" });
  if (resp.ok) {
    sessionStorage.setItem("shoal.token", token);
    $("#token").value = "";
    tryStart();
  } else {
    app.token = "";
    $("#login-error").textContent = resp.status === 403 ? "That token is not valid." : `Sign-in failed (HTTP ${resp.status}).`;
  }
});
$("#logout").addEventListener("click", () => showLogin());
$("#theme").addEventListener("click", () => {
  const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
  document.documentElement.dataset.theme = next;
  localStorage.setItem("shoal.theme", next);
  renderLive();
});
document.documentElement.dataset.theme = localStorage.getItem("shoal.theme")
  || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");

// ---------------------------------------------------------------------------------------------
// routing: #/  #/queues  #/queue/<name>?state=&page=&q=  #/simulation

function parseHash() {
  const h = location.hash.replace(/^#/, "") || "/";
  const [path, query] = h.split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "queue" && parts[1]) return { name: "queue", queue: parts[1], state: params.get("state") || "waiting",
    page: Math.max(0, parseInt(params.get("page") || "0", 10) || 0), q: params.get("q") || "", job: params.get("job") || "" };
  if (parts[0] === "queues") return { name: "queues" };
  if (parts[0] === "simulation") return { name: "simulation" };
  return { name: "overview" };
}
function queueHash(q, state, page = 0, search = "", job = "") {
  const p = new URLSearchParams();
  if (state) p.set("state", state);
  if (page) p.set("page", page);
  if (search) p.set("q", search);
  if (job) p.set("job", job);
  return `#/queue/${encodeURIComponent(q)}?${p}`;
}
window.addEventListener("hashchange", route);

function route() {
  if (!app.overview) return;
  const r = parseHash();
  const prev = app.route;
  app.route = r;
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("on", a.dataset.nav === (r.name === "queue" ? "queues" : r.name));
  }
  app.timers.forEach(clearInterval); app.timers = [];
  const view = $("#view");
  if (r.name === "queue") {
    const same = prev.name === "queue" && prev.queue === r.queue;
    if (!same) view.innerHTML = queueSkeleton(r.queue);
    else if (prev.state !== r.state || prev.page !== r.page || prev.q !== r.q) {
      $("#q-jobs").innerHTML = `<div class="empty">Loading…</div>`;  // never the last tab's rows under a new tab
      $("#q-pager").innerHTML = "";
    }
    loadQueue(r);
    app.timers.push(setInterval(() => {
      const q = app.queue, stale = !q || Date.now() - q.listedAt > LIST_REFRESH_MS;
      loadQueue(app.route, true, stale);
    }, 2000));
    if (r.job) openJob(r.job); else closeDrawer(false);
  } else {
    closeDrawer(false);
    if (r.name === "simulation") view.innerHTML = simulationSkeleton();
    else view.innerHTML = `<div id="live-view"></div>`;
    renderLive();
  }
}

let resizeTimer = 0;
window.addEventListener("resize", () => {
  // charts are drawn at their container's pixel width: draw them again at the new one
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    const r = app.route, q = app.queue;
    if (r.name === "queue" && q && q.name === r.queue) renderQueue(r, q.info, q.list);
    else renderLive();
  }, 150);
});

function renderLive() {
  const r = app.route, o = app.overview;
  if (!o) return;
  if (r.name === "overview") $("#live-view") && ($("#live-view").innerHTML = overviewHtml(o));
  else if (r.name === "queues") $("#live-view") && ($("#live-view").innerHTML = queuesPageHtml(o));
  else if (r.name === "simulation") renderSimulation(o);
  else if (r.name === "queue") renderQueueLive(o);
}

// ---------------------------------------------------------------------------------------------
// charts (SVG drawn here)

function cssVar(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }

function lineChart(t, series, { width = 800, height = 200, stacked = false, area = false, integer = false } = {}) {
  // drawn at the container's pixel width, so text and strokes are never stretched
  width = Math.max(240, Math.round(width));
  const padL = 44, padR = 12, padT = 10, padB = 22;
  const w = width - padL - padR, h = height - padT - padB;
  const n = t.length;
  if (n < 2) return `<svg class="chart" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}"><text x="${width / 2}" y="${height / 2}" text-anchor="middle">collecting samples (one a second)…</text></svg>`;
  let top = 0;
  const sums = new Array(n).fill(0);
  for (const s of series) for (let i = 0; i < n; i++) {
    const v = s.values[i] || 0;
    if (stacked) { sums[i] += v; top = Math.max(top, sums[i]); } else top = Math.max(top, v);
  }
  const step = niceStep(top / 4, integer);
  const max = Math.max(step, Math.ceil(top / step) * step);
  const x = (i) => padL + (i / (n - 1)) * w;
  const y = (v) => padT + h - (v / max) * h;
  let out = `<svg class="chart" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img">`;
  for (let v = 0; v <= max + step / 2; v += step) {
    const yy = y(v).toFixed(1);
    out += `<line class="grid-line" x1="${padL}" x2="${width - padR}" y1="${yy}" y2="${yy}"/>`;
    out += `<text x="${padL - 6}" y="${+yy + 3}" text-anchor="end">${fmtNum(Math.round(v * 100) / 100)}</text>`;
  }
  const t0 = t[0], t1 = t[n - 1], labels = Math.max(1, Math.min(width < 480 ? 2 : 4, Math.floor((t1 - t0) / 2000)));
  for (let k = 0; k <= labels; k++) {
    const tt = t0 + ((t1 - t0) * k) / labels;
    out += `<text x="${padL + (w * k) / labels}" y="${height - 6}" text-anchor="${k === 0 ? "start" : k === labels ? "end" : "middle"}">${fmtTime(tt).slice(0, 8)}</text>`;
  }
  const base = new Array(n).fill(0);
  for (const s of series) {
    const pts = [];
    for (let i = 0; i < n; i++) {
      const v = (s.values[i] || 0) + (stacked ? base[i] : 0);
      pts.push(`${x(i).toFixed(1)},${y(v).toFixed(1)}`);
    }
    const color = cssVar(s.color);
    if (stacked) {
      const low = [];
      for (let i = n - 1; i >= 0; i--) low.push(`${x(i).toFixed(1)},${y(base[i]).toFixed(1)}`);
      out += `<polygon points="${pts.join(" ")} ${low.join(" ")}" fill="${color}" fill-opacity="0.25" stroke="none"/>`;
      for (let i = 0; i < n; i++) base[i] += s.values[i] || 0;
    }
    if (area && !stacked) {
      out += `<polygon points="${x(0).toFixed(1)},${y(0).toFixed(1)} ${pts.join(" ")} ${x(n - 1).toFixed(1)},${y(0).toFixed(1)}" fill="${color}" fill-opacity="0.10" stroke="none"/>`;
    }
    out += `<polyline points="${pts.join(" ")}" fill="none" stroke="${color}" stroke-width="1.6" stroke-linejoin="round"/>`;
  }
  return out + "</svg>";
}
function niceStep(raw, integer) {
  if (raw <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5, 10]) {
    const step = m * p;
    if (step >= raw && (!integer || Number.isInteger(step))) return step;
  }
  return 10 * p;
}
function legend(series) {
  return `<div class="legend">${series.map((s) => `<span><i style="background:var(${s.color})"></i>${esc(s.name)}</span>`).join("")}</div>`;
}
function spark(values, color) {
  const n = values.length, W = 120, H = 28;
  if (n < 2) return `<svg class="spark" viewBox="0 0 ${W} ${H}"></svg>`;
  const max = Math.max(1, ...values);
  const pts = values.map((v, i) => `${((i / (n - 1)) * W).toFixed(1)},${(H - 2 - (v / max) * (H - 4)).toFixed(1)}`).join(" ");
  const c = cssVar(color);
  return `<svg class="spark" viewBox="0 0 ${W} ${H}" preserveAspectRatio="none"><polygon points="0,${H} ${pts} ${W},${H}" fill="${c}" fill-opacity=".15"/><polyline points="${pts}" fill="none" stroke="${c}" stroke-width="1.5" vector-effect="non-scaling-stroke"/></svg>`;
}

// ---------------------------------------------------------------------------------------------
// overview

function totalsOf(o) {
  const t = { waiting: 0, delayed: 0, active: 0, completed: 0, failed: 0, enq: 0, done: 0, fail: 0 };
  for (const q of Object.values(o.queues)) {
    for (const s of STATES) t[s] += q.counts[s] || 0;
    t.enq += q.rates.enqueued; t.done += q.rates.completed; t.fail += q.rates.failed;
  }
  return t;
}

function overviewHtml(o) {
  const t = totalsOf(o);
  const ready = o.nodes.filter((n) => n.reachable && n.ready).length;
  const led = o.partitions.filter((p) => p.leader).length;
  const stat = (label, value, sub, cls = "") => `<div class="card stat"><div class="label">${label}</div><div class="value ${cls}">${value}</div><div class="sub">${sub}</div></div>`;
  const down = o.nodes.filter((n) => !n.reachable).map((n) => n.nodeId);
  const leaderless = o.partitions.filter((p) => !p.leader).map((p) => "p" + p.id);
  return `
  <div class="grid stats" id="summary">
    ${stat("Nodes ready", `${ready}<small> / ${o.nodes.length}</small>`, down.length ? `unreachable: ${esc(down.join(", "))}` : ready < o.nodes.length ? "some are catching up" : "all reachable", ready < o.nodes.length ? "s-failed" : "")}
    ${stat("Partitions led", `${led}<small> / ${o.partitions.length}</small>`, leaderless.length ? `no leader: ${esc(leaderless.join(", "))}` : `${o.partitions.length} Raft groups`, led < o.partitions.length ? "s-failed" : "")}
    ${stat("Waiting", fmtNum(t.waiting), t.delayed ? `+ ${fmtNum(t.delayed)} delayed` : "ready to run", "s-waiting")}
    ${stat("Active", fmtNum(t.active), "leased to workers", "s-active")}
    ${stat("Failed", fmtNum(t.failed), "in dead-letter queues", t.failed ? "s-failed" : "")}
    ${stat("Throughput", `${fmtRate(t.done)}<small> done/s</small>`, `${fmtRate(t.enq)} in/s · ${fmtRate(t.fail)} failed/s`, "s-completed")}
  </div>
  <div class="card" style="margin-bottom:16px">
    <header><h2>Queues</h2><span class="count">${Object.keys(o.queues).length}</span><span class="spacer"></span><a href="#/queues" class="muted">all queues →</a></header>
    ${queuesTable(o)}
  </div>
  <div class="grid nodes" id="nodes">${o.nodes.map(nodeCard).join("")}</div>
  <div class="card" id="moves" style="margin-bottom:16px">
    <header><h2>Moves</h2><span class="count">${(o.moves || []).length}</span><span class="spacer"></span>${settingsHtml(o.settings)}</header>
    ${movesTable(o.moves || [])}
  </div>
  <div class="card">
    <header><h2>Partitions</h2><span class="count">${o.partitions.length} Raft groups</span></header>
    <div class="table-wrap">${partitionsTable(o)}</div>
  </div>`;
}

function nodeCard(n) {
  const status = !n.reachable ? `<span class="badge bad">unreachable</span>`
    : n.stopping ? `<span class="badge warn">stopping</span>`
    : n.ready ? `<span class="badge ok">ready</span>` : `<span class="badge warn">not ready</span>`;
  const state = n.state && n.state !== "active" ? ` <span class="badge warn" title="registry state: its replicas move to the other nodes">${esc(n.state)}</span>` : "";
  const body = n.reachable ? `<dl>
      <dt>Member</dt><dd title="incarnation ${esc(n.incarnation || "not yet known")}">${esc(n.member || n.nodeId)}</dd>
      <dt>Uptime</dt><dd>${fmtDuration(n.uptimeS)}</dd>
      <dt>Memory (RSS)</dt><dd>${fmtBytes(n.rssBytes)}</dd>
      <dt>Connections</dt><dd>${fmtNum(n.connections)}</dd>
      <dt>Sessions</dt><dd>${fmtNum(n.sessions)}</dd>
      <dt>Leads</dt><dd>${leadsHtml(n)}</dd>
    </dl>` : `<p class="muted">${esc(n.error || "no answer")}</p>`;
  return `<div class="card node" data-node="${esc(n.nodeId)}"><h3>${esc(n.nodeId)} ${status}${state}</h3>${body}</div>`;
}

// the same as `shoal cluster status`: partition, from → to (member ids), state, bytes, rate, time left
function settingsHtml(st) {
  if (!st) return "";
  return `<span class="muted">replication ${esc(st.replication)} (${esc(st.replicasPerPartition)} per partition) · rebalance ${st.rebalanceAuto ? "auto" : "by hand"} · move rate ${fmtBytes(st.moveRateBytesPerS)}/s</span>`;
}

function movesTable(moves) {
  if (!moves.length) return `<div class="empty">No moves: every partition is on its target replicas.</div>`;
  const rows = moves.map((m) => {
    const bytes = m.bytesSent !== undefined ? `${fmtBytes(m.bytesSent)} / ${fmtBytes(m.bytesTotal)}`
      : m.matchIndex !== undefined ? `log ${fmtNum(m.matchIndex)} / ${fmtNum(m.commitIndex)}` : "–";
    return `<tr data-move="${m.partition}"><td>p${m.partition}</td><td>${esc(m.fromMember || m.from || "–")}</td>
      <td>${esc(m.toMember || m.to || "–")}</td><td>${esc(m.state)}</td><td class="num">${bytes}</td>
      <td class="num">${m.rateBytesPerS !== undefined ? fmtBytes(m.rateBytesPerS) + "/s" : "–"}</td>
      <td class="num">${m.etaS !== undefined && m.etaS !== null ? fmtDuration(m.etaS) : "–"}</td></tr>`;
  }).join("");
  return `<div class="table-wrap"><table class="moves"><thead><tr><th>Partition</th><th>From</th><th>To</th><th>State</th>
    <th class="num">Sent</th><th class="num">Rate</th><th class="num">Time left</th></tr></thead><tbody>${rows}</tbody></table></div>`;
}

function leadsHtml(n) {
  // a replica that still believes it leads after a newer term elected another is shown apart
  const parts = app.overview ? app.overview.partitions : [];
  const leads = parts.filter((p) => p.leader === n.nodeId).map((p) => `<span class="badge leader">p${p.id}</span>`);
  const stale = (n.leading || []).filter((id) => !parts.some((p) => p.id === id && p.leader === n.nodeId))
    .map((id) => `<span class="badge warn" title="still believes it leads p${id}; a newer term elected another leader">p${id}?</span>`);
  return leads.concat(stale).join(" ") || `<span class="muted">none</span>`;
}

function partitionsTable(o) {
  const rows = o.partitions.map((p) => {
    const lag = Math.max(0, ...Object.values(p.members || {}).map((m) => m.lag || 0));
    const reps = (p.replicas || []).map((r) => `<span class="badge ${r === p.leader ? "leader" : ""}">${esc(r)}${r === p.leader ? " ★" : ""}</span>`).join(" ");
    return `<tr data-partition="${p.id}"><td>p${p.id}</td>
      <td class="leader-cell">${p.leader ? `<b>${esc(p.leader)}</b>` : `<span class="badge bad">no leader</span>`}</td>
      <td><div class="chips">${reps}</div></td><td class="num">${fmtNum(p.term)}</td>
      <td class="num">${fmtNum(p.commitIndex)}</td><td class="num">${fmtNum(p.appliedIndex)}</td>
      <td class="num ${lag > 100 ? "s-failed" : lag ? "" : "zero"}">${fmtNum(lag)}</td></tr>`;
  }).join("");
  return `<table><thead><tr><th>Partition</th><th>Leader</th><th>Replicas</th><th class="num">Term</th><th class="num">Commit</th><th class="num">Applied</th><th class="num" title="largest commit − applied over the replicas">Lag</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function queuesTable(o) {
  const names = Object.keys(o.queues);
  if (!names.length) return `<div class="empty">No queues yet. Push a job, or start the <a href="#/simulation">simulation</a>.</div>`;
  const rows = names.map((name) => {
    const q = o.queues[name], c = q.counts, r = q.rates;
    const backlog = q.history.waiting.map((v, i) => v + (q.history.active[i] || 0) + (q.history.delayed[i] || 0));
    return `<tr class="click" data-queue="${esc(name)}" data-href="${esc(queueHash(name, "waiting"))}">
      <td><a href="${esc(queueHash(name, "waiting"))}"><b>${esc(name)}</b></a> ${q.paused ? `<span class="badge warn">paused</span>` : ""}</td>
      <td class="muted hide-narrow">p${q.partition}</td>
      ${num(c.waiting, "s-waiting c-waiting")}${num(c.delayed, "s-delayed c-delayed")}${num(c.active, "s-active c-active")}${num(c.completed, "s-completed c-completed")}${num(c.failed, "s-failed c-failed")}
      <td class="num">${fmtRate(r.enqueued)}</td><td class="num">${fmtRate(r.completed)}</td><td class="num ${r.failed ? "s-failed" : ""}">${fmtRate(r.failed)}</td>
      <td class="hide-narrow" title="backlog (waiting + delayed + active), last 2 minutes">${spark(backlog, "--waiting")}</td>
      <td class="hide-narrow" title="completed per second, last 2 minutes">${spark(q.history.completedRate, "--completed")}</td></tr>`;
  }).join("");
  return `<div class="table-wrap"><table class="queues"><thead><tr><th>Queue</th><th class="hide-narrow">Part.</th>
    <th class="num">Waiting</th><th class="num">Delayed</th><th class="num">Active</th><th class="num">Completed</th><th class="num">Failed</th>
    <th class="num">In/s</th><th class="num">Done/s</th><th class="num">Fail/s</th><th class="hide-narrow">Backlog</th><th class="hide-narrow">Throughput</th></tr></thead>
    <tbody>${rows}</tbody></table></div>`;
}

function queuesPageHtml(o) {
  return `<div class="page-head"><h1>Queues</h1><span class="muted">${Object.keys(o.queues).length} queues over ${o.partitions.length} partitions</span></div>
    <div class="card">${queuesTable(o)}</div>`;
}

document.addEventListener("click", (ev) => {
  const row = ev.target.closest("tr.click[data-href]");
  if (row && !ev.target.closest("a,button")) location.hash = row.dataset.href;
});

// ---------------------------------------------------------------------------------------------
// queue page

function queueSkeleton(name) {
  return `<div class="page-head">
      <div><div class="crumbs"><a href="#/queues">Queues</a> /</div><h1 id="q-title">${esc(name)}</h1></div>
      <span id="q-badges"></span><span class="spacer"></span>
      <div class="actions action" id="q-actions"></div>
    </div>
    <div class="grid two">
      <div class="card"><header><h2>Jobs by state</h2><span class="count">last 10 minutes</span></header><div class="body" id="q-chart-counts"></div></div>
      <div class="card"><header><h2>Rates</h2><span class="count">jobs per second</span><span class="spacer"></span><span class="muted" id="q-totals"></span></header><div class="body" id="q-chart-rates"></div></div>
    </div>
    <div class="card">
      <nav class="state-tabs" id="q-states"></nav>
      <form class="toolbar" id="q-search">
        <input type="search" name="q" placeholder="Search by job id, custom id or tag" aria-label="search jobs">
        <button class="btn" type="submit">Search</button>
        <a class="btn" id="q-clear" hidden>Clear</a>
        <span class="spacer"></span>
        <span class="actions action" id="q-state-actions"></span>
      </form>
      <div class="table-wrap" id="q-jobs"><div class="empty">Loading…</div></div>
      <div class="pager" id="q-pager"></div>
    </div>`;
}

// The job list is read again only when the queue's counts moved (or every LIST_REFRESH_MS):
// listing scans the partition's jobs on the leader, the settings and history are cheap.
const LIST_REFRESH_MS = 15000;

async function loadQueue(r, background = false, withList = true) {
  const name = r.queue;
  const prev = app.queue && app.queue.route === r ? app.queue : null;
  if (!withList && !prev) withList = true;
  if (background && !withList && app.queueLoading) return;  // never drop a list read for a chart refresh
  app.queueLoading = true;
  const seq = (app.loadSeq = (app.loadSeq || 0) + 1);  // answers to an older route or reload are dropped
  const form = $("#q-search");
  if (form && !background) form.q.value = r.q;
  try {
    const [info, list] = await Promise.all([
      api(`/queues/${encodeURIComponent(name)}`),
      !withList ? Promise.resolve(prev.list)
        : r.q ? api(`/queues/${encodeURIComponent(name)}/search?q=${encodeURIComponent(r.q)}`)
        : api(`/queues/${encodeURIComponent(name)}/list?state=${r.state}&offset=${r.page * PAGE}&limit=${PAGE}`),
    ]);
    if (seq !== app.loadSeq || app.route !== r) return;
    app.queue = { name, route: r, info, list,
      listedAt: withList ? Date.now() : prev.listedAt, counts: JSON.stringify(info.metrics.counts) };
    renderQueue(r, info, list);
  } catch (e) {
    if (!background) $("#q-jobs").innerHTML = `<div class="empty">${esc(e.message)}</div>`;
  } finally {
    if (seq === app.loadSeq) app.queueLoading = false;
  }
}

function renderQueue(r, info, list) {
  const m = info.metrics, c = m.counts;
  $("#q-badges").innerHTML = `<span class="badge">${esc(m.type)}</span> ${m.paused ? `<span class="badge warn" id="q-paused">paused</span>` : `<span class="badge ok">running</span>`}`;
  $("#q-actions").innerHTML = app.readOnly ? "" : `
    ${m.paused ? `<button class="btn primary" data-qact="resume">Resume</button>` : `<button class="btn" data-qact="pause">Pause</button>`}
    <button class="btn" data-qact="drain" data-confirm="Remove every waiting and delayed job of this queue?">Drain</button>
    <button class="btn" data-qact="clean" data-confirm="Remove every completed job of this queue?">Clean completed</button>`;
  $("#q-states").innerHTML = STATES.map((s) => `<a href="${esc(queueHash(r.queue, s))}" class="${!r.q && r.state === s ? "on" : ""}" data-state="${s}"><span class="dot ${s}"></span>${STATE_LABEL[s]}<b class="tab-count">${fmtNum(c[s])}</b></a>`).join("");
  $("#q-state-actions").innerHTML = app.readOnly || r.q ? "" : r.state === "failed" && c.failed
    ? `<button class="btn" type="button" data-qact="dlq/retry" data-confirm="Retry every job of the DLQ?">Retry all</button><button class="btn danger" type="button" data-qact="dlq/purge" data-confirm="Delete every job of the DLQ for good?">Purge DLQ</button>`
    : r.state === "completed" && c.completed ? `<button class="btn" type="button" data-qact="clean" data-confirm="Remove every completed job of this queue?">Clean completed</button>` : "";
  $("#q-clear").hidden = !r.q; $("#q-clear").href = queueHash(r.queue, r.state);
  const tot = m.totals;
  $("#q-totals").textContent = `${fmtNum(tot.enqueued)} in · ${fmtNum(tot.completed)} done · ${fmtNum(tot.failed)} failed · ${fmtNum(tot.reclaimed)} reclaimed`;
  const h = info.history;
  const countSeries = [
    { name: "waiting", color: "--waiting", values: h.waiting }, { name: "delayed", color: "--delayed", values: h.delayed },
    { name: "active", color: "--active", values: h.active }, { name: "failed", color: "--failed", values: h.failed }];
  const cw = (id) => $(id).clientWidth - 32;
  $("#q-chart-counts").innerHTML = lineChart(h.t, countSeries, { area: true, integer: true, width: cw("#q-chart-counts") }) + legend(countSeries);
  const rateSeries = [
    { name: "enqueued/s", color: "--waiting", values: h.enqueuedRate }, { name: "completed/s", color: "--completed", values: h.completedRate },
    { name: "failed/s", color: "--failed", values: h.failedRate }];
  $("#q-chart-rates").innerHTML = lineChart(h.t, rateSeries, { width: cw("#q-chart-rates") }) + legend(rateSeries);
  const jobs = list.jobs || [];
  if (!jobs.length) {
    $("#q-jobs").innerHTML = `<div class="empty">${r.q ? `No job of this queue has the id, custom id or tag “${esc(r.q)}”.` : `No ${esc(r.state)} jobs.`}</div>`;
  } else {
    $("#q-jobs").innerHTML = `<table class="jobs"><thead><tr><th>Id</th><th>State</th><th class="num">Attempts</th><th>Created</th><th class="hide-narrow">Custom id / tag</th><th>Data</th><th class="hide-narrow">Error</th>${app.readOnly ? "" : "<th></th>"}</tr></thead><tbody>${jobs.map((j) => jobRow(r, j)).join("")}</tbody></table>`;
  }
  if (r.q) {
    $("#q-pager").innerHTML = `${jobs.length} found${list.taggedTotal > jobs.length ? ` (${fmtNum(list.taggedTotal)} tagged; the first ${jobs.length} shown)` : ""}`;
  } else {
    const total = list.total || 0, from = r.page * PAGE;
    const pages = Math.max(1, Math.ceil(total / PAGE));
    $("#q-pager").innerHTML = `<span>${total ? `${fmtNum(from + 1)}–${fmtNum(Math.min(total, from + PAGE))} of ${fmtNum(total)}` : ""}</span>
      <a class="btn small ${r.page ? "" : "disabled"}" ${r.page ? `href="${esc(queueHash(r.queue, r.state, r.page - 1))}"` : ""}>‹ Prev</a>
      <span>page ${r.page + 1} / ${pages}</span>
      <a class="btn small ${r.page + 1 < pages ? "" : "disabled"}" ${r.page + 1 < pages ? `href="${esc(queueHash(r.queue, r.state, r.page + 1))}"` : ""}>Next ›</a>`;
  }
}

function jobActions(j, small = true) {
  if (app.readOnly) return "";
  const b = (act, label, extra = "") => `<button class="btn ${small ? "small" : ""} ${extra}" type="button" data-jact="${act}" data-id="${esc(j.id)}">${label}</button>`;
  const out = [];
  if (j.state === "failed" || j.state === "completed") out.push(b("retry", "Retry"));
  if (j.state === "delayed") out.push(b("promote", "Promote"));
  if (j.state === "active") out.push(b("release", "Release"));
  if (["waiting", "delayed", "active"].includes(j.state)) out.push(b("cancel", "Cancel", "danger"));
  if (j.state !== "active") out.push(b("delete", "Delete", "danger"));
  return `<span class="actions">${out.join("")}</span>`;
}

function jobRow(r, j) {
  const ids = [j.customId ? `<span class="badge" title="custom id">${esc(j.customId)}</span>` : "", j.tag ? `<span class="badge" title="tag">#${esc(j.tag)}</span>` : ""].join(" ");
  return `<tr class="click" data-job="${esc(j.id)}" data-href="${esc(queueHash(r.queue, r.state, r.page, r.q, j.id))}">
    <td class="mono"><a href="${esc(queueHash(r.queue, r.state, r.page, r.q, j.id))}">${esc(j.id)}</a></td><td>${stateBadge(j.state)}</td>
    <td class="num">${j.attempts} / ${j.maxAttempts}</td><td title="${esc(fmtDate(j.createdAt))}">${esc(ago(j.createdAt))}</td>
    <td class="hide-narrow">${ids}</td><td class="data">${esc(preview(j.data))}</td><td class="err hide-narrow" title="${esc(j.error || "")}">${esc(j.error || "")}</td>
    ${app.readOnly ? "" : `<td>${jobActions(j)}</td>`}</tr>`;
}

function renderQueueLive(o) {
  // between the 2 s reloads, the overview stream keeps the state tabs' counts current, and a
  // change of counts has the job list read again
  const q = o.queues[app.route.queue];
  if (!q) return;
  const cur = app.queue;
  if (cur && cur.route === app.route && cur.counts !== JSON.stringify(q.counts) && Date.now() - cur.listedAt > 1000) {
    cur.counts = JSON.stringify(q.counts);
    loadQueue(app.route, true, true);
  }
  for (const s of STATES) {
    const el = document.querySelector(`#q-states a[data-state="${s}"] .tab-count`);
    if (el) el.textContent = fmtNum(q.counts[s]);
  }
}

$("#main").addEventListener("submit", (ev) => {
  if (ev.target.id !== "q-search") return;
  ev.preventDefault();
  const r = app.route;
  location.hash = queueHash(r.queue, r.state, 0, ev.target.q.value.trim());
});

document.addEventListener("click", async (ev) => {
  const q = ev.target.closest("[data-qact]");
  const j = ev.target.closest("[data-jact]");
  if (!q && !j) return;
  ev.preventDefault(); ev.stopPropagation();
  const btn = q || j;
  if (btn.dataset.confirm && !confirm(btn.dataset.confirm)) return;
  btn.disabled = true;
  try {
    if (q) {
      const res = await api(`/queues/${encodeURIComponent(app.route.queue)}/${q.dataset.qact}`, { method: "POST", body: q.dataset.qact === "clean" ? { state: "completed", grace: 0 } : undefined });
      toast(`${q.textContent.trim()}: done${res.count !== undefined ? ` (${res.count} jobs)` : ""}`);
    } else {
      const act = j.dataset.jact, id = j.dataset.id;
      if (act === "delete" && !confirm(`Delete job ${id} for good?`)) { btn.disabled = false; return; }
      await api(act === "delete" ? `/jobs/${encodeURIComponent(id)}` : `/jobs/${encodeURIComponent(id)}/${act}`, { method: act === "delete" ? "DELETE" : "POST" });
      toast(`${id}: ${act} done`);
      if (!$("#drawer").hidden) openJob(id);
    }
  } catch (e) {
    toast(e.message, true);
  }
  btn.disabled = false;
  if (app.route.name === "queue") loadQueue(app.route, true);
});

// ---------------------------------------------------------------------------------------------
// job drawer

async function openJob(id) {
  const panel = $("#drawer-panel");
  $("#drawer").hidden = false;
  // asked again every 2 s while open: live state, and its leader keeps recording its history
  clearInterval(app.drawerTimer);
  app.drawerTimer = setInterval(() => { if (!$("#drawer").hidden && panel.dataset.job === id) openJob(id); }, 2000);
  if (panel.dataset.job !== id) panel.innerHTML = `<p class="muted">Loading ${esc(id)}…</p>`;
  panel.dataset.job = id;
  try {
    const d = await api(`/jobs/${encodeURIComponent(id)}/detail`);
    // a flow parent: its children's results and errors (GetChildrenValues)
    if (d.job.children) d.children = await api(`/jobs/${encodeURIComponent(id)}/children`).catch(() => null);
    if (panel.dataset.job !== id) return;
    panel.innerHTML = jobDetailHtml(d);
  } catch (e) {
    panel.innerHTML = `<button class="icon-btn" data-close style="float:right">Close</button><p class="error">${esc(e.message)}</p>`;
  }
}
function closeDrawer(navigate = true) {
  if ($("#drawer").hidden) return;
  $("#drawer").hidden = true; $("#drawer-panel").dataset.job = "";
  clearInterval(app.drawerTimer);
  const r = app.route;
  if (navigate && r.name === "queue" && r.job) location.hash = queueHash(r.queue, r.state, r.page, r.q);
}
$("#drawer").addEventListener("click", (ev) => {
  if (ev.target.closest("[data-close]")) closeDrawer();
  const flowJob = ev.target.closest("[data-flow-job]");
  if (flowJob) { ev.preventDefault(); openJob(flowJob.dataset.flowJob); }
});

function flowHtml(j, c) {
  if (!j.parent && !j.children) return "";
  const link = (id) => `<a href="#" class="mono" data-flow-job="${esc(id)}">${esc(id)}</a>`;
  const rows = [];
  if (c) {
    for (const [id, v] of Object.entries(c.values || {})) rows.push(`<li class="completed">${link(id)} <pre class="json">${jsonHtml(v)}</pre></li>`);
    for (const k of ["failed", "ignored", "removed"])
      for (const [id, e] of Object.entries(c[k] || {})) rows.push(`<li class="failed">${link(id)} <span class="muted">${k}:</span> ${esc(e)}</li>`);
  }
  return `<section><h3>Flow</h3><dl class="kv">
      ${j.parent ? `<dt>Parent</dt><dd>${link(j.parent)}</dd>` : ""}
      ${j.children ? `<dt>Children done</dt><dd>${j.children.done} of ${j.children.expected}</dd>` : ""}
    </dl>${rows.length ? `<ul class="timeline">${rows.join("")}</ul>` : ""}</section>`;
}
document.addEventListener("keydown", (ev) => { if (ev.key === "Escape") closeDrawer(); });

function jobDetailHtml(d) {
  const j = d.job;
  const kv = (k, v) => `<dt>${k}</dt><dd>${v}</dd>`;
  const timeline = (d.timeline || []).map((e) => `<li class="${esc(e.state)}"><b>${esc(e.state)}</b> <span class="muted">${esc(fmtDate(e.time))}${e.source === "leader" ? "" : " · from the job"}</span></li>`).join("");
  const logs = (d.logs || []).map((l) => `<li><time>${esc(fmtTime(l.time))}</time><span>${esc(l.message)}</span></li>`).join("");
  return `<button class="icon-btn" data-close style="float:right">Close ✕</button>
    <h2><span class="mono">${esc(j.id)}</span> ${stateBadge(j.state)}</h2>
    <p class="muted">queue <a href="${esc(queueHash(j.queue, j.state))}">${esc(j.queue)}</a></p>
    ${jobActions(j, false)}
    <section><h3>Job</h3><dl class="kv">
      ${kv("Attempts", `${j.attempts} of ${j.maxAttempts}`)}${kv("Priority", esc(j.priority))}
      ${kv("Progress", `<span class="progress-row"><span class="progress"><i style="width:${Math.max(0, Math.min(100, j.progress || 0))}%"></i></span><span>${esc(j.progress || 0)}%${d.progressMessage ? " · " + esc(d.progressMessage) : ""}</span></span>`)}
      ${kv("Created", esc(fmtDate(j.createdAt)))}${kv("Runs at", esc(fmtDate(j.runAt)))}
      ${j.leaseDeadline ? kv("Lease ends", esc(fmtDate(j.leaseDeadline))) : ""}${j.finishedAt ? kv("Finished", esc(fmtDate(j.finishedAt))) : ""}
      ${j.customId ? kv("Custom id", esc(j.customId)) : ""}${j.tag ? kv("Tag", esc(j.tag)) : ""}${j.group ? kv("Group", esc(j.group)) : ""}
      ${d.traceId ? kv("Trace id", `<span class="mono" id="job-trace" title="the OpenTelemetry trace this job was added in">${esc(d.traceId)}</span>`) : ""}
    </dl></section>
    ${flowHtml(j, d.children)}
    <section><h3>Data</h3><pre class="json" id="job-data">${jsonHtml(j.data)}</pre></section>
    ${j.result !== undefined ? `<section><h3>Result</h3><pre class="json">${jsonHtml(j.result)}</pre></section>` : ""}
    ${j.error ? `<section><h3>Last error</h3><pre class="json s-failed">${esc(j.error)}</pre></section>` : ""}
    <section><h3>History</h3><ul class="timeline">${timeline}</ul></section>
    <section><h3>Logs</h3>${logs ? `<ul class="events">${logs}</ul>` : `<p class="muted">No log lines.</p>`}</section>`;
}

// ---------------------------------------------------------------------------------------------
// simulation: simulated workers draining a queue

function simulationSkeleton() {
  const field = (name, label, value, attrs = "") => `<label>${label}<input name="${name}" value="${value}" ${attrs}></label>`;
  return `<div class="page-head"><h1>Worker simulation</h1>
      <span class="muted">Real clients pull, ack, fail and hang jobs; hung jobs are reclaimed when their lease lapses.</span></div>
    <div class="card action" style="margin-bottom:16px"><form class="body" id="sim-form">
      <div class="form">
        ${field("queue", "Queue", "demo", 'pattern="[A-Za-z0-9_.:\\-]{1,256}" required')}
        ${field("jobs", "Jobs", 500, 'type="number" min="1" max="100000"')}
        ${field("workers", "Workers", 8, 'type="number" min="1" max="200"')}
        ${field("workMs", "Work per job (ms)", 40, 'type="number" min="0" max="60000"')}
        ${field("failRate", "Failure rate", 0.05, 'type="number" min="0" max="1" step="0.01"')}
        ${field("hangRate", "Hang rate", 0.1, 'type="number" min="0" max="1" step="0.01"')}
        ${field("ttrMs", "Lease (ttr, ms)", 2000, 'type="number" min="200" max="600000"')}
        ${field("attempts", "Attempts per job", 3, 'type="number" min="1" max="1000"')}
      </div>
      <p class="error" id="sim-error"></p>
      <div class="actions"><button class="btn primary" type="submit" id="sim-start">Start</button>
        <button class="btn danger" type="button" id="sim-stop">Stop</button></div>
    </form></div>
    <div id="sim-live"></div>`;
}

$("#main").addEventListener("submit", async (ev) => {
  if (ev.target.id !== "sim-form") return;
  ev.preventDefault();
  const f = ev.target, body = { queue: f.queue.value.trim() };
  for (const k of ["jobs", "workers", "workMs", "ttrMs", "attempts"]) body[k] = parseInt(f[k].value, 10);
  for (const k of ["failRate", "hangRate"]) body[k] = parseFloat(f[k].value);
  $("#sim-error").textContent = "";
  try { await api("/simulation", { method: "POST", body }); toast("Simulation started"); }
  catch (e) { $("#sim-error").textContent = e.message; }
});
document.addEventListener("click", async (ev) => {
  if (!ev.target.closest("#sim-stop")) return;
  const node = ev.target.closest("#sim-stop").dataset.node || "";
  try { await api("/simulation" + (node ? `?node=${encodeURIComponent(node)}` : ""), { method: "DELETE" }); toast("Simulation stopped"); }
  catch (e) { $("#sim-error").textContent = e.message; }
});

function renderSimulation(o) {
  const live = $("#sim-live");
  if (!live) return;
  const sim = (o.simulations || []).find((s) => s.nodeId === o.servedBy) || (o.simulations || [])[0];
  if (!sim) { live.innerHTML = `<div class="card empty">No simulation has run on this node yet.</div>`; return; }
  const q = o.queues[sim.queue] || { counts: {}, totals: {}, rates: {} };
  const c = q.counts, k = sim.counters, p = sim.params;
  const total = STATES.reduce((a, s) => a + (c[s] || 0), 0) || 1;
  const bar = STATES.map((s) => `<i style="width:${((c[s] || 0) / total) * 100}%;background:var(--${s})" title="${s}: ${c[s] || 0}"></i>`).join("");
  const phase = { draining: "warn", finished: "ok", failed: "bad", stopped: "" }[sim.phase] ?? "";
  const stat = (label, v, cls = "") => `<div class="card stat"><div class="label">${label}</div><div class="value ${cls}">${fmtNum(v || 0)}</div></div>`;
  $("#sim-start") && ($("#sim-start").disabled = sim.running && sim.nodeId === o.servedBy);
  $("#sim-stop") && ($("#sim-stop").dataset.node = sim.nodeId);
  live.innerHTML = `
    <div class="card" style="margin-bottom:16px"><header><h2>Run on ${esc(sim.nodeId)}: queue <a href="${esc(queueHash(sim.queue, "waiting"))}">${esc(sim.queue)}</a></h2>
      <span class="badge ${phase}" id="sim-phase">${esc(sim.phase)}</span><span class="spacer"></span>
      <span class="muted">${p.jobs} jobs · ${p.workers} workers · fail ${Math.round(p.failRate * 100)}% · hang ${Math.round(p.hangRate * 100)}% · lease ${p.ttrMs} ms${sim.finishedAt ? ` · took ${fmtDuration((sim.finishedAt - sim.startedAt) / 1000)}` : ""}</span></header>
      <div class="body"><div class="progress stacked">${bar}</div>
      <div class="legend">${STATES.map((s) => `<span><i style="background:var(--${s})"></i>${s} <b class="sim-count" data-state="${s}">${fmtNum(c[s] || 0)}</b></span>`).join("")}</div>
      ${sim.error ? `<p class="error">${esc(sim.error)}</p>` : ""}</div></div>
    <div class="grid stats">
      ${stat("Completed", k.completed, "s-completed")}${stat("Failed attempts", k.failedAttempts, "s-failed")}
      ${stat("Hung", k.hung, "s-active")}${stat("Reclaimed (queue)", q.totals.reclaimed, "s-delayed")}
      ${stat("Stale acks refused", k.staleAcksRefused)}${stat("Dead-lettered", k.deadLettered, "s-failed")}
    </div>
    <div class="grid two">
      <div class="card"><header><h2>Workers</h2><span class="count">${sim.workers.filter((w) => w.state === "busy").length} busy · ${sim.workers.filter((w) => w.state === "hung").length} hung</span></header>
        <div class="body workers">${sim.workers.map((w) => `<div class="worker ${esc(w.state)}"><b>${esc(w.id)}<span>${esc(w.state)}</span></b><div class="job">${esc(w.job || "")}</div><div class="wstats"><span class="s-completed" title="completed">✓ ${w.done}</span><span class="s-failed" title="failed attempts">✗ ${w.failed}</span><span class="s-active" title="hangs">‖ ${w.hung}</span></div></div>`).join("")}</div></div>
      <div class="card"><header><h2>What happened</h2><span class="count">latest first</span></header>
        <div class="body"><ul class="events">${sim.events.map((e) => `<li><time>${esc(fmtTime(e.time))}</time><b>${esc(e.worker)}</b><span>${e.job ? `<span class="mono">${esc(e.job)}</span> ` : ""}${esc(e.text)}</span></li>`).join("") || `<li class="muted">Nothing unusual yet.</li>`}</ul></div></div>
    </div>`;
}

// ---------------------------------------------------------------------------------------------

tryStart().then((ok) => { if (!ok && !$("#view").innerHTML) showLogin(); });
