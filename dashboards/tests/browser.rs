//! The web UI in a real headless Chromium, driven over the W3C WebDriver protocol
//! (Debian's `chromium` + `chromium-driver`) through the one WebDriver client in `testkit`.
//!
//! Against a running dashboard seeded with spans (one of them open): the trace list shows
//! both traces, the waterfall shows the spans with the open one drawn as running, and an
//! incident published after page load appears without a reload. Screenshots land in
//! `tests/artifacts/dashboards/` (gitignored).

use std::time::Duration;

use serde_json::json;
use stallwatch_dashboards::DashboardConfig;
use stallwatch_storage::model::EventKind;
use stallwatch_testkit::Driver;
use tokio::task::block_in_place;

use crate::common::*;

/// Each wait on the page gives up after this long.
const WAIT: Duration = Duration::from_secs(20);

// The WebDriver client blocks, so each call leaves the runtime with `block_in_place`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_shows_traces_open_spans_and_live_incidents() {
    let h = Harness::start(DashboardConfig::default()).await;
    seed(&h).await;
    let profile = tempfile::tempdir().unwrap();
    let d = block_in_place(|| Driver::start(profile.path()));

    // Trace list.
    block_in_place(|| d.goto(&h.url("/#/traces")));
    let rows = block_in_place(|| {
        d.wait_for("two trace rows", WAIT, "const r = document.querySelectorAll('tr.trace-row'); return r.length === 2 ? Array.from(r).map(e => e.dataset.traceId) : null")
    });
    let mut ids: Vec<String> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, vec![TRACE_A.to_string(), TRACE_B.to_string()]);
    block_in_place(|| d.screenshot("dashboards/traces.png"));

    // Waterfall, reached by clicking the row of trace A.
    block_in_place(|| {
        d.js(&format!(
        "document.querySelector('tr.trace-row[data-trace-id=\"{TRACE_A}\"]').click(); return true"
    ))
    });
    let spans = block_in_place(|| {
        d.wait_for("three waterfall rows", WAIT, "const r = document.querySelectorAll('#waterfall .wf-row'); return r.length === 3 ? Array.from(r).map(e => [e.dataset.spanId, e.dataset.state, e.innerText]) : null")
    });
    let spans = spans.as_array().unwrap();
    let find = |id: &str| {
        spans
            .iter()
            .find(|s| s[0] == id)
            .unwrap_or_else(|| panic!("span {id} not in waterfall: {spans:?}"))
    };
    assert_eq!(find(ROOT)[1], "ended");
    assert_eq!(find(TOOL)[1], "ended");
    assert!(find(TOOL)[2]
        .as_str()
        .unwrap()
        .contains("execute_tool run_notebook"));
    assert_eq!(find(OPEN)[1], "open");
    assert!(
        find(OPEN)[2].as_str().unwrap().contains("running"),
        "open span not drawn as running: {:?}",
        find(OPEN)
    );
    let open_bar_running = block_in_place(|| {
        d.js(&format!(
            "return !!document.querySelector('.wf-row[data-span-id=\"{OPEN}\"] .wf-bar.open')"
        ))
    });
    assert_eq!(open_bar_running, json!(true));
    // Span details and the trace's logs beside the waterfall.
    block_in_place(|| {
        d.js(&format!(
            "document.querySelector('.wf-row[data-span-id=\"{TOOL}\"]').click(); return true"
        ))
    });
    let details = block_in_place(|| {
        d.wait_for("span details", WAIT, "const e = document.getElementById('span-details'); return e && e.dataset.spanId === '00f067aa0ba902b7' ? e.innerText : null")
    });
    let details = details.as_str().unwrap();
    for needle in [
        "gen_ai.tool.name",
        "run_notebook",
        "exception",
        "TimeoutError",
        "service.name",
        "python-runner",
        "notebook cell 7 timed out",
    ] {
        assert!(
            details.contains(needle),
            "span details lack {needle:?}: {details}"
        );
    }
    let logs = block_in_place(|| d.js("return document.getElementById('trace-logs').innerText"));
    assert!(
        logs.as_str().unwrap().contains("cell 7 still running"),
        "{logs}"
    );
    assert!(
        block_in_place(|| d.js("return location.hash"))
            .as_str()
            .unwrap()
            .ends_with(TOOL),
        "deep link not updated"
    );
    block_in_place(|| d.screenshot("dashboards/trace.png"));

    // Deep link straight to the open span.
    block_in_place(|| d.goto(&h.url(&format!("/#/span/{TRACE_A}/{OPEN}"))));
    let sel = block_in_place(|| {
        d.wait_for("open span selected", WAIT, "const e = document.getElementById('span-details'); return e && e.dataset.spanId === '53995c3f42cd8ad8' ? e.innerText : null")
    });
    assert!(sel.as_str().unwrap().contains("running"), "{sel}");

    // Incidents: a new one appears live, without a reload.
    block_in_place(|| d.goto(&h.url("/#/incidents")));
    block_in_place(|| {
        d.wait_for(
            "seeded incidents",
            WAIT,
            "return document.querySelectorAll('.timeline .incident').length === 2",
        )
    });
    block_in_place(|| {
        d.wait_for(
            "live connection",
            WAIT,
            "return document.getElementById('live').classList.contains('on')",
        )
    });
    let timeline = block_in_place(|| d.js("return document.querySelector('.timeline').innerText"));
    for needle in [
        "SIGTERM at",
        "exited at",
        "SIGKILL at",
        "rolled back",
        "runner nb-1",
        "span run_notebook",
    ] {
        assert!(
            timeline.as_str().unwrap().contains(needle),
            "timeline lacks {needle:?}: {timeline}"
        );
    }
    block_in_place(|| d.js("window.__stallwatch_no_reload = 42; return true"));
    let mut inc = incident(EventKind::RunnerTerminated, "live-1");
    inc.reason = "runner nb-1 terminated after tool span run_notebook overran".into();
    let recorded = h.events.publish(inc).await.unwrap().unwrap();
    let shown = block_in_place(|| {
        d.wait_for("live incident", WAIT, &format!("const e = document.querySelector('.incident[data-incident-id=\"{}\"]'); return e ? e.innerText : null", recorded.id))
    });
    assert!(
        shown
            .as_str()
            .unwrap()
            .contains("terminated after tool span"),
        "{shown}"
    );
    assert_eq!(
        block_in_place(|| d.js("return window.__stallwatch_no_reload")),
        json!(42),
        "the page reloaded"
    );

    // Now page: runner cards with breaker state and the open span with its progress.
    block_in_place(|| d.goto(&h.url("/#/now")));
    let now = block_in_place(|| {
        d.wait_for("runner cards", WAIT, "return document.querySelectorAll('.runner').length === 2 ? document.getElementById('view').innerText : null")
    });
    let now = now.as_str().unwrap();
    for needle in ["nb-1", "CLOSED", "py-2", "OPEN", "plot_results", "running"] {
        assert!(now.contains(needle), "Now page lacks {needle:?}: {now}");
    }
    block_in_place(|| d.screenshot("dashboards/now.png"));

    // Dark theme through prefers-color-scheme (Chrome DevTools emulation via chromedriver).
    block_in_place(|| {
        d.cdp(
            "Emulation.setEmulatedMedia",
            json!({"features": [{"name": "prefers-color-scheme", "value": "dark"}]}),
        )
    });
    let bg = block_in_place(|| {
        d.wait_for("dark background", WAIT, "const c = getComputedStyle(document.body).backgroundColor; return c === 'rgb(15, 18, 23)' ? c : null")
    });
    assert_eq!(bg, json!("rgb(15, 18, 23)"));
    block_in_place(|| d.screenshot("dashboards/now-dark.png"));
    block_in_place(|| drop(d));
    h.stop().await;
}

/// The Now page shows open spans a page at a time (GET /api/v1/open-spans, 100 a page):
/// with 250 open spans it shows the oldest 100 and a Next button, walks to the last 50
/// (no Next there), and back with Previous; never the whole ledger at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn now_page_pages_open_spans() {
    let h = Harness::start(DashboardConfig::default()).await;
    let now = stallwatch_storage::model::now_unix_nano();
    let rows: Vec<_> = (0..250u64)
        .map(|i| {
            let mut r = open_ledger_row(now - 1_000_000_000 + i);
            r.span_id = stallwatch_storage::model::SpanId((i + 1).to_be_bytes());
            r.name = format!("execute_tool page_{i:03}");
            stallwatch_storage::ledger::LedgerWrite::Upsert(Box::new(r))
        })
        .collect();
    h.storage.ledger_apply(rows.into()).await.unwrap();
    let profile = tempfile::tempdir().unwrap();
    let d = block_in_place(|| Driver::start(profile.path()));
    block_in_place(|| d.goto(&h.url("/#/now")));
    // the first page: the oldest 100, and a way on
    let shown = "const r = document.querySelectorAll('tr.open-span'); return r.length";
    let first = block_in_place(|| {
        d.wait_for(
            "the first page of open spans",
            WAIT,
            &format!("{shown} === 100 ? document.querySelector('tr.open-span').innerText : null"),
        )
    });
    assert!(first.as_str().unwrap().contains("page_000"), "{first}");
    let next =
        "Array.from(document.querySelectorAll('.pager button')).find(b => b.innerText === 'Next')";
    let prev = "Array.from(document.querySelectorAll('.pager button')).find(b => b.innerText === 'Previous')";
    for (page, first_name, count) in [(2, "page_100", 100), (3, "page_200", 50)] {
        block_in_place(|| d.js(&format!("{next}.click(); return true")));
        let row = block_in_place(|| {
            d.wait_for(&format!("page {page}"), WAIT, &format!("const r = document.querySelector('tr.open-span'); return r && r.innerText.includes('{first_name}') && document.querySelectorAll('tr.open-span').length === {count} ? r.innerText : null"))
        });
        assert!(row.as_str().unwrap().contains(first_name), "{row}");
    }
    assert_eq!(
        block_in_place(|| d.js(&format!("return !!{next}"))),
        json!(false),
        "a Next button on the last page"
    );
    block_in_place(|| d.js(&format!("{prev}.click(); return true")));
    block_in_place(|| {
        d.wait_for("back on page 2", WAIT, "const r = document.querySelector('tr.open-span'); return r && r.innerText.includes('page_100') && document.querySelectorAll('tr.open-span').length === 100")
    });
    block_in_place(|| d.screenshot("dashboards/now-open-spans-paged.png"));
    block_in_place(|| drop(d));
    h.stop().await;
}
