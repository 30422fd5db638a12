// fabricwatch NOC page: plain JavaScript, no build step, no third-party code.
// Data comes from the REST API with a Bearer token (from ?token= or localStorage); live
// updates come over /api/v1/events, read with fetch() because EventSource cannot send headers.
"use strict";

const TOKEN_KEY = "fabricwatch.token";
const state = { summary: null, topo: null, alerts: null, drains: null, selected: null, lastEventId: null };

// ------------------------------------------------------------------ helpers

function el(tag, attrs, ...kids) {
  // Text goes in as text nodes, never as HTML: alert summaries and names are untrusted.
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    node.appendChild(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}

function $(id) { return document.getElementById(id); }

function token() {
  const url = new URL(window.location.href);
  const t = url.searchParams.get("token");
  if (t) {
    localStorage.setItem(TOKEN_KEY, t);
    url.searchParams.delete("token");   // keep the token out of the address bar and history
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
  return localStorage.getItem(TOKEN_KEY);
}

function headers(extra) {
  const h = Object.assign({ Accept: "application/json" }, extra || {});
  const t = token();
  if (t) h.Authorization = "Bearer " + t;
  return h;
}

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || ("HTTP " + status));
    this.status = status;
  }
}

async function api(path, opts) {
  const o = opts || {};
  const res = await fetch(path, {
    method: o.method || "GET",
    headers: headers(o.body ? { "Content-Type": "application/json" } : {}),
    body: o.body ? JSON.stringify(o.body) : undefined,
  });
  if (res.status === 401) showAuth("This API needs a token (read scope to view, operate to act).");
  if (!res.ok) {
    let problem = null;
    try { problem = await res.json(); } catch (_) { /* not JSON */ }
    throw new ApiError(res.status, problem);
  }
  return res.json();
}

function toast(msg, ok) {
  const t = $("toast");
  t.textContent = msg;
  t.className = "toast" + (ok ? " ok" : "");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.classList.add("hidden"), 5000);
}

function showAuth(msg) {
  $("auth-msg").textContent = msg;
  $("auth").classList.remove("hidden");
}

function fmtTime(v) {
  if (v === null || v === undefined) return "—";
  const d = typeof v === "number" ? new Date(v) : new Date(v);
  return d.toISOString().slice(5, 16).replace("T", " ");
}

function fmtNum(v, digits) {
  return v === null || v === undefined ? "—" : Number(v).toFixed(digits === undefined ? 2 : digits);
}

function entity(a) {
  const s = a.device + (a.port ? ":" + a.port : "") + (a.lane !== null && a.lane !== undefined ? " lane " + a.lane : "");
  if (!a.peer_device) return s;
  return el("span", {}, s, el("div", { class: "peer" }, "↔ " + a.peer_device + (a.peer_port ? ":" + a.peer_port : "")));
}

// ------------------------------------------------------------------ header

function renderKpis() {
  const s = state.summary;
  const box = $("kpis");
  box.replaceChildren();
  if (!s) return;
  const sev = s.alerts.open_by_severity || {};
  const kpi = (v, k, cls) => el("div", { class: "kpi " + (cls || "") }, el("span", { class: "v" }, v),
    el("span", { class: "k" }, k));
  box.append(
    kpi(sev.page || 0, "page", (sev.page || 0) > 0 ? "bad" : "good"),
    kpi(sev.ticket || 0, "ticket", (sev.ticket || 0) > 0 ? "warn" : ""),
    kpi(s.drains.pending, "drains pending", s.drains.pending > 0 ? "warn" : ""),
    kpi(s.incidents.open, "incidents open", ""),
    kpi((s.link_health.down || 0) + (s.link_health.critical || 0), "links bad",
      (s.link_health.down || 0) + (s.link_health.critical || 0) > 0 ? "bad" : "good"),
    kpi(s.targets.failing, "targets failing", s.targets.failing > 0 ? "bad" : ""),
    kpi(s.devices.total, "devices", ""), kpi(s.links, "links", ""), kpi(s.pods, "pods", ""),
  );
}

// ------------------------------------------------------------------ health map

function tile(node, small) {
  const t = el("div", {
    class: "tile h-" + node.health + (small ? " host" : "") + (state.selected && state.selected.device === node.id ? " sel" : ""),
    title: node.id + " — " + node.health + (node.reasons.length ? "\n" + node.reasons.join("\n") : ""),
    "data-device": node.id, "data-health": node.health,
    onclick: () => selectDevice(node.id),
  }, small ? "" : node.id.replace(/^(leaf|spine|core)-/, ""));
  return t;
}

function renderMap() {
  const topo = state.topo;
  const box = $("map");
  if (!topo) return;
  $("health-source").textContent = "· from " + topo.health_source;
  const byPod = new Map();
  for (const n of topo.nodes) {
    const key = n.pod || "";
    if (!byPod.has(key)) byPod.set(key, []);
    byPod.get(key).push(n);
  }
  const out = [];
  const shared = byPod.get("") || [];
  if (shared.length) {
    const cores = shared.filter((n) => n.role === "core"), spines = shared.filter((n) => n.role === "spine");
    out.push(el("div", { class: "pod" },
      el("div", { class: "pod-h" }, "Shared fabric"),
      cores.length ? el("div", { class: "tier" }, el("span", { class: "lbl" }, "core"), el("div", { class: "tiles" }, cores.map((n) => tile(n)))) : null,
      spines.length ? el("div", { class: "tier" }, el("span", { class: "lbl" }, "spine"), el("div", { class: "tiles" }, spines.map((n) => tile(n)))) : null,
    ));
  }
  for (const [pod, nodes] of [...byPod.entries()].filter(([p]) => p !== "").sort()) {
    const counts = {};
    for (const n of nodes) counts[n.health] = (counts[n.health] || 0) + 1;
    const spines = nodes.filter((n) => n.role === "spine" || n.role === "core");
    const leaves = nodes.filter((n) => n.role === "leaf");
    const hosts = nodes.filter((n) => n.role === "host");
    const rails = new Map();
    for (const l of leaves) {
      const r = l.rail === null || l.rail === undefined ? "—" : l.rail;
      if (!rails.has(r)) rails.set(r, []);
      rails.get(r).push(l);
    }
    const railRows = [...rails.entries()].sort((a, b) => String(a[0]).localeCompare(String(b[0]), undefined, { numeric: true }))
      .map(([r, ls]) => el("div", { class: "tier" }, el("span", { class: "lbl" }, r === "—" ? "leaf" : "rail " + r),
        el("div", { class: "tiles" }, ls.map((n) => tile(n)))));
    const stats = ["critical", "down", "warning", "info", "ok", "unknown"].filter((h) => counts[h])
      .map((h) => counts[h] + " " + h).join(" · ");
    out.push(el("div", { class: "pod", "data-pod": pod },
      el("div", { class: "pod-h" }, el("span", { class: "sev " + podHealth(counts) }, pod), el("span", { class: "stats" }, stats)),
      spines.length ? el("div", { class: "tier" }, el("span", { class: "lbl" }, "spine"), el("div", { class: "tiles" }, spines.map((n) => tile(n)))) : null,
      railRows,
      hosts.length ? el("div", { class: "tier" }, el("span", { class: "lbl" }, "hosts " + hosts.length), el("div", { class: "tiles" }, hosts.map((n) => tile(n, true)))) : null,
    ));
  }
  box.replaceChildren(...(out.length ? out : [el("div", { class: "empty" }, "no devices in the inventory")]));
}

function podHealth(counts) {
  for (const h of ["critical", "down", "warning", "info", "ok"]) if (counts[h]) return h;
  return "unknown";
}

// ------------------------------------------------------------------ alerts

function evidence(a) {
  return (a.evidence || []).slice(0, 4).map((e) => el("span", { class: "ev", title: e.note || "" },
    e.feature + " ", el("b", {}, fmtNum(e.value, 3)), e.unit ? " " + e.unit : "",
    e.baseline !== null && e.baseline !== undefined ? " vs " + fmtNum(e.baseline, 3) : ""));
}

function renderAlerts() {
  const body = $("alerts").tBodies[0];
  if (state.alerts === null) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 7, class: "empty" }, "alerts API not available")));
    $("alerts-count").textContent = "";
    return;
  }
  const rank = { page: 0, ticket: 1, info: 2 };
  const items = [...state.alerts].sort((a, b) => (rank[a.severity] ?? 3) - (rank[b.severity] ?? 3)
    || (a.state === "firing" ? 0 : 1) - (b.state === "firing" ? 0 : 1) || b.opened_at_ms - a.opened_at_ms);
  $("alerts-count").textContent = String(items.length);
  if (!items.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 7, class: "empty" }, "no active alerts")));
    return;
  }
  body.replaceChildren(...items.map((a) => el("tr", {
    class: "click alert-row", "data-alert-id": a.id,
    onclick: () => selectPort(a.device, a.port, a.peer_device, a.peer_port),
  },
  el("td", {}, el("span", { class: "sev " + a.severity }, a.severity)),
  el("td", {}, el("span", { class: "state " + a.state }, a.state), a.muted_by ? el("div", { class: "muted" }, "muted") : null),
  el("td", { class: "ent" }, entity(a)),
  el("td", {}, el("div", { class: "sum" }, el("b", {}, a.kind), " · ", a.cause, " — ", a.summary),
    el("div", {}, evidence(a)), a.ttt_hours !== null && a.ttt_hours !== undefined ? el("div", { class: "muted" }, "time to threshold " + fmtNum(a.ttt_hours, 1) + " h") : null),
  el("td", { class: "act" }, a.action.replaceAll("_", " ")),
  el("td", { class: "mono muted when" }, fmtTime(a.opened_at_ms)),
  el("td", {}, a.state === "firing" ? el("button", { type: "button", onclick: (ev) => { ev.stopPropagation(); ack(a.id); } }, "ack") : null),
  )));
}

async function ack(id) {
  try {
    await api("/api/v1/alerts/" + id + "/ack", { method: "POST", body: { comment: "acknowledged from the NOC page" } });
    toast("alert " + id + " acknowledged", true);
    refresh(["alerts", "summary"]);
  } catch (e) { toast("ack failed: " + e.message); }
}

// ------------------------------------------------------------------ drains

function renderDrains() {
  const body = $("drains").tBodies[0];
  if (state.drains === null) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "empty" }, "drains API not available")));
    return;
  }
  $("drains-count").textContent = String(state.drains.length);
  if (!state.drains.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "empty" }, "no drains waiting")));
    return;
  }
  body.replaceChildren(...state.drains.map((d) => {
    const v = d.verdict || {};
    return el("tr", { class: "click drain-row", "data-drain-id": d.id, onclick: () => selectPort(d.device, d.port, d.peer_device, d.peer_port) },
      el("td", { class: "mono" }, d.id),
      el("td", { class: "ent" }, el("div", { class: "muted" }, d.target_kind), entity(d)),
      el("td", { class: "act" }, d.action.replaceAll("_", " ")),
      el("td", {}, el("span", { class: "state " + d.status }, d.status)),
      el("td", {}, el("span", { class: "verdict " + (v.safe ? "safe" : "unsafe") }, v.safe ? "SAFE" : "BLOCKED"), " ", (v.summary || "").replace(/^(safe|blocked|unsafe):\s*/i, ""),
        el("div", { class: "checks" }, (v.checks || []).map((c) => el("span", { class: "chk " + (c.ok ? "ok" : "bad"), title: c.message }, c.constraint.replaceAll("_", " "))))),
      el("td", {}, d.status === "pending" ? el("button", { type: "button", class: "primary", onclick: (ev) => { ev.stopPropagation(); approve(d.id); } }, "approve") : null),
    );
  }));
}

async function approve(id) {
  try {
    await api("/api/v1/drains/" + id + "/approve", { method: "POST", body: { note: "approved from the NOC page" } });
    toast("drain " + id + " approved", true);
    refresh(["drains", "summary"]);
  } catch (e) { toast("approve failed: " + e.message); }
}

// ------------------------------------------------------------------ worst links

function renderWorst() {
  const body = $("worst").tBodies[0];
  const items = (state.summary && state.summary.worst_links) || [];
  if (!items.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 4, class: "empty" }, "every link healthy with margin")));
    return;
  }
  body.replaceChildren(...items.map((l) => el("tr", { class: "click", onclick: () => selectPort(l.source, l.source_port, l.target, l.target_port) },
    el("td", { class: "ent" }, l.source + ":" + l.source_port, el("div", { class: "peer" }, "↔ " + l.target + ":" + l.target_port)),
    el("td", {}, el("span", { class: "sev " + l.health }, l.health)),
    el("td", { class: "mono" }, l.rx_margin_db === null ? "—" : fmtNum(l.rx_margin_db, 1) + " dB"),
    el("td", { class: "muted" }, l.reasons.join("; ")))));
}

// ------------------------------------------------------------------ detail: device and link

async function selectDevice(name) {
  state.selected = { device: name };
  renderMap();
  $("detail-title").replaceChildren("Device ", el("span", { class: "ent" }, name));
  try {
    const d = await api("/api/v1/devices/" + encodeURIComponent(name));
    const rows = d.ports.map((p) => el("tr", { class: p.peer ? "click" : "", onclick: p.peer ? () => selectPort(name, p.name, p.peer.device, p.peer.port) : null },
      el("td", { class: "ent" }, p.name), el("td", {}, p.oper_up === null ? "—" : p.oper_up ? "up" : el("span", { class: "sev down" }, "down")),
      el("td", { class: "mono" }, p.speed_gbps ? p.speed_gbps + "G" : "—"), el("td", {}, p.rail ?? "—"),
      el("td", { class: "muted" }, p.optic ? p.optic.type + " " + (p.optic.part_number || "") : "—"),
      el("td", { class: "ent" }, p.peer ? p.peer.device + ":" + p.peer.port : "—")));
    $("detail").replaceChildren(
      el("div", { class: "muted" }, [d.role, d.pod, d.vendor, d.model].filter(Boolean).join(" · "),
        d.endpoints.length ? " · targets: " + d.endpoints.map((e) => e.protocol + " " + e.state).join(", ") : ""),
      el("table", { class: "grid ports" }, el("thead", {}, el("tr", {}, ["port", "oper", "speed", "rail", "optic", "peer"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)));
  } catch (e) { $("detail").replaceChildren(el("div", { class: "empty" }, "cannot load " + name + ": " + e.message)); }
}

async function selectPort(device, port, peerDevice, peerPort) {
  if (!port) { selectDevice(device); return; }
  state.selected = { device, port };
  renderMap();
  let peer = peerDevice && peerPort ? { device: peerDevice, port: peerPort } : null;
  if (!peer) {
    try {
      const d = await api("/api/v1/devices/" + encodeURIComponent(device));
      const p = d.ports.find((x) => x.name === port);
      if (p && p.peer) peer = { device: p.peer.device, port: p.peer.port };
    } catch (_) { /* detail below says what is missing */ }
  }
  $("detail-title").replaceChildren("Link ", el("span", { class: "ent" }, device + ":" + port + (peer ? " ↔ " + peer.device + ":" + peer.port : "")),
    el("span", { class: "muted" }, "· Rx power per lane, last 6 h of data"));
  const ends = [{ device, port }].concat(peer ? [peer] : []);
  const boxes = ends.map((e) => el("div", { class: "end" }, el("h3", {}, e.device + ":" + e.port), el("div", { class: "meta" }, "loading…")));
  $("detail").replaceChildren(el("div", { class: "ends" }, boxes));
  await Promise.all(ends.map((e, i) => renderEnd(e, boxes[i])));
}

async function renderEnd(end, box) {
  const q = "device=" + encodeURIComponent(end.device) + "&port=" + encodeURIComponent(end.port);
  let optic = null;
  try { optic = (await api("/api/v1/optics?" + q)).items[0] || null; } catch (_) { /* no optic */ }
  const meta = box.querySelector(".meta");
  if (!optic) { meta.textContent = "no optic (DAC or unknown module)"; return; }
  meta.textContent = [optic.type, optic.vendor, optic.part_number, optic.serial].filter(Boolean).join(" · ") +
    " · DOM at " + fmtTime(optic.dom.at);
  const canvas = el("canvas", { class: "plot" });
  box.appendChild(canvas);
  const rx = (optic.thresholds || {}).rx_power_dbm || {};
  let series = [];
  if (optic.dom.at) {
    const endT = new Date(optic.dom.at).getTime();   // data time, not the wall clock
    const start = new Date(endT - 6 * 3600 * 1000).toISOString();
    try {
      const s = await api("/api/v1/series?metric=optic_rx_power_dbm&" + q + "&start=" + encodeURIComponent(start) + "&end=" + encodeURIComponent(optic.dom.at));
      series = s.series.map((x) => ({ lane: x.labels.lane, points: x.points }));
    } catch (e) { meta.textContent += " · series: " + e.message; }
  }
  drawPlot(canvas, series, rx);
  const th = (k) => el("th", {}, k);
  const cell = (r, digits, scale) => r ? el("td", { class: r.status }, fmtNum(r.value === null ? null : r.value * (scale || 1), digits)) : el("td", {}, "—");
  const marginCell = (r) => r && r.margin && r.margin.low_warning !== undefined ? el("td", { class: r.status }, fmtNum(r.margin.low_warning, 1)) : el("td", {}, "—");
  box.appendChild(el("table", { class: "dom" },
    el("thead", {}, el("tr", {}, th("lane"), th("rx dBm"), th("tx dBm"), th("bias mA"), th("rx margin dB"))),
    el("tbody", {}, optic.dom.lanes.map((l) => el("tr", {}, el("td", {}, l.lane), cell(l.rx_power_dbm, 2), cell(l.tx_power_dbm, 2),
      cell(l.tx_bias_amperes, 1, 1000), marginCell(l.rx_power_dbm))),
    el("tr", {}, el("td", { colspan: 5, class: "muted" }, "module " + fmtNum((optic.dom.module.temperature_celsius || {}).value, 1) + " °C · " +
      fmtNum((optic.dom.module.voltage_volts || {}).value, 3) + " V · low warn " + fmtNum(rx.low_warning, 1) + " / alarm " + fmtNum(rx.low_alarm, 1) + " dBm")))));
}

const LANE_COLORS = ["#4aa3ff", "#2fd3a0", "#f3c14b", "#ff7ab6", "#a78bfa", "#7dd3fc", "#fb923c", "#bef264"];

function drawPlot(canvas, series, rx) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 400, h = canvas.clientHeight || 150;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  g.font = "10px ui-monospace, DejaVu Sans Mono, monospace";
  const pts = series.flatMap((s) => s.points.filter((p) => p[1] !== null && p[1] > -39));
  if (!pts.length) { g.fillStyle = "#7d8a99"; g.fillText("no Rx power samples", 10, 20); return; }
  let t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]));
  if (t1 === t0) t1 = t0 + 60000;
  const vals = pts.map((p) => p[1]).concat([rx.low_warning, rx.low_alarm].filter((v) => v !== undefined && v !== null));
  let lo = Math.floor(Math.min(...vals) - 0.5), hi = Math.ceil(Math.max(...vals) + 0.5);
  const L = 36, R = 8, T = 8, B = 18;
  const x = (t) => L + (t - t0) / (t1 - t0) * (w - L - R);
  const y = (v) => T + (hi - v) / (hi - lo) * (h - T - B);
  g.strokeStyle = "#1f2a36"; g.fillStyle = "#7d8a99"; g.lineWidth = 1;
  const step = Math.max(1, Math.ceil((hi - lo) / 5));
  for (let v = Math.ceil(lo); v <= hi; v += step) {
    g.beginPath(); g.moveTo(L, y(v)); g.lineTo(w - R, y(v)); g.stroke();
    g.fillText(String(v), 4, y(v) + 3);
  }
  for (let i = 0; i <= 3; i++) {
    const t = t0 + (t1 - t0) * i / 3;
    g.fillText(new Date(t).toISOString().slice(11, 16), Math.min(x(t) - 12, w - 40), h - 5);
  }
  const hline = (v, color, label) => {
    if (v === undefined || v === null) return;
    g.save(); g.strokeStyle = color; g.setLineDash([4, 3]); g.beginPath(); g.moveTo(L, y(v)); g.lineTo(w - R, y(v)); g.stroke();
    g.restore(); g.fillStyle = color; g.fillText(label, w - R - 60, y(v) - 3);
  };
  hline(rx.low_warning, "#f0a92e", "low warn");
  hline(rx.low_alarm, "#ff4d4f", "low alarm");
  series.forEach((s, i) => {
    g.strokeStyle = LANE_COLORS[(s.lane ?? i) % LANE_COLORS.length]; g.lineWidth = 1.5; g.beginPath();
    let pen = false;
    for (const [t, v] of s.points) {
      if (v === null || v <= -39) { pen = false; continue; }   // -40 dBm is "no light": a gap, not a dive
      if (pen) g.lineTo(x(t), y(v)); else g.moveTo(x(t), y(v));
      pen = true;
    }
    g.stroke();
    g.fillStyle = g.strokeStyle; g.fillText("L" + (s.lane ?? i), L + 4 + i * 24, T + 10);
  });
}

// ------------------------------------------------------------------ loading

const loaders = {
  async summary() { state.summary = await api("/api/v1/summary"); renderKpis(); renderWorst(); },
  async topo() { state.topo = await api("/api/v1/topology"); renderMap(); },
  async alerts() {
    try {
      const page = await api("/api/v1/alerts?state=firing&state=acknowledged&limit=500");
      state.alerts = page.items;
    } catch (e) { if (e.status === 404) state.alerts = null; else throw e; }
    renderAlerts();
  },
  async drains() {
    try {
      state.drains = await api("/api/v1/drains?status=pending&status=blocked&status=approved&limit=200");
      const b = await api("/api/v1/drains/breaker").catch(() => null);
      $("breaker").textContent = b && b.tripped ? "· circuit breaker TRIPPED" : "";
    } catch (e) { if (e.status === 404) state.drains = null; else throw e; }
    renderDrains();
  },
};

async function refresh(which) {
  await Promise.all((which || Object.keys(loaders)).map((k) => loaders[k]().catch((e) => {
    if (e.status !== 401) toast("loading " + k + " failed: " + e.message);
  })));
  document.body.setAttribute("data-loaded", "1");
  if (!state.selected) autoSelect();
}

function autoSelect() {
  // Open the detail on what most needs a look: the worst alert with a port, else the worst link.
  const a = (state.alerts || []).find((x) => x.port && x.severity === "page") || (state.alerts || []).find((x) => x.port);
  if (a) { selectPort(a.device, a.port, a.peer_device, a.peer_port); return; }
  const l = ((state.summary && state.summary.worst_links) || [])[0];
  if (l) selectPort(l.source, l.source_port, l.target, l.target_port);
}

// Events name what changed; we re-read the affected resources, coalescing bursts.
const pending = new Set();
function schedule(kind) {
  const map = { alert: ["alerts", "summary", "topo"], drain: ["drains", "summary"], incident: ["summary"],
    target: ["summary"] };
  for (const k of map[kind] || ["summary"]) pending.add(k);
  clearTimeout(schedule.timer);
  schedule.timer = setTimeout(() => { const w = [...pending]; pending.clear(); refresh(w); }, 400);
}

function setLive(on, text) {
  const l = $("live");
  l.className = "live " + (on ? "on" : "off");
  l.textContent = text;
}

async function stream() {
  let delay = 1000;
  for (;;) {
    try {
      const h = headers({ Accept: "text/event-stream" });
      if (state.lastEventId) h["Last-Event-ID"] = state.lastEventId;
      const res = await fetch("/api/v1/events", { headers: h });
      if (!res.ok) throw new Error("HTTP " + res.status);
      setLive(true, "live");
      delay = 1000;
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let kind = "message", id = null;
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("id:")) id = line.slice(3).trim();
          }
          if (id) { state.lastEventId = id; schedule(kind); }
        }
      }
    } catch (_) { /* fall through to reconnect */ }
    setLive(false, "reconnecting");
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 30000);
    refresh();   // we may have missed events older than the server's replay buffer
  }
}

function tick() { $("clock").textContent = new Date().toISOString().slice(11, 19) + " UTC"; }

document.addEventListener("DOMContentLoaded", () => {
  token();
  $("auth-save").addEventListener("click", () => {
    const v = $("auth-token").value.trim();
    if (v) { localStorage.setItem(TOKEN_KEY, v); $("auth").classList.add("hidden"); refresh(); }
  });
  tick();
  setInterval(tick, 1000);
  refresh();
  setInterval(refresh, 60000);   // a safety net under the event stream
  stream();
});
