// lockd dashboard: reads the public API (Connect JSON), /metrics and the
// watch stream of the node that serves this page. Read-only.
"use strict";

const params = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(250, Number(params.get("refresh") || 2000));
const PAGE = 50;          // rows per page in each table
const CHART_POINTS = 150; // samples kept for the charts (5 min at 2 s)
const FEED_MAX = 200;     // events kept in the feed

const $ = (id) => document.getElementById(id);
const state = {
  prefix: params.get("prefix") || "",
  lockTokens: [""],       // page tokens of the lock pages seen (server paging)
  lockPage: 0,
  nextToken: "",
  openQueues: new Set(),  // locks whose queue is shown
  explain: params.get("explain") || "", // the lock shown in the Explain view
  sessions: [],
  sessionPage: 0,
  expiresBySession: new Map(),
  rates: [], p99s: [], lastScrape: null,
  watch: null, watchPos: "", watchRetry: 0, watchSeen: false,
  timer: null, pending: null,
  stats: { firstRender: 0, lastUpdate: 0, updates: 0 },
};
window.lockdStats = state.stats; // read by the browser test

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

async function call(service, method, body) {
  const r = await fetch(`../${service}/${method}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", "Connect-Protocol-Version": "1" },
    body: JSON.stringify(body || {}),
  });
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try { const e = await r.json(); if (e.message) msg = e.message; } catch (_) { /* not JSON */ }
    throw new Error(`${method}: ${msg}`);
  }
  return r.json();
}
const lockCall = (m, b) => call("lockd.v1.LockService", m, b);

// Durations: protobuf JSON gives "1.5s"; times: RFC 3339 strings.
const secs = (d) => (d ? parseFloat(d) : 0);
const ms = (t) => (t ? Date.parse(t) : 0);

function human(sec) {
  if (!isFinite(sec)) return "–";
  const neg = sec < 0; sec = Math.abs(sec);
  let s;
  if (sec < 10) s = sec.toFixed(1) + "s";
  else if (sec < 120) s = Math.round(sec) + "s";
  else if (sec < 7200) s = Math.floor(sec / 60) + "m" + String(Math.round(sec % 60)).padStart(2, "0") + "s";
  else if (sec < 172800) s = Math.floor(sec / 3600) + "h" + String(Math.floor((sec % 3600) / 60)).padStart(2, "0") + "m";
  else s = Math.floor(sec / 86400) + "d";
  return (neg ? "-" : "") + s;
}

// Clock cells: <span data-since=ms> counts up, <span data-until=ms> down.
function tickClocks() {
  const now = Date.now();
  for (const el of document.querySelectorAll("[data-since]")) el.textContent = human((now - Number(el.dataset.since)) / 1000);
  for (const el of document.querySelectorAll("[data-until]")) {
    const left = (Number(el.dataset.until) - now) / 1000;
    el.textContent = left <= 0 ? "expiring" : human(left);
    el.classList.toggle("soon", left > 0 && left < 3);
    el.classList.toggle("bad", left <= 0);
  }
}
const since = (t) => (t ? `<span data-since="${ms(t)}"></span>` : "–");
const until = (t) => (t ? `<span data-until="${ms(t)}"></span>` : "–");
const modeName = (m) => String(m || "MODE_EXCLUSIVE").replace(/^MODE_/, "").toLowerCase();

function renderLocks(resp, total) {
  const locks = resp.locks || [];
  const rows = [];
  for (const l of locks) {
    const n = esc(l.name);
    const holders = (l.holders || []);
    const mode = holders.length ? modeName(holders[0].mode) : (l.waiters && l.waiters.length ? modeName(l.waiters[0].mode) : "–");
    const asked = (h) => (h.releaseRequestedAt ? ` · <span class="soon" title="${esc(h.releaseReason)}">asked to let go</span>` : "");
    const hs = holders.map((h) => `<div class="holder"><b>${esc(h.owner || h.sessionId)}</b> · <span class="token">#${esc(h.token)}</span> · ${since(h.grantedAt)} · lease ${until(state.expiresBySession.get(h.sessionId))}${asked(h)}</div>`).join("") || "<span class=muted>free</span>";
    const ws = l.waiters || [];
    const open = state.openQueues.has(l.name);
    let q = `<button type="button" class="queue" data-queue="${n}" ${ws.length ? "" : "disabled"} aria-expanded="${open}">${ws.length}</button>`;
    if (open && ws.length) {
      q += `<ol class="queue">${ws.map((w) => `<li>${esc(w.owner || w.sessionId)} <span class="muted">${modeName(w.mode)} · waiting ${since(w.queuedAt)}</span></li>`).join("")}</ol>`;
    }
    let md = [];
    if (l.mark) md.push(`done by ${esc(l.mark.owner || l.mark.sessionId)} #${esc(l.mark.token)} ${since(l.mark.completedAt)} ago`);
    if (l.lockDelay) md.push(`${l.delayed ? '<span class="soon">delayed</span> ' : ""}delay ${human(secs(l.lockDelay))}`);
    const limit = l.limit > 1 ? ` <span class="muted">(limit ${l.limit})</span>` : "";
    const sel = l.name === state.explain;
    rows.push(`<tr data-lock="${n}"${sel ? ' class="selected"' : ""}><td class="name"><button type="button" class="explain" data-explain="${n}" aria-pressed="${sel}" title="explain: who holds it, who waits, what the holders wait for">${n}</button></td><td>${mode}${limit}</td><td>${hs}</td><td>${q}</td><td>${md.join("<br>") || "–"}</td></tr>`);
  }
  if (!rows.length) rows.push(`<tr><td colspan="5" class="muted">no locks${state.prefix ? " under " + esc(state.prefix) : ""}</td></tr>`);
  $("locks").tBodies[0].innerHTML = rows.join("");
  state.nextToken = resp.nextPageToken || "";
  $("locks-prev").disabled = state.lockPage === 0;
  $("locks-next").disabled = !state.nextToken;
  $("locks-page").textContent = `page ${state.lockPage + 1}`;
  $("locks-count").textContent = state.prefix ? "" : `(${total} in all)`;
}

function renderSessions() {
  const all = state.sessions;
  const pages = Math.max(1, Math.ceil(all.length / PAGE));
  state.sessionPage = Math.min(state.sessionPage, pages - 1);
  const part = all.slice(state.sessionPage * PAGE, (state.sessionPage + 1) * PAGE);
  const names = (list, n) => {
    if (!n) return "–";
    const shown = (list || []).map(esc).join(", ");
    return n > (list || []).length ? `${shown} <span class="muted">+${n - list.length}</span>` : shown;
  };
  $("sessions").tBodies[0].innerHTML = part.map((s) =>
    `<tr data-session="${esc(s.sessionId)}"><td class="owner">${esc(s.owner) || "<span class=muted>–</span>"}${s.revoked ? ' <span class="bad">revoked</span>' : ""}</td>` +
    `<td class="token">${esc(s.sessionId.slice(0, 8))}</td><td>${human(secs(s.ttl))}</td><td>${until(s.expiresAt)}</td>` +
    `<td>${names(s.holding, s.holds || 0)}</td><td>${names(s.waiting, s.waits || 0)}</td></tr>`).join("") ||
    `<tr><td colspan="6" class="muted">no sessions</td></tr>`;
  $("sessions-count").textContent = `(${all.length})`;
  $("sessions-page").textContent = `page ${state.sessionPage + 1} of ${pages}`;
  $("sessions-prev").disabled = state.sessionPage === 0;
  $("sessions-next").disabled = state.sessionPage >= pages - 1;
}

function renderMembers(status, health) {
  const ready = new Map((health || []).map((h) => [h.id, h]));
  $("members").tBodies[0].innerHTML = (status.members || []).map((m) => {
    const h = ready.get(m.id);
    const hc = !h ? "<span class=muted>?</span>" : h.ready ? '<span class="ok">ready</span>' : `<span class="bad" title="${esc(h.error)}">not ready</span>`;
    return `<tr><td>${esc(m.id)}${m.id === status.nodeId ? ' <span class="muted">(this node)</span>' : ""}</td>` +
      `<td class="${m.role === "leader" ? "leader" : ""}">${esc(m.role)}</td><td>${m.voter ? "yes" : "no"}</td><td>${hc}</td><td class="token">${esc(m.api)}</td></tr>`;
  }).join("");
  $("node").textContent = `node ${status.nodeId} · ${String(status.state).toLowerCase()} · leader ${status.leader || "none"} · term ${status.term || 0} · ${status.locks || 0} locks · ${status.sessions || 0} sessions`;
}

// Metrics: acquisitions/s from lockd_lock_grants_total, p99 acquire latency
// of granted calls from the lockd_lock_acquire_duration_seconds buckets,
// both over the interval since the previous scrape.
function parseMetrics(text) {
  let grants = 0; const buckets = [];
  for (const line of text.split("\n")) {
    if (line.startsWith("lockd_lock_grants_total ")) grants = parseFloat(line.split(" ")[1]);
    else if (line.startsWith("lockd_lock_acquire_duration_seconds_bucket{") && line.includes('outcome="granted"')) {
      const le = /le="([^"]+)"/.exec(line);
      if (le) buckets.push([le[1] === "+Inf" ? Infinity : parseFloat(le[1]), parseFloat(line.slice(line.lastIndexOf(" ") + 1))]);
    }
  }
  buckets.sort((a, b) => a[0] - b[0]);
  return { t: Date.now(), grants, buckets };
}

function quantile(q, prev, cur) {
  const d = cur.buckets.map(([le, c], i) => [le, c - (prev.buckets[i] ? prev.buckets[i][1] : 0)]);
  const total = d.length ? d[d.length - 1][1] : 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lo = 0, below = 0;
  for (const [le, c] of d) {
    if (c >= rank) {
      if (le === Infinity) return lo;
      return lo + (le - lo) * ((rank - below) / Math.max(1, c - below)); // linear in the bucket, like histogram_quantile
    }
    lo = le; below = c;
  }
  return lo;
}

async function scrapeMetrics() {
  const r = await fetch("../metrics");
  if (!r.ok) return;
  const cur = parseMetrics(await r.text());
  const prev = state.lastScrape;
  state.lastScrape = cur;
  if (!prev) return;
  const dt = (cur.t - prev.t) / 1000;
  if (dt <= 0) return;
  const rate = Math.max(0, (cur.grants - prev.grants) / dt);
  const p99 = quantile(0.99, prev, cur);
  state.rates.push(rate); state.p99s.push(p99);
  if (state.rates.length > CHART_POINTS) { state.rates.shift(); state.p99s.shift(); }
  $("rate-now").textContent = rate.toFixed(1) + "/s";
  $("p99-now").textContent = p99 == null ? "no grants" : fmtSec(p99);
  drawChart($("rate-chart"), state.rates, (v) => v.toFixed(0) + "/s");
  drawChart($("p99-chart"), state.p99s, fmtSec);
}
const fmtSec = (v) => (v < 0.001 ? (v * 1e6).toFixed(0) + "µs" : v < 1 ? (v * 1000).toFixed(1) + "ms" : v.toFixed(2) + "s");

function drawChart(canvas, values, fmt) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 600, h = canvas.clientHeight || 120;
  if (canvas.width !== Math.round(w * dpr)) { canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr); }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const css = getComputedStyle(document.documentElement);
  const vals = values.filter((v) => v != null);
  const max = Math.max(1e-9, ...vals);
  ctx.strokeStyle = css.getPropertyValue("--accent").trim() || "#2563eb";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  let started = false;
  values.forEach((v, i) => {
    if (v == null) { started = false; return; }
    const x = (i / (CHART_POINTS - 1)) * (w - 4) + 2, y = h - 4 - (v / max) * (h - 20);
    if (started) ctx.lineTo(x, y); else ctx.moveTo(x, y);
    started = true;
  });
  ctx.stroke();
  ctx.fillStyle = css.getPropertyValue("--muted").trim() || "#666";
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillText("max " + (vals.length ? fmt(max) : "–"), 4, 12);
}

async function refresh() {
  const started = performance.now();
  try {
    const token = state.lockTokens[state.lockPage] || "";
    const explaining = state.explain;
    const [status, locks, sessions, health, explain] = await Promise.all([
      lockCall("Status", {}),
      lockCall("ListLocks", { prefix: state.prefix, pageSize: PAGE, pageToken: token }),
      lockCall("ListSessions", {}),
      fetch("api/health").then((r) => (r.ok ? r.json() : [])).catch(() => []),
      explainOf(explaining),
    ]);
    state.sessions = (sessions.sessions || []).slice().sort((a, b) => (ms(a.expiresAt) || Infinity) - (ms(b.expiresAt) || Infinity));
    state.expiresBySession = new Map(state.sessions.map((s) => [s.sessionId, s.expiresAt]));
    renderLocks(locks, status.locks || 0);
    renderSessions();
    renderMembers(status, health);
    if (explaining === state.explain) renderExplain(explaining, explain); // else a newer selection's refresh follows
    tickClocks();
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    $("updated").classList.remove("bad");
    const took = performance.now() - started;
    if (!state.stats.firstRender) state.stats.firstRender = performance.now();
    state.stats.lastUpdate = took; state.stats.updates++;
  } catch (e) {
    $("updated").textContent = "error: " + e.message;
    $("updated").classList.add("bad");
  }
  scrapeMetrics().catch(() => {});
}

// schedule runs refresh now (soon, when asked by an event) and then every
// REFRESH_MS; a refresh never overlaps another.
let running = false, again = false;
async function schedule() {
  clearTimeout(state.timer);
  if (running) { again = true; return; }
  running = true;
  await refresh();
  running = false;
  if (again) { again = false; return schedule(); }
  state.timer = setTimeout(schedule, REFRESH_MS);
}
function soon() {
  if (state.pending) return;
  state.pending = setTimeout(() => { state.pending = null; schedule(); }, 150);
}

// The watch stream (text/event-stream): one JSON event per message, a
// "reset" event when the server cannot resume from our position. A server
// without it answers 404: the feed says so and the tables keep polling.
function startWatch() {
  if (state.watch) state.watch.close();
  const q = new URLSearchParams({ prefix: state.prefix });
  if (state.watchPos) q.set("from", state.watchPos);
  const es = new EventSource("../v1/watch?" + q.toString());
  state.watch = es;
  let opened = false;
  es.onopen = () => { opened = true; state.watchSeen = true; state.watchRetry = 0; $("events-state").textContent = "live"; };
  es.onmessage = (m) => {
    let ev;
    try { ev = JSON.parse(m.data); } catch (_) { return; }
    if (ev.position) state.watchPos = ev.position;
    addEvent(ev);
    soon();
  };
  es.addEventListener("reset", (m) => {
    try { const ev = JSON.parse(m.data); if (ev.position) state.watchPos = ev.position; } catch (_) { /* keep */ }
    addEvent({ kind: "reset", name: "(missed events: tables reloaded)" });
    soon();
  });
  es.onerror = () => {
    es.close();
    if (state.watch !== es) return;
    state.watch = null;
    // A stream that never opened is missing (404) or refused: say so and
    // keep trying slowly (the server may be upgraded). One that was open
    // broke: reconnect from the last position.
    if (!opened && !state.watchSeen) {
      $("events-state").textContent = "not available (this server has no watch stream); tables poll every " + REFRESH_MS / 1000 + " s";
    } else {
      $("events-state").textContent = "reconnecting…";
    }
    const delay = Math.min(30000, 1000 * 2 ** state.watchRetry++);
    setTimeout(() => { if (!state.watch) startWatch(); }, delay);
  };
}

function addEvent(ev) {
  const kind = String(ev.kind || "").replace(/^EVENT_KIND_/, "").toLowerCase();
  const li = document.createElement("li");
  const who = [ev.owner, ev.token ? "#" + ev.token : "", ev.mode ? modeName(ev.mode) : ""].filter(Boolean).join(" · ");
  li.innerHTML = `<span class="muted">${new Date().toLocaleTimeString()}</span> <span class="kind">${esc(kind)}</span> ${esc(ev.name)} <span class="muted">${esc(who)}</span>`;
  const list = $("events");
  list.prepend(li);
  while (list.children.length > FEED_MAX) list.lastChild.remove();
}

function setPrefix(p) {
  if (p === state.prefix) return;
  state.prefix = p;
  state.lockTokens = [""]; state.lockPage = 0; state.watchPos = "";
  const u = new URL(location.href);
  if (p) u.searchParams.set("prefix", p); else u.searchParams.delete("prefix");
  history.replaceState(null, "", u);
  $("events").innerHTML = "";
  startWatch();
  schedule();
}

// setExplain shows the Explain view of lock name ("": closes it), kept in
// the URL (?explain=NAME) like the prefix.
function setExplain(name) {
  state.explain = name;
  const u = new URL(location.href);
  if (name) u.searchParams.set("explain", name); else u.searchParams.delete("explain");
  history.replaceState(null, "", u);
  $("explain").innerHTML = name ? '<p class="muted">loading…</p>' : "";
  renderExplain(name, null);
  schedule();
}

function init() {
  $("interval").textContent = REFRESH_MS / 1000;
  $("prefix").value = state.prefix;
  let debounce;
  $("prefix").addEventListener("input", (e) => { clearTimeout(debounce); debounce = setTimeout(() => setPrefix(e.target.value.trim()), 250); });
  $("locks").addEventListener("click", (e) => {
    const x = e.target.closest("button[data-explain]");
    // data-explain holds the escaped name, given back unescaped (as data-queue).
    if (x) { setExplain(x.dataset.explain === state.explain ? "" : x.dataset.explain); return; }
    const b = e.target.closest("button[data-queue]");
    if (!b) return;
    const name = b.dataset.queue;
    // data-queue holds the escaped name; the browser gives it back unescaped.
    if (state.openQueues.has(name)) state.openQueues.delete(name); else state.openQueues.add(name);
    schedule();
  });
  $("locks-next").addEventListener("click", () => { if (!state.nextToken) return; state.lockTokens[state.lockPage + 1] = state.nextToken; state.lockPage++; schedule(); });
  $("locks-prev").addEventListener("click", () => { if (state.lockPage > 0) { state.lockPage--; schedule(); } });
  $("sessions-next").addEventListener("click", () => { state.sessionPage++; renderSessions(); tickClocks(); });
  $("sessions-prev").addEventListener("click", () => { state.sessionPage = Math.max(0, state.sessionPage - 1); renderSessions(); tickClocks(); });
  $("explain-close").addEventListener("click", () => setExplain(""));
  renderExplain(state.explain, null);
  setInterval(tickClocks, 250);
  startWatch();
  schedule();
}
init();
