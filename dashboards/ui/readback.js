// stallwatch Logs and Metrics pages, and the theme toggle (issue 13).
// Logs: #/logs?service=&min_severity=&body=&attr=&trace_id=&span_id=&runner_id= with paging
// and a live tail (GET /api/v1/logs/stream). Metrics: #/metrics?range=15m|1h|24h|custom
// [&from=&to=] (datetime-local) [&service=] [&live=1]: the instrument list and one SVG line
// chart per instrument, one line per series (attribute set): value for sums and gauges,
// the estimated p50 for histograms.
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
  live.addEventListener("change", () => {
    if (es) { es.close(); es = null; }
    if (!live.checked) return;
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

function lineChart(data) {
  const W = 560, H = 180, P = 34;
  const all = [];
  const lines = data.series.map(s => s.points.map(p => [Number(BigInt(p.time_unix_nano) / 1000000n), s.type.includes("histogram") ? p.p50 : s.type === "summary" ? p.count : p.value]).filter(([, v]) => v !== null && v !== undefined));
  for (const l of lines) for (const pt of l) all.push(pt);
  const x0 = Number(BigInt(data.from_unix_nano) / 1000000n), x1 = Number(BigInt(data.to_unix_nano) / 1000000n);
  let y0 = Math.min(0, ...all.map(p => p[1])), y1 = Math.max(1e-9, ...all.map(p => p[1]));
  if (y1 === y0) y1 = y0 + 1;
  const X = x => P + ((x - x0) / (x1 - x0 || 1)) * (W - P - 8), Y = y => H - 18 - ((y - y0) / (y1 - y0)) * (H - 28);
  const g = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, "data-series": String(data.series.length), role: "img" },
    svg("line", { x1: P, y1: H - 18, x2: W - 8, y2: H - 18, class: "axis" }),
    svg("line", { x1: P, y1: 8, x2: P, y2: H - 18, class: "axis" }),
    svg("text", { x: 2, y: 14, class: "tick" }, String(+y1.toPrecision(3))),
    svg("text", { x: 2, y: H - 18, class: "tick" }, String(+y0.toPrecision(3))),
    svg("text", { x: P, y: H - 4, class: "tick" }, new Date(x0).toLocaleTimeString()),
    svg("text", { x: W - 90, y: H - 4, class: "tick" }, new Date(x1).toLocaleTimeString()),
    ...lines.map((l, i) => l.length === 1
      ? svg("circle", { class: "series", cx: X(l[0][0]), cy: Y(l[0][1]), r: 3, fill: PALETTE[i % PALETTE.length], "data-series-index": String(i) })
      : svg("polyline", { class: "series", fill: "none", stroke: PALETTE[i % PALETTE.length], "stroke-width": 2, "data-series-index": String(i), points: l.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(" ") })));
  const legend = h("div", { class: "legend" }, data.series.map((s, i) => h("span", { class: "legend-item" }, h("i", { style: { background: PALETTE[i % PALETTE.length] } }), seriesLabel(s),
    s.points.length ? h("span", { class: "muted" }, ` ${fmtLast(s)}`) : null)));
  return h("div", { class: "chart-box" }, g, legend);
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
  const draw = async () => {
    if (range !== "custom") { to = Date.now(); from = to - (RANGES[range] || 3600e3); }
    let inst;
    try { inst = (await api(`/api/v1/metrics${service ? `?service=${encodeURIComponent(service)}` : ""}`)).items; } catch (e) { list.replaceChildren(errorBox(e)); return; }
    list.replaceChildren(inst.length ? h("table", { id: "instrument-table" }, h("thead", {}, h("tr", {}, ["name", "type", "unit", "service", "points"].map(t => h("th", {}, t)))),
      h("tbody", {}, inst.map(i => h("tr", { class: "clickable", onclick: () => { const el = document.getElementById(`chart-${i.name}-${i.service_name}`); if (el) el.scrollIntoView(); } },
        h("td", {}, i.name), h("td", {}, i.type), h("td", {}, i.unit), h("td", {}, i.service_name), h("td", {}, String(i.point_count)))))) : h("div", { class: "empty" }, "no metrics stored"));
    const boxes = [];
    for (const i of inst.slice(0, 24)) {
      const q = new URLSearchParams({ service: i.service_name, from: ns(from), to: ns(to) });
      let d;
      try { d = await api(`/api/v1/metrics/${encodeURIComponent(i.name)}/points?${q}`); } catch (e) { boxes.push(errorBox(e)); continue; }
      boxes.push(h("div", { class: "panel metric-chart", id: `chart-${i.name}-${i.service_name}`, dataset: { metric: i.name, service: i.service_name } },
        h("h3", {}, i.name, " ", h("span", { class: "muted" }, `${i.type} · ${i.unit || "no unit"} · ${i.service_name}`)),
        i.description ? h("div", { class: "muted" }, i.description) : null,
        d.series.length ? lineChart(d) : h("div", { class: "empty" }, "no points in this range")));
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
