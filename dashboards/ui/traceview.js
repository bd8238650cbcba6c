// stallwatch trace view (issue 13): a virtualised waterfall (only the rows on screen are in
// the DOM, so a 10,000-span trace stays smooth), a time axis with ticks, collapse/expand of
// subtrees, search within the trace (matches highlighted), keyboard (j/k or arrows to move,
// Enter to open, left/right to collapse/expand, / to search, Esc), the critical path, error
// spans, span links, and "download OTLP JSON". The trace JSON lists each resource once and
// spans point at it by resource_index/scope_index.
//
// "parent not received" vs "in progress (inferred)": the API sends a parent that no span
// ever delivered as a span with state "inferred". This view tells the two apart on the
// client: an inferred parent with a child that is still open (state "open") is "in progress
// (inferred)"; one whose children all ended is "parent not received".
"use strict";

const TV_ROW = 24; // px per row
const TV_OVERSCAN = 10;

function tvBuild(t) {
  const spans = t.spans;
  const byId = new Map(spans.map((s, i) => [s.span_id, i]));
  const kids = spans.map(() => []);
  const roots = [];
  // times as Numbers: ns offsets from the first span's start, exact below 2^53 ns (~104 days)
  // as BigInt differences; comparing and sorting Numbers is what keeps the build quick
  const base = spans.length ? BigInt(spans[0].start_time_unix_nano) : 0n;
  const off = (ns) => Number(BigInt(ns) - base);
  const start = spans.map(s => off(s.start_time_unix_nano));
  // the drawn tree's parent of each span (-1: a root); a span naming itself is a root
  const selfParent = new Set();
  const parent = spans.map((s, i) => {
    const p = s.parent_span_id ? byId.get(s.parent_span_id) : undefined;
    if (p === i) selfParent.add(i);
    return p === undefined || p === i ? -1 : p;
  });
  // Parents form a cycle when an exporter (or anyone posting OTLP) names them so: a span
  // of each cycle becomes a root (noted in its details), so every span is drawn and no
  // walk up the parents runs forever. Walking up from each span, colouring the walk's
  // spans, finds each cycle once (linear in the spans).
  const cycleRoot = new Set();
  const walked = new Int32Array(spans.length).fill(-1);
  for (let i = 0; i < spans.length; i++) {
    let j = i;
    while (j !== -1 && walked[j] === -1) { walked[j] = i; j = parent[j]; }
    if (j !== -1 && walked[j] === i) {
      // j is on a cycle: break it at its earliest-starting span
      let r = j, k = parent[j];
      while (k !== j) { if (start[k] < start[r]) r = k; k = parent[k]; }
      parent[r] = -1; cycleRoot.add(r);
    }
  }
  parent.forEach((p, i) => { if (p === -1) roots.push(i); else kids[p].push(i); });
  const cmp = (a, b) => start[a] - start[b];
  kids.forEach(k => { if (k.length > 1) k.sort(cmp); });
  roots.sort(cmp);
  let t0 = null, t1 = null;
  const nowNs = Number(BigInt(Date.now()) * 1000000n - base);
  const end = spans.map((s, i) => (s.end_time_unix_nano && s.end_time_unix_nano !== "0" ? off(s.end_time_unix_nano) : start[i]));
  spans.forEach((s, i) => { if (t0 === null || start[i] < t0) t0 = start[i]; if (t1 === null || end[i] > t1) t1 = end[i]; });
  if (t0 === null) { t0 = 0; t1 = 1; }
  const anyOpen = spans.some(s => s.state === "open");
  // a running span is drawn up to now (this browser's clock), unless now is more than an
  // hour past the trace's last known time (an old span that never ended, or skewed clocks)
  const toNow = anyOpen && nowNs > t1 && nowNs - t1 < 3600e9;
  if (toNow) t1 = nowNs;
  const runEnd = spans.map((s, i) => (s.state === "ended" ? end[i] : t1));
  const depth = new Array(spans.length).fill(0);
  const order = [];
  // depth-first, children by start time (iterative: a deep chain must not overflow the stack)
  const stack = roots.slice().reverse().map(i => [i, 0]);
  while (stack.length) {
    const [i, d] = stack.pop();
    depth[i] = d; order.push(i);
    const k = kids[i];
    for (let c = k.length - 1; c >= 0; c--) stack.push([k[c], d + 1]);
  }
  // inferred parents: still running when a child is open, else only "not received"
  const openBelow = new Array(spans.length).fill(false);
  for (let k = order.length - 1; k >= 0; k--) { const i = order[k]; openBelow[i] = spans[i].state === "open" || kids[i].some(c => openBelow[c]); }
  const label = spans.map((s, i) => s.state !== "inferred" ? null : openBelow[i] ? "in progress (inferred)" : "parent not received");
  const note = spans.map((s, i) => cycleRoot.has(i) ? "its parents form a cycle (each names another as parent): shown here as a root"
    : selfParent.has(i) ? "it names itself as its parent: shown here as a root" : null);
  // critical path: from each root, follow the child that ends last (the one the parent waited on)
  const critical = new Set();
  for (const r of roots) {
    let i = r;
    for (;;) {
      critical.add(i);
      let best = null;
      for (const c of kids[i]) if (best === null || runEnd[c] > runEnd[best]) best = c;
      if (best === null) break;
      i = best;
    }
  }
  return { spans, parent, kids, roots, start, runEnd, depth, order, label, note, critical, t0, t1, toNow, total: (t1 - t0) || 1 };
}

function tvTicks(totalNs, n) {
  const raw = totalNs / n;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
  const out = [];
  for (let v = 0; v <= totalNs; v += step) out.push(v);
  return out;
}

function tvFmtNs(ns) { return fmtDur(ns / 1e6); }

// The lean trace JSON (?lean=true) leaves out per-span keys holding defaults or repeating
// the answer; this puts them back, so the view reads the same span shape as the full JSON.
const TV_KINDS = ["unspecified", "internal", "server", "client", "producer", "consumer"];
const TV_STATUS = ["unset", "ok", "error"];
function tvUnlean(t) {
  const res = t.resources || [];
  for (const s of t.spans) {
    if (s.trace_id === undefined) s.trace_id = t.trace_id;
    if (s.parent_span_id === undefined) s.parent_span_id = null;
    if (s.kind_name === undefined) s.kind_name = TV_KINDS[s.kind] || "unknown";
    if (s.tool_name === undefined) s.tool_name = null;
    if (!s.events) s.events = [];
    if (!s.links) s.links = [];
    if (!s.attributes) s.attributes = [];
    const st = s.status || (s.status = { code: 0 });
    if (st.code_name === undefined) st.code_name = TV_STATUS[st.code] || "unknown";
    if (st.message === undefined) st.message = "";
    if (s.service_name === undefined) { const r = res[s.resource_index]; s.service_name = r ? r.service_name : null; }
  }
  return t;
}

async function viewTraceV2(traceId, spanId) {
  mount(h("div", { class: "empty" }, "loading…"));
  state.render = null;
  let t;
  const t0ms = performance.now();
  try { t = tvUnlean(await api(`/api/v1/traces/${encodeURIComponent(traceId)}?lean=true`)); } catch (e) { mount(errorBox(e)); return; }
  const fetchedMs = performance.now();
  const m = tvBuild(t);
  const builtMs = performance.now();
  const resources = t.resources || [];
  const scopes = t.scopes || [];
  const collapsed = new Set();
  let query = "";
  let matches = new Set();
  let visible = [];
  const recompute = () => {
    visible = [];
    const hidden = new Uint8Array(m.spans.length);
    for (const i of m.order) {
      const p = m.parent[i];
      if (p !== -1 && hidden[p]) { hidden[i] = 1; continue; }
      visible.push(i);
      if (collapsed.has(i)) hidden[i] = 1;
    }
  };
  recompute();
  let cur = Math.max(0, spanId ? visible.findIndex(i => m.spans[i].span_id === spanId) : 0);
  const details = h("div", { class: "panel", id: "span-panel" });
  const axis = h("div", { class: "tv-axis", id: "tv-axis" });
  const inner = h("div", { class: "tv-inner" });
  const scroller = h("div", { class: "tv-scroll", id: "waterfall", tabindex: "0" }, inner);
  const search = h("input", { type: "search", id: "tv-search", placeholder: "search spans (/)", "aria-label": "search within the trace" });
  const count = h("span", { class: "muted", id: "tv-count" }, "");
  const doDownload = () => {
    const a = h("a", { href: `/api/v1/traces/${t.trace_id}/otlp`, download: `trace-${t.trace_id}.otlp.json` });
    document.body.append(a); a.click(); a.remove();
  };
  const ticks = tvTicks(m.total, 6);
  axis.replaceChildren(...ticks.map(v => h("span", { class: "tv-tick", style: { left: `calc(40% + ${(v / m.total) * 60}%)` } }, tvFmtNs(v))));
  const rowFor = (pos) => {
    const i = visible[pos];
    const s = m.spans[i];
    const st = m.start[i] - m.t0, en = m.runEnd[i] - m.t0;
    const left = (st / m.total) * 100, width = Math.max(0.3, ((en - st) / m.total) * 100);
    const cls = "wf-bar" + (s.state === "open" ? " open" : s.state === "inferred" ? " inferred" : s.status.code === 2 ? " error" : "") + (m.critical.has(i) ? " critical" : "");
    const running = s.state !== "ended";
    const label = s.state === "open" ? (m.toNow ? `running · ${fmtDur((en - st) / 1e6)}` : "running") : s.state === "inferred" ? m.label[i] : fmtDur(s.duration_ms);
    const hasKids = m.kids[i].length > 0;
    const toggle = hasKids ? h("button", { class: "tv-toggle", "aria-label": collapsed.has(i) ? "expand" : "collapse", onclick: (ev) => { ev.stopPropagation(); flip(i); } }, collapsed.has(i) ? "▸" : "▾") : h("span", { class: "tv-toggle" }, "");
    return h("div", {
      class: "wf-row tv-row" + (pos === cur ? " selected" : "") + (matches.has(i) ? " match" : "") + (s.status && s.status.code === 2 ? " err" : ""),
      style: { top: `${pos * TV_ROW}px` }, dataset: { spanId: s.span_id, state: s.state, pos: String(pos) },
      onclick: () => { cur = pos; draw(); showDetails(); },
    },
      h("div", { class: "wf-name", title: s.name, style: { paddingLeft: `${m.depth[i] * 12}px` } }, toggle, s.status && s.status.code === 2 ? h("span", { class: "tv-err", title: "status ERROR" }, "!") : null, s.name, s.service_name ? h("span", { class: "muted" }, ` · ${s.service_name}`) : null),
      h("div", { class: "wf-track" }, h("div", { class: cls, style: { left: `${left}%`, width: `${Math.min(width, 100 - left)}%` } }),
        h("span", { class: "wf-label" + (running ? " running" : ""), style: left + width < 80 ? { left: `calc(${left + width}% + 4px)` } : { right: `${100 - left}%`, marginRight: "4px" } }, label)));
  };
  const draw = () => {
    inner.style.height = `${visible.length * TV_ROW}px`;
    const top = scroller.scrollTop, hgt = scroller.clientHeight || 600;
    const a = Math.max(0, Math.floor(top / TV_ROW) - TV_OVERSCAN);
    const b = Math.min(visible.length, Math.ceil((top + hgt) / TV_ROW) + TV_OVERSCAN);
    const rows = [];
    for (let p = a; p < b; p++) rows.push(rowFor(p));
    inner.replaceChildren(...rows);
  };
  const ensureVisible = () => {
    const y = cur * TV_ROW, top = scroller.scrollTop, hgt = scroller.clientHeight || 600;
    if (y < top) scroller.scrollTop = y; else if (y + TV_ROW > top + hgt) scroller.scrollTop = y + TV_ROW - hgt;
  };
  const showDetails = () => {
    const i = visible[cur];
    if (i === undefined) { details.replaceChildren(h("div", { class: "empty" }, "no span")); return; }
    const s = m.spans[i];
    details.replaceChildren(tvDetails(s, resources[s.resource_index], scopes[s.scope_index], m.label[i], m.note[i]));
    const want = `#/span/${t.trace_id}/${s.span_id}`;
    if (location.hash !== want) history.replaceState(null, "", want);
  };
  const flip = (i) => {
    const keep = m.spans[visible[cur]];
    if (collapsed.has(i)) collapsed.delete(i); else collapsed.add(i);
    recompute();
    cur = Math.max(0, visible.findIndex(v => m.spans[v] === keep));
    draw();
  };
  const runSearch = () => {
    query = search.value.trim().toLowerCase();
    matches = new Set();
    if (query) m.spans.forEach((s, i) => {
      if (s.name.toLowerCase().includes(query) || (s.service_name || "").toLowerCase().includes(query) || s.span_id.startsWith(query)
        || s.attributes.some(kv => kv.key.toLowerCase().includes(query) || anyValue(kv.value).toLowerCase().includes(query))) matches.add(i);
    });
    count.textContent = query ? `${matches.size} match${matches.size === 1 ? "" : "es"}` : "";
    if (matches.size) {
      // open the ancestors of the first match, then go to it
      const first = m.order.find(i => matches.has(i));
      for (let p = m.parent[first]; p !== -1; p = m.parent[p]) collapsed.delete(p);
      recompute();
      cur = Math.max(0, visible.indexOf(first));
      ensureVisible();
      showDetails();
    }
    draw();
  };
  search.addEventListener("input", runSearch);
  search.addEventListener("keydown", (ev) => { if (ev.key === "Escape" || ev.key === "Enter") { ev.preventDefault(); scroller.focus(); } });
  const nextMatch = (dir) => {
    if (!matches.size) return;
    for (let k = 1; k <= visible.length; k++) { const p = (cur + dir * k + visible.length) % visible.length; if (matches.has(visible[p])) { cur = p; break; } }
  };
  const onKey = (ev) => {
    if (!document.body.contains(scroller)) { document.removeEventListener("keydown", onKey); return; }
    if (ev.target === search || ev.target.tagName === "INPUT" || ev.target.tagName === "SELECT") return;
    const i = visible[cur];
    switch (ev.key) {
      case "j": case "ArrowDown": cur = Math.min(visible.length - 1, cur + 1); break;
      case "k": case "ArrowUp": cur = Math.max(0, cur - 1); break;
      case "ArrowLeft": case "h": if (i !== undefined && m.kids[i].length && !collapsed.has(i)) { flip(i); } else return; break;
      case "ArrowRight": case "l": if (i !== undefined && collapsed.has(i)) { flip(i); } else return; break;
      case "Enter": if (i !== undefined) location.hash = `#/span/${t.trace_id}/${m.spans[i].span_id}`; showDetails(); details.scrollIntoView({ block: "nearest" }); ev.preventDefault(); return;
      case "/": ev.preventDefault(); search.focus(); return;
      case "n": nextMatch(1); break;
      case "N": nextMatch(-1); break;
      case "Escape": search.value = ""; runSearch(); scroller.focus(); break;
      default: return;
    }
    ev.preventDefault();
    ensureVisible(); draw(); showDetails();
  };
  document.addEventListener("keydown", onKey);
  scroller.addEventListener("scroll", () => requestAnimationFrame(draw), { passive: true });
  const errs = t.spans.filter(s => s.status && s.status.code === 2).length;
  const logs = h("div", { class: "logs", id: "trace-logs" }, t.logs.length ? t.logs.map(l => h("div", { class: "log" },
    h("span", { class: `sev sev-${sevClass(l.severity_number)}` }, l.severity_text || `sev ${l.severity_number}`), " ", h("span", { class: "muted" }, fmtTime(l.time_unix_nano)),
    l.span_id ? [" ", h("a", { href: `#/span/${t.trace_id}/${l.span_id}` }, "span")] : null, h("div", { class: "mono" }, anyValue(l.body)))) : h("div", { class: "empty" }, "no logs in this trace"));
  mount(h("h2", {}, "Trace ", h("span", { class: "mono" }, t.trace_id)),
    h("div", { class: "tv-bar" }, search, count,
      h("span", { class: "muted" }, `${t.spans.length} spans · ${fmtDur(m.total / 1e6)} · ${errs} error${errs === 1 ? "" : "s"} · critical path highlighted`),
      h("button", { type: "button", id: "tv-download", class: "secondary", onclick: doDownload }, "Download OTLP JSON")),
    h("div", { class: "trace-layout" },
      h("div", { class: "side" }, h("div", { class: "panel tv-panel" }, axis, scroller), h("div", { class: "panel" }, h("h2", {}, `Logs (${t.logs.length})`), logs)),
      h("div", { class: "side" }, details)));
  draw();
  ensureVisible();
  draw();
  showDetails();
  scroller.focus({ preventScroll: true });
  const ready = { spans: t.spans.length, at: performance.now(), start: t0ms, fetched: fetchedMs, built: builtMs, painted: null };
  window.__traceViewReady = ready;
  // the frame after this one: the first rows are on screen (benchmarks read it)
  requestAnimationFrame(() => setTimeout(() => { ready.painted = performance.now(); }, 0));
}

function sevClass(n) { return n >= 17 ? "error" : n >= 13 ? "warn" : n >= 9 ? "info" : "debug"; }

function tvDetails(s, resource, scope, inferredLabel, note) {
  const state_ = s.state === "open" ? badge("running", "running") : s.state === "inferred" ? badge(inferredLabel || "in progress (inferred)", "inferred") : badge(s.status.code_name, s.status.code_name);
  return h("div", { id: "span-details", dataset: { spanId: s.span_id } },
    h("h3", {}, s.name, " ", state_),
    note ? h("p", { class: "muted", id: "span-note" }, note) : null,
    h("dl", { class: "kv" },
      h("dt", {}, "span"), h("dd", { class: "mono" }, s.span_id),
      h("dt", {}, "parent"), h("dd", { class: "mono" }, s.parent_span_id ? h("a", { href: `#/span/${s.trace_id}/${s.parent_span_id}` }, s.parent_span_id) : "—"),
      h("dt", {}, "service"), h("dd", {}, s.service_name || "—"),
      h("dt", {}, "kind"), h("dd", {}, s.kind_name),
      h("dt", {}, "start"), h("dd", {}, fmtTime(s.start_time_unix_nano)),
      h("dt", {}, "duration"), h("dd", {}, s.state === "ended" ? fmtDur(s.duration_ms) : "running"),
      h("dt", {}, "status"), h("dd", {}, s.status.code_name, s.status.message ? `: ${s.status.message}` : ""),
      h("dt", {}, "logs"), h("dd", {}, h("a", { href: `#/logs?trace_id=${s.trace_id}&span_id=${s.span_id}` }, "logs of this span"))),
    h("h2", {}, "Attributes"), attrTable(s.attributes),
    h("h2", {}, `Events (${s.events.length})`), s.events.length ? s.events.map(e => h("div", {}, h("b", {}, e.name), " ", h("span", { class: "muted" }, fmtTime(e.time_unix_nano)), attrTable(e.attributes))) : h("div", { class: "empty" }, "none"),
    h("h2", {}, `Links (${s.links.length})`), s.links.length ? s.links.map(l => h("div", { class: "span-link" }, h("a", { class: "mono", href: `#/span/${l.trace_id}/${l.span_id}` }, `${l.trace_id.slice(0, 12)}…/${l.span_id}`), attrTable(l.attributes))) : h("div", { class: "empty" }, "none"),
    h("h2", {}, "Resource"), resource ? attrTable(resource.attributes) : h("div", { class: "empty" }, "not received yet"),
    scope ? [h("h2", {}, "Scope"), h("div", { class: "mono" }, `${scope.name} ${scope.version}`)] : null);
}
