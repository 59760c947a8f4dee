// fabricscope operator console: one ES2020 module, no framework, no build step, no network
// access beyond this server's /api/v1 (the page works offline).
//
// Security: the API token lives in sessionStorage (this tab only) and travels only in the
// Authorization header; it is never put in a URL, the DOM or a console message. Every string
// that comes from the API is inserted with textContent (no innerHTML), so a hostile finding or
// incident title cannot inject markup.

const API = "api/v1";
const TOKEN_KEY = "fabricscope.token";
const NS = 1e9;

/** State the tests and the benchmark read (see tests/test_console_browser.py). */
const hooks = {
  page: "", ready: {}, readyAt: {}, sse: { connected: false, events: 0, reconnects: 0 },
  fabric: null, errors: [],
};
window.fabricscope = hooks;

// ------------------------------------------------------------------ DOM helpers
const $ = (sel, root = document) => root.querySelector(sel);

/** Create an element; attrs may hold `class`, `text`, dataset via `data-*`, events via `on*`. */
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") e.textContent = String(v);
    else if (k === "class") e.className = v;
    else if (k.startsWith("on") && typeof v === "function") e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

/** Replace the children of `target` (nested arrays flattened, null / false skipped). */
function put(target, ...kids) {
  target.replaceChildren(...kids.flat(Infinity).filter((k) => k !== null && k !== undefined && k !== false)
    .map((k) => (k instanceof Node ? k : document.createTextNode(String(k)))));
}

/** A page has drawn its data: tests and the benchmark wait for this (time since navigation). */
function markReady(page) { hooks.ready[page] = true; hooks.readyAt[page] = performance.now(); }

function announce(text) { $("#announce").textContent = text; }

/** Simulated (or wall) nanoseconds as seconds, e.g. "12.345 s". */
function fmtNs(ns) {
  if (ns === null || ns === undefined) return "–";
  // live sources: nanoseconds since the epoch (after 2001) -> UTC date and time
  if (Math.abs(ns) > 1e18) return new Date(ns / 1e6).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  const s = ns / NS;
  if (Math.abs(s) >= 3600) return `${Math.floor(s / 3600)}h ${fmtFixed((s % 3600) / 60, 0)}m`;
  return `${fmtFixed(s, Math.abs(s) >= 100 ? 1 : 3)} s`;
}
function fmtFixed(x, d) { return Number(x).toFixed(d); }
function fmtNum(x, d = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return x.toLocaleString("en");
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(2);
  return x.toFixed(d);
}
function pct(x) { return `${(100 * x).toFixed(1)} %`; }

// ------------------------------------------------------------------ API access
class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

/** GET/POST one JSON endpoint; a 401 ends the session and shows the login form. */
async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${token()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let r;
  try {
    r = await fetch(`${API}${path}`, {
      method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch (exc) {
    if (exc.name === "AbortError") throw exc;
    throw new ApiError(0, "the console server cannot be reached");
  }
  if (r.status === 401) { signOut("The API refused the token (401 Unauthorized). Sign in again."); throw new ApiError(401, "unauthorized"); }
  if (r.status === 429) {
    const after = r.headers.get("Retry-After") || "60";
    signOut(`Too many failed sign-ins from this client (429): retry in ${after} s.`);
    throw new ApiError(429, "throttled");
  }
  if (!r.ok) {
    let msg = `${r.status} ${r.statusText}`;
    try {
      const j = await r.json();
      const d = j.detail ?? j.error ?? j.message;
      if (d) msg += `: ${typeof d === "string" ? d : JSON.stringify(d)}`;
    } catch { /* not JSON */ }
    throw new ApiError(r.status, msg);
  }
  return r.json();
}

function showError(target, exc) {
  if (exc && (exc.status === 401 || exc.status === 429 || exc.name === "AbortError")) return;
  put(target, el("p", { class: "err", role: "alert", text: `Error: ${exc.message || exc}` }));
}

// ------------------------------------------------------------------ sign in / out
let started = false;

function showLogin(message) {
  for (const s of document.querySelectorAll("main > .page")) s.hidden = s.id !== "login";
  $("#nav").hidden = true;
  $("#logout").hidden = true;
  const msg = $("#login-msg");
  msg.textContent = message || "";
  msg.className = message ? "msg err" : "msg";
  hooks.page = "login";
  $("#token").focus();
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  started = false;
  sse.stop();
  stopTimers();
  showLogin(message);
}

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const t = $("#token").value.trim();
  if (!t) return;
  sessionStorage.setItem(TOKEN_KEY, t);
  $("#token").value = "";
  await start();
});
$("#logout").addEventListener("click", () => signOut("Signed out."));

async function start() {
  try {
    const st = await api("/status");
    renderStatus(st);
  } catch (exc) {
    if (exc.status !== 401 && exc.status !== 429) showLogin(`Cannot reach the API: ${exc.message}`);
    return;
  }
  started = true;
  $("#nav").hidden = false;
  $("#logout").hidden = false;
  $("#login").hidden = true;
  sse.start();
  if (!location.hash || location.hash === "#" || location.hash === "#/login") location.hash = "#/incidents";
  else route();
}

// ------------------------------------------------------------------ header
const live = { simNs: 0 };

function renderStatus(st) {
  $("#h-fabric").textContent = st.fabric ?? "–";
  $("#h-mode").textContent = st.mode ?? "–";
  $("#h-time-label").textContent = st.mode === "twin" ? "Simulated time" : "Time";
  setSimTime(st.sim_ns ?? 0);
  $("#h-open").textContent = String(st.incidents_open ?? 0);
  if (st.version) $("#h-version").textContent = `fabricscope ${st.version}`;
}
function setSimTime(ns) {
  live.simNs = ns;
  $("#h-time").textContent = fmtNs(ns);
}
function setLive(state) {
  const e = $("#h-live");
  e.dataset.state = state;
  e.className = `live ${state === "connected" ? "on" : state === "retry" ? "retry" : "off"}`;
  e.textContent = state === "connected" ? "live" : state === "retry" ? "reconnecting" : "offline";
}

let statusTimer = 0;
function stopTimers() { clearInterval(statusTimer); statusTimer = 0; pageTimers.forEach(clearInterval); pageTimers = []; }
let pageTimers = [];

// ------------------------------------------------------------------ server-sent events
/** An SSE client over fetch() + ReadableStream (EventSource cannot send an Authorization
 * header). Parsing follows the WHATWG HTML "server-sent events" interpretation rules: lines end
 * in CR, LF or CRLF; `:` starts a comment (the server's heartbeat); a blank line dispatches.
 * Reconnects with exponential backoff (0.5 s doubling to 30 s, with jitter) and a watchdog that
 * restarts a stream silent for 45 s. */
const sse = (() => {
  let ctrl = null, attempt = 0, timer = 0, lastSeen = 0, watchdog = 0, running = false;
  const handlers = new Map();

  function on(type, fn) {
    if (!handlers.has(type)) handlers.set(type, new Set());
    handlers.get(type).add(fn);
    return () => handlers.get(type).delete(fn);
  }
  function dispatch(type, data) {
    hooks.sse.events += 1;
    let parsed = data;
    try { parsed = JSON.parse(data); } catch { /* keep text */ }
    for (const fn of handlers.get(type) || []) {
      try { fn(parsed); } catch (exc) { hooks.errors.push(String(exc)); }
    }
  }
  async function connect() {
    ctrl = new AbortController();
    let r;
    try {
      r = await fetch(`${API}/events`, {
        headers: { Accept: "text/event-stream", Authorization: `Bearer ${token()}` },
        signal: ctrl.signal, cache: "no-store",
      });
    } catch (exc) { return retry(); }
    if (r.status === 401) { signOut("The API refused the token (401 Unauthorized). Sign in again."); return; }
    if (!r.ok || !r.body) return retry();
    attempt = 0;
    hooks.sse.connected = true;
    setLive("connected");
    lastSeen = Date.now();
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "", type = "", data = [];
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        lastSeen = Date.now();
        buf += value;
        let m;
        while ((m = /\r\n|\r|\n/.exec(buf)) !== null) {
          if (m[0] === "\r" && m.index === buf.length - 1) break; // maybe half of CRLF
          const line = buf.slice(0, m.index);
          buf = buf.slice(m.index + m[0].length);
          if (line === "") {
            if (data.length) dispatch(type || "message", data.join("\n"));
            type = ""; data = [];
          } else if (line[0] !== ":") {
            const i = line.indexOf(":");
            const field = i < 0 ? line : line.slice(0, i);
            let v = i < 0 ? "" : line.slice(i + 1);
            if (v[0] === " ") v = v.slice(1);
            if (field === "event") type = v;
            else if (field === "data") data.push(v);
          }
        }
      }
    } catch { /* aborted or network error */ }
    hooks.sse.connected = false;
    if (running) retry();
  }
  function retry() {
    hooks.sse.connected = false;
    if (!running) return;
    setLive("retry");
    hooks.sse.reconnects += 1;
    const delay = Math.min(30000, 500 * 2 ** attempt) * (0.75 + 0.5 * Math.random());
    attempt = Math.min(attempt + 1, 8);
    clearTimeout(timer);
    timer = setTimeout(connect, delay);
  }
  return {
    on,
    start() {
      if (running) return;
      running = true; attempt = 0;
      connect();
      watchdog = setInterval(() => {
        if (hooks.sse.connected && Date.now() - lastSeen > 45000 && ctrl) ctrl.abort();
      }, 5000);
    },
    stop() {
      running = false;
      clearTimeout(timer); clearInterval(watchdog);
      if (ctrl) ctrl.abort();
      hooks.sse.connected = false;
      setLive("off");
    },
  };
})();

sse.on("status", (st) => { if (st && typeof st === "object") renderStatus(st); });
let lastTickPaint = 0, tickTimer = 0;
sse.on("tick", (d) => {
  if (d && typeof d.sim_ns === "number") {
    live.simNs = d.sim_ns;
    const now = performance.now();
    clearTimeout(tickTimer);
    if (now - lastTickPaint > 250) { lastTickPaint = now; setSimTime(d.sim_ns); }
    else tickTimer = setTimeout(() => { lastTickPaint = performance.now(); setSimTime(live.simNs); }, 300);
  }
});

// ------------------------------------------------------------------ router
const pages = {
  incidents: { section: "page-incidents", show: showIncidents },
  incident: { section: "page-incident", show: showIncident },
  fabric: { section: "page-fabric", show: showFabric },
  probes: { section: "page-probes", show: showProbes },
  stragglers: { section: "page-stragglers", show: showStragglers },
  optics: { section: "page-optics", show: showOptics },
  whatif: { section: "page-whatif", show: showWhatif },
  advisor: { section: "page-advisor", show: showAdvisor },
};
let leavePage = null;

function route() {
  if (!started) return;
  const parts = (location.hash || "#/incidents").replace(/^#\/?/, "").split("/");
  const name = pages[parts[0]] ? parts[0] : "incidents";
  const arg = parts.slice(1).map(decodeURIComponent).join("/");
  if (leavePage) { leavePage(); leavePage = null; }
  pageTimers.forEach(clearInterval); pageTimers = [];
  for (const s of document.querySelectorAll("main > .page")) s.hidden = s.id !== pages[name].section;
  for (const a of document.querySelectorAll("#nav a")) {
    const target = a.getAttribute("href").slice(2);
    if (target === name || (name === "incident" && target === "incidents")) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  hooks.page = name;
  hooks.ready[name] = false;
  const r = pages[name].show(arg);
  if (r && typeof r.then === "function") r.catch((exc) => hooks.errors.push(String(exc)));
}
window.addEventListener("hashchange", route);

// ------------------------------------------------------------------ canvas helpers
/** Size a canvas's backing store to its CSS box at the device pixel ratio; returns the 2-D
 * context in CSS pixels with the box's width and height. */
function setupCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const r = canvas.getBoundingClientRect();
  const w = Math.max(50, Math.round(r.width)), h = Math.max(50, Math.round(r.height));
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "12px system-ui, sans-serif";
  return { ctx, w, h };
}

/** Sequential colour scale (light to dark red), `n` buckets. */
const HEAT = ["#fde0c5", "#fbbf8f", "#f6955f", "#e8633f", "#c93b34", "#93203a"];
function heatColor(v, max) {
  if (v === null || v === undefined || Number.isNaN(v)) return "#e6e9ed";
  if (max <= 0) return HEAT[0];
  const i = Math.min(HEAT.length - 1, Math.max(0, Math.floor((v / max) * HEAT.length)));
  return HEAT[i];
}
const LANE_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];
const SEV_COLOR = { critical: "#b00020", warning: "#d99500", info: "#1a5fb4" };

function legend(target, items) {
  put(target, ...items.map(([color, label]) =>
    el("span", {}, el("span", { class: "sw", style: `background:${color}` }), label)));
}

/** Nice axis ticks between lo and hi (about n of them). */
function ticks(lo, hi, n = 6) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / n, p = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(t);
  return out;
}

/** A line plot: `series` [{label, xs, ys, color}]; x in ns (shown as s). */
function linePlot(canvas, series, { ylabel = "" } = {}) {
  const { ctx, w, h } = setupCanvas(canvas);
  const L = 56, R = 10, T = 10, B = 28;
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const s of series) for (let i = 0; i < s.xs.length; i++) {
    const y = s.ys[i];
    if (y === null || y === undefined) continue;
    x0 = Math.min(x0, s.xs[i]); x1 = Math.max(x1, s.xs[i]); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
  }
  if (!Number.isFinite(x0)) { ctx.fillStyle = "#4f5966"; ctx.fillText("no data", L, T + 14); return; }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 1; y1 += 1; }
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (w - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (h - T - B);
  ctx.strokeStyle = "#c9d1d9"; ctx.fillStyle = "#4f5966"; ctx.lineWidth = 1;
  for (const t of ticks(y0, y1, 5)) {
    ctx.beginPath(); ctx.moveTo(L, Y(t)); ctx.lineTo(w - R, Y(t)); ctx.stroke();
    ctx.fillText(fmtNum(t, 2), 4, Y(t) + 4);
  }
  for (const t of ticks(x0 / NS, x1 / NS, 6)) ctx.fillText(`${fmtNum(t, 1)} s`, X(t * NS) - 12, h - 8);
  if (ylabel) ctx.fillText(ylabel, L + 4, T + 12);
  for (const s of series) {
    ctx.strokeStyle = s.color; ctx.lineWidth = 1.5; ctx.beginPath();
    let pen = false;
    for (let i = 0; i < s.xs.length; i++) {
      const y = s.ys[i];
      if (y === null || y === undefined) { pen = false; continue; }
      if (pen) ctx.lineTo(X(s.xs[i]), Y(y)); else ctx.moveTo(X(s.xs[i]), Y(y));
      pen = true;
    }
    ctx.stroke();
  }
}

/** A heatmap of `rows` x `cols` values (null: no data). Returns the hit-test geometry. */
function heatmap(canvas, values, { rowLabels, colLabels, max, left = 120, bottom = 70 }) {
  const { ctx, w, h } = setupCanvas(canvas);
  const nr = values.length, nc = nr ? values[0].length : 0;
  const T = 8, R = 8;
  const cw = (w - left - R) / Math.max(1, nc), ch = (h - T - bottom) / Math.max(1, nr);
  for (let i = 0; i < nr; i++) {
    const row = values[i];
    for (let j = 0; j < nc; j++) {
      ctx.fillStyle = heatColor(row[j], max);
      ctx.fillRect(left + j * cw, T + i * ch, Math.ceil(cw), Math.ceil(ch));
    }
  }
  ctx.fillStyle = "#1b1f24";
  const rstep = Math.max(1, Math.ceil(14 / ch)), cstep = Math.max(1, Math.ceil(14 / cw));
  ctx.textAlign = "right";
  for (let i = 0; i < nr; i += rstep) ctx.fillText(String(rowLabels[i]).slice(-28), left - 4, T + (i + 0.5) * ch + 4);
  ctx.textAlign = "left";
  for (let j = 0; j < nc; j += cstep) {
    ctx.save();
    ctx.translate(left + (j + 0.5) * cw + 4, h - bottom + 6);
    ctx.rotate(Math.PI / 3);
    ctx.fillText(String(colLabels[j]).slice(-18), 0, 0);
    ctx.restore();
  }
  return { left, top: T, cw, ch, nr, nc };
}

function hoverCells(canvas, tip, geomRef, text) {
  canvas.onmousemove = (ev) => {
    const g = geomRef();
    if (!g) return;
    const r = canvas.getBoundingClientRect();
    const x = ev.clientX - r.left, y = ev.clientY - r.top;
    const j = Math.floor((x - g.left) / g.cw), i = Math.floor((y - g.top) / g.ch);
    if (i < 0 || j < 0 || i >= g.nr || j >= g.nc) { tip.hidden = true; return; }
    tip.textContent = text(i, j);
    tip.hidden = false;
    tip.style.left = `${Math.min(x + 12, r.width - 220)}px`; tip.style.top = `${y + 12}px`;
  };
  canvas.onmouseleave = () => { tip.hidden = true; };
}

// ------------------------------------------------------------------ incidents
const inc = { items: new Map(), total: 0, kinds: new Set(), filters: {}, loaded: false, gen: 0 };

function matches(item, f) {
  if (f.status && item.status !== f.status) return false;
  if (f.severity && item.severity !== f.severity) return false;
  if (f.kind && item.kind !== f.kind) return false;
  if (f.q) {
    const q = f.q.toLowerCase();
    if (!(String(item.title).toLowerCase().includes(q) || String(item.id).includes(q)
      || String(item.resource || "").toLowerCase().includes(q))) return false;
  }
  return true;
}

function readFilters() {
  const fd = new FormData($("#inc-filter"));
  return { status: fd.get("status") || "", severity: fd.get("severity") || "", kind: fd.get("kind") || "", q: (fd.get("q") || "").trim() };
}

async function loadIncidents() {
  const f = readFilters();
  inc.filters = f;
  const gen = ++inc.gen;
  const qs = new URLSearchParams({ limit: "500" });
  for (const [k, v] of Object.entries(f)) if (v) qs.set(k, v);
  const r = await api(`/incidents?${qs}`);
  if (gen !== inc.gen) return;
  inc.items = new Map(r.items.map((i) => [i.id, i]));
  inc.total = r.total;
  for (const i of r.items) inc.kinds.add(i.kind);
  inc.loaded = true;
  renderIncidents();
}

sse.on("incident", (item) => {
  if (!item || !item.id) return;
  const known = inc.items.has(item.id);
  const before = known ? inc.items.get(item.id).status : "";
  inc.kinds.add(item.kind);
  // the header's open count follows the stream between /status polls (which correct it)
  const open = Number($("#h-open").textContent) || 0;
  if (item.status === "open" && before !== "open") $("#h-open").textContent = String(open + 1);
  else if (item.status !== "open" && before === "open") $("#h-open").textContent = String(Math.max(0, open - 1));
  if (matches(item, inc.filters)) {
    if (!known) inc.total += 1;
    // newest first: a new incident goes to the front of the insertion order
    if (known) inc.items.set(item.id, item);
    else inc.items = new Map([[item.id, item], ...inc.items]);
    if (!known) announce(`New incident ${item.id}: ${item.title}`);
  } else if (known) {
    inc.items.delete(item.id); inc.total = Math.max(0, inc.total - 1);
  }
  if (hooks.page === "incidents") renderIncidents(item.id);
  if (hooks.page === "incident" && currentIncident === item.id) refreshIncidentSoon();
});
sse.on("ack", (d) => {
  const id = d && (d.id || d.incident || d);
  if (hooks.page === "incident" && currentIncident === id) refreshIncidentSoon();
  if (inc.items.has(id)) { inc.items.get(id).acked = true; if (hooks.page === "incidents") renderIncidents(); }
});

function renderIncidents(flashId) {
  const sel = $("#inc-filter select[name=kind]");
  const have = new Set([...sel.options].map((o) => o.value));
  for (const k of [...inc.kinds].sort()) if (k && !have.has(k)) sel.append(el("option", { value: k, text: k }));
  const items = [...inc.items.values()];
  $("#inc-count").textContent = `${inc.total.toLocaleString("en")} incident${inc.total === 1 ? "" : "s"}` + (inc.total > items.length ? ` (newest ${items.length} shown)` : "");
  // rows are kept by id and only changed ones are rebuilt, so that a live update does not
  // move the keyboard focus or the reader's place in the table
  const tbody = $("#inc-table tbody");
  const rows = items.map((i) => {
    const key = JSON.stringify(i);
    const have = rowCache.get(i.id);
    if (have && have.key === key) return have.tr;
    const tr = el("tr", { "data-id": i.id, class: i.id === flashId ? "flash" : "" },
      el("td", {}, el("a", { href: `#/incident/${encodeURIComponent(i.id)}`, text: i.id })),
      el("td", { class: `status-${i.status}`, text: i.status }),
      el("td", {}, el("span", { class: `sev ${i.severity}`, text: i.severity })),
      el("td", { text: i.kind }),
      el("td", {}, el("code", { text: i.resource || "–" })),
      el("td", { class: "num", text: i.probability == null ? "–" : fmtNum(i.probability, 2) }),
      el("td", { text: i.title }),
      el("td", { class: "num", text: fmtNs(i.first_symptom_ns) }),
      el("td", { text: i.acked ? "yes" : "no" }));
    tr.addEventListener("click", (ev) => { if (ev.target.tagName !== "A") location.hash = `#/incident/${encodeURIComponent(i.id)}`; });
    rowCache.set(i.id, { key, tr });
    return tr;
  });
  const keep = new Set(rows);
  for (const tr of [...tbody.children]) if (!keep.has(tr)) tr.remove();
  rows.forEach((tr, n) => { if (tbody.children[n] !== tr) tbody.insertBefore(tr, tbody.children[n] || null); });
  for (const id of [...rowCache.keys()]) if (!inc.items.has(id)) rowCache.delete(id);
  drawTimeline(items);
  markReady("incidents");
}

const rowCache = new Map();
let timelineGeom = [];
function drawTimeline(items) {
  const canvas = $("#timeline");
  const { ctx, w, h } = setupCanvas(canvas);
  const L = 10, R = 10, T = 8, B = 22;
  const now = Math.max(live.simNs, ...items.map((i) => i.updated_ns || 0));
  const first = items.length ? Math.min(...items.map((i) => i.first_symptom_ns ?? i.opened_ns)) : Math.max(0, now - 60 * NS);
  const t0 = Math.max(0, first - 0.1 * (now - first)), t1 = Math.max(now, t0 + NS);
  const X = (t) => L + ((t - t0) / (t1 - t0)) * (w - L - R);
  ctx.fillStyle = "#4f5966"; ctx.strokeStyle = "#c9d1d9";
  for (const t of ticks(t0 / NS, t1 / NS, 8)) {
    const x = X(t * NS);
    ctx.beginPath(); ctx.moveTo(x, T); ctx.lineTo(x, h - B); ctx.stroke();
    ctx.fillText(`${fmtNum(t, 1)} s`, x - 10, h - 6);
  }
  // greedy lane packing, oldest first
  const sorted = [...items].sort((a, b) => (a.first_symptom_ns ?? 0) - (b.first_symptom_ns ?? 0));
  const lanes = Math.max(1, Math.floor((h - T - B) / 9));
  const ends = new Array(lanes).fill(-Infinity);
  timelineGeom = [];
  let hidden = 0;
  for (const i of sorted) {
    const s = i.first_symptom_ns ?? i.opened_ns, e = i.closed_ns ?? now;
    const x0 = X(s), x1 = Math.max(X(e), x0 + 3);
    let lane = ends.findIndex((end) => end + 2 < x0);
    if (lane < 0) { hidden += 1; continue; }
    ends[lane] = x1;
    const y = T + lane * 9;
    ctx.fillStyle = SEV_COLOR[i.severity] || "#5b6470";
    ctx.globalAlpha = i.status === "closed" ? 0.55 : 1;
    ctx.fillRect(x0, y, x1 - x0, 7);
    timelineGeom.push([x0, y, x1, y + 7, i.id]);
  }
  ctx.globalAlpha = 1;
  const open = items.filter((i) => i.status === "open").length;
  canvas.setAttribute("aria-label", `Incident timeline: ${items.length} incidents (${open} open) from ${fmtNs(t0)} to ${fmtNs(t1)} of simulated time` + (hidden ? `; ${hidden} not drawn for lack of room` : ""));
  canvas.dataset.bars = String(timelineGeom.length);
}
$("#timeline").addEventListener("click", (ev) => {
  const r = ev.currentTarget.getBoundingClientRect();
  const x = ev.clientX - r.left, y = ev.clientY - r.top;
  const hit = timelineGeom.find(([a, b, c, d]) => x >= a && x <= c && y >= b - 1 && y <= d + 1);
  if (hit) location.hash = `#/incident/${encodeURIComponent(hit[4])}`;
});

let filterTimer = 0;
$("#inc-filter").addEventListener("input", () => {
  clearTimeout(filterTimer);
  filterTimer = setTimeout(() => loadIncidents().catch((e) => showError($("#inc-count"), e)), 200);
});
$("#inc-filter").addEventListener("submit", (ev) => ev.preventDefault());

legend($("#timeline-legend"), [[SEV_COLOR.critical, "critical"], [SEV_COLOR.warning, "warning"], [SEV_COLOR.info, "info"], ["#b8bec6", "closed: lighter"]]);

async function showIncidents() {
  try { await loadIncidents(); } catch (exc) { showError($("#inc-count"), exc); }
  statusLoop();
}

function statusLoop() {
  if (statusTimer) return;
  statusTimer = setInterval(async () => {
    if (!started) return;
    try { renderStatus(await api("/status")); } catch { /* shown elsewhere */ }
  }, 5000);
}

// ------------------------------------------------------------------ incident detail
let currentIncident = "", refreshTimer = 0;
function refreshIncidentSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => showIncident(currentIncident, true), 300);
}

const SOURCE_TITLES = {
  telemetry: "Telemetry counters", probe: "Probes", optics: "DOM readings (optics)",
  straggler: "Trace operators (stragglers)", collective: "Collective checks", host: "Host checks",
  config: "Configuration", operator: "Operator",
};

async function showIncident(id, quiet = false) {
  currentIncident = id;
  statusLoop();
  const body = $("#one-body");
  if (!quiet) put(body, el("p", { class: "muted", text: "loading…" }));
  let d;
  try { d = await api(`/incidents/${encodeURIComponent(id)}`); } catch (exc) { showError(body, exc); return; }
  const i = d.incident;
  $("#one-h").textContent = `Incident ${i.id}: ${i.title || d.kind}`;
  const since = (t) => (t == null || i.first_symptom_ns == null ? "" : ` (+${fmtNs(t - i.first_symptom_ns)})`);
  const facts = el("dl", { class: "kv" },
    el("dt", { text: "Status" }), el("dd", { class: `status-${i.status}`, text: i.status }),
    el("dt", { text: "Severity" }), el("dd", {}, el("span", { class: `sev ${i.severity}`, text: i.severity })),
    el("dt", { text: "Kind" }), el("dd", { text: d.kind }),
    el("dt", { text: "First symptom" }), el("dd", { text: fmtNs(i.first_symptom_ns) }),
    el("dt", { text: "Detected" }), el("dd", { text: fmtNs(i.detected_ns) + since(i.detected_ns) }),
    el("dt", { text: "Root cause named" }), el("dd", { text: fmtNs(i.root_cause_ns) + since(i.root_cause_ns) }),
    el("dt", { text: "Closed" }), el("dd", { text: i.closed_ns == null ? "still open" : fmtNs(i.closed_ns) }),
    el("dt", { text: "Blast radius" }), el("dd", { text: Object.entries(i.blast || {}).map(([k, v]) => `${v} ${k}`).join(", ") || "–" }));

  // acknowledge
  const ackNote = el("input", { id: "ack-note", type: "text", placeholder: "optional note" });
  const ackState = el("span", { id: "ack-state", class: "muted", text: d.ack ? `acknowledged by ${d.ack.by} at ${new Date(d.ack.at_s * 1000).toLocaleString()}${d.ack.note ? ` — “${d.ack.note}”` : ""}` : "not acknowledged" });
  const ackBtn = el("button", { type: "button", id: "ack-btn", text: d.ack ? "Acknowledge again" : "Acknowledge" });
  ackBtn.addEventListener("click", async () => {
    ackBtn.disabled = true;
    try {
      await api(`/incidents/${encodeURIComponent(i.id)}/ack`, { method: "POST", body: { note: ackNote.value } });
      announce(`Incident ${i.id} acknowledged`);
      await showIncident(i.id, true);
    } catch (exc) { showError(ackState, exc); ackBtn.disabled = false; }
  });
  const ackBox = el("div", { class: "actions" }, el("label", { for: "ack-note", text: "Acknowledgement note" }), ackNote, ackBtn, ackState);

  // root causes
  const approvals = d.approvals || [];
  const rcs = (i.root_causes || []).map((rc, n) => {
    const approved = approvals.filter((a) => a.action === rc.action);
    const card = el("article", { class: "card root-cause", "aria-labelledby": `rc-${n}` },
      el("h3", { id: `rc-${n}` }, `#${n + 1} ${rc.fault} on `, el("code", { text: rc.resource })),
      el("p", {}, el("span", { class: "prob", style: `width:${Math.round(120 * rc.probability)}px` }),
        `probability ${pct(rc.probability)}`, rc.specialist ? ` · specialist: ${rc.specialist}` : ""),
      rc.evidence && rc.evidence.length ? el("div", {}, el("h4", { text: "Evidence" }),
        el("ul", { class: "evidence" }, rc.evidence.map((e) => el("li", { text: e })))) : null,
      rc.explains && rc.explains.length ? el("p", { class: "muted" }, "Explains findings: ",
        rc.explains.map((fid, k) => [k ? ", " : "", el("a", { href: `#f-${fid}`, text: fid })])) : null,
      rc.checks && rc.checks.length ? el("div", {}, el("h4", { text: "Checks" }),
        el("table", { class: "grid" }, el("thead", {}, el("tr", {}, ["Check", "Source", "Result", "Detail"].map((t) => el("th", { scope: "col", text: t })))),
          el("tbody", {}, rc.checks.map((c) => el("tr", {}, el("td", { text: c.name }), el("td", { text: c.source }),
            el("td", { class: `check-${c.result}`, text: c.result }), el("td", { text: c.detail })))))) : null);
    if (rc.action) {
      const note = el("input", { type: "text", id: `approve-note-${n}`, placeholder: "optional note" });
      const btn = el("button", { type: "button", class: "primary approve", "data-action": rc.action, text: "Approve" });
      const state = el("span", { class: "muted approve-state", text: approved.length ? approved.map((a) => `approved by ${a.by} at ${new Date(a.at_s * 1000).toLocaleString()} — ${a.result || (a.executed ? "executed" : "not executed")}`).join("; ") : "" });
      btn.addEventListener("click", async () => {
        btn.disabled = true;
        try {
          const r = await api(`/incidents/${encodeURIComponent(i.id)}/approve`, { method: "POST", body: { action: rc.action, note: note.value } });
          announce(r && r.approval && r.approval.executed ? "Approved and executed" : "Approval recorded; the action is not executed");
          await showIncident(i.id, true);
        } catch (exc) { showError(state, exc); btn.disabled = false; }
      });
      const row = el("div", { class: "actions" }, el("label", { for: `approve-note-${n}`, text: "Approval note" }), note, btn, state);
      if (n === 0 && d.undoable) {
        const undo = el("button", { type: "button", class: "undo", text: "Undo the executed action" });
        undo.addEventListener("click", async () => {
          undo.disabled = true;
          try {
            const r = await api(`/incidents/${encodeURIComponent(i.id)}/undo`, { method: "POST", body: {} });
            announce(r && r.undo && r.undo.ok ? "Action undone" : "Undo failed");
            await showIncident(i.id, true);
          } catch (exc) { showError(state, exc); undo.disabled = false; }
        });
        row.append(undo);
      }
      card.append(el("h4", { text: "Proposed action" }), el("p", { text: rc.action }), row);
    }
    return card;
  });

  // findings grouped by source
  const bySource = new Map();
  for (const f of d.findings || []) {
    if (!bySource.has(f.source)) bySource.set(f.source, []);
    bySource.get(f.source).push(f);
  }
  const groups = [...bySource.entries()].map(([src, fs]) => el("section", { class: "finding-group", "data-source": src, "aria-label": SOURCE_TITLES[src] || src },
    el("h3", { text: `${SOURCE_TITLES[src] || src} (${fs.length})` }),
    fs.map((f) => el("article", { class: "card finding", id: `f-${f.id}`, "data-finding-id": f.id },
      el("h4", {}, el("code", { text: f.id }), ` ${f.kind} on `, el("code", { text: f.subject })),
      el("dl", { class: "kv" },
        el("dt", { text: "Score" }), el("dd", { text: fmtNum(f.score, 3) }),
        el("dt", { text: "Window" }), el("dd", { text: `${fmtNs(f.window[0])} – ${fmtNs(f.window[1])}` }),
        el("dt", { text: "Reported" }), el("dd", { text: fmtNs(f.reported_ns) }),
        f.action ? [el("dt", { text: "Action" }), el("dd", { text: f.action })] : null),
      f.evidence && f.evidence.length ? el("ul", { class: "evidence" }, f.evidence.map((e) => el("li", { text: e }))) : null,
      f.details && Object.keys(f.details).length ? el("dl", { class: "kv details" },
        Object.entries(f.details).map(([k, v]) => [el("dt", { text: k }), el("dd", { text: fmtNum(v, 4) })])) : null,
      f.source === "telemetry" ? el("div", { class: "counters", "data-counters-for": f.id }) : null))));
  const missing = (i.findings || []).filter((fid) => !bySource.size || !(d.findings || []).some((f) => f.id === fid));

  const hist = el("ol", { class: "history" }, (d.history || []).map((h) => el("li", {}, el("span", { class: "muted", text: `${fmtNs(h.sim_ns)} ` }), h.what)));
  put(body, facts, ackBox,
    el("h2", { text: "Root causes, most likely first" }),
    rcs.length ? rcs : el("p", { class: "muted", text: "No root cause named yet: the findings are unexplained." }),
    (i.actions || []).length ? el("div", {}, el("h2", { text: "Actions" }), el("ul", {}, i.actions.map((a) => el("li", { text: a })))) : null,
    el("h2", { text: "Findings behind it" }),
    groups.length ? groups : el("p", { class: "muted", text: "No finding recorded." }),
    missing.length ? el("p", { class: "muted", text: `Findings no longer held by the console (evicted): ${missing.join(", ")}` }) : null,
    el("h2", { text: "History" }), hist);
  await Promise.all([...body.querySelectorAll("[data-counters-for]")].map((box) => loadCounters(box)));
  markReady("incident");
}

/** The counters behind a telemetry finding: the port's series around its evidence window
 * (GET /findings/{id}/counters), one small plot per series that moved, the window shaded. */
async function loadCounters(box) {
  const id = box.dataset.countersFor;
  let d;
  try { d = await api(`/findings/${encodeURIComponent(id)}/counters`); } catch (exc) {
    showError(box, exc);
    return;
  }
  if (d.reason) return;  // not a finding on a port: it has no counters to show
  const moved = d.series.filter((x) => x.moved);
  const still = d.series.filter((x) => !x.moved).map((x) => x.name.split("/").pop());
  put(box, el("h5", { text: `Counters of ${d.target}:${d.interface}` }),
    moved.length ? null : el("p", { class: "muted", text: "No counter of this port moved in the window." }));
  for (const x of moved.slice(0, 4)) {
    const short = x.name.split("/").pop();
    const vals = x.points.map((p) => p[1]).filter((v) => v !== null);
    const peak = vals.length ? Math.max(...vals) : 0;
    const canvas = el("canvas", { class: "counter-plot", role: "img", width: 360, height: 70,
      "aria-label": `${short} (${x.kind}) over ${fmtNs(d.start_ns)} to ${fmtNs(d.end_ns)}: peak ${fmtNum(peak, 4)}${x.unit}` });
    box.append(el("figure", { class: "counter" }, canvas,
      el("figcaption", { text: `${short} (${x.kind === "rate" ? "per second" : "max"}), peak ${fmtNum(peak, 4)}${x.unit}` })));
    drawCounter(canvas, x.points, d.start_ns, d.end_ns, d.window, peak);
  }
  if (still.length) box.append(el("p", { class: "muted", text: `Unchanged: ${still.join(", ")}` }));
}

function drawCounter(canvas, pts, t0, t1, win, peak) {
  const { ctx, w, h } = setupCanvas(canvas);
  const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * (w - 4) + 2;
  const y = (v) => h - 4 - (peak > 0 ? (v / peak) * (h - 10) : 0);
  ctx.fillStyle = "#fdecea";  // the finding's evidence window
  ctx.fillRect(x(win[0]), 0, Math.max(2, x(win[1]) - x(win[0])), h);
  ctx.strokeStyle = "#1f4e79"; ctx.lineWidth = 1.5; ctx.beginPath();
  let started = false;
  for (const [t, v] of pts) {
    if (v === null) { started = false; continue; }
    if (!started) { ctx.moveTo(x(t), y(v)); started = true; } else ctx.lineTo(x(t), y(v));
  }
  ctx.stroke();
}

// ------------------------------------------------------------------ fabric view
const ROW_ORDER = ["core", "spine", "leaf", "nic", "host"]; // top to bottom
const ROLE_COLOR = { core: "#b03a2e", spine: "#7d3c98", leaf: "#1e8449", nic: "#2e6fc0", host: "#5b6470" };
const BUCKET_COLORS = ["#a9b3bd", ...HEAT]; // 0: zero / no value
const DOWN_COLOR = "#d0021b";

const fab = {
  data: null, linkIndex: null, rows: [], devRow: null, devX: null, rowY: [], la: null, lb: null,
  bucket: null, view: { k: 1, tx: 0, ty: 0 }, metric: "utilization", overlay: null, grid: null,
  stats: {}, pending: false, loadedFor: "",
};

/** Lay out the columnar /fabric answer: one row per role (core top, hosts bottom), devices in
 * a row sorted by (pod, plane, rail, order given), pods separated by a gap. World x and y are
 * in [0, 1]; everything else is typed arrays so that 40k devices / 100k links cost a few ms. */
function layoutFabric(data) {
  const d = data.devices, n = d.id.length;
  const roles = [...new Set(d.role)];
  const order = [...ROW_ORDER.filter((r) => roles.includes(r)), ...roles.filter((r) => !ROW_ORDER.includes(r)).sort()];
  const rowOf = new Map(order.map((r, i) => [r, i]));
  const devRow = new Uint8Array(n), devX = new Float64Array(n);
  const members = order.map(() => []);
  for (let i = 0; i < n; i++) { devRow[i] = rowOf.get(d.role[i]); members[devRow[i]].push(i); }
  const key = (a) => (a === null || a === undefined ? -1 : a);
  const rows = members.map((m, r) => {
    m.sort((a, b) => key(d.pod[a]) - key(d.pod[b]) || key(d.plane[a]) - key(d.plane[b])
      || key(d.rail[a]) - key(d.rail[b]) || a - b);
    let groups = 1;
    for (let i = 1; i < m.length; i++) if (key(d.pod[m[i]]) !== key(d.pod[m[i - 1]])) groups += 1;
    const gap = groups > 1 ? Math.max(1, m.length / groups / 8) : 0;
    const span = Math.max(1, m.length - 1 + gap * (groups - 1));
    let g = 0;
    const xs = new Float64Array(m.length);
    for (let i = 0; i < m.length; i++) {
      if (i > 0 && key(d.pod[m[i]]) !== key(d.pod[m[i - 1]])) g += 1;
      const x = m.length === 1 ? 0.5 : (i + g * gap) / span;
      xs[i] = x; devX[m[i]] = x;
    }
    return { role: order[r], idx: Int32Array.from(m), xs, y: (r + 0.5) / order.length, groups };
  });
  const la = Int32Array.from(data.links.a), lb = Int32Array.from(data.links.b);
  const linkIndex = new Map();
  data.links.id.forEach((id, e) => linkIndex.set(id, e));
  return { rows, devRow, devX, la, lb, linkIndex };
}

/** A spatial index of the links for hover: links are grouped by the pair of rows they join;
 * within a pair, cell (i, j) of a G x G grid holds the links whose upper end is in x-bin i
 * and lower end in x-bin j. At height t between the rows a link in cell (i, j) lies within
 * 1/G of ((1-t) i + t j)/G, so a query visits O(G) cells instead of every link. */
const G = 64;
function buildLinkGrid() {
  const { la, lb, devRow, devX, rows } = fab;
  const pairs = new Map();
  const m = la.length;
  const pairOf = new Int32Array(m), cellOf = new Int32Array(m);
  for (let e = 0; e < m; e++) {
    let a = la[e], b = lb[e];
    if (devRow[a] === devRow[b]) { pairOf[e] = -1; continue; }
    if (devRow[a] > devRow[b]) [a, b] = [b, a];
    const key = devRow[a] * 256 + devRow[b];
    let p = pairs.get(key);
    if (!p) { p = { top: devRow[a], bot: devRow[b], count: new Int32Array(G * G + 1) }; pairs.set(key, p); }
    const c = Math.min(G - 1, Math.floor(devX[a] * G)) * G + Math.min(G - 1, Math.floor(devX[b] * G));
    pairOf[e] = key; cellOf[e] = c; p.count[c + 1] += 1;
  }
  for (const p of pairs.values()) {
    for (let c = 0; c < G * G; c++) p.count[c + 1] += p.count[c];
    p.start = p.count.slice(); p.items = new Int32Array(p.count[G * G]);
    p.fill = p.count.slice(0, G * G);
  }
  for (let e = 0; e < m; e++) {
    if (pairOf[e] < 0) continue;
    const p = pairs.get(pairOf[e]);
    p.items[p.fill[cellOf[e]]++] = e;
  }
  for (const p of pairs.values()) { delete p.fill; delete p.count; p.yTop = rows[p.top].y; p.yBot = rows[p.bot].y; }
  return [...pairs.values()];
}

function fabGeom(w, h) {
  const L = 96, R = 12, T = 16, B = 16;
  return { L, T, iw: w - L - R, ih: h - T - B, w, h };
}

function scheduleFabricDraw() {
  if (fab.pending) return;
  fab.pending = true;
  requestAnimationFrame(() => { fab.pending = false; drawFabric(); });
}

function drawFabric() {
  const canvas = $("#fabric");
  if (!fab.data) return;
  const t0 = performance.now();
  const { ctx, w, h } = setupCanvas(canvas);
  const g = fabGeom(w, h), { k, tx, ty } = fab.view;
  const SX = (x) => (g.L + x * g.iw) * k + tx, SY = (y) => (g.T + y * g.ih) * k + ty;
  const { la, lb, devRow, devX, rows, bucket } = fab;
  const nDev = devX.length, m = la.length;
  const sx = new Float32Array(nDev);
  for (let i = 0; i < nDev; i++) sx[i] = SX(devX[i]);
  const rowSY = rows.map((r) => SY(r.y));
  // --- links: cull, then aggregate when there are more than pixels to show them
  let visible = 0;
  const vis = new Int32Array(m);
  for (let e = 0; e < m; e++) {
    const xa = sx[la[e]], xb = sx[lb[e]], ya = rowSY[devRow[la[e]]], yb = rowSY[devRow[lb[e]]];
    if ((xa < 0 && xb < 0) || (xa > w && xb > w) || (ya < 0 && yb < 0) || (ya > h && yb > h)) continue;
    vis[visible++] = e;
  }
  const aggregate = visible > w * 4;
  const nb = BUCKET_COLORS.length + 1; // last: down
  const segs = Array.from({ length: nb }, () => []);
  let drawnLinks = 0;
  if (aggregate) {
    // one segment per (row pair, 2-px bin of each end), coloured by the worst link it stands for
    const best = new Map();
    for (let v = 0; v < visible; v++) {
      const e = vis[v];
      const qa = Math.max(-1, Math.min(4094, Math.floor(sx[la[e]] / 2))) + 1;
      const qb = Math.max(-1, Math.min(4094, Math.floor(sx[lb[e]] / 2))) + 1;
      const key = ((devRow[la[e]] * 16 + devRow[lb[e]]) * 4096 + qa) * 4096 + qb;
      const prev = best.get(key);
      const bk = bucket ? bucket[e] : 0;
      if (prev === undefined || bk > prev) best.set(key, bk);
    }
    for (const [key, bk] of best) {
      const qb = key % 4096, r1 = Math.floor(key / 4096), qa = r1 % 4096, rr = Math.floor(r1 / 4096);
      segs[bk].push((qa - 1) * 2 + 1, rowSY[Math.floor(rr / 16)], (qb - 1) * 2 + 1, rowSY[rr % 16]);
    }
    drawnLinks = best.size;
  } else {
    for (let v = 0; v < visible; v++) {
      const e = vis[v];
      segs[bucket ? bucket[e] : 0].push(sx[la[e]], rowSY[devRow[la[e]]], sx[lb[e]], rowSY[devRow[lb[e]]]);
    }
    drawnLinks = visible;
  }
  const colors = [...BUCKET_COLORS, DOWN_COLOR];
  const perBucket = segs.map((s) => s.length / 4);
  for (let b = 0; b < nb; b++) {
    const s = segs[b];
    if (!s.length) continue;
    ctx.strokeStyle = colors[b];
    ctx.globalAlpha = b === 0 ? 0.35 : 0.95;
    ctx.lineWidth = b === 0 ? 0.6 : Math.min(3, 1.2 * Math.sqrt(k));
    ctx.beginPath();
    for (let i = 0; i < s.length; i += 4) { ctx.moveTo(s[i], s[i + 1]); ctx.lineTo(s[i + 2], s[i + 3]); }
    ctx.stroke();
  }
  ctx.globalAlpha = 1;
  // --- devices: marks, or a density strip when the row has more devices than pixels
  let drawnDevices = 0, strips = 0;
  for (let r = 0; r < rows.length; r++) {
    const row = rows[r], y = rowSY[r];
    if (y < -10 || y > h + 10) continue;
    const lo = lowerBound(row.xs, ((0 - tx) / k - g.L) / g.iw), hi = lowerBound(row.xs, ((w - tx) / k - g.L) / g.iw + 1e-12);
    const count = hi - lo;
    ctx.fillStyle = ROLE_COLOR[row.role] || "#444";
    if (count > w / 3) {
      const cols = new Uint16Array(Math.ceil(w) + 1);
      let mx = 1;
      for (let i = lo; i < hi; i++) {
        const c = Math.floor(sx[row.idx[i]]);
        if (c >= 0 && c <= w) { cols[c] += 1; if (cols[c] > mx) mx = cols[c]; }
      }
      for (let level = 1; level <= 4; level++) {
        ctx.globalAlpha = 0.25 * level;
        ctx.beginPath();
        for (let c = 0; c < cols.length; c++) {
          if (!cols[c]) continue;
          const lv = Math.min(4, 1 + Math.floor((cols[c] / mx) * 4));
          if (lv === level) { ctx.rect(c, y - 5, 1, 10); strips += 1; }
        }
        ctx.fill();
      }
      ctx.globalAlpha = 1;
    } else {
      const spacing = count > 1 ? (w / count) : 12;
      const s = Math.max(2, Math.min(10, spacing * 0.7));
      ctx.beginPath();
      for (let i = lo; i < hi; i++) ctx.rect(sx[row.idx[i]] - s / 2, y - s / 2, s, s);
      ctx.fill();
      drawnDevices += count;
    }
  }
  // --- row labels (fixed at the left edge)
  ctx.fillStyle = "#ffffffd0"; ctx.fillRect(0, 0, g.L - 4, h);
  ctx.fillStyle = "#1b1f24";
  rows.forEach((row, r) => { const y = rowSY[r]; if (y > 0 && y < h) ctx.fillText(`${row.role} ${row.idx.length}`, 4, y + 4); });
  const ms = performance.now() - t0;
  fab.stats = { devices: nDev, links: m, visibleLinks: visible, drawnLinks, drawnDevices, densityColumns: strips, aggregated: aggregate, frameMs: Math.round(ms * 10) / 10, zoom: k, perBucket };
  Object.assign(canvas.dataset, { devices: nDev, links: m, drawnLinks, drawnDevices, densityColumns: strips, aggregated: aggregate, frameMs: fab.stats.frameMs });
  hooks.fabric = { ...fab.stats, timings: fab.timings, ready: true, metric: fab.metric, overlayLinks: fab.overlay ? Object.keys(fab.overlay.values).length : 0 };
  const c = fab.data.counts || {};
  canvas.setAttribute("aria-label", `Fabric ${fab.data.name}: ${c.gpus ?? "?"} GPUs, ${rows.map((r) => `${r.idx.length} ${r.role}`).join(", ")}, ${m} links; overlay ${fab.metric}: ${fab.overlaySummary || "no data"}`);
  $("#fab-info").textContent = `${nDev.toLocaleString("en")} devices, ${m.toLocaleString("en")} links; drawn ${drawnLinks.toLocaleString("en")} ${aggregate ? "aggregated " : ""}segments in ${fab.stats.frameMs} ms`;
}

function lowerBound(arr, x) {
  let lo = 0, hi = arr.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (arr[mid] < x) lo = mid + 1; else hi = mid; }
  return lo;
}

function applyOverlay(ov) {
  fab.overlay = ov;
  const m = fab.la.length;
  const bucket = new Uint8Array(m);
  const isState = ov.metric === "state";
  // utilization as a fraction has a natural full scale (1); other metrics scale to their max
  const max = ov.metric === "utilization" && (ov.max || 0) <= 1 ? 1 : Math.max(1e-12, ov.max || 0);
  let n = 0, unknown = 0;
  for (const [id, v] of Object.entries(ov.values || {})) {
    const e = fab.linkIndex.get(id);
    if (e === undefined) { unknown += 1; continue; }
    n += 1;
    if (!(v > 0)) continue;
    bucket[e] = isState ? BUCKET_COLORS.length : 1 + Math.min(HEAT.length - 1, Math.floor((v / max) * HEAT.length));
  }
  fab.bucket = bucket;
  fab.max = max;
  fab.overlaySummary = `${n} links with a non-zero value` + (unknown ? ` (${unknown} unknown ids)` : "") + ` at ${fmtNs(ov.sim_ns)}`;
  if (isState) legend($("#fab-legend"), [[BUCKET_COLORS[0], "up"], [DOWN_COLOR, "down"]]);
  else legend($("#fab-legend"), [[BUCKET_COLORS[0], "0 / no value"], ...HEAT.map((c, i) =>
    [c, `${fmtNum((i * max) / HEAT.length, 3)}–${fmtNum(((i + 1) * max) / HEAT.length, 3)}`])]);
}

async function loadOverlay() {
  try {
    const ov = await api(`/fabric/overlay?metric=${encodeURIComponent(fab.metric)}`);
    applyOverlay(ov);
  } catch (exc) {
    if (exc.status === 401 || exc.status === 429) return;
    fab.bucket = null; fab.overlaySummary = `overlay unavailable (${exc.message})`;
    legend($("#fab-legend"), [[BUCKET_COLORS[0], `link (overlay unavailable: ${exc.message})`]]);
  }
  scheduleFabricDraw();
}

async function showFabric() {
  statusLoop();
  const canvas = $("#fabric");
  const tStart = performance.now();
  if (!fab.data) {
    $("#fab-info").textContent = "loading the inventory…";
    let data;
    try { data = await api("/fabric"); } catch (exc) { showError($("#fab-info"), exc); return; }
    const tLoaded = performance.now();
    Object.assign(fab, layoutFabric(data), { data });
    fab.grid = buildLinkGrid();
    fab.timings = { fetchMs: Math.round(tLoaded - tStart), layoutMs: Math.round(performance.now() - tLoaded) };
  }
  await loadOverlay();
  drawFabric();
  fab.timings = { ...fab.timings, toFirstFrameMs: Math.round(performance.now() - tStart) };
  hooks.fabric.timings = fab.timings;
  markReady("fabric");
  const t = setInterval(() => { if (!document.hidden) loadOverlay(); }, 5000);
  pageTimers.push(t);
  const onResize = () => scheduleFabricDraw();
  window.addEventListener("resize", onResize);
  leavePage = () => window.removeEventListener("resize", onResize);
  canvas.focus({ preventScroll: true });
}

$("#fab-metric").addEventListener("change", (ev) => { fab.metric = ev.target.value; loadOverlay(); });
$("#fab-reset").addEventListener("click", () => { fab.view = { k: 1, tx: 0, ty: 0 }; scheduleFabricDraw(); });

function zoomAt(mx, my, f) {
  const v = fab.view;
  const k = Math.max(1, Math.min(2000, v.k * f));
  const ff = k / v.k;
  v.tx = mx - (mx - v.tx) * ff; v.ty = my - (my - v.ty) * ff; v.k = k;
  if (k === 1) { v.tx = 0; v.ty = 0; }
  scheduleFabricDraw();
}
{
  const canvas = $("#fabric");
  let drag = null;
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = canvas.getBoundingClientRect();
    zoomAt(ev.clientX - r.left, ev.clientY - r.top, Math.exp(-ev.deltaY * 0.0015));
  }, { passive: false });
  canvas.addEventListener("pointerdown", (ev) => { drag = { x: ev.clientX, y: ev.clientY, tx: fab.view.tx, ty: fab.view.ty }; canvas.setPointerCapture(ev.pointerId); });
  canvas.addEventListener("pointerup", () => { drag = null; });
  canvas.addEventListener("pointermove", (ev) => {
    if (drag) {
      fab.view.tx = drag.tx + ev.clientX - drag.x; fab.view.ty = drag.ty + ev.clientY - drag.y;
      scheduleFabricDraw();
      return;
    }
    hoverFabric(ev);
  });
  canvas.addEventListener("pointerleave", () => { $("#fab-tip").hidden = true; });
  canvas.addEventListener("keydown", (ev) => {
    const r = canvas.getBoundingClientRect(), cx = r.width / 2, cy = r.height / 2;
    const step = 60;
    const acts = {
      "+": () => zoomAt(cx, cy, 1.5), "=": () => zoomAt(cx, cy, 1.5), "-": () => zoomAt(cx, cy, 1 / 1.5),
      ArrowLeft: () => { fab.view.tx += step; }, ArrowRight: () => { fab.view.tx -= step; },
      ArrowUp: () => { fab.view.ty += step; }, ArrowDown: () => { fab.view.ty -= step; },
      "0": () => { fab.view = { k: 1, tx: 0, ty: 0 }; },
    };
    if (acts[ev.key]) { ev.preventDefault(); acts[ev.key](); scheduleFabricDraw(); }
  });
}

/** What is under the pointer: the nearest device of a row within 8 px, else the nearest link
 * within 6 px (through the link grid). */
function pickFabric(mx, my) {
  if (!fab.data) return null;
  const canvas = $("#fabric");
  const r = canvas.getBoundingClientRect();
  const g = fabGeom(r.width, r.height), { k, tx, ty } = fab.view;
  const wx = ((mx - tx) / k - g.L) / g.iw, wy = ((my - ty) / k - g.T) / g.ih;
  const pxX = k * g.iw, pxY = k * g.ih;
  const d = fab.data.devices;
  for (const row of fab.rows) {
    if (Math.abs((row.y - wy) * pxY) > 8) continue;
    const i = lowerBound(row.xs, wx);
    let best = -1, bd = 8;
    for (const c of [i - 1, i]) {
      if (c < 0 || c >= row.xs.length) continue;
      const dd = Math.abs((row.xs[c] - wx) * pxX);
      if (dd <= bd) { bd = dd; best = c; }
    }
    if (best >= 0) {
      const di = row.idx[best];
      const where = ["pod", "plane", "rail"].filter((f) => d[f][di] !== null && d[f][di] !== undefined).map((f) => `${f} ${d[f][di]}`).join(", ");
      return { kind: "device", index: di, text: `${d.id[di]} (${d.role[di]}${where ? `, ${where}` : ""})` };
    }
  }
  const tol = 6 / pxX;
  let best = -1, bd = Infinity;
  const near = [];
  for (const p of fab.grid) {
    if (wy < p.yTop || wy > p.yBot) continue;
    const t = (wy - p.yTop) / (p.yBot - p.yTop);
    const X = wx * G, tg = tol * G;
    for (let i = 0; i < G; i++) {
      let jlo = 0, jhi = G - 1;
      const A = X - tg - 1 - (1 - t) * i, B = X + tg - (1 - t) * i;
      if (t > 1e-6) { jlo = Math.max(0, Math.ceil(A / t - 1e-9)); jhi = Math.min(G - 1, Math.floor(B / t + 1e-9)); }
      else if (!(A <= 0 && B >= 0)) continue;
      for (let j = jlo; j <= jhi; j++) {
        const c = i * G + j;
        for (let q = p.start[c]; q < p.start[c + 1]; q++) {
          const e = p.items[q];
          let a = fab.la[e], b = fab.lb[e];
          if (fab.devRow[a] > fab.devRow[b]) [a, b] = [b, a];
          const x = fab.devX[a] + (fab.devX[b] - fab.devX[a]) * t;
          const dd = Math.abs(x - wx);
          if (dd <= tol) near.push(e);
          if (dd < bd) { bd = dd; best = e; }
        }
      }
    }
  }
  if (best >= 0 && bd <= tol) {
    // parallel cables between the same two devices share one line: name them all
    const a0 = Math.min(fab.la[best], fab.lb[best]), b0 = Math.max(fab.la[best], fab.lb[best]);
    const group = near.filter((e) => Math.min(fab.la[e], fab.lb[e]) === a0 && Math.max(fab.la[e], fab.lb[e]) === b0);
    const vals = fab.overlay && fab.overlay.values ? fab.overlay.values : {};
    const ids = group.map((e) => fab.data.links.id[e]);
    const lines = ids.slice(0, 6).map((id) => `${id}  ${fab.metric}: ${vals[id] === undefined ? 0 : fmtNum(vals[id], 4)}`);
    if (ids.length > 6) lines.push(`… ${ids.length - 6} more parallel links`);
    return { kind: "link", index: best, ids, text: `${lines.join("\n")}\n${fab.data.links.gbps[best]} Gb/s each` };
  }
  return null;
}
hooks.pickFabric = pickFabric;
/** Where link `id` crosses the middle between its rows, in canvas CSS pixels (for tests). */
hooks.linkScreenPos = (id) => {
  const e = fab.linkIndex ? fab.linkIndex.get(id) : undefined;
  if (e === undefined) return null;
  const r = $("#fabric").getBoundingClientRect(), g = fabGeom(r.width, r.height), { k, tx, ty } = fab.view;
  const x = (fab.devX[fab.la[e]] + fab.devX[fab.lb[e]]) / 2;
  const y = (fab.rows[fab.devRow[fab.la[e]]].y + fab.rows[fab.devRow[fab.lb[e]]].y) / 2;
  return [(g.L + x * g.iw) * k + tx, (g.T + y * g.ih) * k + ty];
};

function hoverFabric(ev) {
  const canvas = $("#fabric"), tip = $("#fab-tip");
  const r = canvas.getBoundingClientRect();
  const mx = ev.clientX - r.left, my = ev.clientY - r.top;
  hooks.lastPointer = [mx, my];
  const hit = pickFabric(mx, my);
  if (!hit) { tip.hidden = true; return; }
  tip.textContent = hit.text;
  tip.hidden = false;
  tip.style.left = `${Math.min(mx + 14, r.width - 320)}px`; tip.style.top = `${my + 14}px`;
}

// ------------------------------------------------------------------ probes
async function showProbes() {
  statusLoop();
  const canvas = $("#probes"), info = $("#pr-info");
  let d;
  try { d = await api("/probes/matrix"); } catch (exc) { showError(info, exc); return; }
  const n = d.nodes.length;
  let max = 0, lossy = 0;
  for (const row of d.loss) for (const v of row) if (v !== null && v > 0) { lossy += 1; max = Math.max(max, v); }
  info.textContent = n ? `${n} ${d.group}s, window ${d.window_s} s at ${fmtNs(d.sim_ns)}; ${lossy} pairs with loss (max ${pct(max)})` : "No probe results yet.";
  const m = Math.max(max, 1e-4);
  let geom = null;
  if (n) geom = heatmap(canvas, d.loss, { rowLabels: d.nodes, colLabels: d.nodes, max: m, left: 130, bottom: 90 });
  canvas.setAttribute("aria-label", `Probe loss matrix, ${n} by ${n} ${d.group}s (rows send, columns receive): ${lossy} pairs with loss, max ${pct(max)}`);
  canvas.dataset.cells = String(n * n);
  legend($("#pr-legend"), [["#e6e9ed", "no probe"], ...HEAT.map((c, i) => [c, `${pct((i * m) / HEAT.length)}–${pct(((i + 1) * m) / HEAT.length)}`])]);
  hoverCells(canvas, $("#pr-tip"), () => geom, (i, j) => {
    const loss = d.loss[i][j], rtt = d.rtt_us ? d.rtt_us[i][j] : null;
    return `${d.nodes[i]} → ${d.nodes[j]}\nloss ${loss === null ? "no data" : pct(loss)} · RTT ${rtt === null || rtt === undefined ? "–" : `${fmtNum(rtt, 1)} µs`}`;
  });
  markReady("probes");
}

// ------------------------------------------------------------------ stragglers
function findingList(fs) {
  if (!fs || !fs.length) return el("p", { class: "muted", text: "No straggler finding." });
  return el("table", { class: "grid" },
    el("thead", {}, el("tr", {}, ["Id", "Kind", "Subject", "Score", "Window", "Evidence"].map((t) => el("th", { scope: "col", text: t })))),
    el("tbody", {}, fs.map((f) => el("tr", {}, el("td", {}, el("code", { text: f.id })), el("td", { text: f.kind }),
      el("td", {}, el("code", { text: f.subject })), el("td", { class: "num", text: fmtNum(f.score, 2) }),
      el("td", { text: `${fmtNs(f.window[0])} – ${fmtNs(f.window[1])}` }),
      el("td", {}, el("ul", { class: "evidence" }, (f.evidence || []).map((e) => el("li", { text: e }))))))));
}

async function showStragglers() {
  statusLoop();
  const canvas = $("#stragglers"), info = $("#st-info");
  let d;
  try { d = await api("/stragglers"); } catch (exc) { showError(info, exc); return; }
  const ranks = d.ranks || [], wins = d.windows || [];
  // rows: ranks; columns: windows
  const values = ranks.map((_, r) => wins.map((w) => (w.values[r] === undefined ? null : w.values[r])));
  let max = 1;
  for (const row of values) for (const v of row) if (v !== null) max = Math.max(max, v);
  info.textContent = ranks.length ? `${ranks.length} ranks of ${d.job ? d.job.iterations : "?"} iterations, ${wins.length} windows; worst slowdown ${fmtNum(max, 2)}×` : "No training job traces yet.";
  let geom = null;
  if (ranks.length && wins.length) {
    // colour the excess over 1.0 (no slowdown) so that a healthy job is uniformly light
    const excess = values.map((row) => row.map((v) => (v === null ? null : Math.max(0, v - 1))));
    geom = heatmap(canvas, excess, { rowLabels: ranks.map((r) => `rank ${r.rank} ${r.gpu}`), colLabels: wins.map((w) => fmtNs(w.t_ns)), max: Math.max(max - 1, 0.05), left: 170, bottom: 60 });
  }
  canvas.setAttribute("aria-label", `Per-rank slowdown over time: ${ranks.length} ranks by ${wins.length} windows, worst ${fmtNum(max, 2)} times the median`);
  const em = Math.max(max - 1, 0.05);
  legend($("#st-legend"), HEAT.map((c, i) => [c, `${fmtNum(1 + (i * em) / HEAT.length, 2)}–${fmtNum(1 + ((i + 1) * em) / HEAT.length, 2)}×`]));
  hoverCells(canvas, $("#st-tip"), () => geom, (i, j) => `rank ${ranks[i].rank} (${ranks[i].gpu}) at ${fmtNs(wins[j].t_ns)}\nslowdown ${fmtNum(values[i][j], 3)}×`);
  put($("#st-findings"), findingList(d.findings));
  markReady("stragglers");
}

// ------------------------------------------------------------------ optics
const GRADE_RANK = { failed: 0, fail: 0, bad: 1, critical: 1, failing: 1, degraded: 2, warn: 3, warning: 3, watch: 3, marginal: 3, ok: 5, good: 6, healthy: 6 };
const optics = { ports: [], sort: "grade", dir: -1, selected: "" };

function renderOpticsTable() {
  const key = optics.sort, dir = optics.dir;
  const val = (p) => (key === "grade" ? -(GRADE_RANK[String(p.grade).toLowerCase()] ?? 4) : key === "lanes" ? (Array.isArray(p.lanes) ? p.lanes.length : p.lanes) : p[key]);
  const rows = [...optics.ports].sort((a, b) => {
    const x = val(a), y = val(b);
    if (x === y) return String(a.port).localeCompare(String(b.port));
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * dir;
  });
  for (const th of document.querySelectorAll("#op-table th")) {
    const k = th.querySelector("button").dataset.key;
    th.setAttribute("aria-sort", k === key ? (dir > 0 ? "ascending" : "descending") : "none");
  }
  put($("#op-table tbody"), ...rows.map((p) => {
    const btn = el("button", { type: "button", class: "port-btn", text: p.port, "aria-label": `Plot lanes of ${p.port}` });
    btn.addEventListener("click", () => plotOptic(p.port));
    return el("tr", { class: p.port === optics.selected ? "selected" : "", "data-port": p.port },
      el("td", {}, btn), el("td", { text: p.grade }), el("td", { class: "num", text: fmtNum(p.rx_dbm, 2) }),
      el("td", { class: "num", text: fmtNum(p.tx_dbm, 2) }), el("td", { class: "num", text: fmtNum(p.temp_c, 1) }),
      el("td", { class: "num", text: Array.isArray(p.lanes) ? p.lanes.length : fmtNum(p.lanes) }));
  }));
}
for (const b of document.querySelectorAll("#op-table th button")) {
  b.addEventListener("click", () => {
    const k = b.dataset.key;
    if (optics.sort === k) optics.dir = -optics.dir; else { optics.sort = k; optics.dir = k === "grade" ? -1 : 1; }
    renderOpticsTable();
  });
}

async function plotOptic(port) {
  optics.selected = port;
  renderOpticsTable();
  const canvas = $("#optics-plot");
  $("#op-plot-h").textContent = `Per-lane receive power of ${port}`;
  let d;
  try { d = await api(`/optics/${encodeURIComponent(port)}`); } catch (exc) { showError($("#op-legend"), exc); return; }
  const series = d.lanes.map((l, i) => ({ label: `lane ${l.lane}`, xs: d.t_ns, ys: l.rx_dbm, color: LANE_COLORS[i % LANE_COLORS.length] }));
  linePlot(canvas, series, { ylabel: "Rx power (dBm)" });
  const last = d.lanes.map((l) => `lane ${l.lane} ${fmtNum(l.rx_dbm[l.rx_dbm.length - 1], 2)} dBm`).join(", ");
  canvas.setAttribute("aria-label", `Receive power of ${d.lanes.length} lanes of ${port} over ${d.t_ns.length} samples; latest ${last}`);
  legend($("#op-legend"), series.map((s) => [s.color, s.label]));
}

async function showOptics() {
  statusLoop();
  let d;
  try { d = await api("/optics"); } catch (exc) { showError($("#op-counts"), exc); return; }
  optics.ports = d.ports || [];
  $("#op-counts").textContent = optics.ports.length ? `${optics.ports.length} transceivers at ${fmtNs(d.sim_ns)}: ` + Object.entries(d.counts || {}).map(([g, n]) => `${n} ${g}`).join(", ") : "No transceiver readings yet.";
  renderOpticsTable();
  markReady("optics");
}

// ------------------------------------------------------------------ what-if
$("#wi-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const fd = new FormData(ev.target);
  const lb = fd.getAll("lb");
  const status = $("#wi-status"), out = $("#wi-result");
  if (!lb.length) { status.textContent = "Choose at least one load-balancing scheme."; status.className = "msg err"; return; }
  const servers = Number(fd.get("servers")) || 16;
  const scenario = {
    name: "console what-if",
    topology: { kind: "rail-optimized", params: { servers, servers_per_leaf: Math.max(1, Math.min(4, servers / 2)) } },
    workload: { kind: fd.get("kind"), size: fd.get("size") || "8MiB" },
    lb, seeds: [0],
  };
  if (fd.get("fail")) scenario.faults = [{ kind: "link-down", link: "leaf-p0-r0-00~spine-p0-00" }];
  status.className = "msg"; status.textContent = "submitting…"; put(out, );
  let job;
  try { job = await api("/whatif", { method: "POST", body: { scenario } }); } catch (exc) { status.textContent = ""; showError(out, exc); return; }
  const t0 = Date.now();
  const poll = async () => {
    let r;
    try { r = await api(`/whatif/${encodeURIComponent(job.id)}`); } catch (exc) { showError(out, exc); return; }
    status.textContent = `run ${r.id}: ${r.status} (${Math.round((Date.now() - t0) / 1000)} s)`;
    if (r.status === "queued" || r.status === "running") { setTimeout(poll, 500); return; }
    if (r.status === "failed") { put(out, el("p", { class: "err", role: "alert", text: `The run failed: ${r.error}` })); return; }
    renderWhatif(r, out);
    markReady("whatif");
  };
  poll();
});

function renderWhatif(r, out) {
  const rows = r.table || [];
  const cols = [...new Set(rows.flatMap((row) => Object.keys(row)))];
  put(out, 
    el("h2", { text: "Result" }),
    rows.length ? el("div", { class: "scroll" }, el("table", { class: "grid", id: "wi-table" },
      el("thead", {}, el("tr", {}, cols.map((c) => el("th", { scope: "col", text: c })))),
      el("tbody", {}, rows.map((row) => el("tr", {}, cols.map((c) => el("td", { class: typeof row[c] === "number" ? "num" : "", text: typeof row[c] === "number" ? fmtNum(row[c], 3) : (row[c] ?? "") }))))))) : el("p", { text: "No rows." }),
    el("h2", { text: "Comparisons" }),
    el("ul", {}, (r.comparisons || []).map((c) => el("li", { text: c }))));
}
function showWhatif() { statusLoop(); markReady("whatif"); }

// ------------------------------------------------------------------ advisor
$("#ad-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const text = $("#ad-text").value.trim();
  const status = $("#ad-status"), out = $("#ad-answer");
  if (!text) { status.className = "msg err"; status.textContent = "Describe the symptom first."; return; }
  status.className = "msg"; status.textContent = "asking…";
  let r;
  try { r = await api("/advise", { method: "POST", body: { symptom: text } }); } catch (exc) { status.textContent = ""; showError(out, exc); return; }
  const a = r.answer || {};
  status.textContent = `answered in ${fmtNum(a.seconds ?? 0, 2)} s`;
  const rcs = a.root_causes || [];
  put(out, 
    (a.focus || []).length ? el("p", {}, "Focus: ", a.focus.map((f, i) => [i ? ", " : "", el("code", { text: f })])) : null,
    el("h2", { text: "Root causes" }),
    rcs.length ? el("ol", {}, rcs.map((rc) => el("li", {},
      el("strong", { text: `${rc.fault} on ` }), el("code", { text: rc.resource }), ` — ${pct(rc.probability)}`,
      rc.incident ? [" (incident ", el("a", { href: `#/incident/${encodeURIComponent(rc.incident)}`, text: rc.incident }), ")"] : null,
      el("ul", { class: "evidence" }, (rc.evidence || []).map((e) => el("li", { text: e }))),
      rc.action ? el("p", {}, el("strong", { text: "Action: " }), rc.action) : null))) : el("p", { class: "muted", text: "No root cause: nothing the console holds explains this symptom." }),
    el("h2", { text: "Plan" }),
    (a.plan || []).length ? el("ol", {}, a.plan.map((p) => el("li", {},
      el("strong", { text: `${p.check} ` }), `(${p.for}, ${p.source}): `, el("code", { text: p.run }),
      el("br"), `if true: ${p.if_true}`, el("br"), `if false: ${p.if_false}`))) : el("p", { class: "muted", text: "No plan." }),
    (a.notes || []).length ? el("div", {}, el("h2", { text: "Notes" }), el("ul", {}, a.notes.map((n) => el("li", { text: n })))) : null);
  markReady("advisor");
});
function showAdvisor() { statusLoop(); markReady("advisor"); }

// ------------------------------------------------------------------ boot
if (token()) start(); else showLogin("");
