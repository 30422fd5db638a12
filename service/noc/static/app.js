// fabricwatch NOC page: plain JavaScript, no build step, no third-party code.
// Data comes from the REST API with a Bearer token (from ?token= or localStorage); live
// updates come over /api/v1/events, read with fetch() because EventSource cannot send headers.
"use strict";

const TOKEN_KEY = "fabricwatch.token";
const state = { summary: null, topo: null, alerts: null, drains: null, selected: null, lastEventId: null,
  me: null, authFailed: false };

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
  if (!res.ok) {
    let problem = null;
    try { problem = await res.json(); } catch (_) { /* not JSON */ }
    const err = new ApiError(res.status, problem);
    if (res.status === 401) authFailed(err.message);
    throw err;
  }
  return res.json();
}

// A 401 stops every poll, reconnect and refresh until a new token is entered: retrying a wrong
// token only fills the server's failed-login counter (and gets this address a 429).
let tokenSaved = null;
function authFailed(detail) {
  state.authFailed = true;
  state.me = null;
  setLive(false, "no access");
  renderWho();
  showAuth(token()
    ? "The token was refused (" + detail + "). The page stopped asking the API; enter a valid token."
    : "This page needs a token (read scope to view, operate to act). The page stopped asking the API until you enter one.");
}

function untilTokenSaved() {
  return new Promise((resolve) => { tokenSaved = resolve; });
}

function canOperate() { return !!(state.me && state.me.allows && state.me.allows.operate); }

async function loadMe() {
  // Which buttons to show depends on the token's scopes; the API still checks each action.
  try {
    state.me = await api("/api/v1/auth/whoami");
  } catch (e) {
    if (e.status === 404) {   // a server from before whoami: show the data, offer no actions
      state.me = { name: "token", scopes: [], allows: { read: true } };
    } else {
      if (e.status !== 401) toast("who am I failed: " + e.message + " (retrying every minute)");
      return false;
    }
  }
  renderWho();
  if (!state.me.allows.read) {
    state.authFailed = true;
    showAuth("This token (" + state.me.name + ": " + state.me.scopes.join(", ") + ") cannot read; enter a token with the read scope.");
    return false;
  }
  return true;
}

function renderWho() {
  const w = $("who");
  if (!state.me) { w.textContent = ""; w.className = "who hidden"; return; }
  w.className = "who" + (canOperate() ? "" : " ro");
  w.textContent = state.me.name + " · " + (canOperate() ? state.me.scopes.join(", ") : "read only");
  w.title = "token " + state.me.name + ", scopes: " + state.me.scopes.join(", ");
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
  // A link's two ends on two lines; a name is never broken across lines (see .nm in style.css).
  const here = a.device + (a.port ? ":" + a.port : "") + (a.lane !== null && a.lane !== undefined ? " lane " + a.lane : "");
  const there = a.peer_device ? "↔ " + a.peer_device + (a.peer_port ? ":" + a.peer_port : "") : null;
  return el("div", { class: "ent", title: here + (there ? " " + there : "") }, el("div", { class: "nm" }, here),
    there ? el("div", { class: "nm peer" }, there) : null);
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

const BAD_HEALTH = { down: 0, critical: 1, warning: 2 };   // link health worth a line on the map, worst first
const LABEL_LIMIT = 48;   // a tier with more devices labels its unhealthy ones and counts the rest
const BAD_LINKS_SHOWN = 6;

function tile(node, badLinks) {
  const n = badLinks.get(node.id) || 0;
  const sel = state.selected && state.selected.device === node.id;
  return el("div", {
    class: "tile h-" + node.health + (sel ? " sel" : ""),
    title: node.id + (node.rail !== null && node.rail !== undefined ? " · rail " + node.rail : "") + " — " + node.health +
      (n ? ", " + n + " bad link" + (n > 1 ? "s" : "") : "") +
      (node.reasons.length ? "\n" + node.reasons.join("\n") : ""),
    "data-device": node.id, "data-health": node.health, "data-bad-links": n || null,
    onclick: () => selectDevice(node.id),
  }, node.id, n ? el("span", { class: "bl" }, "✗" + n) : null);
}

function tier(label, nodes, badLinks) {
  if (!nodes.length) return null;
  let shown = [...nodes].sort((a, b) => numCmp(a.id, b.id)), rest = [];
  if (shown.length > LABEL_LIMIT) {
    rest = shown.filter((n) => (n.health === "ok" || n.health === "unknown") && !badLinks.get(n.id));
    shown = shown.filter((n) => !rest.includes(n));
  }
  const ok = rest.filter((n) => n.health === "ok").length, nodata = rest.length - ok;
  const more = [ok ? ok + " ok" : "", nodata ? nodata + " no data" : ""].filter(Boolean).join(" · ");
  return el("div", { class: "tier" }, el("span", { class: "lbl" }, label),
    el("div", { class: "tiles" }, shown.map((n) => tile(n, badLinks)),
      more ? el("span", { class: "more", title: "healthy devices are counted, not drawn, above " + LABEL_LIMIT + " per row" }, "+ " + more) : null));
}

function badLinkList(edges) {
  if (!edges.length) return null;
  const rows = edges.slice(0, BAD_LINKS_SHOWN).map((e) => el("div", {
    class: "blink", "data-link-id": e.id, "data-health": e.health, title: e.reasons.join("\n"),
    onclick: () => selectPort(e.source, e.source_port, e.target, e.target_port),
  },
  el("span", { class: "sev " + e.health }, e.health),
  el("span", { class: "nm" }, e.source + ":" + e.source_port), el("span", { class: "arrow" }, "↔"),
  el("span", { class: "nm" }, e.target + ":" + e.target_port),
  el("span", { class: "why" }, e.reasons.join("; "))));
  const extra = edges.length - rows.length;
  return el("div", { class: "blinks" }, el("div", { class: "lbl" }, "bad links"), rows,
    extra > 0 ? el("div", { class: "more" }, "+ " + extra + " more") : null);
}

function renderMap() {
  const topo = state.topo;
  const box = $("map");
  if (!topo) return;
  $("health-source").textContent = "· from " + topo.health_source;
  const nodes = new Map(topo.nodes.map((n) => [n.id, n]));
  const podOf = (id) => (nodes.get(id) || {}).pod || "";
  // Bad links: counted on both end devices, listed under the pod they sit in (a leaf's uplink under its pod).
  const badLinks = new Map(), badByPod = new Map();
  const bad = topo.edges.filter((e) => e.health in BAD_HEALTH)
    .sort((a, b) => BAD_HEALTH[a.health] - BAD_HEALTH[b.health] || a.id - b.id);
  for (const e of bad) {
    for (const d of [e.source, e.target]) badLinks.set(d, (badLinks.get(d) || 0) + 1);
    const pod = podOf(e.source) || podOf(e.target);
    if (!badByPod.has(pod)) badByPod.set(pod, []);
    badByPod.get(pod).push(e);
  }
  const byPod = new Map();
  for (const n of topo.nodes) {
    const key = n.pod || "";
    if (!byPod.has(key)) byPod.set(key, []);
    byPod.get(key).push(n);
  }
  const role = (ns, ...roles) => ns.filter((n) => roles.includes(n.role));
  const out = [];
  const shared = byPod.get("") || [];
  if (shared.length) {
    out.push(el("div", { class: "pod", "data-pod": "" },
      el("div", { class: "pod-h" }, "Shared fabric", badCount(badByPod.get(""),
        bad.filter((e) => !podOf(e.source) || !podOf(e.target)).length - (badByPod.get("") || []).length)),
      tier("core", role(shared, "core"), badLinks), tier("spine", role(shared, "spine"), badLinks),
      tier("other", shared.filter((n) => !["core", "spine"].includes(n.role)), badLinks),
      badLinkList(badByPod.get("") || [])));
  }
  for (const [pod, ns] of [...byPod.entries()].filter(([p]) => p !== "").sort((a, b) => numCmp(a[0], b[0]))) {
    const counts = {};
    for (const n of ns) counts[n.health] = (counts[n.health] || 0) + 1;
    const rails = new Map();
    for (const l of role(ns, "leaf")) {
      const r = l.rail === null || l.rail === undefined ? "—" : l.rail;
      if (!rails.has(r)) rails.set(r, []);
      rails.get(r).push(l);
    }
    // A row per rail while that stays short; a wide rail-optimized pod gets one row of leaves.
    const railRows = rails.size > 4 ? [tier("leaves " + role(ns, "leaf").length, role(ns, "leaf"), badLinks)]
      : [...rails.entries()].sort((a, b) => numCmp(a[0], b[0])).map(([r, ls]) => tier(r === "—" ? "leaf" : "rail " + r, ls, badLinks));
    const hosts = role(ns, "host");
    const stats = ["critical", "down", "warning", "info", "ok", "unknown"].filter((h) => counts[h])
      .map((h) => counts[h] + " " + (h === "unknown" ? "no data" : h)).join(" · ");
    out.push(el("div", { class: "pod", "data-pod": pod },
      el("div", { class: "pod-h" }, el("span", { class: "sev " + podHealth(counts) }, pod), el("span", { class: "stats" }, stats),
        badCount(badByPod.get(pod))),
      tier("spine", role(ns, "spine", "core"), badLinks), railRows,
      tier("hosts " + hosts.length, hosts, badLinks),
      tier("other", ns.filter((n) => !["spine", "core", "leaf", "host"].includes(n.role)), badLinks),
      badLinkList(badByPod.get(pod) || [])));
  }
  box.replaceChildren(...(out.length ? out : [el("div", { class: "empty" }, "no devices in the inventory")]));
}

function badCount(edges, elsewhere) {
  // `elsewhere`: bad links of these devices listed under a pod (a spine's downlink sits with its leaf's pod).
  const n = (edges || []).length;
  const text = n ? n + " bad link" + (n > 1 ? "s" : "") : elsewhere ? elsewhere + " bad downlink" + (elsewhere > 1 ? "s" : "") + ", listed under the pod" : "all links ok";
  return el("span", { class: "bad-count" + (n || elsewhere ? " on" : "") }, text);
}

function podHealth(counts) {
  for (const h of ["critical", "down", "warning", "info", "ok"]) if (counts[h]) return h;
  return "unknown";
}

// ------------------------------------------------------------------ collection gaps

const GAPS_SHOWN = 5;   // a compact strip above the map; the rest are counted

function renderGaps() {
  // Targets that are blind (degraded: answered but nothing stored, or an expected metric group missing) or
  // failing, with the reason in words: never an "ok" that hides a gap (/api/v1/targets, docs/api.md).
  const box = $("gaps");
  const bad = (state.targets || []).filter((t) => t.state === "degraded" || t.state === "failing")
    .sort((a, b) => (a.state === "failing") - (b.state === "failing") || numCmp(a.target, b.target));
  if (!bad.length) { box.replaceChildren(); box.classList.add("hidden"); return; }
  const n = (s) => bad.filter((t) => t.state === s).length;
  const rows = bad.slice(0, GAPS_SHOWN).map((t) => {
    const cov = t.coverage || {};
    const refused = Object.entries(cov.rejected || {}).map(([why, r]) => r.count + " " + why + " (e.g. " + r.examples.slice(0, 3).join(", ") + ")");
    const tip = [t.reason || ""].concat(refused.length ? ["refused: " + refused.join("; ")] : [],
      (cov.blocked_rules || []).slice(0, 6).map((b) => "rule " + b.rule + " blocked on " + b.ports + " port(s): " + b.reason)).join("\n");
    return el("div", { class: "gap", "data-target": t.target, "data-state": t.state, title: tip, onclick: () => selectDevice(t.device) },
      el("span", { class: "sev " + (t.state === "failing" ? "critical" : "warning") }, t.state),
      el("span", { class: "nm" }, t.target),
      (cov.missing || []).map((g) => el("span", { class: "grp" }, "no " + g)),
      refused.length ? el("span", { class: "grp" }, Object.values(cov.rejected).reduce((a, r) => a + r.count, 0) + " refused") : null,
      el("span", { class: "why" }, t.reason || ""));
  });
  const more = bad.length > GAPS_SHOWN ? [el("div", { class: "more" }, "+ " + (bad.length - GAPS_SHOWN) + " more (GET /api/v1/targets)")] : [];
  box.replaceChildren(el("div", { class: "lbl" }, "collection gaps · " + [n("degraded") ? n("degraded") + " degraded" : "",
    n("failing") ? n("failing") + " failing" : ""].filter(Boolean).join(" · ")), ...rows, ...more);
  box.classList.remove("hidden");
}

// ------------------------------------------------------------------ alerts

function evidence(a) {
  return (a.evidence || []).slice(0, 4).map((e) => el("span", { class: "ev", title: e.note || "" },
    e.feature + " ", el("b", {}, fmtNum(e.value, 3)), e.unit ? " " + e.unit : "",
    e.baseline !== null && e.baseline !== undefined ? " vs " + fmtNum(e.baseline, 3) : ""));
}

// One alert or drain per two-line row: names never wrap, long text ends in an ellipsis (its title holds all).
function line(cls, title, ...kids) { return el("div", { class: "line " + (cls || ""), title }, ...kids); }

function renderAlerts() {
  const body = $("alerts").tBodies[0];
  if (state.alerts === null) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "empty" }, "alerts API not available")));
    $("alerts-count").textContent = "";
    return;
  }
  const rank = { page: 0, ticket: 1, info: 2 };
  const items = [...state.alerts].sort((a, b) => (rank[a.severity] ?? 3) - (rank[b.severity] ?? 3)
    || (a.state === "firing" ? 0 : 1) - (b.state === "firing" ? 0 : 1) || b.opened_at_ms - a.opened_at_ms);
  $("alerts-count").textContent = String(items.length);
  if (!items.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "empty" }, "no active alerts")));
    return;
  }
  body.replaceChildren(...items.map((a) => el("tr", {
    class: "click alert-row", "data-alert-id": a.id,
    onclick: () => selectPort(a.device, a.port, a.peer_device, a.peer_port),
  },
  el("td", { class: "sevc" }, el("span", { class: "sev " + a.severity }, a.severity),
    el("div", { class: "state " + a.state }, a.state + (a.muted_by ? " · muted" : ""))),
  el("td", { class: "entc" }, entity(a)),
  el("td", { class: "fill" }, line("sum", a.summary, a.summary),
    line("", "condition " + a.kind + ", cause " + a.cause, el("span", { class: "kind" }, a.cause.replaceAll("_", " ")), evidence(a),
      a.ttt_hours !== null && a.ttt_hours !== undefined ? el("span", { class: "muted" }, " threshold in " + fmtNum(a.ttt_hours, 1) + " h") : null)),
  el("td", { class: "act" }, el("div", {}, a.action.replaceAll("_", " ")), el("div", { class: "mono muted" }, fmtTime(a.opened_at_ms))),
  el("td", { class: "btnc" }, canOperate() && a.state === "firing"
    ? el("button", { type: "button", onclick: (ev) => { ev.stopPropagation(); ack(a.id); } }, "ack") : null),
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

function alertState(d) {
  // `alert_state`: the state of the alert the drain came from (null: no alert); older servers omit it.
  if (!("alert_state" in d)) return el("span", { class: "muted", title: "this server does not report the alert's state" }, "—");
  if (d.alert_state === null) return el("span", { class: "muted", "data-alert-state": "" }, "no alert");
  return el("span", { class: "state " + d.alert_state, "data-alert-state": d.alert_state }, d.alert_state);
}

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
    const summary = (v.summary || "").replace(/^(safe|blocked|unsafe):\s*/i, "");
    return el("tr", { class: "click drain-row", "data-drain-id": d.id, onclick: () => selectPort(d.device, d.port, d.peer_device, d.peer_port) },
      el("td", { class: "mono" }, el("div", {}, d.id), el("div", { class: "muted" }, d.target_kind)),
      el("td", { class: "entc" }, entity(d)),
      el("td", { class: "act" }, el("div", {}, d.action.replaceAll("_", " ")), el("div", { class: "state " + d.status }, d.status.replaceAll("_", " "))),
      el("td", { class: "alertc" }, alertState(d)),
      el("td", { class: "fill" }, line("sum reason", d.reason, d.reason),
        line("", summary, el("span", { class: "verdict " + (v.safe ? "safe" : "unsafe") }, v.safe ? "SAFE" : "BLOCKED"), " ",
          [...(v.checks || [])].sort((a, b) => a.ok - b.ok)   // what blocks it first
            .map((c) => el("span", { class: "chk " + (c.ok ? "ok" : "bad"), title: c.message }, c.constraint.replaceAll("_", " "))),
          " ", el("span", { class: "muted" }, summary))),
      el("td", { class: "btnc" }, canOperate() && d.status === "pending"
        ? el("button", { type: "button", class: "primary", onclick: (ev) => { ev.stopPropagation(); approve(d.id); } }, "approve") : null),
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
    el("td", { class: "entc" }, entity({ device: l.source, port: l.source_port, peer_device: l.target, peer_port: l.target_port })),
    el("td", {}, el("span", { class: "sev " + l.health }, l.health)),
    el("td", { class: "mono when" }, l.rx_margin_db === null ? "—" : fmtNum(l.rx_margin_db, 1) + " dB"),
    el("td", { class: "fill" }, l.reasons.map((r) => line("muted", r, r))))));
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

// ------------------------------------------------------------------ KPI view: heatmap, recovery, NCCL

const kv = { loaded: false, anchor: null, heat: null, recovery: null, nccl: null, pick: null };
const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...kids) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    node.appendChild(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}

const iso = (ms) => new Date(ms).toISOString();

async function dataTime() {
  // KPIs are computed up to the newest telemetry, not the wall clock: a replayed or lagging
  // collector still shows its last hour. An optic's DOM time is the cheapest "newest sample" we have.
  try {
    const o = await api("/api/v1/optics?limit=1");
    const at = o.items.length && o.items[0].dom.at;
    if (at) return Date.parse(at);
  } catch (e) { if (e.status === 401) throw e; }
  return Date.now();
}

function fmtDur(s) {
  if (s === null || s === undefined) return "—";
  if (s < 60) return (Math.round(s * 10) / 10) + "s";
  if (s < 3600) { const m = Math.floor(s / 60), r = Math.round(s - m * 60); return m + "m" + (r ? " " + r + "s" : ""); }
  const h = Math.floor(s / 3600), m = Math.round((s - h * 3600) / 60);
  return h + "h " + String(m).padStart(2, "0") + "m";
}

function fmtRate(v) {
  if (v === null || v === undefined) return "—";
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return v.toFixed(v < 10 ? 1 : 0);
}

function fmtPct(v, digits) { return v === null || v === undefined ? "—" : (v * 100).toFixed(digits) + "%"; }

function fmtBytes(b) {
  const units = ["B", "K", "M", "G", "T"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return (Number.isInteger(b) ? b : b.toFixed(1)) + units[i];
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// Sequential ramp, dark (quiet) to red (hot); one scale for every heatmap so colours read the same.
const RAMP = [[0, [22, 38, 58]], [0.25, [24, 92, 122]], [0.5, [38, 158, 140]], [0.72, [214, 182, 58]],
  [0.86, [235, 120, 44]], [1, [226, 56, 62]]];

function rampColor(t) {
  t = Math.max(0, Math.min(1, t));
  let i = 1;
  while (i < RAMP.length - 1 && RAMP[i][0] < t) i++;
  const [t0, c0] = RAMP[i - 1], [t1, c1] = RAMP[i];
  const f = (t - t0) / (t1 - t0 || 1);
  const c = c0.map((x, k) => Math.round(x + (c1[k] - x) * f));
  return { css: "rgb(" + c.join(",") + ")", dark: 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] > 150 };
}

const HEAT_METRICS = [
  { key: "utilization_mean", family: "utilization", title: "Utilization", sub: "mean tx / capacity",
    fmt: (v) => fmtPct(v, 1), max: () => 1 },
  { key: "pfc_rx_pause_duty", family: "congestion", title: "PFC pause", sub: "rx paused time share",
    fmt: (v) => fmtPct(v, v !== null && v < 0.001 ? 3 : 2), max: (m) => niceMax(Math.max(m, 0.01)) },
  { key: "ecn_marked_per_s", family: "congestion", title: "ECN marks", sub: "marked pkts/s per port",
    fmt: (v) => fmtRate(v) + "/s", max: (m) => niceMax(m) },
  // Down time is what hurts: 100 % is quiet, 90 % or less is full red.
  { key: "availability", family: "availability", title: "Availability", sub: "port time oper up",
    fmt: (v) => fmtPct(v, v !== null && v > 0.999 && v < 1 ? 2 : 1), max: () => 0.9, scale: (v, lo) => (1 - v) / (1 - lo),
    legend: [1, 0.9] },
];

function mergeBuckets(report) {
  // The window may straddle two step buckets: fold them into one value per group, weighting
  // utilization by its interval count and the other KPIs by bucket.
  const out = new Map();
  const add = (g, k, v, w) => {
    if (v === null || v === undefined) return;
    if (!out.has(g)) out.set(g, {});
    const o = out.get(g);
    const a = o[k] || (o[k] = { s: 0, w: 0 });
    a.s += v * w; a.w += w;
  };
  for (const p of report.utilization) add(p.group, "utilization_mean", p.utilization_mean, p.intervals || 1);
  for (const p of report.congestion) for (const [k, v] of Object.entries(p)) if (k !== "group" && k !== "t") add(p.group, k, v, 1);
  for (const p of report.availability) add(p.group, "availability", p.availability, 1);
  const flat = new Map();
  for (const [g, o] of out) flat.set(g, Object.fromEntries(Object.entries(o).map(([k, a]) => [k, a.w ? a.s / a.w : null])));
  return flat;
}

function numCmp(a, b) { return String(a).localeCompare(String(b), undefined, { numeric: true }); }

async function loadHeat() {
  const win = Number($("heat-window").value);
  const end = kv.anchor, start = end - win * 1000;
  const q = "&start=" + encodeURIComponent(iso(start)) + "&end=" + encodeURIComponent(iso(end)) + "&step=" + win + "&top=1";
  const [leaf, rail, topo] = await Promise.all([api("/api/v1/kpis?scope=leaf" + q), api("/api/v1/kpis?scope=rail" + q),
    state.topo ? Promise.resolve(state.topo) : api("/api/v1/topology")]);
  kv.heat = { leaf: mergeBuckets(leaf), rail: mergeBuckets(rail), leaves: topo.nodes.filter((n) => n.role === "leaf"), start, end };
  renderHeat();
}

function renderHeat() {
  const h = kv.heat, box = $("heat");
  $("heat-range").textContent = "· " + fmtTime(h.start) + " → " + fmtTime(h.end) + " UTC (data time)";
  if (!h.leaves.length || !h.leaf.size) {
    box.replaceChildren(el("div", { class: "empty" }, h.leaves.length ? "no telemetry from leaf ports in this window" : "no leaves in the inventory"));
    return;
  }
  // Rows: each pod's leaves, the n-th leaf of a rail on the n-th row; columns: rails.
  const rails = [...new Set(h.leaves.map((l) => l.rail ?? "—"))].sort(numCmp);
  const rows = new Map();
  for (const l of [...h.leaves].sort((a, b) => numCmp(a.id, b.id))) {
    const pod = l.pod || "—", rail = l.rail ?? "—";
    let n = 0;
    while (rows.has(pod + "|" + n) && rows.get(pod + "|" + n).cells[rail]) n++;
    const key = pod + "|" + n;
    if (!rows.has(key)) rows.set(key, { pod, n, cells: {} });
    rows.get(key).cells[rail] = l.id;
  }
  const rowList = [...rows.values()].sort((a, b) => numCmp(a.pod, b.pod) || a.n - b.n);
  box.replaceChildren(...HEAT_METRICS.map((m) => {
    const vals = [...h.leaf.values(), ...h.rail.values()].map((o) => o[m.key]).filter((v) => v !== null && v !== undefined);
    const max = m.max(vals.length ? Math.max(...vals) : 0);
    const cell = (v, label, attrs) => {
      if (v === null || v === undefined) return el("td", Object.assign({ class: "cell none" }, attrs), "—", label ? el("span", { class: "lf" }, label) : null);
      const c = rampColor(m.scale ? m.scale(v, max) : v / max);
      const td = el("td", Object.assign({ class: "cell" + (c.dark ? " dark" : ""), "data-value": v }, attrs), m.fmt(v),
        label ? el("span", { class: "lf" }, label) : null);
      td.style.backgroundColor = c.css;   // CSSOM, not a style attribute: allowed by the page's CSP
      return td;
    };
    const body = rowList.map((r) => el("tr", {}, el("th", { class: "row" }, r.pod + (r.n ? " #" + (r.n + 1) : "")),
      rails.map((rl) => {
        const leaf = r.cells[rl];
        if (!leaf) return el("td", { class: "cell none" }, "");
        const o = h.leaf.get(leaf) || {};
        const td = cell(o[m.key], leaf.replace(/^leaf-/, ""), { "data-leaf": leaf, "data-rail": rl, "data-metric": m.key });
        td.title = leaf + " · rail " + rl + "\n" + m.title + " " + m.fmt(o[m.key] ?? null) +
          (o.pfc_rx_pause_frames_per_s !== undefined ? "\npause frames " + fmtRate(o.pfc_rx_pause_frames_per_s) + "/s" : "") +
          (o.cnp_sent_per_s !== undefined ? " · CNP " + fmtRate(o.cnp_sent_per_s) + "/s" : "") +
          (o.availability !== undefined && o.availability !== null ? "\navailability " + fmtPct(o.availability, 2) : "");
        return td;
      })));
    const total = el("tr", { class: "total" }, el("th", { class: "row" }, "rail"),
      rails.map((rl) => cell((h.rail.get(String(rl)) || {})[m.key], null, { "data-rail-total": rl, "data-metric": m.key })));
    const bar = el("span", { class: "bar" });
    bar.style.background = "linear-gradient(90deg, " + [0, 0.25, 0.5, 0.72, 0.86, 1].map((t) => rampColor(t).css).join(", ") + ")";
    return el("div", { class: "hm", "data-heatmap": m.key },
      el("h3", {}, m.title, " ", el("span", { class: "muted" }, m.sub)),
      el("table", { class: "hm-grid" },
        el("thead", {}, el("tr", {}, el("th", {}, ""), rails.map((rl) => el("th", {}, rl === "—" ? "no rail" : "rail " + rl)))),
        el("tbody", {}, body, total)),
      el("div", { class: "ramp", "data-legend": m.key }, el("span", {}, m.fmt(m.legend ? m.legend[0] : 0)), bar,
        el("span", {}, m.fmt(m.legend ? m.legend[1] : max))));
  }));
}

// ------------------------------------------------------------------ KPI view: recovery times

async function loadRecovery() {
  const end = kv.anchor, start = end - 30 * 86400 * 1000;
  kv.recovery = await api("/api/v1/kpis/recovery?start=" + encodeURIComponent(iso(start)) + "&end=" + encodeURIComponent(iso(end + 1000)));
  renderRecovery();
}

function renderRecovery() {
  const r = kv.recovery, target = r.mitigation_target_s;
  $("recovery-range").textContent = "· incidents opened in the 30 d to " + fmtTime(kv.anchor) + " · mitigation target " + fmtDur(target);
  const body = $("recovery").tBodies[0];
  const causes = Object.entries(r.by_cause);
  if (!causes.length) {
    body.replaceChildren(el("tr", {}, el("td", { colspan: 10, class: "empty" }, "no incidents in the last 30 days of data")));
    return;
  }
  const num = (v, extra) => el("td", Object.assign({ class: "num" }, extra || {}), fmtDur(v));
  const judged = (v) => v === null || v === undefined ? "" : v <= target ? "good" : "bad";
  const tbar = (st) => {
    // 0 .. 2x target (or the p90 if larger); the yellow tick is the target.
    const span = Math.max(2 * target, st.p90 || 0);
    const bar = el("div", { class: "tbar", title: "mitigate p50 " + fmtDur(st.p50) + ", p90 " + fmtDur(st.p90) + ", target " + fmtDur(target) });
    if (st.p90 !== null) { const b = el("span", { class: "p90" + (st.p90 > target ? " over" : "") }); b.style.width = (100 * st.p90 / span) + "%"; bar.append(b); }
    if (st.p50 !== null) { const b = el("span", { class: "p50" + (st.p50 > target ? " over" : "") }); b.style.width = (100 * st.p50 / span) + "%"; bar.append(b); }
    const t = el("span", { class: "tgt" }); t.style.left = (100 * target / span) + "%"; bar.append(t);
    return bar;
  };
  // Detect needs an onset recorded before the alert; the pipeline opens incidents with their alert, so
  // its incidents have none and the API answers null: "—" with the reason, never a false "0s".
  const unmeasured = "not measured: no fault onset before the alert was recorded for these incidents " +
    "(the detector opens an incident together with its alert and does not record an onset yet)";
  const detect = (v, g, extra) => el("td", Object.assign({ class: "num" + (v === null ? " nm-why" : ""),
    title: v === null ? unmeasured : "measured on " + g.detect.count + " of " + g.incidents + " incidents" }, extra || {}),
  v === null ? "—" : fmtDur(v));
  const row = (name, g, cls) => el("tr", { class: cls || "", "data-cause": name },
    el("td", { class: "ent" }, name.replaceAll("_", " ")), el("td", { class: "num" }, g.incidents),
    detect(g.detect.p50, g, { "data-detect-p50": g.detect.p50 }), detect(g.detect.p90, g),
    el("td", { class: "num " + judged(g.mitigate.p50), "data-mitigate-p50": g.mitigate.p50 }, fmtDur(g.mitigate.p50)),
    el("td", { class: "num " + judged(g.mitigate.p90), "data-mitigate-p90": g.mitigate.p90 }, fmtDur(g.mitigate.p90)),
    el("td", {}, tbar(g.mitigate)),
    el("td", { class: "num " + (g.mitigation_within_target === null ? "" : g.mitigation_within_target >= 0.9 ? "good" : "bad"),
      "data-within": g.mitigation_within_target }, g.mitigation_within_target === null ? "—" : fmtPct(g.mitigation_within_target, 0)),
    num(g.restore.p50, { "data-restore-p50": g.restore.p50 }), num(g.restore.p90));
  const pods = Object.entries(r.by_pod).map(([p, g]) => {
    const tr = row("pod " + p, g, "pod");
    tr.removeAttribute("data-cause");
    tr.setAttribute("data-pod", p);
    return tr;
  });
  body.replaceChildren(...causes.map(([c, g]) => row(c, g)), row("all causes", r.overall, "all"),
    ...(pods.length ? [el("tr", { class: "sect" }, el("td", { colspan: 10 }, "per pod")), ...pods] : []));
  const foot = $("recovery-panel").querySelector(".rec-foot") || $("recovery-panel").appendChild(el("div", { class: "rec-foot" }));
  const unknown = [r.overall, ...Object.values(r.by_cause)].some((g) => g.detect.p50 === null);
  foot.replaceChildren(el("div", {}, "detect: fault onset → first alert · mitigate: alert → drained · restore: drained → returned to service",
    el("i", { class: "p50" }), "p50", el("i", { class: "p90" }), "p90", el("i", { class: "tgt" }), "target"),
  ...(unknown ? [el("div", { class: "detect-note" }, "detect — : not measured. It needs a fault onset recorded before the alert " +
    "(evidence onset_ms, or an incident opened as suspect earlier); incidents the detector opens start with their alert, so they have none.")] : []));
}

// ------------------------------------------------------------------ KPI view: NCCL busbw

async function loadNccl() {
  const [runs, bases] = await Promise.all([api("/api/v1/nccl/runs?limit=500"), api("/api/v1/nccl/baselines")]);
  const groups = new Map();   // runs arrive newest first, so each group's first run is its latest
  for (const r of runs.items) {
    const k = r.test + " " + r.scope;
    if (!groups.has(k)) groups.set(k, { test: r.test, scope: r.scope, latest: r, count: 0 });
    groups.get(k).count++;
  }
  for (const b of bases.items) { const g = groups.get(b.test + " " + b.scope); if (g) g.baseline = b.run_id; }
  kv.nccl = { groups };
  const pick = $("nccl-pick");
  if (!kv.pick || !groups.has(kv.pick)) kv.pick = groups.size ? groups.keys().next().value : null;
  pick.replaceChildren(...[...groups.values()].map((g) => el("option", { value: g.test + " " + g.scope },
    g.test.replace(/_perf$/, "") + " · " + g.scope + " (" + g.count + " run" + (g.count > 1 ? "s" : "") + ")")));
  pick.value = kv.pick || "";
  pick.classList.toggle("hidden", !groups.size);
  await renderNccl();
}

async function renderNccl() {
  const chart = $("nccl-chart"), side = $("nccl-side");
  const g = kv.pick && kv.nccl.groups.get(kv.pick);
  if (!g) {
    $("nccl-sub").textContent = "";
    chart.replaceChildren(el("div", { class: "empty" }, "no NCCL runs yet — import nccl-tests output with `fabricwatch nccl import FILE` or POST /api/v1/nccl"));
    side.replaceChildren();
    return;
  }
  const latestId = g.latest.id, baseId = g.baseline ?? null;
  const [latest, base, cmp] = await Promise.all([api("/api/v1/nccl/runs/" + latestId),
    baseId !== null && baseId !== latestId ? api("/api/v1/nccl/runs/" + baseId) : Promise.resolve(null),
    api("/api/v1/nccl/runs/" + latestId + "/compare")]);
  $("nccl-sub").textContent = "· out-of-place busbw, " + (base ? "baseline run " + base.id + " vs latest run " + latest.id : "run " + latest.id);
  drawNccl(chart, latest, base, cmp);
  renderNcclSide(side, latest, base, cmp);
}

function drawNccl(box, latest, base, cmp) {
  const w = Math.max(box.clientWidth - 12, 360), h = Math.max(box.clientHeight - 10, 200);
  const L = 52, R = 14, T = 22, B = 34;
  const rows = (run) => run ? run.results.filter((r) => r.size_bytes > 0 && r.oop_busbw !== null) : [];
  const lr = rows(latest), br = rows(base);
  const all = lr.concat(br);
  if (!all.length) { box.replaceChildren(el("div", { class: "empty" }, "run " + latest.id + " has no results")); return; }
  const lx = all.map((r) => Math.log2(r.size_bytes));
  const x0 = Math.floor(Math.min(...lx)), x1 = Math.max(Math.ceil(Math.max(...lx)), x0 + 1);
  const yMax = niceMax(Math.max(...all.map((r) => r.oop_busbw)) * 1.05);
  const x = (s) => L + (Math.log2(s) - x0) / (x1 - x0) * (w - L - R);
  const y = (v) => T + (1 - v / yMax) * (h - T - B);
  const s = svg("svg", { viewBox: "0 0 " + w + " " + h, preserveAspectRatio: "none", role: "img", "data-chart": "nccl",
    "aria-label": "NCCL busbw against message size" });
  const grid = svg("g", { stroke: "#1f2a36", "stroke-width": 1 });
  for (let i = 0; i <= 5; i++) {
    const v = yMax * i / 5;
    grid.append(svg("line", { x1: L, x2: w - R, y1: y(v), y2: y(v) }));
    s.append(svg("text", { x: L - 6, y: y(v) + 3, "text-anchor": "end" }, v % 1 ? v.toFixed(1) : v));
  }
  const every = Math.max(1, Math.ceil((x1 - x0) / 10));   // about ten labelled powers of two
  for (let p = x0; p <= x1; p++) {
    const xv = x(Math.pow(2, p));
    if ((p - x0) % every === 0) {
      grid.append(svg("line", { x1: xv, x2: xv, y1: T, y2: h - B }));
      s.append(svg("text", { x: xv, y: h - B + 13, "text-anchor": "middle" }, fmtBytes(Math.pow(2, p))));
    }
  }
  s.prepend(grid);
  s.append(svg("text", { x: L + (w - L - R) / 2, y: h - 4, "text-anchor": "middle", class: "axis-title" }, "message size (log₂)"),
    svg("text", { x: 12, y: T + (h - T - B) / 2, "text-anchor": "middle", class: "axis-title",
      transform: "rotate(-90 12 " + (T + (h - T - B) / 2) + ")" }, "busbw GB/s"));
  const path = (pts) => pts.map((r, i) => (i ? "L" : "M") + x(r.size_bytes).toFixed(1) + " " + y(r.oop_busbw).toFixed(1)).join(" ");
  if (br.length) {
    // The tolerance band: below its lower edge a size counts as regressed.
    const tol = cmp.tolerance || 0.1;
    const upper = br.map((r) => x(r.size_bytes).toFixed(1) + " " + y(r.oop_busbw).toFixed(1));
    const lower = [...br].reverse().map((r) => x(r.size_bytes).toFixed(1) + " " + y(r.oop_busbw * (1 - tol)).toFixed(1));
    s.append(svg("path", { d: "M" + upper.join(" L") + " L" + lower.join(" L") + " Z", fill: "rgba(154,169,186,.16)", stroke: "none", class: "band" }));
    s.append(svg("path", { d: path(br), fill: "none", stroke: "#9aa9ba", "stroke-width": 1.5, "stroke-dasharray": "5 3", class: "line baseline", "data-run": base.id }));
  }
  s.append(svg("path", { d: path(lr), fill: "none", stroke: "#4aa3ff", "stroke-width": 2, class: "line latest", "data-run": latest.id }));
  const bad = new Map(cmp.sizes.filter((z) => z.regressed).map((z) => [z.size_bytes, z]));
  const pts = svg("g", {});
  for (const [run, rs, cls] of [[base, br, "baseline"], [latest, lr, "latest"]]) {
    if (!run) continue;
    for (const r of rs) {
      const reg = cls === "latest" && bad.get(r.size_bytes);
      pts.append(svg("circle", { cx: x(r.size_bytes), cy: y(r.oop_busbw), r: reg ? 3.6 : cls === "latest" ? 2.2 : 1.6,
        fill: reg ? "#ff4d4f" : cls === "latest" ? "#4aa3ff" : "#9aa9ba", class: "pt " + cls + (reg ? " regressed" : ""),
        "data-size": r.size_bytes, "data-busbw": r.oop_busbw },
      svg("title", {}, cls + " run " + run.id + ": " + fmtBytes(r.size_bytes) + " → " + r.oop_busbw + " GB/s" +
        (reg ? " (" + (reg.change * 100).toFixed(1) + "% vs baseline " + reg.baseline_busbw + ")" : ""))));
    }
  }
  s.append(pts);
  const key = svg("g", { transform: "translate(" + (L + 8) + "," + (T - 8) + ")" });
  const keys = base ? [["baseline #" + base.id, "#9aa9ba", "5 3"], ["latest #" + latest.id, "#4aa3ff", null]] : [["run #" + latest.id, "#4aa3ff", null]];
  keys.forEach(([label, color, dash], i) => {
    key.append(svg("line", { x1: i * 120, x2: i * 120 + 18, y1: 0, y2: 0, stroke: color, "stroke-width": 2, "stroke-dasharray": dash }),
      svg("text", { x: i * 120 + 23, y: 3 }, label));
  });
  if (bad.size) key.append(svg("circle", { cx: keys.length * 120 + 4, cy: 0, r: 3.6, fill: "#ff4d4f" }),
    svg("text", { x: keys.length * 120 + 12, y: 3 }, "regressed (> " + Math.round((cmp.tolerance || 0.1) * 100) + "% below)"));
  s.append(key);
  box.replaceChildren(s);
}

function renderNcclSide(side, latest, base, cmp) {
  const status = !base ? "na" : cmp.regressed ? "bad" : "ok";
  const word = { na: latest.wrong_total ? "WRONG VALUES" : "BASELINE ONLY", bad: "REGRESSED", ok: "WITHIN TOLERANCE" }[status];
  const worst = [...cmp.sizes].sort((a, b) => a.change - b.change).filter((z) => z.change < 0).slice(0, 6);
  const meta = (run, label) => run ? [el("span", { class: "k" }, label),
    el("span", { class: "mono" }, "#" + run.id + " · " + fmtTime(run.run_at) + " · NCCL " + (run.nccl_version || "?") +
      " · avg " + fmtNum(run.avg_busbw, 1) + " GB/s")] : [];
  side.replaceChildren(...[
    el("div", {}, el("span", { class: "verdict-badge " + (latest.wrong_total ? "bad" : status), "data-verdict": status }, word),
      " ", el("span", { class: "muted" }, latest.test + " · " + latest.scope + " · " + (latest.gpu_model || "GPU ?"))),
    cmp.reasons.map((r) => el("div", { class: "reason" }, r)),
    cmp.notes.map((n) => el("div", { class: "note" }, n)),
    el("div", { class: "runs" }, meta(base, "baseline"), meta(latest, base ? "latest" : "run"),
      el("span", { class: "k" }, "hosts"), el("span", { class: "mono" }, (latest.hosts || []).join(", ")),
      latest.job ? [el("span", { class: "k" }, "job"), el("span", { class: "mono" }, latest.job)] : []),
    worst.length ? el("table", {}, el("thead", {}, el("tr", {}, ["size", "baseline", "latest", "change"].map((k) => el("th", {}, k)))),
      el("tbody", {}, worst.map((z) => el("tr", { "data-size": z.size_bytes }, el("td", {}, fmtBytes(z.size_bytes)),
        el("td", {}, fmtNum(z.baseline_busbw, 1)), el("td", {}, fmtNum(z.busbw, 1)),
        el("td", { class: z.regressed ? "bad" : "" }, (z.change * 100).toFixed(1) + "%"))))) : null,
    el("div", { class: "note" }, "sizes with baseline busbw under 1 GB/s are not compared")].flat().filter(Boolean));
}

// ------------------------------------------------------------------ KPI view: loading and tabs

async function refreshKpis(which) {
  if (state.authFailed || !state.me) return;
  try {
    kv.anchor = await dataTime();
  } catch (e) { return; }   // 401: the token banner is up
  const parts = { heat: loadHeat, recovery: loadRecovery, nccl: loadNccl };
  await Promise.all((which || Object.keys(parts)).map((k) => parts[k]().catch((e) => {
    if (e.status === 401) return;
    const where = { heat: "heat", recovery: "recovery", nccl: "nccl-chart" }[k];
    const box = k === "recovery" ? $("recovery").tBodies[0] : $(where);
    const msg = e.status === 404 ? k + " API not available" : "loading " + k + " failed: " + e.message;
    box.replaceChildren(k === "recovery" ? el("tr", {}, el("td", { colspan: 10, class: "empty" }, msg)) : el("div", { class: "empty" }, msg));
  })));
  kv.loaded = true;
  document.body.setAttribute("data-kpis-loaded", "1");
}

function kpiActive() { return window.location.hash === "#kpis"; }

function showTab() {
  const k = kpiActive();
  $("ops-view").classList.toggle("hidden", k);
  $("kpi-view").classList.toggle("hidden", !k);
  $("tab-ops").classList.toggle("on", !k);
  $("tab-kpis").classList.toggle("on", k);
  if (k && !kv.loaded) refreshKpis();
  else if (k && kv.nccl) renderNccl().catch(() => {});   // the chart sizes itself to a now-visible box
}

// ------------------------------------------------------------------ loading

const loaders = {
  async summary() { state.summary = await api("/api/v1/summary"); renderKpis(); renderWorst(); },
  async topo() { state.topo = await api("/api/v1/topology"); renderMap(); },
  async targets() { state.targets = (await api("/api/v1/targets")).targets; renderGaps(); },
  async alerts() {
    try {
      const page = await api("/api/v1/alerts?state=firing&state=acknowledged&limit=500");
      state.alerts = page.items;
    } catch (e) { if (e.status === 404) state.alerts = null; else throw e; }
    renderAlerts();
  },
  async drains() {
    try {
      // waiting for a decision, approved, or an execution a person must settle (failed, or it never ended)
      state.drains = await api("/api/v1/drains?status=pending&status=blocked&status=approved"
        + "&status=execution_failed&status=execution_unknown&limit=200");
      const b = await api("/api/v1/drains/breaker").catch(() => null);
      $("breaker").textContent = b && b.tripped ? "· circuit breaker TRIPPED" : "";
    } catch (e) { if (e.status === 404) state.drains = null; else throw e; }
    renderDrains();
  },
};

async function refresh(which) {
  if (state.authFailed || !state.me) return;
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
const pending = new Set(), kpiPending = new Set();
function schedule(kind) {
  const map = { alert: ["alerts", "summary", "topo", "targets"], drain: ["drains", "summary"], incident: ["summary"],
    target: ["summary", "targets"] };
  for (const k of map[kind] || ["summary"]) pending.add(k);
  // Incidents move recovery times; an NCCL import shows up as an alert (regression) or nothing.
  const kmap = { incident: ["recovery"], alert: ["nccl"], drain: ["recovery"] };
  if (kpiActive() && kv.loaded) for (const k of kmap[kind] || []) kpiPending.add(k);
  clearTimeout(schedule.timer);
  schedule.timer = setTimeout(() => {
    const w = [...pending], kw = [...kpiPending];
    pending.clear(); kpiPending.clear();
    refresh(w);
    if (kw.length) refreshKpis(kw);
  }, 400);
}

function setLive(on, text) {
  const l = $("live");
  l.className = "live " + (on ? "on" : "off");
  l.textContent = text;
}

async function stream() {
  let delay = 1000;
  for (;;) {
    if (state.authFailed) { await untilTokenSaved(); delay = 1000; continue; }
    try {
      const h = headers({ Accept: "text/event-stream" });
      if (state.lastEventId) h["Last-Event-ID"] = state.lastEventId;
      const res = await fetch("/api/v1/events", { headers: h });
      if (res.status === 401) { authFailed("HTTP 401"); continue; }
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
    if (state.authFailed) continue;
    setLive(false, "reconnecting");
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 30000);
    refresh();   // we may have missed events older than the server's replay buffer
  }
}

function tick() { $("clock").textContent = new Date().toISOString().slice(11, 19) + " UTC"; }

let streaming = false;

async function start() {
  // Who am I first: a refused token stops here, before any other request repeats the 401.
  if (!(await loadMe())) return;
  await refresh();
  if (kpiActive()) refreshKpis();
  if (!streaming) { streaming = true; stream(); }
}

document.addEventListener("DOMContentLoaded", () => {
  token();
  $("auth-save").addEventListener("click", () => {
    const v = $("auth-token").value.trim();
    if (!v) return;
    localStorage.setItem(TOKEN_KEY, v);
    $("auth").classList.add("hidden");
    state.authFailed = false;
    kv.loaded = false;
    if (tokenSaved) { tokenSaved(); tokenSaved = null; }
    start();
  });
  $("heat-window").addEventListener("change", () => refreshKpis(["heat"]));
  $("nccl-pick").addEventListener("change", (ev) => { kv.pick = ev.target.value; renderNccl().catch((e) => toast("NCCL: " + e.message)); });
  window.addEventListener("hashchange", showTab);
  let resized = null;
  window.addEventListener("resize", () => {
    clearTimeout(resized);
    resized = setTimeout(() => { if (kpiActive() && kv.nccl) renderNccl().catch(() => {}); }, 200);
  });
  tick();
  setInterval(tick, 1000);
  showTab();
  start();
  setInterval(() => {   // a safety net under the event stream
    if (!state.me) { if (!state.authFailed) start(); return; }
    refresh();
    if (kpiActive()) refreshKpis();
  }, 60000);
});
