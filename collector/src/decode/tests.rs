//! Unit tests of the decode layer: one test per OTLP/JSON rule and per shared validation
//! rule, each able to fail. Case files come from the project's own copy under
//! `tests/data/cases/payloads/`.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::trace::v1 as pt;
use prost::Message;
use serde_json::{json, Value};
use stallwatch_storage::model::{attr, AnyValue, MetricKind, TraceBatch, UNKNOWN_SERVICE};

use super::*;

const LIMITS: Limits = Limits {
    max_nesting_depth: 32,
};

macro_rules! case {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/data/cases/payloads/",
            $name
        ))
    };
}

fn traces_json(v: &Value) -> Result<Decoded<TraceBatch>, DecodeError> {
    decode_traces(v.to_string().as_bytes(), Format::Json, &LIMITS)
}

/// A one-span request with `span` merged over a valid span.
fn one_span(span: Value) -> Value {
    let mut base = json!({
        "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
        "spanId": "b7ad6b7169203331",
        "name": "s",
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2"
    });
    for (k, v) in span.as_object().unwrap() {
        base[k] = v.clone();
    }
    json!({"resourceSpans": [{"scopeSpans": [{"spans": [base]}]}]})
}

fn attr_value(v: Value) -> Value {
    one_span(json!({"attributes": [{"key": "a", "value": v}]}))
}

fn first_attr(d: &Decoded<TraceBatch>) -> AnyValue {
    d.batch.spans().next().unwrap().2.attributes[0]
        .value
        .clone()
}

#[test]
fn hex_ids_are_case_insensitive() {
    let lower = decode_traces(
        case!("crafted/c01_ids_lowercase_hex.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    let mixed = decode_traces(
        case!("crafted/c01_ids_mixedcase_hex.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(lower.batch.span_count(), 2);
    assert_eq!(lower.batch, mixed.batch);
    let span = lower.batch.spans().next().unwrap().2;
    assert_eq!(span.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    let upper = traces_json(&one_span(
        json!({"traceId": "4BF92F3577B34DA6A3CE929D0E0E4736"}),
    ))
    .unwrap();
    assert_eq!(
        upper.batch.spans().next().unwrap().2.trace_id,
        span.trace_id
    );
}

#[test]
fn base64_ids_are_refused_naming_the_field() {
    let err =
        decode_traces(case!("crafted/c01_ids_base64.json"), Format::Json, &LIMITS).unwrap_err();
    assert!(
        err.0
            .starts_with("resourceSpans[0].scopeSpans[0].spans[0].traceId: "),
        "{err}"
    );
    assert!(err.0.contains("base64"), "{err}");
    let err = traces_json(&one_span(json!({"spanId": "APBnqgupArc="}))).unwrap_err();
    assert!(err.0.contains("spans[0].spanId"), "{err}");
}

#[test]
fn non_hex_and_wrong_length_ids_are_refused() {
    let err =
        decode_traces(case!("crafted/c09_ids_non_hex.json"), Format::Json, &LIMITS).unwrap_err();
    assert!(
        err.0.contains("traceId") && err.0.contains("not hexadecimal"),
        "{err}"
    );
    let err = decode_traces(
        case!("crafted/c09_ids_wrong_length.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap_err();
    assert!(
        err.0.contains("traceId") && err.0.contains("want 32 hex characters, got 30"),
        "{err}"
    );
    let err = traces_json(&one_span(json!({"parentSpanId": "abc"}))).unwrap_err();
    assert!(err.0.contains("parentSpanId"), "{err}");
    let err = traces_json(&one_span(json!({"traceId": 12}))).unwrap_err();
    assert!(
        err.0.contains("traceId") && err.0.contains("hex string"),
        "{err}"
    );
}

#[test]
fn a_span_ending_before_it_starts_is_refused_naming_it() {
    let v = json!({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "b7ad6b7169203331",
         "name": "backwards", "startTimeUnixNano": "2000", "endTimeUnixNano": "1000"},
        {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "b7ad6b7169203332",
         "name": "instant", "startTimeUnixNano": "1000", "endTimeUnixNano": "1000"},
        {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "b7ad6b7169203333",
         "name": "open", "startTimeUnixNano": "1000", "endTimeUnixNano": "0"}
    ]}]}]});
    let d = traces_json(&v).unwrap();
    // Zero-length and open (end 0) spans are healthy; only the backwards one goes.
    assert_eq!((d.batch.span_count(), d.rejected), (2, 1));
    assert_eq!(d.rejected_end_before_start, 1);
    assert!(
        d.message.starts_with(
            "1 span refused: span \"backwards\" (spanId b7ad6b7169203331) ends before it starts"
        ),
        "{}",
        d.message
    );
}

#[test]
fn empty_and_all_zero_ids_refuse_the_span_with_a_count() {
    let d = decode_traces(
        case!("crafted/c09_trace_id_empty_string.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    assert_eq!((d.batch.span_count(), d.rejected), (0, 1));
    assert!(
        d.message.starts_with("1 span refused: traceId"),
        "{}",
        d.message
    );
    let d = decode_traces(
        case!("crafted/c09_trace_id_all_zero.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    assert_eq!((d.batch.span_count(), d.rejected), (0, 1));
    let d = decode_traces(
        case!("crafted/c09_trace_id_all_zero.pb"),
        Format::Protobuf,
        &LIMITS,
    )
    .unwrap();
    assert_eq!((d.batch.span_count(), d.rejected), (0, 1));
    // Mixed batch: one good, two refused.
    let v = json!({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "b7ad6b7169203331"},
        {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "0000000000000000"},
        {"spanId": "b7ad6b7169203331"}
    ]}]}]});
    let d = traces_json(&v).unwrap();
    assert_eq!((d.batch.span_count(), d.rejected), (1, 2));
    assert!(d.message.starts_with("2 spans refused"), "{}", d.message);
}

#[test]
fn empty_parent_is_a_root_span() {
    let d = decode_traces(
        case!("crafted/c09_root_span_empty_parent.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(d.batch.span_count(), 1);
    assert_eq!(d.batch.spans().next().unwrap().2.parent_span_id, None);
    let d = traces_json(&one_span(json!({"parentSpanId": "00F067AA0BA902B7"}))).unwrap();
    assert_eq!(
        d.batch
            .spans()
            .next()
            .unwrap()
            .2
            .parent_span_id
            .unwrap()
            .to_hex(),
        "00f067aa0ba902b7"
    );
}

#[test]
fn int64_as_numbers_and_strings_keep_full_precision() {
    for file in [
        &case!("crafted/c02_int64_as_numbers.json")[..],
        &case!("crafted/c02_int64_as_strings.json")[..],
    ] {
        let d = decode_traces(file, Format::Json, &LIMITS).unwrap();
        let span = d.batch.spans().next().unwrap().2;
        assert_eq!(span.start_time_unix_nano, 1_700_000_000_123_456_789);
        assert_ne!(span.start_time_unix_nano, 1_700_000_000_123_456_768);
        assert_eq!(span.end_time_unix_nano, 1_700_000_001_623_456_789);
        assert_eq!(
            attr(&span.attributes, "tokens.max"),
            Some(&AnyValue::Int(i64::MAX))
        );
        assert_eq!(
            attr(&span.attributes, "tokens.min"),
            Some(&AnyValue::Int(i64::MIN))
        );
    }
}

#[test]
fn out_of_range_and_fractional_ints_are_refused() {
    let err = decode_traces(
        case!("crafted/c02_int64_out_of_range.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap_err();
    assert!(
        err.0.contains("intValue") && err.0.contains("out of range"),
        "{err}"
    );
    let err = decode_traces(
        case!("crafted/c02_int64_fractional.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap_err();
    assert!(
        err.0.contains("intValue") && err.0.contains("must be an integer"),
        "{err}"
    );
    for bad in [
        json!("1.5"),
        json!(-1),
        json!("-1"),
        json!(18446744073709551616.0),
        json!("abc"),
        json!(true),
    ] {
        let err = traces_json(&one_span(json!({"startTimeUnixNano": bad.clone()}))).unwrap_err();
        assert!(err.0.contains("startTimeUnixNano"), "{bad}: {err}");
    }
    assert!(traces_json(&one_span(json!({"flags": 4294967296u64}))).is_err());
    assert!(traces_json(&attr_value(json!({"intValue": "-9223372036854775809"}))).is_err());
    // Beyond 2^53 an exponent form in range is refused for what it is, not as out of range.
    let err = traces_json(&one_span(json!({"startTimeUnixNano": 1.7e18}))).unwrap_err();
    assert!(
        err.0.contains("exponent")
            && err.0.contains("decimal integer")
            && !err.0.contains("out of range"),
        "{err}"
    );
    // Integral exponent forms within 2^53 are exact and accepted.
    let d = traces_json(&one_span(
        json!({"startTimeUnixNano": 1e3, "endTimeUnixNano": 2e3}),
    ))
    .unwrap();
    assert_eq!(d.batch.spans().next().unwrap().2.start_time_unix_nano, 1000);
}

#[test]
fn special_doubles_are_accepted() {
    let d = decode_traces(
        case!("crafted/c02_double_special_strings.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    let span = d.batch.spans().next().unwrap().2;
    let get = |k| match attr(&span.attributes, k) {
        Some(AnyValue::Double(d)) => *d,
        other => panic!("{k}: {other:?}"),
    };
    assert!(get("score.nan").is_nan());
    assert_eq!(get("score.inf"), f64::INFINITY);
    assert_eq!(get("score.neginf"), f64::NEG_INFINITY);
    assert_eq!(get("score.int"), 3.0);
    assert_eq!(get("score.str"), 2.5);
    // the Rust SDK's HTTP/JSON exporter writes NaN and ±Inf as null: still a double
    let d = traces_json(&attr_value(json!({"doubleValue": null}))).unwrap();
    match first_attr(&d) {
        AnyValue::Double(v) => assert!(v.is_nan(), "{v}"),
        other => panic!("doubleValue null became {other:?}"),
    }
    for bad in [json!("inf"), json!("nan"), json!("2.5x"), json!([1])] {
        assert!(
            traces_json(&attr_value(json!({"doubleValue": bad.clone()}))).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn enums_as_ints_and_names() {
    let d = decode_traces(
        case!("crafted/c04_enums_as_names.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    let span = d.batch.spans().next().unwrap().2;
    assert_eq!((span.kind, span.status.code), (2, 2));
    let d = decode_traces(
        case!("crafted/c04_enums_unknown_values.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    let span = d.batch.spans().next().unwrap().2;
    assert_eq!((span.kind, span.status.code), (42, 9));
    let err = decode_traces(
        case!("crafted/c04_enum_unknown_name.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap_err();
    assert!(
        err.0.contains("spans[0].kind") && err.0.contains("\"SERVER\""),
        "{err}"
    );
    assert!(traces_json(&one_span(json!({"kind": 4294967296u64}))).is_err());
}

#[test]
fn snake_case_field_names_are_accepted() {
    let camel = decode_traces(
        case!("crafted/c01_ids_lowercase_hex.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    let snake = decode_traces(
        case!("crafted/c05_snake_case_field_names.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(snake.batch.span_count(), 2);
    assert_eq!(camel.batch, snake.batch);
    let up = decode_traces(
        case!("upstream/otelproto_examples_trace_v7de58cc_snakecase_numeric_int64.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(up.batch.span_count(), 1);
}

#[test]
fn unknown_fields_ignored_and_nulls_are_defaults() {
    let v = json!({"resourceSpans": [{"resource": null, "whatever": 1, "scopeSpans": [{"scope": null, "spans": [
        {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "b7ad6b7169203331", "attributes": null,
         "events": null, "links": null, "status": null, "name": null, "newField": {"x": [1, 2]}}
    ]}, {"spans": null}]}], "extra": "ignored"});
    let d = traces_json(&v).unwrap();
    assert_eq!(d.batch.span_count(), 1);
    let span = d.batch.spans().next().unwrap().2;
    assert!(span.attributes.is_empty() && span.events.is_empty() && span.name.is_empty());
    let err = traces_json(&json!({"resourceSpans": {"not": "a list"}})).unwrap_err();
    assert!(
        err.0.starts_with("resourceSpans: expected an array"),
        "{err}"
    );
}

#[test]
fn empty_requests_are_empty_batches() {
    for body in [
        &b""[..],
        b"  \n",
        b"{}",
        case!("crafted/c07_empty_resourceSpans.json"),
        case!("crafted/c07_empty_at_every_level.json"),
    ] {
        let d = decode_traces(body, Format::Json, &LIMITS).unwrap();
        assert_eq!((d.batch.span_count(), d.rejected), (0, 0));
    }
    assert_eq!(
        decode_traces(b"", Format::Protobuf, &LIMITS)
            .unwrap()
            .batch
            .span_count(),
        0
    );
    assert!(decode_traces(b"[]", Format::Json, &LIMITS).is_err());
    let err = decode_traces(
        case!("crafted/c20_truncated_body.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap_err();
    assert!(err.0.starts_with("invalid JSON"), "{err}");
}

#[test]
fn span_without_resource_gets_the_default_service() {
    let d = decode_traces(
        case!("crafted/c07_no_resource_no_scope.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    let (resource, scope, _) = d.batch.spans().next().unwrap();
    assert_eq!(resource.service_name(), UNKNOWN_SERVICE);
    assert!(scope.name.is_empty());
}

#[test]
fn bytes_value_is_base64() {
    let d = decode_traces(
        case!("upstream/jaeger_span_tags_trace_bytesValue.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    let span = d.batch.spans().next().unwrap().2;
    assert!(span
        .attributes
        .iter()
        .any(|kv| kv.value == AnyValue::Bytes(vec![0, 0, 0x30, 0x39])));
    for (text, want) in [
        ("AAAwOQ==", vec![0, 0, 0x30, 0x39]),
        ("AAAwOQ", vec![0, 0, 0x30, 0x39]),
        ("-_8", vec![0xfb, 0xff]),
    ] {
        let d = traces_json(&attr_value(json!({"bytesValue": text}))).unwrap();
        assert_eq!(first_attr(&d), AnyValue::Bytes(want), "{text}");
    }
    assert!(traces_json(&attr_value(json!({"bytesValue": "!!!"}))).is_err());
}

#[test]
fn any_value_with_two_values_is_refused() {
    let err = traces_json(&attr_value(json!({"stringValue": "a", "intValue": "1"}))).unwrap_err();
    assert!(err.0.contains("more than one value"), "{err}");
    assert_eq!(
        first_attr(&traces_json(&attr_value(json!({}))).unwrap()),
        AnyValue::Empty
    );
}

fn nested_json(depth: usize) -> Value {
    let mut v = json!({"stringValue": "leaf"});
    for _ in 1..depth {
        v = json!({"arrayValue": {"values": [v]}});
    }
    v
}

fn nested_json_kvlist(depth: usize) -> Value {
    let mut v = json!({"stringValue": "leaf"});
    for _ in 1..depth {
        v = json!({"kvlistValue": {"values": [{"key": "k", "value": v}]}});
    }
    v
}

fn nested_proto(depth: usize, kvlist: bool) -> pc::AnyValue {
    let mut v = pc::AnyValue {
        value: Some(pc::any_value::Value::StringValue("leaf".into())),
    };
    for _ in 1..depth {
        let inner = if kvlist {
            pc::any_value::Value::KvlistValue(pc::KeyValueList {
                values: vec![pc::KeyValue {
                    key: "k".into(),
                    value: Some(v),
                    ..Default::default()
                }],
            })
        } else {
            pc::any_value::Value::ArrayValue(pc::ArrayValue { values: vec![v] })
        };
        v = pc::AnyValue { value: Some(inner) };
    }
    v
}

fn proto_request(span: pt::Span) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![pt::ResourceSpans {
            scope_spans: vec![pt::ScopeSpans {
                spans: vec![span],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn proto_span() -> pt::Span {
    pt::Span {
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        ..Default::default()
    }
}

#[test]
fn nesting_deeper_than_the_limit_is_refused() {
    assert!(traces_json(&attr_value(nested_json(32))).is_ok());
    let err = traces_json(&attr_value(nested_json(33))).unwrap_err();
    assert!(err.0.contains("nested deeper than 32"), "{err}");
    // kvlists nest as deep as in protobuf (each costs four JSON levels: serde_json's own
    // recursion limit of 128 refused 31 of them)
    assert!(traces_json(&attr_value(nested_json_kvlist(32))).is_ok());
    let err = traces_json(&attr_value(nested_json_kvlist(33))).unwrap_err();
    assert!(err.0.contains("nested deeper than 32"), "{err}");
    // Far deeper: stopped before any parsing, with a clean error; brackets inside strings
    // do not count.
    let err = traces_json(&attr_value(nested_json(200))).unwrap_err();
    assert!(err.0.contains("nested deeper than 192 levels"), "{err}");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let r = traces_json(&json!({"resourceSpans": [], "x": deep, "y": "\\\"[{"}));
    assert!(r.is_ok(), "a string's brackets counted: {:?}", r.err());
    let body = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = decode_traces(body.as_bytes(), Format::Json, &LIMITS).unwrap_err();
    assert!(err.0.contains("nested deeper than 192 levels"), "{err}");
    let mut span = proto_span();
    span.attributes = vec![pc::KeyValue {
        key: "a".into(),
        value: Some(nested_proto(32, false)),
        ..Default::default()
    }];
    assert!(decode_traces(&proto_request(span.clone()), Format::Protobuf, &LIMITS).is_ok());
    span.attributes[0].value = Some(nested_proto(33, false));
    let err = decode_traces(&proto_request(span.clone()), Format::Protobuf, &LIMITS).unwrap_err();
    assert!(err.0.contains("nested deeper than 32"), "{err}");
    // kvlists cost prost three message levels each: its recursion limit answers first.
    span.attributes[0].value = Some(nested_proto(33, true));
    let err = decode_traces(&proto_request(span), Format::Protobuf, &LIMITS).unwrap_err();
    assert!(
        err.0.contains("nested deeper") && err.0.len() < 400,
        "{err}"
    );
}

#[test]
fn protobuf_ids_are_validated_like_json() {
    let mut span = proto_span();
    span.trace_id = vec![1; 15];
    let err = decode_traces(&proto_request(span), Format::Protobuf, &LIMITS).unwrap_err();
    assert_eq!(
        err.0,
        "resourceSpans[0].scopeSpans[0].spans[0].traceId: invalid trace id length: got 15 bytes, want 16"
    );
    let mut span = proto_span();
    span.span_id = vec![0; 8];
    let d = decode_traces(&proto_request(span), Format::Protobuf, &LIMITS).unwrap();
    assert_eq!((d.batch.span_count(), d.rejected), (0, 1));
    let err = decode_traces(b"\x0a\xff\xff", Format::Protobuf, &LIMITS).unwrap_err();
    assert!(
        err.0.starts_with("cannot decode ExportTraceServiceRequest"),
        "{err}"
    );
}

#[test]
fn json_and_protobuf_twins_decode_to_the_same_spans() {
    let j = decode_traces(
        case!("upstream/otelproto_examples_trace.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    let p = decode_traces(
        case!("upstream/otelproto_examples_trace.protobuf-bin"),
        Format::Protobuf,
        &LIMITS,
    )
    .unwrap();
    let c = decode_traces(
        case!("crafted/c19_official_trace_json_as_protobuf.pb"),
        Format::Protobuf,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(j.batch.span_count(), 1);
    assert_eq!(j.batch, p.batch);
    assert_eq!(j.batch, c.batch);
    assert_eq!(
        j.batch.spans().next().unwrap().2.trace_id.to_hex(),
        "5b8efff798038103d269b633813fc60c"
    );
}

#[test]
fn upstream_fixtures_keep_links_events_flags_and_dropped_counts() {
    let d = decode_traces(
        case!("upstream/jaeger_otlp_fields_trace.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    let span = d.batch.spans().next().unwrap().2;
    let raw: Value =
        serde_json::from_slice(case!("upstream/jaeger_otlp_fields_trace.json")).unwrap();
    let rs = &raw["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    assert_eq!(
        u64::from(span.dropped_attributes_count),
        rs["droppedAttributesCount"].as_u64().unwrap_or(0)
    );
    assert_eq!(
        u64::from(span.dropped_events_count),
        rs["droppedEventsCount"].as_u64().unwrap_or(0)
    );
    assert_eq!(
        u64::from(span.dropped_links_count),
        rs["droppedLinksCount"].as_u64().unwrap_or(0)
    );
    assert!(
        span.dropped_attributes_count + span.dropped_events_count + span.dropped_links_count > 0
    );
    let d = decode_traces(
        case!("upstream/jaeger_otlp_span_links_v900a9d7.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(d.batch.spans().next().unwrap().2.links.len(), 1);
    let d = decode_traces(
        case!("upstream/jaeger_memory_otel_traces_01.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(d.batch.span_count(), 4);
    let kinds: Vec<i32> = d.batch.spans().map(|s| s.2.kind).collect();
    for k in 2..=5 {
        assert!(kinds.contains(&k), "{kinds:?}");
    }
    // A JSON document with a leading stray backslash is a clean 400.
    assert!(decode_traces(
        case!("upstream/jaeger_otlp_span_links_v20b939c_leading_backslash.json"),
        Format::Json,
        &LIMITS
    )
    .is_err());
}

/// Records timed after i64::MAX ns (2262) are refused alone with partial success: stored,
/// their INTEGER time wrapped negative, listed but out of every time range.
#[test]
fn logs_and_points_timed_after_2262_are_refused_alone() {
    let late = u64::MAX.to_string();
    let v = json!({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"timeUnixNano": "1700000000000000000", "body": {"stringValue": "now"}},
        {"timeUnixNano": late, "body": {"stringValue": "late"}},
        {"observedTimeUnixNano": "9223372036854775808", "body": {"stringValue": "late too"}},
        {"timeUnixNano": "9223372036854775807", "body": {"stringValue": "the last storable"}}
    ]}]}]});
    let d = decode_logs(v.to_string().as_bytes(), Format::Json, &LIMITS).unwrap();
    assert_eq!((d.batch.record_count(), d.rejected), (2, 2));
    assert!(d.message.contains("after 2262-04-11"), "{}", d.message);
    assert!(d.message.contains("logRecords[1]"), "{}", d.message);
    let gauge = |t: &str| json!({"timeUnixNano": t, "asDouble": 1.0});
    let v = json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "g", "gauge": {"dataPoints": [gauge("1700000000000000000"), gauge(&late)]}},
        {"name": "h", "gauge": {"dataPoints": [gauge(&late)]}}
    ]}]}]});
    let d = decode_metrics(v.to_string().as_bytes(), Format::Json, &LIMITS).unwrap();
    assert_eq!((d.batch.point_count(), d.rejected), (1, 2));
    assert!(d.message.contains("after 2262-04-11"), "{}", d.message);
}

#[test]
fn logs_are_linked_to_their_trace_and_span() {
    let v = json!({"resourceLogs": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
    "scopeLogs": [{"logRecords": [
        {"timeUnixNano": "1700000000123456789", "severityNumber": "SEVERITY_NUMBER_WARN", "body": {"stringValue": "hi"},
         "traceId": "4BF92F3577B34DA6A3CE929D0E0E4736", "spanId": "b7ad6b7169203331", "eventName": "e"},
        {"severity_number": 9, "trace_id": "", "span_id": "0000000000000000"}
    ]}]}]});
    let d = decode_logs(v.to_string().as_bytes(), Format::Json, &LIMITS).unwrap();
    assert_eq!(d.batch.record_count(), 2);
    let recs = &d.batch.resource_logs[0].scope_logs[0].log_records;
    assert_eq!(
        recs[0].trace_id.unwrap().to_hex(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(recs[0].span_id.unwrap().to_hex(), "b7ad6b7169203331");
    assert_eq!(
        (recs[0].severity_number, recs[0].time_unix_nano),
        (13, 1_700_000_000_123_456_789)
    );
    assert_eq!(
        (recs[1].trace_id, recs[1].span_id, recs[1].severity_number),
        (None, None, 9)
    );
    let bad =
        json!({"resourceLogs": [{"scopeLogs": [{"logRecords": [{"severityNumber": "LOUD"}]}]}]});
    assert!(decode_logs(bad.to_string().as_bytes(), Format::Json, &LIMITS).is_err());
    let up = decode_logs(
        case!("upstream/otelproto_examples_logs.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    assert!(up.batch.record_count() >= 1);
    let ev = decode_logs(
        case!("upstream/otelproto_examples_events.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    assert!(ev.batch.resource_logs[0].scope_logs[0]
        .log_records
        .iter()
        .any(|r| !r.event_name.is_empty()));
}

#[test]
fn metrics_are_flattened_to_points() {
    let d = decode_metrics(
        case!("upstream/otelproto_examples_metrics.json"),
        Format::Json,
        &LIMITS,
    )
    .unwrap();
    let p = d.batch.point_count();
    assert!(p >= 4, "{p}");
    let points: Vec<_> = d
        .batch
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.points)
        .collect();
    assert!(points
        .iter()
        .any(|p| p.kind == MetricKind::Histogram && p.count.is_some()));
    assert!(points
        .iter()
        .any(|p| p.kind == MetricKind::Sum && p.value.is_some()));
    for p in &points {
        serde_json::from_str::<Value>(&p.detail).unwrap();
    }
    // Exact int value kept in detail; temporality by name; no-data metric reported.
    let v = json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "g", "gauge": {"dataPoints": [{"asInt": "9007199254740993", "timeUnixNano": 5}]}},
        {"name": "s", "sum": {"aggregationTemporality": "AGGREGATION_TEMPORALITY_DELTA", "isMonotonic": true,
            "dataPoints": [{"asDouble": "NaN"}]}},
        {"name": "empty"}
    ]}]}]});
    let d = decode_metrics(v.to_string().as_bytes(), Format::Json, &LIMITS).unwrap();
    assert_eq!(d.batch.point_count(), 2);
    let pts = &d.batch.resource_metrics[0].scope_metrics[0].points;
    let detail: Value = serde_json::from_str(&pts[0].detail).unwrap();
    assert_eq!(detail["as_int"], "9007199254740993");
    assert!(pts[1].value.unwrap().is_nan());
    let detail: Value = serde_json::from_str(&pts[1].detail).unwrap();
    assert_eq!(
        detail["aggregation_temporality"],
        "AGGREGATION_TEMPORALITY_DELTA"
    );
    assert_eq!(d.rejected, 0);
    assert!(d.message.contains("\"empty\""), "{}", d.message);
    let bad = json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "x", "gauge": {}, "sum": {}}]}]}]});
    assert!(decode_metrics(bad.to_string().as_bytes(), Format::Json, &LIMITS).is_err());
}

/// Histogram points that are not histograms are refused alone, each named (partial
/// success); a valid one beside them is kept, and one with no buckets at all is valid.
/// A count that is not the sum of the buckets (with `zero_count` for an exponential one)
/// is refused too.
#[test]
fn invalid_summary_points_are_refused_alone() {
    let v = json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "s", "summary": {"dataPoints": [
            {"count": "3", "sum": 6, "quantileValues": [{"quantile": 0, "value": 1}, {"quantile": 0.5, "value": 2}, {"quantile": 1, "value": 3}]},
            {"count": "0", "sum": 0, "quantileValues": [{"quantile": 0.5, "value": "NaN"}]},
            {"count": "3", "sum": 6, "quantileValues": [{"quantile": 2, "value": 1}]},
            {"count": "3", "sum": 6, "quantileValues": [{"quantile": "NaN", "value": 1}]},
            {"count": "3", "sum": 6, "quantileValues": [{"quantile": 0.9, "value": -4}]}
        ]}}
    ]}]}]});
    let d = decode_metrics(v.to_string().as_bytes(), Format::Json, &LIMITS).unwrap();
    assert_eq!((d.batch.point_count(), d.rejected), (2, 3), "{}", d.message);
    assert!(
        d.message
            .contains("summary.dataPoints[2]: quantile_values[0].quantile is 2"),
        "{}",
        d.message
    );
    use super::convert::summary_quantiles_invalid as invalid;
    assert_eq!(invalid(&[(0.0, 0.0), (1.0, f64::NAN), (0.99, -0.0)]), None);
    assert!(invalid(&[(f64::NAN, 1.0)]).is_some());
    assert!(invalid(&[(-0.1, 1.0)]).is_some());
    assert!(invalid(&[(0.5, -1.0)]).is_some_and(|m| m.contains("must not be negative")));
}

#[test]
fn invalid_histogram_points_are_refused_alone() {
    let v = json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "h", "histogram": {"dataPoints": [
            {"explicitBounds": [1, 10], "bucketCounts": ["1", "2", "3"], "count": "6"},
            {"explicitBounds": [10, 1], "bucketCounts": ["1", "2", "3"], "count": "6"},
            {"explicitBounds": [1, "NaN"], "bucketCounts": ["1", "2", "3"], "count": "6"},
            {"explicitBounds": [1, 10], "bucketCounts": ["1", "2"], "count": "3"},
            {"count": "4", "sum": 2.5},
            {"explicitBounds": [1, 10], "bucketCounts": ["1", "2", "3"], "count": "7"}
        ]}},
        {"name": "e", "exponentialHistogram": {"dataPoints": [
            {"scale": 3, "count": "1", "positive": {"offset": 1, "bucketCounts": ["1"]}},
            {"scale": 1000, "count": "1"},
            {"scale": -11, "count": "1"},
            {"scale": 3, "count": "6", "zeroCount": "1",
                "positive": {"bucketCounts": ["1", "2"]}, "negative": {"bucketCounts": ["2"]}},
            {"scale": 3, "count": "5", "zeroCount": "1",
                "positive": {"bucketCounts": ["1", "2"]}, "negative": {"bucketCounts": ["2"]}}
        ]}}
    ]}]}]});
    let d = decode_metrics(v.to_string().as_bytes(), Format::Json, &LIMITS).unwrap();
    assert_eq!(d.batch.point_count(), 4, "{}", d.message);
    assert_eq!(d.rejected, 7, "{}", d.message);
    use super::convert::histogram_count_invalid as count_invalid;
    assert_eq!(count_invalid(9, []), None);
    assert_eq!(count_invalid(3, [1, 2]), None);
    assert!(count_invalid(0, [u64::MAX, 1]).is_some_and(|m| m.contains("past 2^64")));
    // each named alone (the message gives the first refusal)
    for (metric, point, why) in [
        (
            json!({"name": "h", "histogram": {"dataPoints": [
                {"explicitBounds": [1, 10], "bucketCounts": ["1", "2", "3"], "count": "7"}]}}),
            "histogram.dataPoints[0]",
            "bucket counts sum to 6 but count is 7",
        ),
        (
            json!({"name": "e", "exponentialHistogram": {"dataPoints": [
                {"scale": 3, "count": "5", "zeroCount": "1",
                    "positive": {"bucketCounts": ["1", "2"]}, "negative": {"bucketCounts": ["2"]}}]}}),
            "exponentialHistogram.dataPoints[0]",
            "bucket counts sum to 6 but count is 5",
        ),
    ] {
        let v = json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [metric]}]}]});
        let d = decode_metrics(v.to_string().as_bytes(), Format::Json, &LIMITS).unwrap();
        assert_eq!((d.batch.point_count(), d.rejected), (0, 1), "{}", d.message);
        assert!(
            d.message.contains(&format!("{point}: {why}")),
            "{}",
            d.message
        );
    }
    assert!(
        d.message.contains("not strictly increasing"),
        "{}",
        d.message
    );
    for (why, bounds, counts) in [
        ("not strictly increasing", vec![10.0, 1.0], 3),
        ("is NaN", vec![1.0, f64::NAN], 3),
        ("it needs 3", vec![1.0, 10.0], 2),
    ] {
        assert!(
            super::convert::histogram_buckets_invalid(&bounds, counts)
                .is_some_and(|m| m.contains(why)),
            "{why}"
        );
    }
    assert_eq!(
        super::convert::histogram_buckets_invalid(&[1.0, f64::INFINITY], 3),
        None
    );
    assert_eq!(super::convert::histogram_buckets_invalid(&[], 0), None);
}

/// The old whole-request decode, kept here as the reference for the per-span scan.
fn whole_request(body: &[u8]) -> Result<Decoded<TraceBatch>, DecodeError> {
    convert::traces(protobuf(body, "ExportTraceServiceRequest")?, &LIMITS)
}

#[test]
fn per_span_scan_decodes_like_the_whole_request() {
    let c14 = flate2::read::GzDecoder::new(&case!("crafted/c14_trace.pb.gz")[..]);
    let c14: Vec<u8> = std::io::Read::bytes(c14).map(Result::unwrap).collect();
    for body in [
        &case!("upstream/otelproto_examples_trace.protobuf-bin")[..],
        &case!("crafted/c19_official_trace_json_as_protobuf.pb")[..],
        &case!("crafted/c09_trace_id_all_zero.pb")[..],
        &case!("crafted/c14_trace.pb")[..],
        &c14[..],
        &[][..],
    ] {
        let want = whole_request(body).unwrap();
        let got = decode_traces(body, Format::Protobuf, &LIMITS).unwrap();
        assert_eq!(got, want);
    }
}

#[test]
fn per_span_scan_takes_fields_in_any_order_and_skips_unknown_ones() {
    let mut span = proto_span();
    span.name = "late resource".into();
    let rs = pt::ResourceSpans {
        resource: Some(opentelemetry_proto::tonic::resource::v1::Resource {
            attributes: vec![pc::KeyValue {
                key: "service.name".into(),
                value: Some(pc::AnyValue {
                    value: Some(pc::any_value::Value::StringValue("svc".into())),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        scope_spans: vec![pt::ScopeSpans {
            scope: Some(pc::InstrumentationScope {
                name: "sc".into(),
                ..Default::default()
            }),
            spans: vec![span.clone(), span],
            schema_url: "https://opentelemetry.io/schemas/1.30.0".into(),
        }],
        schema_url: "https://opentelemetry.io/schemas/1.29.0".into(),
    };
    let want = whole_request(
        &ExportTraceServiceRequest {
            resource_spans: vec![rs.clone()],
        }
        .encode_to_vec(),
    )
    .unwrap();
    // ResourceSpans with its fields reversed (3, 2, 1) and an unknown varint field 9 in
    // every message level: prost reads it the same, so must the scan.
    let mut inner = Vec::new();
    prost::encoding::string::encode(3, &rs.schema_url, &mut inner);
    for ss in &rs.scope_spans {
        prost::encoding::message::encode(2, ss, &mut inner);
    }
    prost::encoding::uint64::encode(9, &7, &mut inner);
    prost::encoding::message::encode(1, rs.resource.as_ref().unwrap(), &mut inner);
    let mut body = Vec::new();
    prost::encoding::uint64::encode(9, &7, &mut body);
    prost::encoding::bytes::encode(1, &inner, &mut body);
    assert_eq!(whole_request(&body).unwrap(), want);
    assert_eq!(
        decode_traces(&body, Format::Protobuf, &LIMITS).unwrap(),
        want
    );
}

#[test]
fn per_span_scan_names_the_span_it_cannot_decode() {
    // The second span's bytes are cut short inside a valid outer frame.
    let mut scope = Vec::new();
    prost::encoding::message::encode(2, &proto_span(), &mut scope);
    prost::encoding::bytes::encode(2, &vec![0x0a, 0x10, 1, 2], &mut scope);
    let mut rs = Vec::new();
    prost::encoding::bytes::encode(2, &scope, &mut rs);
    let mut body = Vec::new();
    prost::encoding::bytes::encode(1, &rs, &mut body);
    let err = decode_traces(&body, Format::Protobuf, &LIMITS).unwrap_err();
    assert!(
        err.0.starts_with(
            "cannot decode ExportTraceServiceRequest protobuf: resourceSpans[0].scopeSpans[0].spans[1]: "
        ),
        "{err}"
    );
    // A known field with the wrong wire type is refused, as prost refuses it.
    let err = decode_traces(&[0x08, 0x01], Format::Protobuf, &LIMITS).unwrap_err();
    assert!(err.0.contains("invalid wire type"), "{err}");
    assert!(whole_request(&[0x08, 0x01]).is_err());
}

/// A JSON metric is read its data points a batch at a time (issue 17 #14): every point
/// is kept, in order, and an error names the point's index in the whole list.
#[test]
fn a_json_metric_with_thousands_of_points_keeps_them_all_and_names_bad_ones_exactly() {
    let points = |bad: Option<usize>| -> Vec<Value> {
        (0..2500)
            .map(|i| {
                if Some(i) == bad {
                    json!({"timeUnixNano": "x", "asInt": "1"})
                } else {
                    json!({"timeUnixNano": (1000 + i).to_string(), "asInt": i.to_string()})
                }
            })
            .collect()
    };
    let body = |bad| {
        json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [{
            "name": "m",
            "sum": {"aggregationTemporality": 2, "isMonotonic": true, "dataPoints": points(bad)}
        }]}]}]})
        .to_string()
    };
    let d = decode_metrics(body(None).as_bytes(), Format::Json, &LIMITS).unwrap();
    let got: Vec<_> = d.batch.resource_metrics[0].scope_metrics[0]
        .points
        .iter()
        .map(|p| (p.name.clone(), p.time_unix_nano, p.value))
        .collect();
    assert_eq!(got.len(), 2500);
    for (i, (name, time, value)) in got.into_iter().enumerate() {
        assert_eq!(
            (name.as_str(), time, value),
            ("m", 1000 + i as u64, Some(i as f64))
        );
    }
    assert!(d.batch.resource_metrics[0].scope_metrics[0].points[0]
        .detail
        .contains("is_monotonic"));
    let err = decode_metrics(body(Some(2100)).as_bytes(), Format::Json, &LIMITS).unwrap_err();
    assert!(err.0.contains("sum.dataPoints[2100].timeUnixNano"), "{err}");
    // Two data members are refused as before.
    let two = json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [{
        "name": "m", "gauge": {"dataPoints": points(None)}, "sum": {"dataPoints": []}
    }]}]}]});
    let err = decode_metrics(two.to_string().as_bytes(), Format::Json, &LIMITS).unwrap_err();
    assert!(err.0.contains("more than one"), "{err}");
}

/// Lone surrogate escapes are replaced (high alone, low alone, a high before another high,
/// either case), pairs and escaped backslashes are left, and the result is JSON serde reads.
#[test]
fn lone_surrogate_escapes_are_replaced_and_pairs_kept() {
    use super::json::replace_lone_surrogates as fix;
    let read = |b: &[u8]| serde_json::from_slice::<String>(b).unwrap();
    for (input, replaced, text) in [
        (r#""hi \ud83d""#, 1, "hi \u{FFFD}"),
        (r#""\uDE00x""#, 1, "\u{FFFD}x"),
        (r#""\ud83d\ud83d\ude00""#, 1, "\u{FFFD}\u{1F600}"),
        (r#""\ud83d\u0041""#, 1, "\u{FFFD}A"),
    ] {
        let (fixed, n) = fix(input.as_bytes()).unwrap_or_else(|| panic!("{input}"));
        assert_eq!(n, replaced, "{input}");
        assert_eq!(fixed.len(), input.len());
        assert_eq!(read(&fixed), text, "{input}");
    }
    for kept in [
        r#""\ud83d\ude00""#,
        r#""\\ud83d""#,
        r#""\\\\ud83d is text""#,
        r#""plain \u00e9""#,
        r#"{"k": "\uD83D\uDE00", "v": 1}"#,
    ] {
        assert!(fix(kept.as_bytes()).is_none(), "{kept}");
    }
    // serde refuses the original, reads the replaced text
    assert!(serde_json::from_slice::<String>(br#""hi \ud83d""#).is_err());
    assert_eq!(
        super::json::lone_surrogates_warning("1 span refused".into(), 2),
        "1 span refused; 2 unpaired UTF-16 surrogate escapes in JSON strings (a string cut inside a character) replaced by U+FFFD"
    );
    assert_eq!(super::json::lone_surrogates_warning(String::new(), 0), "");
}
