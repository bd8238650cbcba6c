//! OTLP/JSON → protobuf wire types, by hand (the OTLP/JSON rules, not generic proto3 JSON
//! through `with-serde`, which gets them wrong; see the cases README).
//!
//! Rules (OTLP spec "JSON Protobuf Encoding" and proto3 JSON mapping; case numbers from
//! `tests/data/cases/payloads/MANIFEST.json`):
//! - field names in lowerCamelCase or the original snake_case (C05); unknown fields are
//!   ignored; `null` means the default, `null` lists are empty (C07);
//! - trace and span ids are hex, case-insensitive (C01); base64, non-hex or wrong-length ids
//!   are a 400 naming the field; the empty string is an absent id (the converter refuses
//!   the span, C09);
//! - 64-bit integers as decimal strings or JSON numbers, never through `f64` (serde_json
//!   keeps integer tokens exact), out-of-range or fractional values are a 400 (C02);
//! - doubles as numbers, numeric strings, or `"NaN"`, `"Infinity"`, `"-Infinity"` (C02);
//! - enums as integers (unknown ones kept) or proto names; an unknown name is a 400 (C04,
//!   docs/design.md "OTLP/JSON case choices");
//! - `bytesValue` is base64 (standard or URL-safe alphabet, padding optional).
//!
//! Validation shared with protobuf input (all-zero ids, nesting depth) happens afterwards
//! in [`super::convert`].

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::logs::v1 as pl;
use opentelemetry_proto::tonic::metrics::v1 as pm;
use opentelemetry_proto::tonic::resource::v1 as pr;
use opentelemetry_proto::tonic::trace::v1 as pt;
use serde_json::{Map, Value};

use super::path::Path;
use super::DecodeError;

type Obj = Map<String, Value>;

const B64_CONFIG: GeneralPurposeConfig = GeneralPurposeConfig::new()
    .with_encode_padding(true)
    .with_decode_padding_mode(DecodePaddingMode::Indifferent);
const B64_STANDARD: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, B64_CONFIG);
const B64_URL_SAFE: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, B64_CONFIG);

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses the body; `None` for an empty (or whitespace-only) body.
fn parse_root(body: &[u8]) -> Result<Option<Obj>, DecodeError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(None);
    }
    let v: Value =
        serde_json::from_slice(body).map_err(|e| DecodeError::new(format!("invalid JSON: {e}")))?;
    match v {
        Value::Object(o) => Ok(Some(o)),
        other => Err(DecodeError::new(format!(
            "invalid OTLP/JSON request: expected an object at the top level, got {}",
            kind(&other)
        ))),
    }
}

/// Removes a member by its lowerCamelCase or snake_case name; `null` counts as absent.
fn take(o: &mut Obj, camel: &'static str, snake: &'static str) -> Option<Value> {
    let v = match o.remove(camel) {
        Some(Value::Null) | None if camel != snake => o.remove(snake),
        v => v,
    };
    match v {
        Some(Value::Null) | None => None,
        v => v,
    }
}

fn object(v: Value, p: &Path) -> Result<Obj, DecodeError> {
    match v {
        Value::Object(o) => Ok(o),
        other => Err(DecodeError::at(
            p,
            format!("expected an object, got {}", kind(&other)),
        )),
    }
}

fn opt_object(
    o: &mut Obj,
    camel: &'static str,
    snake: &'static str,
    p: &Path,
) -> Result<Option<Obj>, DecodeError> {
    take(o, camel, snake)
        .map(|v| object(v, &p.field(camel)))
        .transpose()
}

fn list(
    o: &mut Obj,
    camel: &'static str,
    snake: &'static str,
    p: &Path,
) -> Result<Vec<Value>, DecodeError> {
    match take(o, camel, snake) {
        None => Ok(Vec::new()),
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(DecodeError::at(
            &p.field(camel),
            format!("expected an array, got {}", kind(&other)),
        )),
    }
}

fn string(
    o: &mut Obj,
    camel: &'static str,
    snake: &'static str,
    p: &Path,
) -> Result<String, DecodeError> {
    match take(o, camel, snake) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(DecodeError::at(
            &p.field(camel),
            format!("expected a string, got {}", kind(&other)),
        )),
    }
}

fn boolean(v: Value, p: &Path) -> Result<bool, DecodeError> {
    match v {
        Value::Bool(b) => Ok(b),
        other => Err(DecodeError::at(
            p,
            format!("expected true or false, got {}", kind(&other)),
        )),
    }
}

/// An integer from a JSON number or a decimal string, exact over the whole `i128` range
/// the 64-bit types need. Fractional values and exponents that do not give an exact
/// integer are refused.
fn integer(v: &Value, p: &Path, type_name: &str) -> Result<i128, DecodeError> {
    let bad = |why: String| DecodeError::at(p, why);
    match v {
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                Ok(u as i128)
            } else if let Some(i) = n.as_i64() {
                Ok(i as i128)
            } else {
                // serde_json parsed a fraction, an exponent, or an integer beyond 64 bits.
                let f = n.as_f64().unwrap_or(f64::NAN);
                if f.fract() != 0.0 {
                    Err(bad(format!("{type_name} must be an integer, got {n}")))
                } else if f.abs() < 9_007_199_254_740_992.0 {
                    Ok(f as i128)
                } else {
                    Err(bad(format!("{type_name} out of range: {n}")))
                }
            }
        }
        Value::String(s) => {
            let t = s.as_str();
            if let Ok(i) = t.parse::<i128>() {
                return Ok(i);
            }
            if t.parse::<f64>().is_ok() && t.bytes().all(|c| b"0123456789+-.eE".contains(&c)) {
                if t.contains(['.', 'e', 'E']) {
                    return Err(bad(format!("{type_name} must be an integer, got {t:?}")));
                }
                return Err(bad(format!("{type_name} out of range: {t:?}")));
            }
            Err(bad(format!(
                "{type_name} must be a decimal integer (string or number), got {t:?}"
            )))
        }
        other => Err(bad(format!(
            "{type_name} must be an integer (string or number), got {}",
            kind(other)
        ))),
    }
}

fn ranged<T: TryFrom<i128>>(v: Value, p: &Path, type_name: &str) -> Result<T, DecodeError> {
    let i = integer(&v, p, type_name)?;
    T::try_from(i).map_err(|_| DecodeError::at(p, format!("{type_name} out of range: {i}")))
}

fn u64_field(o: &mut Obj, c: &'static str, s: &'static str, p: &Path) -> Result<u64, DecodeError> {
    take(o, c, s).map_or(Ok(0), |v| ranged(v, &p.field(c), "uint64"))
}

fn u32_field(o: &mut Obj, c: &'static str, s: &'static str, p: &Path) -> Result<u32, DecodeError> {
    take(o, c, s).map_or(Ok(0), |v| ranged(v, &p.field(c), "uint32"))
}

fn i32_field(o: &mut Obj, c: &'static str, s: &'static str, p: &Path) -> Result<i32, DecodeError> {
    take(o, c, s).map_or(Ok(0), |v| ranged(v, &p.field(c), "int32"))
}

/// A double: a JSON number, a numeric string, or `"NaN"`, `"Infinity"`, `"-Infinity"`.
fn double(v: Value, p: &Path) -> Result<f64, DecodeError> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| DecodeError::at(p, format!("double out of range: {n}"))),
        Value::String(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            t if !t.is_empty() && t.bytes().all(|c| b"0123456789+-.eE".contains(&c)) => {
                t.parse::<f64>().map_err(|_| {
                    DecodeError::at(p, format!("double must be a number, got {t:?}"))
                })
            }
            t => Err(DecodeError::at(
                p,
                format!(
                    "double must be a number, a numeric string, \"NaN\", \"Infinity\" or \"-Infinity\", got {t:?}"
                ),
            )),
        },
        other => Err(DecodeError::at(
            p,
            format!("double must be a number, got {}", kind(&other)),
        )),
    }
}

fn f64_field(o: &mut Obj, c: &'static str, s: &'static str, p: &Path) -> Result<f64, DecodeError> {
    take(o, c, s).map_or(Ok(0.0), |v| double(v, &p.field(c)))
}

fn opt_f64_field(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<Option<f64>, DecodeError> {
    take(o, c, s).map(|v| double(v, &p.field(c))).transpose()
}

/// An enum given as an integer (any `int32`, unknown values kept) or as its proto name.
fn enumeration(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
    from_name: fn(&str) -> Option<i32>,
    example: &str,
) -> Result<i32, DecodeError> {
    let Some(v) = take(o, c, s) else {
        return Ok(0);
    };
    let p = p.field(c);
    match v {
        Value::String(name) => {
            if let Some(i) = from_name(&name) {
                Ok(i)
            } else if let Ok(i) = name.parse::<i32>() {
                Ok(i)
            } else {
                Err(DecodeError::at(
                    &p,
                    format!("unknown enum name {name:?} (expected an integer or a proto name such as {example})"),
                ))
            }
        }
        v @ Value::Number(_) => ranged(v, &p, "enum (int32)"),
        other => Err(DecodeError::at(
            &p,
            format!("enum must be an integer or a name, got {}", kind(&other)),
        )),
    }
}

/// A trace or span id in hex (case-insensitive): `len` bytes, or empty when absent.
fn hex_id(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
    len: usize,
) -> Result<Vec<u8>, DecodeError> {
    let Some(v) = take(o, c, s) else {
        return Ok(Vec::new());
    };
    let p = p.field(c);
    let what = if len == 16 { "trace id" } else { "span id" };
    let Value::String(text) = v else {
        return Err(DecodeError::at(
            &p,
            format!("{what} must be a hex string, got {}", kind(&v)),
        ));
    };
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let looks_base64 = text.contains(['+', '/', '=']) || text.len() * 3 / 4 == len;
    let hint = if looks_base64 && !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        " (this looks like base64; OTLP/JSON ids are hex)"
    } else {
        ""
    };
    if text.len() != 2 * len {
        return Err(DecodeError::at(
            &p,
            format!(
                "invalid {what} {text:?}: want {} hex characters, got {}{hint}",
                2 * len,
                text.len()
            ),
        ));
    }
    hex::decode(&text).map_err(|_| {
        DecodeError::at(
            &p,
            format!("invalid {what} {text:?}: not hexadecimal{hint}"),
        )
    })
}

fn any_value(v: Value, p: &Path) -> Result<pc::AnyValue, DecodeError> {
    use pc::any_value::Value as V;
    let mut o = object(v, p)?;
    let mut found: Vec<(&'static str, V)> = Vec::with_capacity(1);
    if let Some(v) = take(&mut o, "stringValue", "string_value") {
        match v {
            Value::String(s) => found.push(("stringValue", V::StringValue(s))),
            other => {
                return Err(DecodeError::at(
                    &p.field("stringValue"),
                    format!("expected a string, got {}", kind(&other)),
                ))
            }
        }
    }
    if let Some(v) = take(&mut o, "boolValue", "bool_value") {
        found.push((
            "boolValue",
            V::BoolValue(boolean(v, &p.field("boolValue"))?),
        ));
    }
    if let Some(v) = take(&mut o, "intValue", "int_value") {
        found.push((
            "intValue",
            V::IntValue(ranged(v, &p.field("intValue"), "int64")?),
        ));
    }
    // `{"doubleValue": null}` is what the Rust SDK's HTTP/JSON exporter writes for NaN and
    // ±Inf (serde_json has no non-finite numbers): keep it a double, NaN being the honest
    // reading, rather than an empty value (issue 12 #10).
    let double_null = [o.get("doubleValue"), o.get("double_value")]
        .iter()
        .any(|v| matches!(v, Some(Value::Null)));
    if let Some(v) = take(&mut o, "doubleValue", "double_value") {
        found.push((
            "doubleValue",
            V::DoubleValue(double(v, &p.field("doubleValue"))?),
        ));
    }
    if let Some(v) = take(&mut o, "bytesValue", "bytes_value") {
        let pb = p.field("bytesValue");
        let Value::String(s) = v else {
            return Err(DecodeError::at(
                &pb,
                format!("expected a base64 string, got {}", kind(&v)),
            ));
        };
        let bytes = B64_STANDARD
            .decode(s.as_bytes())
            .or_else(|_| B64_URL_SAFE.decode(s.as_bytes()))
            .map_err(|e| DecodeError::at(&pb, format!("invalid base64: {e}")))?;
        found.push(("bytesValue", V::BytesValue(bytes)));
    }
    if let Some(v) = take(&mut o, "arrayValue", "array_value") {
        let pa = p.field("arrayValue");
        let mut a = object(v, &pa)?;
        let values = list(&mut a, "values", "values", &pa)?;
        let pv = pa.field("values");
        let mut out = Vec::with_capacity(values.len());
        for (i, v) in values.into_iter().enumerate() {
            out.push(any_value(v, &pv.index(i))?);
        }
        found.push(("arrayValue", V::ArrayValue(pc::ArrayValue { values: out })));
    }
    if let Some(v) = take(&mut o, "kvlistValue", "kvlist_value") {
        let pk = p.field("kvlistValue");
        let mut k = object(v, &pk)?;
        let values = key_values(&mut k, "values", "values", &pk)?;
        found.push(("kvlistValue", V::KvlistValue(pc::KeyValueList { values })));
    }
    match found.len() {
        0 if double_null => Ok(pc::AnyValue {
            value: Some(V::DoubleValue(f64::NAN)),
        }),
        0 => Ok(pc::AnyValue { value: None }),
        1 => Ok(pc::AnyValue {
            value: found.pop().map(|(_, v)| v),
        }),
        _ => Err(DecodeError::at(
            p,
            format!(
                "AnyValue sets more than one value ({})",
                found.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

fn key_values(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<Vec<pc::KeyValue>, DecodeError> {
    let items = list(o, c, s, p)?;
    let pl = p.field(c);
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let pi = pl.index(i);
        let mut kv = object(item, &pi)?;
        let key = string(&mut kv, "key", "key", &pi)?;
        let value = take(&mut kv, "value", "value")
            .map(|v| any_value(v, &pi.field("value")))
            .transpose()?;
        out.push(pc::KeyValue {
            key,
            value,
            ..Default::default()
        });
    }
    Ok(out)
}

fn attributes(o: &mut Obj, p: &Path) -> Result<Vec<pc::KeyValue>, DecodeError> {
    key_values(o, "attributes", "attributes", p)
}

fn resource(o: &mut Obj, p: &Path) -> Result<Option<pr::Resource>, DecodeError> {
    let Some(mut r) = opt_object(o, "resource", "resource", p)? else {
        return Ok(None);
    };
    let p = p.field("resource");
    Ok(Some(pr::Resource {
        attributes: attributes(&mut r, &p)?,
        dropped_attributes_count: u32_field(
            &mut r,
            "droppedAttributesCount",
            "dropped_attributes_count",
            &p,
        )?,
        ..Default::default()
    }))
}

fn scope(o: &mut Obj, p: &Path) -> Result<Option<pc::InstrumentationScope>, DecodeError> {
    let Some(mut s) = opt_object(o, "scope", "scope", p)? else {
        return Ok(None);
    };
    let p = p.field("scope");
    Ok(Some(pc::InstrumentationScope {
        name: string(&mut s, "name", "name", &p)?,
        version: string(&mut s, "version", "version", &p)?,
        attributes: attributes(&mut s, &p)?,
        dropped_attributes_count: u32_field(
            &mut s,
            "droppedAttributesCount",
            "dropped_attributes_count",
            &p,
        )?,
    }))
}

fn span_kind_from_name(s: &str) -> Option<i32> {
    pt::span::SpanKind::from_str_name(s).map(|k| k as i32)
}
fn status_code_from_name(s: &str) -> Option<i32> {
    pt::status::StatusCode::from_str_name(s).map(|k| k as i32)
}
fn severity_from_name(s: &str) -> Option<i32> {
    pl::SeverityNumber::from_str_name(s).map(|k| k as i32)
}
fn temporality_from_name(s: &str) -> Option<i32> {
    pm::AggregationTemporality::from_str_name(s).map(|k| k as i32)
}

/// Decodes an OTLP/JSON `ExportTraceServiceRequest` (also a `TracesData`).
pub(crate) fn traces(body: &[u8]) -> Result<ExportTraceServiceRequest, DecodeError> {
    let Some(mut root) = parse_root(body)? else {
        return Ok(ExportTraceServiceRequest::default());
    };
    let resource_spans = envelope(
        &mut root,
        [
            ("resourceSpans", "resource_spans"),
            ("scopeSpans", "scope_spans"),
            ("spans", "spans"),
        ],
        span,
        |scope, spans, schema_url| pt::ScopeSpans {
            scope,
            spans,
            schema_url,
        },
        |resource, scope_spans, schema_url| pt::ResourceSpans {
            resource,
            scope_spans,
            schema_url,
        },
    )?;
    Ok(ExportTraceServiceRequest { resource_spans })
}

/// The envelope all three signals share: `resource{X}[]` (resource, schemaUrl) →
/// `scope{X}[]` (scope, schemaUrl) → items, each level named in lowerCamelCase and
/// snake_case (`names`), with field paths for error messages. `item` decodes one item;
/// `scope_msg` and `resource_msg` build the protobuf messages.
fn envelope<T, S, R>(
    root: &mut Obj,
    names: [(&'static str, &'static str); 3],
    item: fn(Value, &Path) -> Result<T, DecodeError>,
    scope_msg: fn(Option<pc::InstrumentationScope>, Vec<T>, String) -> S,
    resource_msg: fn(Option<pr::Resource>, Vec<S>, String) -> R,
) -> Result<Vec<R>, DecodeError> {
    let [(res_camel, res_snake), (scope_camel, scope_snake), (item_camel, item_snake)] = names;
    let r = Path::ROOT;
    let resources = list(root, res_camel, res_snake, &r)?;
    let pres = r.field(res_camel);
    let mut out = Vec::with_capacity(resources.len());
    for (ri, rv) in resources.into_iter().enumerate() {
        let pr = pres.index(ri);
        let mut ro = object(rv, &pr)?;
        let resource = resource(&mut ro, &pr)?;
        let schema_url = string(&mut ro, "schemaUrl", "schema_url", &pr)?;
        let scopes = list(&mut ro, scope_camel, scope_snake, &pr)?;
        let pscopes = pr.field(scope_camel);
        let mut scope_out = Vec::with_capacity(scopes.len());
        for (si, sv) in scopes.into_iter().enumerate() {
            let ps = pscopes.index(si);
            let mut so = object(sv, &ps)?;
            let scope = scope(&mut so, &ps)?;
            let scope_schema_url = string(&mut so, "schemaUrl", "schema_url", &ps)?;
            let values = list(&mut so, item_camel, item_snake, &ps)?;
            let pitems = ps.field(item_camel);
            let mut items = Vec::with_capacity(values.len());
            for (i, v) in values.into_iter().enumerate() {
                items.push(item(v, &pitems.index(i))?);
            }
            scope_out.push(scope_msg(scope, items, scope_schema_url));
        }
        out.push(resource_msg(resource, scope_out, schema_url));
    }
    Ok(out)
}

fn span(v: Value, p: &Path) -> Result<pt::Span, DecodeError> {
    let mut o = object(v, p)?;
    let trace_id = hex_id(&mut o, "traceId", "trace_id", p, 16)?;
    let span_id = hex_id(&mut o, "spanId", "span_id", p, 8)?;
    let parent_span_id = hex_id(&mut o, "parentSpanId", "parent_span_id", p, 8)?;
    let events_in = list(&mut o, "events", "events", p)?;
    let pe = p.field("events");
    let mut events = Vec::with_capacity(events_in.len());
    for (i, e) in events_in.into_iter().enumerate() {
        let pi = pe.index(i);
        let mut e = object(e, &pi)?;
        events.push(pt::span::Event {
            time_unix_nano: u64_field(&mut e, "timeUnixNano", "time_unix_nano", &pi)?,
            name: string(&mut e, "name", "name", &pi)?,
            attributes: attributes(&mut e, &pi)?,
            dropped_attributes_count: u32_field(
                &mut e,
                "droppedAttributesCount",
                "dropped_attributes_count",
                &pi,
            )?,
        });
    }
    let links_in = list(&mut o, "links", "links", p)?;
    let pl = p.field("links");
    let mut links = Vec::with_capacity(links_in.len());
    for (i, l) in links_in.into_iter().enumerate() {
        let pi = pl.index(i);
        let mut l = object(l, &pi)?;
        links.push(pt::span::Link {
            trace_id: hex_id(&mut l, "traceId", "trace_id", &pi, 16)?,
            span_id: hex_id(&mut l, "spanId", "span_id", &pi, 8)?,
            trace_state: string(&mut l, "traceState", "trace_state", &pi)?,
            attributes: attributes(&mut l, &pi)?,
            dropped_attributes_count: u32_field(
                &mut l,
                "droppedAttributesCount",
                "dropped_attributes_count",
                &pi,
            )?,
            flags: u32_field(&mut l, "flags", "flags", &pi)?,
        });
    }
    let status = match opt_object(&mut o, "status", "status", p)? {
        None => None,
        Some(mut s) => {
            let ps = p.field("status");
            Some(pt::Status {
                message: string(&mut s, "message", "message", &ps)?,
                code: enumeration(
                    &mut s,
                    "code",
                    "code",
                    &ps,
                    status_code_from_name,
                    "STATUS_CODE_ERROR",
                )?,
            })
        }
    };
    Ok(pt::Span {
        trace_id,
        span_id,
        trace_state: string(&mut o, "traceState", "trace_state", p)?,
        parent_span_id,
        flags: u32_field(&mut o, "flags", "flags", p)?,
        name: string(&mut o, "name", "name", p)?,
        kind: enumeration(
            &mut o,
            "kind",
            "kind",
            p,
            span_kind_from_name,
            "SPAN_KIND_SERVER",
        )?,
        start_time_unix_nano: u64_field(&mut o, "startTimeUnixNano", "start_time_unix_nano", p)?,
        end_time_unix_nano: u64_field(&mut o, "endTimeUnixNano", "end_time_unix_nano", p)?,
        attributes: attributes(&mut o, p)?,
        dropped_attributes_count: u32_field(
            &mut o,
            "droppedAttributesCount",
            "dropped_attributes_count",
            p,
        )?,
        events,
        dropped_events_count: u32_field(&mut o, "droppedEventsCount", "dropped_events_count", p)?,
        links,
        dropped_links_count: u32_field(&mut o, "droppedLinksCount", "dropped_links_count", p)?,
        status,
    })
}

/// Decodes an OTLP/JSON `ExportLogsServiceRequest` (also a `LogsData`).
pub(crate) fn logs(body: &[u8]) -> Result<ExportLogsServiceRequest, DecodeError> {
    let Some(mut root) = parse_root(body)? else {
        return Ok(ExportLogsServiceRequest::default());
    };
    let resource_logs = envelope(
        &mut root,
        [
            ("resourceLogs", "resource_logs"),
            ("scopeLogs", "scope_logs"),
            ("logRecords", "log_records"),
        ],
        log_record,
        |scope, log_records, schema_url| pl::ScopeLogs {
            scope,
            log_records,
            schema_url,
        },
        |resource, scope_logs, schema_url| pl::ResourceLogs {
            resource,
            scope_logs,
            schema_url,
        },
    )?;
    Ok(ExportLogsServiceRequest { resource_logs })
}

fn log_record(v: Value, p: &Path) -> Result<pl::LogRecord, DecodeError> {
    let mut o = object(v, p)?;
    Ok(pl::LogRecord {
        time_unix_nano: u64_field(&mut o, "timeUnixNano", "time_unix_nano", p)?,
        observed_time_unix_nano: u64_field(
            &mut o,
            "observedTimeUnixNano",
            "observed_time_unix_nano",
            p,
        )?,
        severity_number: enumeration(
            &mut o,
            "severityNumber",
            "severity_number",
            p,
            severity_from_name,
            "SEVERITY_NUMBER_INFO",
        )?,
        severity_text: string(&mut o, "severityText", "severity_text", p)?,
        body: take(&mut o, "body", "body")
            .map(|v| any_value(v, &p.field("body")))
            .transpose()?,
        attributes: attributes(&mut o, p)?,
        dropped_attributes_count: u32_field(
            &mut o,
            "droppedAttributesCount",
            "dropped_attributes_count",
            p,
        )?,
        flags: u32_field(&mut o, "flags", "flags", p)?,
        trace_id: hex_id(&mut o, "traceId", "trace_id", p, 16)?,
        span_id: hex_id(&mut o, "spanId", "span_id", p, 8)?,
        event_name: string(&mut o, "eventName", "event_name", p)?,
    })
}

/// Decodes an OTLP/JSON `ExportMetricsServiceRequest` (also a `MetricsData`).
pub(crate) fn metrics(body: &[u8]) -> Result<ExportMetricsServiceRequest, DecodeError> {
    let Some(mut root) = parse_root(body)? else {
        return Ok(ExportMetricsServiceRequest::default());
    };
    let resource_metrics = envelope(
        &mut root,
        [
            ("resourceMetrics", "resource_metrics"),
            ("scopeMetrics", "scope_metrics"),
            ("metrics", "metrics"),
        ],
        metric,
        |scope, metrics, schema_url| pm::ScopeMetrics {
            scope,
            metrics,
            schema_url,
        },
        |resource, scope_metrics, schema_url| pm::ResourceMetrics {
            resource,
            scope_metrics,
            schema_url,
        },
    )?;
    Ok(ExportMetricsServiceRequest { resource_metrics })
}

fn metric(v: Value, p: &Path) -> Result<pm::Metric, DecodeError> {
    use pm::metric::Data;
    let mut o = object(v, p)?;
    let name = string(&mut o, "name", "name", p)?;
    let description = string(&mut o, "description", "description", p)?;
    let unit = string(&mut o, "unit", "unit", p)?;
    let metadata = key_values(&mut o, "metadata", "metadata", p)?;
    let mut data = Vec::with_capacity(1);
    if let Some(mut g) = opt_object(&mut o, "gauge", "gauge", p)? {
        let pg = p.field("gauge");
        data.push(Data::Gauge(pm::Gauge {
            data_points: number_points(&mut g, &pg)?,
        }));
    }
    if let Some(mut s) = opt_object(&mut o, "sum", "sum", p)? {
        let ps = p.field("sum");
        data.push(Data::Sum(pm::Sum {
            data_points: number_points(&mut s, &ps)?,
            aggregation_temporality: temporality(&mut s, &ps)?,
            is_monotonic: take(&mut s, "isMonotonic", "is_monotonic")
                .map(|v| boolean(v, &ps.field("isMonotonic")))
                .transpose()?
                .unwrap_or(false),
        }));
    }
    if let Some(mut h) = opt_object(&mut o, "histogram", "histogram", p)? {
        let ph = p.field("histogram");
        let dps = list(&mut h, "dataPoints", "data_points", &ph)?;
        let pd = ph.field("dataPoints");
        let mut data_points = Vec::with_capacity(dps.len());
        for (i, dp) in dps.into_iter().enumerate() {
            let pi = pd.index(i);
            let mut d = object(dp, &pi)?;
            data_points.push(pm::HistogramDataPoint {
                attributes: attributes(&mut d, &pi)?,
                start_time_unix_nano: u64_field(
                    &mut d,
                    "startTimeUnixNano",
                    "start_time_unix_nano",
                    &pi,
                )?,
                time_unix_nano: u64_field(&mut d, "timeUnixNano", "time_unix_nano", &pi)?,
                count: u64_field(&mut d, "count", "count", &pi)?,
                sum: opt_f64_field(&mut d, "sum", "sum", &pi)?,
                bucket_counts: u64_list(&mut d, "bucketCounts", "bucket_counts", &pi)?,
                explicit_bounds: f64_list(&mut d, "explicitBounds", "explicit_bounds", &pi)?,
                exemplars: exemplars(&mut d, &pi)?,
                flags: u32_field(&mut d, "flags", "flags", &pi)?,
                min: opt_f64_field(&mut d, "min", "min", &pi)?,
                max: opt_f64_field(&mut d, "max", "max", &pi)?,
            });
        }
        data.push(Data::Histogram(pm::Histogram {
            data_points,
            aggregation_temporality: temporality(&mut h, &ph)?,
        }));
    }
    if let Some(mut h) = opt_object(&mut o, "exponentialHistogram", "exponential_histogram", p)? {
        let ph = p.field("exponentialHistogram");
        let dps = list(&mut h, "dataPoints", "data_points", &ph)?;
        let pd = ph.field("dataPoints");
        let mut data_points = Vec::with_capacity(dps.len());
        for (i, dp) in dps.into_iter().enumerate() {
            let pi = pd.index(i);
            let mut d = object(dp, &pi)?;
            data_points.push(pm::ExponentialHistogramDataPoint {
                attributes: attributes(&mut d, &pi)?,
                start_time_unix_nano: u64_field(
                    &mut d,
                    "startTimeUnixNano",
                    "start_time_unix_nano",
                    &pi,
                )?,
                time_unix_nano: u64_field(&mut d, "timeUnixNano", "time_unix_nano", &pi)?,
                count: u64_field(&mut d, "count", "count", &pi)?,
                sum: opt_f64_field(&mut d, "sum", "sum", &pi)?,
                scale: i32_field(&mut d, "scale", "scale", &pi)?,
                zero_count: u64_field(&mut d, "zeroCount", "zero_count", &pi)?,
                positive: buckets(&mut d, "positive", &pi)?,
                negative: buckets(&mut d, "negative", &pi)?,
                flags: u32_field(&mut d, "flags", "flags", &pi)?,
                exemplars: exemplars(&mut d, &pi)?,
                min: opt_f64_field(&mut d, "min", "min", &pi)?,
                max: opt_f64_field(&mut d, "max", "max", &pi)?,
                zero_threshold: f64_field(&mut d, "zeroThreshold", "zero_threshold", &pi)?,
            });
        }
        data.push(Data::ExponentialHistogram(pm::ExponentialHistogram {
            data_points,
            aggregation_temporality: temporality(&mut h, &ph)?,
        }));
    }
    if let Some(mut s) = opt_object(&mut o, "summary", "summary", p)? {
        let ps = p.field("summary");
        let dps = list(&mut s, "dataPoints", "data_points", &ps)?;
        let pd = ps.field("dataPoints");
        let mut data_points = Vec::with_capacity(dps.len());
        for (i, dp) in dps.into_iter().enumerate() {
            let pi = pd.index(i);
            let mut d = object(dp, &pi)?;
            let qs = list(&mut d, "quantileValues", "quantile_values", &pi)?;
            let pq = pi.field("quantileValues");
            let mut quantile_values = Vec::with_capacity(qs.len());
            for (qi, q) in qs.into_iter().enumerate() {
                let pqi = pq.index(qi);
                let mut q = object(q, &pqi)?;
                quantile_values.push(pm::summary_data_point::ValueAtQuantile {
                    quantile: f64_field(&mut q, "quantile", "quantile", &pqi)?,
                    value: f64_field(&mut q, "value", "value", &pqi)?,
                });
            }
            data_points.push(pm::SummaryDataPoint {
                attributes: attributes(&mut d, &pi)?,
                start_time_unix_nano: u64_field(
                    &mut d,
                    "startTimeUnixNano",
                    "start_time_unix_nano",
                    &pi,
                )?,
                time_unix_nano: u64_field(&mut d, "timeUnixNano", "time_unix_nano", &pi)?,
                count: u64_field(&mut d, "count", "count", &pi)?,
                sum: f64_field(&mut d, "sum", "sum", &pi)?,
                quantile_values,
                flags: u32_field(&mut d, "flags", "flags", &pi)?,
            });
        }
        data.push(Data::Summary(pm::Summary { data_points }));
    }
    if data.len() > 1 {
        return Err(DecodeError::at(
            p,
            "metric sets more than one of gauge, sum, histogram, exponentialHistogram, summary",
        ));
    }
    Ok(pm::Metric {
        name,
        description,
        unit,
        metadata,
        data: data.pop(),
    })
}

fn temporality(o: &mut Obj, p: &Path) -> Result<i32, DecodeError> {
    enumeration(
        o,
        "aggregationTemporality",
        "aggregation_temporality",
        p,
        temporality_from_name,
        "AGGREGATION_TEMPORALITY_CUMULATIVE",
    )
}

fn number_points(o: &mut Obj, p: &Path) -> Result<Vec<pm::NumberDataPoint>, DecodeError> {
    use pm::number_data_point::Value as NV;
    let dps = list(o, "dataPoints", "data_points", p)?;
    let pd = p.field("dataPoints");
    let mut out = Vec::with_capacity(dps.len());
    for (i, dp) in dps.into_iter().enumerate() {
        let pi = pd.index(i);
        let mut d = object(dp, &pi)?;
        let as_double = take(&mut d, "asDouble", "as_double")
            .map(|v| double(v, &pi.field("asDouble")))
            .transpose()?;
        let as_int = take(&mut d, "asInt", "as_int")
            .map(|v| ranged::<i64>(v, &pi.field("asInt"), "int64"))
            .transpose()?;
        let value = match (as_double, as_int) {
            (Some(_), Some(_)) => {
                return Err(DecodeError::at(
                    &pi,
                    "data point sets both asDouble and asInt",
                ))
            }
            (Some(v), None) => Some(NV::AsDouble(v)),
            (None, Some(v)) => Some(NV::AsInt(v)),
            (None, None) => None,
        };
        out.push(pm::NumberDataPoint {
            attributes: attributes(&mut d, &pi)?,
            start_time_unix_nano: u64_field(
                &mut d,
                "startTimeUnixNano",
                "start_time_unix_nano",
                &pi,
            )?,
            time_unix_nano: u64_field(&mut d, "timeUnixNano", "time_unix_nano", &pi)?,
            exemplars: exemplars(&mut d, &pi)?,
            flags: u32_field(&mut d, "flags", "flags", &pi)?,
            value,
        });
    }
    Ok(out)
}

fn exemplars(o: &mut Obj, p: &Path) -> Result<Vec<pm::Exemplar>, DecodeError> {
    use pm::exemplar::Value as EV;
    let items = list(o, "exemplars", "exemplars", p)?;
    let pe = p.field("exemplars");
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let pi = pe.index(i);
        let mut e = object(item, &pi)?;
        let value = if let Some(v) = take(&mut e, "asDouble", "as_double") {
            Some(EV::AsDouble(double(v, &pi.field("asDouble"))?))
        } else if let Some(v) = take(&mut e, "asInt", "as_int") {
            Some(EV::AsInt(ranged(v, &pi.field("asInt"), "int64")?))
        } else {
            None
        };
        out.push(pm::Exemplar {
            filtered_attributes: key_values(
                &mut e,
                "filteredAttributes",
                "filtered_attributes",
                &pi,
            )?,
            time_unix_nano: u64_field(&mut e, "timeUnixNano", "time_unix_nano", &pi)?,
            span_id: hex_id(&mut e, "spanId", "span_id", &pi, 8)?,
            trace_id: hex_id(&mut e, "traceId", "trace_id", &pi, 16)?,
            value,
        });
    }
    Ok(out)
}

fn buckets(
    o: &mut Obj,
    name: &'static str,
    p: &Path,
) -> Result<Option<pm::exponential_histogram_data_point::Buckets>, DecodeError> {
    let Some(mut b) = opt_object(o, name, name, p)? else {
        return Ok(None);
    };
    let pb = p.field(name);
    Ok(Some(pm::exponential_histogram_data_point::Buckets {
        offset: i32_field(&mut b, "offset", "offset", &pb)?,
        bucket_counts: u64_list(&mut b, "bucketCounts", "bucket_counts", &pb)?,
    }))
}

fn u64_list(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<Vec<u64>, DecodeError> {
    let items = list(o, c, s, p)?;
    let pl = p.field(c);
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| ranged(v, &pl.index(i), "uint64"))
        .collect()
}

fn f64_list(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<Vec<f64>, DecodeError> {
    let items = list(o, c, s, p)?;
    let pl = p.field(c);
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| double(v, &pl.index(i)))
        .collect()
}
