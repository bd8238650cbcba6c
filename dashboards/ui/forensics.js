// stallwatch dashboard: the stall-forensics panel of the incident page (issue 18).
// Shows evidence.classification, the CPU figures, a threads table (state, system call,
// wchan, idle time, CPU) and the runtime stacks of every thread with the tool's own frame
// highlighted. Loaded after app.js and uses its DOM helper `h`; app.js calls
// forensicsPanel(evidence) from the incident view. No innerHTML: text only.
"use strict";

function fxMs(ms) {
  if (ms === null || ms === undefined) return "—";
  return ms >= 10000 ? `${Math.round(ms / 1000)} s` : `${(ms / 1000).toFixed(1)} s`;
}

function fxFrame(f) {
  const where = `${f.file}${f.line ? ":" + f.line : ""}${f.column ? ":" + f.column : ""}`;
  return h("li", { class: f.tool ? "fx-frame fx-tool" : "fx-frame", title: f.tool ? "inside the tool's code" : null },
    h("span", { class: "fx-fn" }, f.function), " ", h("span", { class: "mono muted" }, where),
    f.tool ? h("span", { class: "badge b-warn" }, "tool") : null);
}

function fxThreadsTable(threads) {
  const head = ["tid", "name", "state", "system call", "on", "wchan", "idle", "CPU user / system", "ctx switches"];
  return h("table", { class: "fx-threads" },
    h("thead", {}, h("tr", {}, head.map(t => h("th", {}, t)))),
    h("tbody", {}, threads.map(t => h("tr", { class: t.main ? "fx-main" : null },
      h("td", { class: "mono" }, String(t.tid), t.main ? " (main)" : ""),
      h("td", {}, t.name || ""),
      h("td", { title: t.state_name || "" }, `${t.state} ${t.state_name || ""}`),
      h("td", { class: "mono" }, t.syscall ? `${t.syscall}()${t.futex_untimed === true ? " no timeout" : ""}` : "—"),
      h("td", { class: "mono" }, t.syscall_target || "—"),
      h("td", { class: "mono" }, t.wchan || "—"),
      h("td", {}, fxMs(t.idle_ms)),
      h("td", {}, `${t.cpu_user_ms ?? "—"} / ${t.cpu_system_ms ?? "—"} ms`),
      h("td", {}, `${t.voluntary_ctxt_switches ?? "—"} / ${t.nonvoluntary_ctxt_switches ?? "—"}`)))));
}

function fxStacks(stacks) {
  if (!stacks) return null;
  if (stacks.unavailable) return h("div", { class: "empty" }, `No runtime stacks: ${stacks.unavailable}`);
  // The main thread first (it is what the reason line names), then the others as dumped.
  const threads = [...(stacks.threads || [])].sort((a, b) => (b.main ? 1 : 0) - (a.main ? 1 : 0));
  return h("div", { class: "fx-stacks" },
    h("div", { class: "muted" }, `${stacks.runtime} stacks, innermost frame first`,
      stacks.tool_frame ? ` — tool frame: ${stacks.tool_frame.function} (${stacks.tool_frame.file}:${stacks.tool_frame.line})` : ""),
    stacks.taken_by ? h("div", { class: "muted" }, stacks.taken_by === "heartbeat" ? "taken by the kit on its heartbeat socket (no signal sent)" : "taken by the kit's SIGUSR2 handler") : null,
    stacks.note ? h("div", { class: "empty" }, stacks.note) : null,
    stacks.threads_unavailable ? h("div", { class: "empty" }, `Other threads missing: ${stacks.threads_unavailable}`) : null,
    stacks.main_stack_unavailable ? h("div", { class: "empty" }, `Main thread's stack missing: ${stacks.main_stack_unavailable}`) : null,
    (stacks.active_handles || []).length ? h("div", { class: "muted" }, "active handles: ", stacks.active_handles.map(a => `${a.type} × ${a.count}`).join(", ")) : null,
    threads.map(t => h("div", { class: t.main ? "fx-thread fx-main" : "fx-thread" },
      h("h3", {}, t.label ? t.label : `thread ${t.name ? `${t.name} ` : ""}${t.id}`, t.main ? " (main)" : "", t.current ? " (ran the dump)" : ""),
      t.frames.length ? h("ol", { class: "fx-frames" }, t.frames.map(fxFrame)) : h("div", { class: "empty" }, "no frames"),
      t.frames_omitted ? h("div", { class: "muted" }, `${t.frames_omitted} more frames left out`) : null)));
}

// The panel for an incident's evidence; null when the incident has no forensics.
function forensicsPanel(ev) {
  if (!ev || typeof ev !== "object" || typeof ev.classification !== "string") return null;
  const fx = ev.forensics || {};
  const cpu = fx.cpu || {};
  const pct = v => (v === null || v === undefined ? "—" : `${v}%`);
  return h("section", { class: "panel fx", dataset: { forensics: fx.kind || "" } },
    h("h2", {}, "Why it was stuck"),
    h("p", { class: "fx-class" }, ev.classification),
    h("dl", { class: "kv" },
      h("dt", {}, "CPU, last seconds"), h("dd", {}, `${pct(cpu.recent_pct)} used, ${pct(cpu.recent_demand_pct)} wanted over ${fxMs(cpu.recent_window_ms)}`),
      h("dt", {}, "CPU since the tool span started"), h("dd", {}, `${pct(cpu.since_span_start_pct)} over ${fxMs(cpu.since_span_start_window_ms)}`),
      h("dt", {}, "RSS"), h("dd", {}, fx.rss_bytes ? `${(fx.rss_bytes / 1048576).toFixed(1)} MiB` : "—"),
      h("dt", {}, "open fds"), h("dd", {}, fx.fd_count ?? "—"),
      h("dt", {}, "threads"), h("dd", {}, fx.thread_count ?? "—"),
      h("dt", {}, "collected in"), h("dd", {}, `${fx.collected_ms ?? "—"} ms of a ${fx.budget_ms ?? "—"} ms budget${fx.truncated ? " (truncated to 64 KiB)" : ""}`)),
    h("h3", {}, "Threads (kernel)"),
    Array.isArray(ev.threads) && ev.threads.length ? fxThreadsTable(ev.threads) : h("div", { class: "empty" }, "no threads read"),
    h("h3", {}, "Stacks (runtime)"),
    fxStacks(ev.stacks));
}
