//! One export request cut into requests of at most `max` items (spans, log records, metric
//! points), each keeping its items' resource and scope (the OTLP data model: an item belongs
//! to the resource and scope it is listed under, so a piece repeats them).
//!
//! Why: one stored row is one export stallwatch accepted, and an export may hold far more
//! items than `batch_max_spans` (up to 20 MiB of them). Sent whole, an upstream that finds
//! it too large (HTTP 413, gRPC `RESOURCE_EXHAUSTED`) refused it for good and every item was
//! dropped; halving the batch size could not help a request of one row.
//!
//! Metrics are cut between metrics, not inside one: a metric's points share its name, kind
//! and temporality, and one metric with more than `max` points is sent alone.

use std::collections::VecDeque;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::logs::v1::ScopeLogs;
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, Metric, ScopeMetrics};
use opentelemetry_proto::tonic::trace::v1::ScopeSpans;

use super::client::Request;

/// Cuts a three-level OTLP request (resource → scope → items) into pieces of at most `max`
/// items by `weight`, each piece repeating the resource and scope its items came from.
macro_rules! cut {
    ($req:expr, $max:expr, $Req:ident, $res:ident, $scopes:ident, $Scope:ident, $items:ident, $weight:expr) => {{
        let max = ($max).max(1) as u64;
        let mut out: Vec<($Req, u64)> = Vec::new();
        let mut cur = $Req::default();
        let mut n = 0u64;
        // The (resource, scope) the current piece's last item came from.
        let mut last: Option<(usize, usize)> = None;
        for (ri, mut shell_r) in $req.$res.into_iter().enumerate() {
            let scopes: Vec<$Scope> = std::mem::take(&mut shell_r.$scopes);
            for (si, mut shell_s) in scopes.into_iter().enumerate() {
                let items = std::mem::take(&mut shell_s.$items);
                for item in items {
                    let w: u64 = ($weight)(&item);
                    if n > 0 && n + w > max {
                        out.push((std::mem::take(&mut cur), n));
                        n = 0;
                        last = None;
                    }
                    if last != Some((ri, si)) {
                        if last.map(|l| l.0) != Some(ri) {
                            cur.$res.push(shell_r.clone());
                        }
                        if let Some(r) = cur.$res.last_mut() {
                            r.$scopes.push(shell_s.clone());
                        }
                        last = Some((ri, si));
                    }
                    if let Some(s) = cur.$res.last_mut().and_then(|r| r.$scopes.last_mut()) {
                        s.$items.push(item);
                    }
                    n += w;
                }
            }
        }
        if !cur.$res.is_empty() || out.is_empty() {
            out.push((cur, n));
        }
        out
    }};
}

/// Data points in a metric.
pub fn metric_points(m: &Metric) -> u64 {
    match &m.data {
        Some(Data::Gauge(g)) => g.data_points.len() as u64,
        Some(Data::Sum(s)) => s.data_points.len() as u64,
        Some(Data::Histogram(h)) => h.data_points.len() as u64,
        Some(Data::ExponentialHistogram(h)) => h.data_points.len() as u64,
        Some(Data::Summary(s)) => s.data_points.len() as u64,
        None => 0,
    }
}

/// Items in a request: spans, log records or metric points.
fn weight(req: &Request) -> u64 {
    match req {
        Request::Traces(t) => t
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len() as u64)
            .sum(),
        Request::Logs(l) => l
            .resource_logs
            .iter()
            .flat_map(|r| &r.scope_logs)
            .map(|s| s.log_records.len() as u64)
            .sum(),
        Request::Metrics(m) => m
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .map(metric_points)
            .sum(),
    }
}

/// `req` as requests of at most `max` items each (`max` ≥ 1; a metric with more points is
/// one piece), in the order the items came, each with its item count. A request that fits
/// (the usual case) is returned as it is, not rebuilt; one with no items is one piece of 0
/// of its own signal.
pub fn cut(req: Request, max: usize) -> VecDeque<(Request, u64)> {
    let total = weight(&req);
    if total <= max.max(1) as u64 {
        return VecDeque::from([(req, total)]);
    }
    let pieces: Vec<(Request, u64)> = match req {
        Request::Traces(t) => cut!(
            t,
            max,
            ExportTraceServiceRequest,
            resource_spans,
            scope_spans,
            ScopeSpans,
            spans,
            |_: &_| 1u64
        )
        .into_iter()
        .map(|(r, n)| (Request::Traces(r), n))
        .collect(),
        Request::Logs(l) => cut!(
            l,
            max,
            ExportLogsServiceRequest,
            resource_logs,
            scope_logs,
            ScopeLogs,
            log_records,
            |_: &_| 1u64
        )
        .into_iter()
        .map(|(r, n)| (Request::Logs(r), n))
        .collect(),
        Request::Metrics(m) => cut!(
            m,
            max,
            ExportMetricsServiceRequest,
            resource_metrics,
            scope_metrics,
            ScopeMetrics,
            metrics,
            metric_points
        )
        .into_iter()
        .map(|(r, n)| (Request::Metrics(r), n))
        .collect(),
    };
    pieces.into_iter().collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
    use opentelemetry_proto::tonic::metrics::v1::{Gauge, NumberDataPoint, ResourceMetrics};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, Span};

    fn span(i: u8) -> Span {
        Span {
            span_id: vec![i; 8],
            name: format!("s{i}"),
            ..Default::default()
        }
    }

    fn traces() -> ExportTraceServiceRequest {
        let scope = |name: &str, spans: Vec<Span>| ScopeSpans {
            scope: Some(InstrumentationScope {
                name: name.into(),
                ..Default::default()
            }),
            spans,
            schema_url: format!("scope-{name}"),
        };
        let resource = |n: u32| Resource {
            dropped_attributes_count: n,
            ..Default::default()
        };
        ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    resource: Some(resource(1)),
                    scope_spans: vec![
                        scope("a", (0..5).map(span).collect()),
                        scope("b", (5..7).map(span).collect()),
                    ],
                    schema_url: "r1".into(),
                },
                ResourceSpans {
                    resource: Some(resource(2)),
                    scope_spans: vec![scope("c", (7..10).map(span).collect())],
                    schema_url: "r2".into(),
                },
            ],
        }
    }

    /// Every span once, in order, under its own resource and scope; no piece over `max`.
    #[test]
    fn spans_are_cut_keeping_their_resource_and_scope() {
        let whole = traces();
        for max in 1..=11 {
            let pieces = cut(Request::Traces(whole.clone()), max);
            let mut seen = Vec::new();
            for (p, n) in &pieces {
                let Request::Traces(t) = p else {
                    panic!("not traces")
                };
                let count: usize = t
                    .resource_spans
                    .iter()
                    .flat_map(|r| &r.scope_spans)
                    .map(|s| s.spans.len())
                    .sum();
                assert_eq!(count as u64, *n);
                assert!(*n as usize <= max && *n > 0, "max {max}: a piece of {n}");
                for r in &t.resource_spans {
                    for s in &r.scope_spans {
                        for sp in &s.spans {
                            let i = sp.span_id[0];
                            let (res, scope) = match i {
                                0..=4 => (1, "a"),
                                5..=6 => (1, "b"),
                                _ => (2, "c"),
                            };
                            assert_eq!(r.resource.as_ref().unwrap().dropped_attributes_count, res);
                            assert_eq!(r.schema_url, format!("r{res}"));
                            assert_eq!(s.scope.as_ref().unwrap().name, scope);
                            assert_eq!(s.schema_url, format!("scope-{scope}"));
                            seen.push(i);
                        }
                    }
                }
            }
            assert_eq!(seen, (0..10).collect::<Vec<u8>>(), "max {max}");
            assert_eq!(pieces.len(), 10usize.div_ceil(max), "max {max}");
        }
    }

    /// A scope change within one resource opens a scope, not a second copy of the resource;
    /// a request that fits comes back whole; an empty one stays a request of its signal.
    #[test]
    fn a_resource_is_not_repeated_within_a_piece_and_small_requests_stay_whole() {
        let pieces = cut(Request::Traces(traces()), 9);
        let Some((Request::Traces(first), 9)) = pieces.front() else {
            panic!("first piece: {pieces:?}")
        };
        assert_eq!(first.resource_spans.len(), 2, "{first:?}");
        assert_eq!(first.resource_spans[0].scope_spans.len(), 2);
        let whole = cut(Request::Traces(traces()), 10);
        assert_eq!(whole.len(), 1);
        assert!(matches!(&whole[0], (Request::Traces(t), 10) if *t == traces()));
        let empty = cut(Request::Logs(ExportLogsServiceRequest::default()), 5);
        assert!(
            matches!(empty.front(), Some((Request::Logs(_), 0))) && empty.len() == 1,
            "{empty:?}"
        );
    }

    /// Metrics are cut between metrics; one larger than `max` goes alone.
    #[test]
    fn metrics_are_cut_between_metrics() {
        let gauge = |name: &str, points: usize| Metric {
            name: name.into(),
            data: Some(Data::Gauge(Gauge {
                data_points: vec![NumberDataPoint::default(); points],
            })),
            ..Default::default()
        };
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![gauge("a", 2), gauge("b", 5), gauge("c", 1), gauge("d", 1)],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let pieces = cut(Request::Metrics(req), 3);
        let names: Vec<(Vec<String>, u64)> = pieces
            .iter()
            .map(|(p, n)| {
                let Request::Metrics(m) = p else {
                    panic!("not metrics")
                };
                let names = m.resource_metrics[0].scope_metrics[0]
                    .metrics
                    .iter()
                    .map(|m| m.name.clone())
                    .collect();
                (names, *n)
            })
            .collect();
        assert_eq!(
            names,
            vec![
                (vec!["a".to_string()], 2),
                (vec!["b".to_string()], 5),
                (vec!["c".to_string(), "d".to_string()], 2)
            ]
        );
    }
}
