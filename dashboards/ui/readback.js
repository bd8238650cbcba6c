// stallwatch Logs and Metrics pages, and the theme toggle (issue 13).
// Logs: #/logs?service=&min_severity=&body=&attr=&trace_id=&span_id=&runner_id= with paging
// and a live tail (GET /api/v1/logs/stream). Metrics: #/metrics?range=15m|1h|24h|custom
// [&from=&to=] (datetime-local) [&service=] [&live=1]: the instrument list and one uPlot
// chart per instrument, one line per series (attribute set): value for sums and gauges,
// the estimated p50 for histograms, the count for summaries. Traces page: drop-to-import
// (importPanel, POST /api/v1/import/traces).
"use strict";

const SEV_NAMES = [["", "any"], ["trace", "trace+"], ["debug", "debug+"], ["info", "info+"], ["warn", "warn+"], ["error", "error+"], ["fatal", "fatal"]];
function sevName(n) { return n >= 21 ? "fatal" : n >= 17 ? "error" : n >= 13 ? "warn" : n >= 9 ? "info" : n >= 5 ? "debug" : n >= 1 ? "trace" : "unset"; }

function logRow(l) {
  return h("tr", { class: `log-row sev-${sevName(l.severity_number)}`, dataset: { id: String(l.id) } },
    h("td", { class: "nowrap" }, fmtTime(l.time_unix_nano)),
    h("td", {}, h("span", { class: `sev sev-${sevName(l.severity_number)}` }, l.severity_text || sevName(l.severity_number))),
    h("td", {}, l.service_name),
    h("td", { class: "mono log-body" }, anyValue(l.body)),
    h("td", { class: "nowrap" },
      l.trace_id ? h("a", { href: `#/trace/${l.trace_id}` }, "trace") : null, " ",
      l.trace_id && l.span_id ? h("a", { href: `#/span/${l.trace_id}/${l.span_id}` }, "span") : null, " ",
      l.runner_id ? h("a", { href: `#/runner/${l.runner_id}` }, `runner ${l.runner_id}`) : null));
}

const LOG_FIELDS = ["service", "min_severity", "body", "attr", "trace_id", "span_id", "runner_id"];
async function viewLogs(params) {
  const inputs = {};
  for (const f of LOG_FIELDS) {
    inputs[f] = f === "min_severity"
      ? h("select", { name: f }, SEV_NAMES.map(([v, t]) => h("option", { value: v }, t)))
      : h("input", { name: f, placeholder: f === "attr" ? "key=value" : f === "body" ? "text in the body" : "" });
    inputs[f].value = params.get(f) || "";
  }
  const live = h("input", { type: "checkbox", id: "logs-live" });
  const form = h("form", { class: "search panel", id: "logs-form", onsubmit: (ev) => { ev.preventDefault(); const q = new URLSearchParams(); for (const f of LOG_FIELDS) if (inputs[f].value) q.set(f, inputs[f].value); location.hash = `#/logs?${q}`; } },
    LOG_FIELDS.map(f => h("label", {}, f.replace("_", " "), inputs[f])),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Search"), h("button", { type: "button", class: "secondary", onclick: () => { location.hash = "#/logs"; } }, "Clear"),
      h("label", { class: "inline" }, live, " live tail")));
  const tbody = h("tbody", { id: "log-rows" });
  const table = h("table", { id: "log-list" }, h("thead", {}, h("tr", {}, ["time", "severity", "service", "body", "links"].map(t => h("th", {}, t)))), tbody);
  const pager = h("div", { class: "pager" });
  const status = h("div", { class: "muted", id: "logs-status" });
  mount(h("h2", {}, "Logs"), form, h("div", { class: "panel" }, status, table, pager));
  const q = new URLSearchParams();
  for (const f of LOG_FIELDS) if (params.get(f)) q.set(f, params.get(f));
  const load = async (cursor) => {
    const qq = new URLSearchParams(q); if (cursor) qq.set("cursor", cursor);
    try {
      const page = await api(`/api/v1/logs?${qq}`);
      if (!cursor) tbody.replaceChildren();
      tbody.append(...page.items.map(logRow));
      status.textContent = tbody.children.length ? `${tbody.children.length} records` : "no records match";
      pager.replaceChildren(page.next_cursor ? h("button", { class: "secondary", onclick: () => load(page.next_cursor) }, "Older") : "");
    } catch (e) { status.replaceChildren(errorBox(e)); }
  };
  let es = null;
  // the stream ends with this view (any route change re-renders it) and when the page is
  // left: a page kept in the back/forward cache would otherwise hold one of the browser's
  // 6 connections per host (see pagehide in app.js)
  const stop = () => {
    if (es) { es.close(); es = null; }
    live.checked = false;
    window.removeEventListener("hashchange", stop);
    window.removeEventListener("pagehide", stop);
  };
  live.addEventListener("change", () => {
    if (es) { es.close(); es = null; }
    if (!live.checked) return;
    window.addEventListener("hashchange", stop);
    window.addEventListener("pagehide", stop);
    es = new EventSource(`/api/v1/logs/stream?${q}`);
    es.addEventListener("logs", (ev) => {
      if (!document.body.contains(tbody)) { es.close(); return; }
      const items = JSON.parse(ev.data).items;
      for (const l of items) tbody.prepend(logRow(l));
      status.textContent = `${tbody.children.length} records (live)`;
    });
  });
  await load(null);
}

// ---------- Metrics ----------
const RANGES = { "15m": 15 * 60e3, "1h": 3600e3, "24h": 86400e3 };
const PALETTE = ["#5b8def", "#e0a100", "#1a9f6f", "#d9534f", "#8e6bd1", "#2aa1b3", "#c2548f", "#7a8b2f"];

function seriesLabel(s) {
  const a = s.attributes.map(kv => `${kv.key}=${anyValue(kv.value)}`).join(", ");
  return a || "(no attributes)";
}

// One uPlot chart (vendored, /ui/uPlot.iife.min.js, MIT) per instrument: one line per
// series, on the union of the series' step times (seconds); a series without a point at a
// time is a gap that the line spans.
function seriesValue(s, p) { return s.type.includes("histogram") ? p.p50 : s.type === "summary" ? p.count : p.value; }
function uplotChart(data, width) {
  const toS = ns => Number(BigInt(ns) / 1000000n) / 1000;
  const xs = [...new Set(data.series.flatMap(s => s.points.map(p => toS(p.time_unix_nano))))].sort((a, b) => a - b);
  const ys = data.series.map(s => { const m = new Map(s.points.map(p => [toS(p.time_unix_nano), seriesValue(s, p)])); return xs.map(x => { const v = m.get(x); return v === undefined || v === null ? null : Number(v); }); });
  const ink = getComputedStyle(document.body).color;
  const grid = { stroke: "rgba(128,128,128,0.2)", width: 1 };
  const axis = { stroke: ink, grid, ticks: grid };
  const opts = {
    width: Math.max(320, width), height: 200,
    scales: { x: { time: true, range: [toS(data.from_unix_nano), toS(data.to_unix_nano)] } },
    series: [{ label: "time" }, ...data.series.map((s, i) => ({ label: s.points.length ? `${seriesLabel(s)} · ${fmtLast(s)}` : seriesLabel(s), stroke: PALETTE[i % PALETTE.length], width: 2, spanGaps: true, points: { show: true, size: 6 } }))],
    axes: [axis, axis],
    legend: { live: false },
  };
  const box = h("div", { class: "chart-box", dataset: { series: String(data.series.length) } });
  const u = new uPlot(opts, [xs, ...ys], box);
  box.__uplot = u;
  return box;
}

function fmtLast(s) {
  const p = s.points[s.points.length - 1];
  if (s.type.includes("histogram")) return `count ${p.count} · p50 ${fmtNum(p.p50)} · p90 ${fmtNum(p.p90)} · p99 ${fmtNum(p.p99)}`;
  return `last ${fmtNum(p.value)}`;
}
function fmtNum(v) { return v === null || v === undefined ? "—" : String(+Number(v).toPrecision(4)); }

async function viewMetrics(params) {
  const range = params.get("range") || "1h";
  const service = params.get("service") || "";
  const nav = (over) => { const q = new URLSearchParams(params); for (const [k, v] of Object.entries(over)) { if (v) q.set(k, v); else q.delete(k); } location.hash = `#/metrics?${q}`; };
  const fromIn = h("input", { type: "datetime-local", id: "metrics-from", value: params.get("from") || "" });
  const toIn = h("input", { type: "datetime-local", id: "metrics-to", value: params.get("to") || "" });
  const live = h("input", { type: "checkbox", id: "metrics-live" });
  live.checked = params.get("live") === "1";
  const bar = h("div", { class: "panel range-bar" },
    ["15m", "1h", "24h"].map(r => h("button", { type: "button", class: r === range ? "" : "secondary", dataset: { range: r }, onclick: () => nav({ range: r, from: "", to: "" }) }, r)),
    h("label", { class: "inline" }, "from ", fromIn), h("label", { class: "inline" }, "to ", toIn),
    h("button", { type: "button", class: range === "custom" ? "" : "secondary", onclick: () => nav({ range: "custom", from: fromIn.value, to: toIn.value }) }, "custom"),
    h("label", { class: "inline" }, live, " live refresh"));
  const list = h("div", { id: "metric-list" });
  const charts = h("div", { id: "metric-charts", class: "charts" });
  mount(h("h2", {}, "Metrics"), bar, h("div", { class: "metrics-layout" }, h("div", { class: "panel" }, h("h2", {}, "Instruments"), list), charts));
  let to = Date.now(), from = to - (RANGES[range] || 3600e3);
  if (range === "custom") { const f = new Date(params.get("from")).getTime(), t = new Date(params.get("to")).getTime(); if (!isNaN(f) && !isNaN(t) && t > f) { from = f; to = t; } }
  const ns = ms => (BigInt(Math.floor(ms)) * 1000000n).toString();
  let plots = [];
  const draw = async () => {
    if (range !== "custom") { to = Date.now(); from = to - (RANGES[range] || 3600e3); }
    let inst;
    try { inst = (await api(`/api/v1/metrics${service ? `?service=${encodeURIComponent(service)}` : ""}`)).items; } catch (e) { list.replaceChildren(errorBox(e)); return; }
    list.replaceChildren(inst.length ? h("table", { id: "instrument-table" }, h("thead", {}, h("tr", {}, ["instrument", "type", "points"].map(t => h("th", {}, t)))),
      h("tbody", {}, inst.map(i => h("tr", { class: "clickable", title: i.description || i.name, onclick: () => { const el = document.getElementById(`chart-${i.name}-${i.service_name}`); if (el) el.scrollIntoView(); } },
        h("td", {}, h("div", {}, i.name), h("div", { class: "muted small" }, `${i.service_name}${i.unit ? ` · ${i.unit}` : ""}`)), h("td", {}, i.type.replace("exponential_histogram", "exp. histogram")), h("td", {}, String(i.point_count)))))) : h("div", { class: "empty" }, "no metrics stored"));
    const boxes = [];
    const width = (charts.clientWidth || 600) - 40;
    for (const u of plots) u.destroy();
    plots = [];
    for (const i of inst.slice(0, 24)) {
      const q = new URLSearchParams({ service: i.service_name, from: ns(from), to: ns(to) });
      let d;
      try { d = await api(`/api/v1/metrics/${encodeURIComponent(i.name)}/points?${q}`); } catch (e) { boxes.push(errorBox(e)); continue; }
      boxes.push(h("div", { class: "panel metric-chart", id: `chart-${i.name}-${i.service_name}`, dataset: { metric: i.name, service: i.service_name } },
        h("h3", {}, i.name, " ", h("span", { class: "muted" }, `${i.type} · ${i.unit || "no unit"} · ${i.service_name}`)),
        i.description ? h("div", { class: "muted" }, i.description) : null,
        d.series.length ? (() => { const c = uplotChart(d, width); plots.push(c.__uplot); return c; })() : h("div", { class: "empty" }, "no points in this range")));
    }
    charts.replaceChildren(...boxes);
    window.__metricsDrawn = (window.__metricsDrawn || 0) + 1;
  };
  await draw();
  let timer = null;
  const arm = () => { clearInterval(timer); if (live.checked) timer = setInterval(() => { if (!document.body.contains(charts)) { clearInterval(timer); return; } draw(); }, 10000); };
  live.addEventListener("change", arm);
  arm();
}

// ---------- theme ----------
function applyTheme(t) {
  if (t === "light" || t === "dark") document.documentElement.dataset.theme = t; else delete document.documentElement.dataset.theme;
  const b = document.getElementById("theme-toggle");
  if (b) b.textContent = `theme: ${t || "auto"}`;
}
function setupTheme() {
  let t = null;
  try { t = localStorage.getItem("stallwatch.theme"); } catch { /* storage off */ }
  applyTheme(t);
  const b = document.getElementById("theme-toggle");
  if (b) b.addEventListener("click", () => {
    const next = { auto: "light", light: "dark", dark: "auto" }[t || "auto"];
    t = next === "auto" ? null : next;
    try { if (t) localStorage.setItem("stallwatch.theme", t); else localStorage.removeItem("stallwatch.theme"); } catch { /* storage off */ }
    applyTheme(t);
  });
}
window.addEventListener("DOMContentLoaded", setupTheme);

// ---------- Traces page: drop-to-import ----------
// Drop an OTLP/JSON TracesData file (e.g. a trace's "download OTLP JSON") on the zone, or
// choose it: it is POSTed to /api/v1/import/traces, which stores it through the same ingest
// as /v1/traces. The dashboard's own page needs no token unless an ingest token is set;
// then the token field (the data folder's `token` file) is sent as a bearer token.
// The spans of an OTLP/JSON export, read as the server reads it: lowerCamelCase field
// names or the proto's own (snake_case), the first winning when both are there.
function countSpans(doc) {
  let n = 0;
  for (const rs of (doc && (doc.resourceSpans ?? doc.resource_spans)) || []) {
    for (const ss of (rs && (rs.scopeSpans ?? rs.scope_spans)) || []) n += ((ss && ss.spans) || []).length;
  }
  return n;
}
function importPanel(onImported) {
  const status = h("div", { id: "trace-import-status", class: "muted" }, "");
  const token = h("input", { type: "password", id: "trace-import-token", autocomplete: "off", placeholder: "if an ingest token is set" });
  try { token.value = sessionStorage.getItem("stallwatch.token") || ""; } catch { /* storage off */ }
  const send = async (file) => {
    if (!file) return;
    status.className = "muted"; status.textContent = `importing ${file.name}…`;
    let text;
    try { text = await file.text(); } catch (e) { status.className = "error-box"; status.textContent = `cannot read ${file.name}: ${e}`; return; }
    let spans = null;
    try { spans = countSpans(JSON.parse(text)); } catch { /* the server names what is wrong */ }
    const headers = { "content-type": "application/json", accept: "application/json" };
    if (token.value) { headers.authorization = `Bearer ${token.value.trim()}`; try { sessionStorage.setItem("stallwatch.token", token.value.trim()); } catch { /* storage off */ } }
    let r, body;
    try { r = await fetch("/api/v1/import/traces", { method: "POST", headers, body: text }); body = await r.json().catch(() => ({})); }
    catch (e) { status.className = "error-box"; status.textContent = `import failed: ${e}`; return; }
    if (!r.ok) {
      const msg = body.error ? `${body.error.code}: ${body.error.message}` : body.message || `HTTP ${r.status}`;
      const retry = r.headers.get("retry-after");
      status.className = "error-box";
      status.textContent = `import of ${file.name} refused (HTTP ${r.status}): ${msg}${retry ? ` — retry in ${retry} s` : ""}${r.status === 401 ? " — paste the token from the data folder's token file" : ""}`;
      return;
    }
    const ps = body.partialSuccess || {};
    const rejected = Number(ps.rejectedSpans || 0);
    const accepted = spans === null ? null : spans - rejected;
    status.className = rejected ? "error-box" : "ok-box";
    status.dataset.accepted = String(accepted);
    status.dataset.rejected = String(rejected);
    status.textContent = `${file.name}: ${accepted === null ? "?" : accepted} spans imported, ${rejected} rejected${ps.errorMessage ? ` (${ps.errorMessage})` : ""}`;
    onImported();
  };
  const input = h("input", { type: "file", id: "trace-import-file", accept: ".json,application/json", onchange: () => { send(input.files[0]); input.value = ""; } });
  const zone = h("div", { id: "trace-drop", class: "drop-zone", tabindex: "0" },
    h("strong", {}, "Import a trace: "), "drop an OTLP/JSON file here, or ", h("label", { class: "inline file-pick" }, "choose one ", input));
  zone.addEventListener("dragover", (ev) => { ev.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (ev) => { ev.preventDefault(); zone.classList.remove("over"); const f = ev.dataTransfer && ev.dataTransfer.files[0]; send(f); });
  return h("div", { class: "panel import" }, zone, h("label", { class: "inline" }, "token ", token), status);
}

// ---------- Breakers: #/breakers (GET /api/v1/breakers; redrawn on live board events) ----------
function breakerBadge(s) { return badge(s); }
async function viewBreakers() {
  const box = h("div", { class: "panel" }, h("div", { class: "empty" }, "loading…"));
  mount(h("h2", {}, "Circuit breakers"),
    h("p", { class: "muted" }, "One breaker per runner: CLOSED admits work; OPEN refuses it after a trip until the cooldown ends; HALF_OPEN admits one probe. Tools ask GET /api/v1/runners/{id}/admit."),
    box);
  const ticket = newestRead();
  const load = async () => {
    const current = ticket();
    try {
      const items = (await api("/api/v1/breakers")).items;
      if (!current()) return;
      box.replaceChildren(items.length ? h("table", { id: "breaker-list" },
        h("thead", {}, h("tr", {}, ["runner", "breaker", "verdict", "reason", "retry after"].map(t => h("th", {}, t)))),
        h("tbody", {}, items.map(b => h("tr", { class: "breaker-row", dataset: { runnerId: b.runner_id, state: b.state } },
          h("td", {}, h("a", { href: `#/runner/${b.runner_id}` }, b.runner_id)), h("td", {}, breakerBadge(b.state)),
          h("td", {}, b.verdict ? badge(b.verdict, b.verdict === "healthy" ? "ok" : "warn") : "—"), h("td", {}, b.reason || "—"),
          h("td", {}, b.retry_after_ms ? fmtDur(b.retry_after_ms) : "—"))))) : h("div", { class: "empty" }, "no runners registered"));
    } catch (e) { if (current()) box.replaceChildren(errorBox(e)); }
  };
  let t = null;
  state.render = (what) => { if (what === "board") { clearTimeout(t); t = setTimeout(load, 300); } };
  await load();
}
