// stallwatch dashboard: a dependency-free single-page UI over /api/v1.
// Views by URL hash: #/now, #/incidents, #/incident/<id>, #/traces?..., #/trace/<id>,
// #/logs?..., #/metrics?... (readback.js; the trace view is traceview.js),
// #/span/<trace>/<span>, #/runner/<id>, #/breakers (readback.js), #/webhooks. Live updates come from one
// EventSource on /api/v1/events?board=1 (incidents by id, and the runner board), never polling.
"use strict";

const state = {
  board: [],            // runners, from the last board event or fetch
  incidents: [],        // newest first, as loaded or streamed
  lastIncidentId: 0,
  openSpans: [],        // the open-span page shown (one page of GET /api/v1/open-spans)
  es: null,
  render: null,         // re-render hook of the current view for live data
};

// ---------- tiny DOM helpers (no innerHTML with data; CSP forbids inline styles) ----------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style") Object.assign(el.style, v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children) el.append(c);
  return el;
}
const view = () => document.getElementById("view");
function mount(...nodes) { const v = view(); v.replaceChildren(...nodes); }
function badge(text, cls) { return h("span", { class: `badge b-${cls || text}` }, text); }

// ---------- formatting ----------
function nsToMs(ns) { if (ns === null || ns === undefined) return null; try { return Number(BigInt(ns) / 1000000n); } catch { return null; } }
function fmtTime(ns) {
  const ms = nsToMs(ns);
  if (!ms) return "—";
  const d = new Date(ms);
  return d.toLocaleString(undefined, { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}
function fmtDur(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1) return `${(ms * 1000).toFixed(0)} µs`;
  if (ms < 1000) return `${ms.toFixed(ms < 10 ? 2 : 0)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
  return `${Math.floor(ms / 60000)} m ${Math.round((ms % 60000) / 1000)} s`;
}
function anyValue(v) {
  if (!v) return "";
  if ("stringValue" in v) return v.stringValue;
  if ("intValue" in v) return v.intValue;
  if ("doubleValue" in v) return String(v.doubleValue);
  if ("boolValue" in v) return String(v.boolValue);
  if ("bytesValue" in v) return `base64:${v.bytesValue}`;
  if ("arrayValue" in v) return "[" + (v.arrayValue.values || []).map(anyValue).join(", ") + "]";
  if ("kvlistValue" in v) return "{" + (v.kvlistValue.values || []).map(kv => `${kv.key}: ${anyValue(kv.value)}`).join(", ") + "}";
  return "";
}
function attrTable(attrs) {
  if (!attrs || !attrs.length) return h("div", { class: "empty" }, "none");
  return h("dl", { class: "kv" }, attrs.map(a => [h("dt", {}, a.key), h("dd", { class: "mono" }, anyValue(a.value))]));
}
function progressBar(ratio) {
  const r = Math.max(0, ratio || 0);
  const cls = r >= 1 ? "progress over" : r >= 0.75 ? "progress warn" : "progress";
  return h("div", { class: cls, title: `${Math.round(r * 100)}% of SLA` }, h("span", { style: { width: `${Math.min(100, r * 100)}%` } }));
}

// ---------- API ----------
async function api(path) {
  const r = await fetch(path, { headers: { accept: "application/json" } });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error ? `${body.error.code}: ${body.error.message}` : `HTTP ${r.status}`);
  return body;
}
function errorBox(e) { return h("div", { class: "error-box" }, String(e.message || e)); }

// ---------- live: one EventSource ----------
const EVENTS = ["verdict.suspect", "breaker.opened", "breaker.half_open", "breaker.closed", "runner.started",
  "runner.exited", "runner.crashed", "runner.terminated", "runner.restarted", "runner.orphaned",
  "checkpoint.committed", "checkpoint.rolled_back", "storage.full", "sidecar.degraded"];
function connectLive() {
  const live = document.getElementById("live");
  const url = `/api/v1/events?board=1&last_event_id=${state.lastIncidentId}`;
  const es = new EventSource(url);
  state.es = es;
  es.onopen = () => { live.textContent = "live"; live.className = "live on"; };
  es.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
  for (const name of EVENTS) {
    es.addEventListener(name, ev => {
      let inc; try { inc = JSON.parse(ev.data); } catch { return; }
      if (inc.id && state.incidents.some(i => i.id === inc.id)) return;
      inc._fresh = true;
      state.incidents.unshift(inc);
      if (inc.id > state.lastIncidentId) state.lastIncidentId = inc.id;
      if (state.render) state.render("incident", inc);
    });
  }
  es.addEventListener("board", ev => {
    try { state.board = JSON.parse(ev.data).items || []; } catch { return; }
    if (state.render) state.render("board");
  });
}
// Leaving the page closes the stream. A page kept in Chromium's back/forward cache keeps its
// EventSource's connection open (and its slot in the browser's 6 HTTP/1.1 connections per
// host), so six pages left that way made the next page load wait ~1 min for a connection
// (issue 13's trace-view bench). Coming back from that cache reconnects, resuming after the
// newest incident seen (replayed by the server).
window.addEventListener("pagehide", () => {
  if (state.es) { state.es.close(); state.es = null; }
});
window.addEventListener("pageshow", ev => {
  if (ev.persisted && !state.es) connectLive();
});

// ---------- Now ----------
function sparkline(samples) {
  if (!samples || samples.length < 2) return h("div", { class: "muted" }, "no heartbeat samples yet");
  const w = 280, hgt = 36;
  const xs = samples.map(s => s.at_unix_ms), ys = samples.map(s => s.rtt_us);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), ymax = Math.max(...ys, 1);
  const pts = samples.map(s => `${((s.at_unix_ms - x0) / Math.max(1, x1 - x0) * w).toFixed(1)},${(hgt - 2 - s.rtt_us / ymax * (hgt - 4)).toFixed(1)}`).join(" ");
  const last = ys[ys.length - 1];
  return h("div", {}, svg("svg", { class: "spark", viewBox: `0 0 ${w} ${hgt}`, preserveAspectRatio: "none" }, svg("polyline", { points: pts })),
    h("div", { class: "muted" }, `heartbeat RTT: last ${(last / 1000).toFixed(2)} ms, max ${(ymax / 1000).toFixed(2)} ms`));
}
// lifecycle (docs/design.md, Runner lifecycle) → badge class
const LIFECYCLE_CLASS = { starting: "warn", running: "ok", stopping: "warn", exited: "unset", restarting: "warn", gave_up: "bad", detached: "warn" };
function runnerCard(r) {
  const w = r.worst_span;
  const lc = r.lifecycle || "running";
  const alive = ["starting", "running", "stopping", "detached"].includes(lc);
  return h("div", { class: "panel card runner", dataset: { runnerId: r.id, lifecycle: lc } },
    h("h3", {}, h("a", { href: `#/runner/${r.id}` }, r.id), h("span", { class: `badge lifecycle b-${LIFECYCLE_CLASS[lc] || "unset"}` }, lc.replace("_", " ")),
      badge(r.breaker), alive ? badge(r.verdict, r.verdict === "healthy" ? "ok" : "warn") : null),
    h("dl", { class: "kv" },
      h("dt", {}, alive ? "pid" : "last pid"), h("dd", {}, r.pid ?? "—", r.spawned ? " (spawned)" : " (attached)"),
      h("dt", {}, "heartbeat"), h("dd", {}, alive ? r.heartbeat : "— (not running)"),
      r.reason ? [h("dt", {}, "reason"), h("dd", {}, r.reason)] : null,
      r.retry_after_ms ? [h("dt", {}, "retry after"), h("dd", {}, fmtDur(r.retry_after_ms))] : null),
    sparkline(r.heartbeat_rtt_us),
    w ? h("div", {},
      h("div", {}, "worst open tool span: ", h("a", { href: `#/span/${w.trace_id}/${w.span_id}` }, w.tool_name),
        w.stale ? [" ", badge("stale", "warn")] : null, h("span", { class: "muted" }, ` ${fmtDur(w.elapsed_ms)} of ${fmtDur(w.sla_ms)}`)),
      progressBar(w.progress)) : h("div", { class: "muted" }, alive ? "no open tool span" : "not running"));
}
function openSpansTable(items) {
  if (!items.length) return h("div", { class: "empty" }, "no open spans");
  return h("table", {}, h("thead", {}, h("tr", {}, ["span", "tool", "runner", "service", "state", "elapsed", "SLA", "progress"].map(t => h("th", {}, t)))),
    h("tbody", {}, items.map(o => h("tr", { class: "clickable open-span", dataset: { spanId: o.span_id }, onclick: () => { location.hash = `#/span/${o.trace_id}/${o.span_id}`; } },
      h("td", {}, o.name), h("td", {}, o.tool_name || "—"), h("td", {}, o.runner_id ? h("a", { href: `#/runner/${o.runner_id}` }, o.runner_id) : "—"),
      h("td", {}, o.service_name), h("td", {}, badge(o.state === "open" ? "running" : "inferred", o.state === "open" ? "running" : "inferred")),
      h("td", {}, fmtDur(o.elapsed_ms)), h("td", {}, o.sla_ms ? fmtDur(o.sla_ms) : "—"), h("td", {}, o.progress !== null ? progressBar(o.progress) : "—")))));
}
// Open spans a page at a time (GET /api/v1/open-spans: oldest first, OPEN_SPANS_PAGE per
// page, next_cursor for more), never the whole ledger: a flood of never-ending spans made one
// unpaged read tens of MB. `load()` reads the page shown again (live refresh); the pager walks
// pages like the trace search's.
const OPEN_SPANS_PAGE = 100;
// For reads that can overlap (a live refresh and a click): take a ticket before the read
// and draw only while it is still the newest, so an older answer that arrives last never
// draws over a newer one (a page turned by Next came back to page 1).
function newestRead() {
  let n = 0;
  return () => { const mine = ++n; return () => mine === n; };
}
function openSpansPanel(box, runnerId) {
  const table = h("div", {}), pager = h("div", { class: "pager" });
  box.replaceChildren(table, pager);
  const pages = [null];
  const ticket = newestRead();
  const load = async () => {
    const current = ticket();
    const q = new URLSearchParams({ limit: String(OPEN_SPANS_PAGE) });
    if (runnerId) q.set("runner_id", runnerId);
    const cursor = pages[pages.length - 1];
    if (cursor) q.set("cursor", cursor);
    try {
      const page = await api(`/api/v1/open-spans?${q}`);
      if (!current()) return;
      state.openSpans = page.items;
      table.replaceChildren(openSpansTable(page.items));
      pager.replaceChildren(
        pages.length > 1 ? h("button", { class: "secondary", onclick: () => { pages.pop(); load(); } }, "Previous") : "",
        page.next_cursor ? h("span", { class: "muted" }, `oldest first, ${OPEN_SPANS_PAGE} a page; more are open `) : "",
        page.next_cursor ? h("button", { class: "secondary", onclick: () => { pages.push(page.next_cursor); load(); } }, "Next") : "");
    } catch (e) { if (current()) table.replaceChildren(errorBox(e)); }
  };
  return { load };
}
async function viewNow() {
  const runnersBox = h("div", { class: "cards" });
  const openBox = h("div", { class: "panel" });
  const incBox = h("div", { class: "panel timeline" });
  mount(h("h2", {}, "Runners"), runnersBox, h("h2", {}, "Open spans"), openBox, h("h2", {}, "Latest incidents"), incBox);
  const drawRunners = () => runnersBox.replaceChildren(...(state.board.length ? state.board.map(runnerCard) : [h("div", { class: "empty" }, "no runners registered")]));
  const drawInc = () => incBox.replaceChildren(...(state.incidents.length ? state.incidents.slice(0, 10).map(incidentRow) : [h("div", { class: "empty" }, "no incidents")]));
  const open = openSpansPanel(openBox, null);
  let pending = null;
  const refreshOpen = () => {
    if (pending) return;
    pending = setTimeout(() => { pending = null; open.load(); }, 300);
  };
  state.render = (what) => { if (what === "board") { drawRunners(); refreshOpen(); } else { drawInc(); refreshOpen(); } };
  try {
    const [runners] = await Promise.all([api("/api/v1/runners"), open.load()]);
    state.board = runners.items;
  } catch (e) { runnersBox.replaceChildren(errorBox(e)); }
  drawRunners(); drawInc();
}

// ---------- Incidents ----------
function fmtMs(ms) {
  if (!ms) return "—";
  const d = new Date(ms);
  return d.toLocaleString(undefined, { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}
// Termination evidence (the reaper's report: SIGTERM at, exited at, SIGKILL at, rollbacks), or
// any evidence keys naming those steps.
function evidenceSteps(ev) {
  if (!ev || typeof ev !== "object") return null;
  const items = [];
  const rep = ev.report && typeof ev.report === "object" ? ev.report : null;
  if (rep && rep.sigterm_unix_nano) {
    const t0 = nsToMs(String(BigInt(Math.round(Number(rep.sigterm_unix_nano)))));
    const step = name => (rep.steps || []).find(s => s.step === name);
    const exited = step("exited") || step("reaped");
    items.push(["SIGTERM at", fmtMs(t0)]);
    items.push(["exited at", exited ? fmtMs(t0 + exited.at_ms) : "—"]);
    items.push(["SIGKILL at", rep.sigkill_unix_nano ? fmtMs(nsToMs(String(BigInt(Math.round(Number(rep.sigkill_unix_nano)))))) : "—"]);
    if (rep.ended_by) items.push(["ended by", rep.ended_by]);
    if (rep.survivors && rep.survivors.length) items.push(["survivors", String(rep.survivors.length)]);
  } else {
    const rank = k => ["sigterm", "exited", "sigkill"].findIndex(w => k.toLowerCase().includes(w));
    for (const k of Object.keys(ev).filter(k => rank(k) >= 0).sort((a, b) => rank(a) - rank(b))) {
      const v = ev[k];
      items.push([k.replace(/_unix_nano$/, "").replace(/_at$/, "").replace(/_/g, " ") + " at", v === null ? "—" : (/unix_nano$/.test(k) ? fmtTime(v) : String(v))]);
    }
  }
  const rolled = ev.checkpoints_rolled_back ?? ev.rolled_back;
  if (rolled !== undefined && rolled !== null) items.push(["rolled back", Array.isArray(rolled) ? `${rolled.length} checkpoint(s)` : String(rolled)]);
  if (ev.spans_closed !== undefined) items.push(["spans closed", String(ev.spans_closed)]);
  if (!items.length) return null;
  return h("div", { class: "steps" }, items.map(([k, v]) => h("span", {}, h("b", {}, k), v)));
}
function incidentLinks(i) {
  return h("div", { class: "links" },
    h("a", { href: `#/incident/${i.id}` }, `#${i.id}`),
    i.runner_id ? h("a", { href: `#/runner/${i.runner_id}` }, `runner ${i.runner_id}`) : null,
    i.trace_id ? h("a", { href: `#/trace/${i.trace_id}` }, "trace") : null,
    i.trace_id && i.span_id ? h("a", { href: `#/span/${i.trace_id}/${i.span_id}` }, `span${i.tool_name ? " " + i.tool_name : ""}`) : null);
}
function eventClass(e) {
  if (/opened|crashed|terminated|orphaned|full|rolled_back/.test(e)) return "bad";
  if (/suspect|half_open|restarted|exited/.test(e)) return "warn";
  return "ok";
}
function incidentRow(i) {
  const el = h("div", { class: "incident" + (i._fresh ? " fresh" : ""), dataset: { incidentId: i.id, event: i.event } },
    h("div", { class: "mono" }, fmtTime(i.at_unix_nano)),
    h("div", {}, badge(i.event, eventClass(i.event))),
    h("div", {}, h("div", {}, i.reason), evidenceSteps(i.evidence), incidentLinks(i)));
  i._fresh = false;
  return el;
}
async function viewIncidents(params) {
  const runner = params.get("runner_id") || "", event = params.get("event") || "";
  const list = h("div", { class: "panel timeline" });
  const pager = h("div", { class: "pager" });
  const runnerIn = h("input", { value: runner, placeholder: "runner id" });
  const eventSel = h("select", {}, h("option", { value: "" }, "any event"), EVENTS.map(e => h("option", { value: e, selected: e === event }, e)));
  const apply = (ev) => { ev.preventDefault(); const q = new URLSearchParams(); if (runnerIn.value) q.set("runner_id", runnerIn.value); if (eventSel.value) q.set("event", eventSel.value); location.hash = `#/incidents?${q}`; };
  mount(h("h2", {}, "Incidents"), h("form", { class: "filters", onsubmit: apply },
    h("label", {}, "runner", runnerIn), h("label", {}, "event", eventSel), h("button", { type: "submit" }, "Filter")), list, pager);
  let items = [];
  const draw = () => list.replaceChildren(...(items.length ? items.map(incidentRow) : [h("div", { class: "empty" }, "no incidents")]));
  const load = async (cursor) => {
    const q = new URLSearchParams({ limit: "100" });
    if (runner) q.set("runner_id", runner); if (event) q.set("event", event); if (cursor) q.set("cursor", cursor);
    try {
      const page = await api(`/api/v1/incidents?${q}`);
      items = items.concat(page.items);
      draw();
      pager.replaceChildren(page.next_cursor ? h("button", { class: "secondary", onclick: () => load(page.next_cursor) }, "Older") : "");
    } catch (e) { list.replaceChildren(errorBox(e)); }
  };
  state.render = (what, inc) => {
    if (what !== "incident") return;
    if ((runner && inc.runner_id !== runner) || (event && inc.event !== event)) return;
    if (items.some(i => i.id === inc.id)) return;
    items.unshift({ ...inc, _fresh: true }); draw();
  };
  await load(null);
}
async function viewIncident(id) {
  mount(h("div", { class: "empty" }, "loading…"));
  try {
    const [i, d] = await Promise.all([api(`/api/v1/incidents/${encodeURIComponent(id)}`), api(`/api/v1/webhooks/deliveries?incident_id=${encodeURIComponent(id)}`)]);
    mount(h("h2", {}, `Incident #${i.id} `, badge(i.event, eventClass(i.event))),
      h("div", { class: "panel" }, h("dl", { class: "kv" },
        h("dt", {}, "at"), h("dd", {}, fmtTime(i.at_unix_nano)),
        h("dt", {}, "reason"), h("dd", {}, i.reason),
        h("dt", {}, "runner"), h("dd", {}, i.runner_id ? h("a", { href: `#/runner/${i.runner_id}` }, i.runner_id) : "—"),
        h("dt", {}, "tool"), h("dd", {}, i.tool_name || "—"),
        h("dt", {}, "trace"), h("dd", {}, i.trace_id ? h("a", { class: "mono", href: `#/trace/${i.trace_id}` }, i.trace_id) : "—"),
        h("dt", {}, "span"), h("dd", {}, i.span_id ? h("a", { class: "mono", href: `#/span/${i.trace_id}/${i.span_id}` }, i.span_id) : "—")),
        evidenceSteps(i.evidence), typeof forensicsPanel === "function" ? forensicsPanel(i.evidence) : null, h("h2", {}, "Evidence"), h("pre", {}, JSON.stringify(i.evidence, null, 2))),
      h("h2", {}, "Webhook deliveries"), h("div", { class: "panel" }, deliveriesTable(d.items)));
  } catch (e) { mount(errorBox(e)); }
}

// ---------- Traces search ----------
const SEARCH_FIELDS = ["service", "span_name", "tool_name", "status", "min_duration_ms", "attr", "start", "end", "limit"];
function toNs(local) { if (!local) return null; const ms = new Date(local).getTime(); return isNaN(ms) ? null : (BigInt(ms) * 1000000n).toString(); }
async function viewTraces(params) {
  const inputs = {};
  const field = (name, label, el) => { inputs[name] = el; if (params.get(name)) el.value = params.get(name); return h("label", {}, label, el); };
  const services = h("datalist", { id: "dl-services" }), names = h("datalist", { id: "dl-names" });
  const form = h("form", { class: "search panel", onsubmit: (ev) => { ev.preventDefault(); const q = new URLSearchParams(); for (const f of SEARCH_FIELDS) if (inputs[f].value) q.set(f, inputs[f].value); location.hash = `#/traces?${q}`; } },
    field("service", "service", h("input", { list: "dl-services", name: "service" })),
    field("span_name", "span name", h("input", { list: "dl-names", name: "span_name" })),
    field("tool_name", "tool name", h("input", { name: "tool_name" })),
    field("status", "status", h("select", { name: "status" }, ["", "unset", "ok", "error"].map(s => h("option", { value: s }, s || "any")))),
    field("min_duration_ms", "min duration (ms)", h("input", { name: "min_duration_ms", type: "number", min: "0", step: "any" })),
    field("attr", "attribute key=value", h("input", { name: "attr", placeholder: "error.type=timeout" })),
    field("start", "from", h("input", { name: "start", type: "datetime-local", step: "1" })),
    field("end", "to", h("input", { name: "end", type: "datetime-local", step: "1" })),
    field("limit", "page size", h("input", { name: "limit", type: "number", min: "1", max: "1000", placeholder: "50" })),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Search"), h("button", { type: "button", class: "secondary", onclick: () => { location.hash = "#/traces"; } }, "Clear")),
    services, names);
  const results = h("div", { class: "panel" }, h("div", { class: "empty" }, "searching…"));
  const pager = h("div", { class: "pager" });
  mount(h("h2", {}, "Traces"), form, importPanel(() => load(null)), results, pager);
  state.render = null;
  api("/api/v1/services").then(r => services.replaceChildren(...r.items.map(s => h("option", { value: s })))).catch(() => {});
  api("/api/v1/span-names").then(r => names.replaceChildren(...r.items.map(s => h("option", { value: s })))).catch(() => {});
  const q = new URLSearchParams();
  for (const f of ["service", "span_name", "tool_name", "status", "min_duration_ms", "attr", "limit"]) if (params.get(f)) q.set(f, params.get(f));
  const s = toNs(params.get("start")), e = toNs(params.get("end"));
  if (s) q.set("start_unix_nano", s); if (e) q.set("end_unix_nano", e);
  const pages = [null];
  const load = async (cursor) => {
    const qq = new URLSearchParams(q); if (cursor) qq.set("cursor", cursor);
    try {
      const page = await api(`/api/v1/traces?${qq}`);
      results.replaceChildren(page.items.length ? h("table", { id: "trace-list" },
        h("thead", {}, h("tr", {}, ["trace", "root service", "root span", "start", "duration", "spans", "errors", "open"].map(t => h("th", {}, t)))),
        h("tbody", {}, page.items.map(t => h("tr", { class: "clickable trace-row", dataset: { traceId: t.trace_id }, onclick: () => { location.hash = `#/trace/${t.trace_id}`; } },
          h("td", { class: "mono" }, h("a", { href: `#/trace/${t.trace_id}` }, t.trace_id.slice(0, 16) + "…")), h("td", {}, t.root_service), h("td", {}, t.root_name),
          h("td", {}, fmtTime(t.start_time_unix_nano)), h("td", {}, t.open_count > 0 && t.duration_ms === null ? badge("running") : fmtDur(t.duration_ms)),
          h("td", {}, t.span_count), h("td", {}, t.error_count ? badge(String(t.error_count), "bad") : "0"),
          h("td", {}, t.open_count ? badge(String(t.open_count), "running") : "0"))))) : h("div", { class: "empty" }, "no traces match"));
      pager.replaceChildren(
        pages.length > 1 ? h("button", { class: "secondary", onclick: () => { pages.pop(); load(pages[pages.length - 1]); } }, "Previous") : "",
        page.next_cursor ? h("button", { class: "secondary", onclick: () => { pages.push(page.next_cursor); load(page.next_cursor); } }, "Next") : "");
    } catch (err) { results.replaceChildren(errorBox(err)); }
  };
  await load(null);
}

// ---------- Trace view: traceview.js (virtualised, issue 13) ----------

// ---------- Runner ----------
async function viewRunner(id) {
  const card = h("div", {}), incBox = h("div", { class: "panel timeline" }), openBox = h("div", { class: "panel" });
  mount(h("h2", {}, `Runner ${id}`), card, h("h2", {}, "Open spans"), openBox, h("h2", {}, "Incidents"), incBox);
  let incs = [];
  const drawCard = () => { const r = state.board.find(r => r.id === id); card.replaceChildren(r ? runnerCard(r) : h("div", { class: "empty" }, "not registered (no status from the watchdog)")); };
  const drawInc = () => incBox.replaceChildren(...(incs.length ? incs.map(incidentRow) : [h("div", { class: "empty" }, "no incidents")]));
  state.render = async (what, inc) => {
    if (what === "board") drawCard();
    if (what === "incident" && inc.runner_id === id && !incs.some(i => i.id === inc.id)) { incs.unshift({ ...inc, _fresh: true }); drawInc(); }
  };
  try {
    const [runners, i] = await Promise.all([api("/api/v1/runners"), api(`/api/v1/incidents?runner_id=${encodeURIComponent(id)}&limit=200`), openSpansPanel(openBox, id).load()]);
    state.board = runners.items; incs = i.items;
  } catch (e) { incBox.replaceChildren(errorBox(e)); }
  drawCard(); drawInc();
}

// ---------- Webhooks ----------
function deliveriesTable(items) {
  if (!items.length) return h("div", { class: "empty" }, "no deliveries");
  return h("table", {}, h("thead", {}, h("tr", {}, ["#", "incident", "event", "webhook", "state", "attempts"].map(t => h("th", {}, t)))),
    h("tbody", {}, items.map(d => h("tr", {},
      h("td", {}, d.id), h("td", {}, h("a", { href: `#/incident/${d.incident_id}` }, `#${d.incident_id}`)), h("td", {}, d.event),
      h("td", { class: "mono" }, d.webhook), h("td", {}, badge(d.state, d.state === "delivered" ? "ok" : d.state === "failed" ? "bad" : "warn"),
        d.state === "pending" ? h("div", { class: "muted" }, `next ${fmtTime(d.next_attempt_unix_nano)}`) : null),
      h("td", {}, d.attempt_log.map(a => h("div", { class: "mono" }, `${fmtTime(a.at_unix_nano)} → ${a.status ?? "—"} ${a.error || ""} (${a.duration_ms} ms)`)))))));
}
async function viewWebhooks() {
  const box = h("div", { class: "panel" }, h("div", { class: "empty" }, "loading…"));
  mount(h("h2", {}, "Webhook deliveries"), box);
  const ticket = newestRead();
  const load = async () => {
    const current = ticket();
    try { const items = (await api("/api/v1/webhooks/deliveries?limit=100")).items; if (current()) box.replaceChildren(deliveriesTable(items)); }
    catch (e) { if (current()) box.replaceChildren(errorBox(e)); }
  };
  let t = null;
  state.render = (what) => { if (what === "incident") { clearTimeout(t); t = setTimeout(load, 1500); } };
  await load();
}

// ---------- router ----------
async function route() {
  const hash = location.hash || "#/now";
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const top = parts[0] || "now";
  for (const a of document.querySelectorAll("nav a")) {
    const nav = a.dataset.nav;
    a.classList.toggle("active", nav === top || (nav === "incidents" && top === "incident") || (nav === "traces" && (top === "trace" || top === "span")) || (nav === "now" && top === "runner"));
  }
  state.render = null;
  switch (top) {
    case "incidents": return viewIncidents(params);
    case "incident": return viewIncident(parts[1]);
    case "traces": return viewTraces(params);
    case "trace": return viewTraceV2(parts[1], null);
    case "span": return viewTraceV2(parts[1], parts[2]);
    case "logs": return viewLogs(params);
    case "metrics": return viewMetrics(params);
    case "runner": return viewRunner(parts[1]);
    case "breakers": return viewBreakers();
    case "webhooks": return viewWebhooks();
    default: return viewNow();
  }
}
window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", async () => {
  // the trace view reads no incident list: it starts at once, its fetch beside this one
  // (issue 13: a 10,000-span trace keyboard-ready in < 500 ms)
  const early = /^#\/(trace|span)\//.test(location.hash);
  if (early) route();
  try {
    const page = await api("/api/v1/incidents?limit=50");
    state.incidents = page.items;
    state.lastIncidentId = page.items.length ? page.items[0].id : 0;
  } catch { /* shown by the views */ }
  connectLive();
  if (!early) route();
});

// ---------- degraded storage banner (GET /readyz `degraded`) ----------
async function pollDegraded() {
  const el = document.getElementById("degraded");
  try {
    const r = await (await fetch("/readyz", { headers: { accept: "application/json" } })).json();
    const d = r.degraded;
    el.hidden = !d;
    el.textContent = d ? `storage degraded (${d.condition}): telemetry is refused with 503 until it passes; runners are still watched. ${d.detail}` : "";
  } catch (_) { /* the live badge already says the server is away */ }
}
pollDegraded();
setInterval(pollDegraded, 5000);
