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
//! in [`super::convert`]. Before any of it the body's container nesting is bounded
//! ([`MAX_JSON_DEPTH`]), and serde_json's own recursion limit (128) is off: a `kvlistValue`
//! costs four JSON levels, so the limit refused at 31 attribute levels what protobuf
//! accepts (and what the read API exports, so a trace could not be imported back).
//!
//! Split: JSON scalars (integers, doubles, enums, ids) in `scalar.rs`, the envelope, values,
//! spans and logs here, metrics in `metrics.rs`.

use base64::Engine as _;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::logs::v1 as pl;
use opentelemetry_proto::tonic::resource::v1 as pr;
use opentelemetry_proto::tonic::trace::v1 as pt;
use serde_json::value::RawValue;
use serde_json::Value;

use super::path::Path;
use super::DecodeError;

mod metrics;
mod scalar;

pub(crate) use metrics::metrics;
use scalar::{
    boolean, double, enumeration, hex_id, kind, list, object, opt_object, ranged, string, take,
    u32_field, u64_field, Obj, B64_STANDARD, B64_URL_SAFE,
};

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

pub(super) fn key_values(
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

pub(super) fn attributes(o: &mut Obj, p: &Path) -> Result<Vec<pc::KeyValue>, DecodeError> {
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
/// Walks an OTLP/JSON `ExportTraceServiceRequest` (also a `TracesData`) span by span into
/// `out` (see [`walk`]).
pub(crate) fn traces_walk(
    body: &[u8],
    out: &mut dyn Envelope<pt::Span>,
) -> Result<(), DecodeError> {
    walk(
        body,
        [
            ("resourceSpans", "resource_spans"),
            ("scopeSpans", "scope_spans"),
            ("spans", "spans"),
        ],
        |r, p| span(tree(r)?, p),
        out,
    )
}

/// What [`walk`] hands over, in document order: each resource, then each of its scopes,
/// each followed by its items. Each call may fail, which ends the walk with that error.
pub(crate) trait Envelope<T> {
    /// A `resource{X}[]` entry starts: its resource and `schemaUrl`.
    fn resource(
        &mut self,
        resource: Option<pr::Resource>,
        schema_url: String,
        p: &Path,
    ) -> Result<(), DecodeError>;
    /// A `scope{X}[]` entry of the current resource starts: its scope and `schemaUrl`.
    fn scope(
        &mut self,
        scope: Option<pc::InstrumentationScope>,
        schema_url: String,
        p: &Path,
    ) -> Result<(), DecodeError>;
    /// One item of the current scope; `source_bytes` is its length in the body.
    fn item(&mut self, item: T, p: &Path, source_bytes: usize) -> Result<(), DecodeError>;
}

/// A JSON object whose member values are left unparsed (slices of the body).
type RawObj<'a> = std::collections::BTreeMap<String, &'a RawValue>;

fn raw_kind(r: &RawValue) -> &'static str {
    match r.get().trim_start().as_bytes().first() {
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        _ => "a number",
    }
}

fn invalid_json(e: serde_json::Error) -> DecodeError {
    DecodeError::new(format!("invalid JSON: {e}"))
}

/// Deepest nesting of JSON arrays and objects accepted, levels: the envelope (about 12
/// levels down to an attribute's value) plus four per `kvlistValue` level, for the deepest
/// `max_nesting_depth` that can be configured (40), with room to spare. What passes it
/// is parsed without serde_json's recursion limit ([`parse`]).
pub(crate) const MAX_JSON_DEPTH: usize = 192;

/// True when `body` nests arrays and objects deeper than `max` (strings, escapes included,
/// are skipped; the body is not otherwise validated here).
fn nested_deeper_than(body: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Lone UTF-16 surrogate escapes in the strings of a JSON body replaced by `\ufffd`
/// (U+FFFD REPLACEMENT CHARACTER, the same six bytes), with how many were replaced; `None`
/// when there are none (the usual case: one `memmem` pass finds no `\uD`).
///
/// JSON text may hold an escaped surrogate that is not half of a pair (RFC 8259 §8.2 calls
/// the result unpredictable), and JavaScript makes them whenever a string is cut between
/// the two halves of an emoji (`JSON.stringify("hi 😀".substring(0, 4))` is `"hi \ud83d"`).
/// No protobuf string can hold one, and serde_json refuses the whole body for it; so one
/// truncated attribute would lose a whole export to a 400 that cannot be retried. The
/// character is replaced, as a lossy UTF-8 decoder replaces invalid bytes, and the answer
/// says so ([`lone_surrogates_warning`]). Escapes are read as JSON reads them: only inside
/// strings, and `\\u` is an escaped backslash, not an escape.
pub(crate) fn replace_lone_surrogates(body: &[u8]) -> Option<(Vec<u8>, usize)> {
    let candidate = memchr::memmem::find_iter(body, b"\\u")
        .any(|i| matches!(body.get(i + 2), Some(b'd' | b'D')));
    if !candidate {
        return None;
    }
    let hex4 = |at: usize| -> Option<u32> {
        let h = body.get(at..at + 4)?;
        u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()
    };
    let is_low = |u: u32| (0xDC00..0xE000).contains(&u);
    let mut lone = Vec::new();
    let (mut i, mut in_string) = (0, false);
    while i < body.len() {
        match (in_string, body[i]) {
            (false, b'"') => in_string = true,
            (false, _) => {}
            (true, b'"') => in_string = false,
            (true, b'\\') => {
                if body.get(i + 1) == Some(&b'u') {
                    match hex4(i + 2) {
                        Some(u) if (0xD800..0xDC00).contains(&u) => {
                            let paired = body.get(i + 6..i + 8) == Some(&b"\\u"[..])
                                && hex4(i + 8).is_some_and(is_low);
                            if paired {
                                i += 12;
                                continue;
                            }
                            lone.push(i);
                        }
                        Some(u) if is_low(u) => lone.push(i),
                        // not an escape serde_json takes: it names the fault itself
                        _ => {}
                    }
                }
                i += 2;
                continue;
            }
            (true, _) => {}
        }
        i += 1;
    }
    if lone.is_empty() {
        return None;
    }
    let mut fixed = body.to_vec();
    for &at in &lone {
        fixed[at..at + 6].copy_from_slice(b"\\ufffd");
    }
    Some((fixed, lone.len()))
}

/// `message` (an export's `partial_success.error_message`, maybe empty) with the warning
/// that `replaced` lone surrogates were replaced ([`replace_lone_surrogates`]).
pub(crate) fn lone_surrogates_warning(message: String, replaced: usize) -> String {
    if replaced == 0 {
        return message;
    }
    let warning = format!(
        "{replaced} unpaired UTF-16 surrogate escape{} in JSON strings (a string cut inside a character) replaced by U+FFFD",
        if replaced == 1 { "" } else { "s" }
    );
    if message.is_empty() {
        warning
    } else {
        format!("{message}; {warning}")
    }
}

/// `T` from JSON text without serde_json's recursion limit: only for text inside a body
/// [`walk`] has bounded by [`MAX_JSON_DEPTH`].
fn parse<'a, T: serde::Deserialize<'a>>(text: &'a str) -> Result<T, DecodeError> {
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    let v = T::deserialize(&mut de).map_err(invalid_json)?;
    de.end().map_err(invalid_json)?;
    Ok(v)
}

/// An unparsed value made into a JSON tree.
pub(super) fn tree(r: &RawValue) -> Result<Value, DecodeError> {
    parse(r.get())
}

pub(super) fn raw_object<'a>(r: &'a RawValue, p: &Path) -> Result<RawObj<'a>, DecodeError> {
    match raw_kind(r) {
        "an object" => parse(r.get()),
        other => Err(DecodeError::at(
            p,
            format!("expected an object, got {other}"),
        )),
    }
}

/// [`take`] on an unparsed object: the lowerCamelCase member, else the snake_case one;
/// `null` counts as absent.
pub(super) fn raw_take<'a>(
    o: &mut RawObj<'a>,
    camel: &'static str,
    snake: &'static str,
) -> Option<&'a RawValue> {
    let is_null = |r: &&RawValue| raw_kind(r) == "null";
    let v = match o.remove(camel) {
        Some(r) if !is_null(&r) => Some(r),
        _ if camel != snake => o.remove(snake),
        other => other,
    };
    v.filter(|r| !is_null(r))
}

/// [`list`] on an unparsed object: the array's items, unparsed.
pub(super) fn raw_list<'a>(
    o: &mut RawObj<'a>,
    camel: &'static str,
    snake: &'static str,
    p: &Path,
) -> Result<Vec<&'a RawValue>, DecodeError> {
    match raw_take(o, camel, snake) {
        None => Ok(Vec::new()),
        Some(r) if raw_kind(r) == "an array" => parse(r.get()),
        Some(r) => Err(DecodeError::at(
            &p.field(camel),
            format!("expected an array, got {}", raw_kind(r)),
        )),
    }
}

/// The members of an unparsed object named in `keys`, parsed (the small ones: resource or
/// scope and schema URL), as an [`Obj`] for the member readers.
fn parsed_members(o: &mut RawObj<'_>, keys: &[&str]) -> Result<Obj, DecodeError> {
    let mut out = Obj::new();
    for k in keys {
        if let Some(r) = o.remove(*k) {
            out.insert((*k).to_string(), parse(r.get())?);
        }
    }
    Ok(out)
}

/// The envelope all three signals share: `resource{X}[]` (resource, schemaUrl) →
/// `scope{X}[]` (scope, schemaUrl) → items, each level named in lowerCamelCase and
/// snake_case (`names`), with field paths for error messages. `item` decodes one item.
///
/// The body is checked as JSON once, then walked level by level with the members left as
/// slices of the body; only one item at a time becomes a JSON tree, so a 20 MiB body never
/// becomes a whole tree in memory (issue 17 #14). The rules are those of the member
/// readers (`take`, `list`, `object`): camelCase wins unless `null`, `null` is absent, a
/// duplicate member keeps its last value.
pub(super) fn walk<T>(
    body: &[u8],
    names: [(&'static str, &'static str); 3],
    item: fn(&RawValue, &Path) -> Result<T, DecodeError>,
    out: &mut dyn Envelope<T>,
) -> Result<(), DecodeError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(());
    }
    if nested_deeper_than(body, MAX_JSON_DEPTH) {
        return Err(DecodeError::new(format!(
            "invalid OTLP/JSON request: arrays and objects nested deeper than {MAX_JSON_DEPTH} \
             levels (attribute values nest at most max_nesting_depth levels)"
        )));
    }
    let whole: &RawValue = {
        let mut de = serde_json::Deserializer::from_slice(body);
        de.disable_recursion_limit();
        let v = serde::Deserialize::deserialize(&mut de).map_err(invalid_json)?;
        de.end().map_err(invalid_json)?;
        v
    };
    if raw_kind(whole) != "an object" {
        return Err(DecodeError::new(format!(
            "invalid OTLP/JSON request: expected an object at the top level, got {}",
            raw_kind(whole)
        )));
    }
    let mut root: RawObj = parse(whole.get())?;
    let [(res_camel, res_snake), (scope_camel, scope_snake), (item_camel, item_snake)] = names;
    let r = Path::ROOT;
    let resources = raw_list(&mut root, res_camel, res_snake, &r)?;
    drop(root);
    let pres = r.field(res_camel);
    for (ri, rv) in resources.into_iter().enumerate() {
        let pr = pres.index(ri);
        let mut raw = raw_object(rv, &pr)?;
        let mut ro = parsed_members(&mut raw, &["resource", "schemaUrl", "schema_url"])?;
        let resource = resource(&mut ro, &pr)?;
        let schema_url = string(&mut ro, "schemaUrl", "schema_url", &pr)?;
        let scopes = raw_list(&mut raw, scope_camel, scope_snake, &pr)?;
        drop(raw);
        out.resource(resource, schema_url, &pr)?;
        let pscopes = pr.field(scope_camel);
        for (si, sv) in scopes.into_iter().enumerate() {
            let ps = pscopes.index(si);
            let mut raw = raw_object(sv, &ps)?;
            let mut so = parsed_members(&mut raw, &["scope", "schemaUrl", "schema_url"])?;
            let scope = scope(&mut so, &ps)?;
            let scope_schema_url = string(&mut so, "schemaUrl", "schema_url", &ps)?;
            let values = raw_list(&mut raw, item_camel, item_snake, &ps)?;
            drop(raw);
            out.scope(scope, scope_schema_url, &ps)?;
            let pitems = ps.field(item_camel);
            for (i, v) in values.into_iter().enumerate() {
                out.item(item(v, &pitems.index(i))?, &pitems.index(i), v.get().len())?;
            }
        }
    }
    Ok(())
}

/// [`walk`] collected into the protobuf messages of a whole request: `scope_msg` and
/// `resource_msg` build them (logs and metrics; traces stream through [`traces_walk`]).
pub(super) fn envelope<T, S, R>(
    body: &[u8],
    names: [(&'static str, &'static str); 3],
    item: fn(&RawValue, &Path) -> Result<T, DecodeError>,
    scope_msg: fn(Option<pc::InstrumentationScope>, Vec<T>, String) -> S,
    resource_msg: fn(Option<pr::Resource>, Vec<S>, String) -> R,
) -> Result<Vec<R>, DecodeError> {
    type Scoped<T> = (Option<pc::InstrumentationScope>, String, Vec<T>);
    struct Build<T> {
        resources: Vec<(Option<pr::Resource>, String, Vec<Scoped<T>>)>,
    }
    impl<T> Envelope<T> for Build<T> {
        fn resource(
            &mut self,
            resource: Option<pr::Resource>,
            schema_url: String,
            _: &Path,
        ) -> Result<(), DecodeError> {
            self.resources.push((resource, schema_url, Vec::new()));
            Ok(())
        }
        fn scope(
            &mut self,
            scope: Option<pc::InstrumentationScope>,
            schema_url: String,
            _: &Path,
        ) -> Result<(), DecodeError> {
            if let Some(r) = self.resources.last_mut() {
                r.2.push((scope, schema_url, Vec::new()));
            }
            Ok(())
        }
        fn item(&mut self, item: T, _: &Path, _: usize) -> Result<(), DecodeError> {
            if let Some(s) = self.resources.last_mut().and_then(|r| r.2.last_mut()) {
                s.2.push(item);
            }
            Ok(())
        }
    }
    let mut b = Build {
        resources: Vec::new(),
    };
    walk(body, names, item, &mut b)?;
    Ok(b.resources
        .into_iter()
        .map(|(res, url, scopes)| {
            let scopes = scopes
                .into_iter()
                .map(|(sc, url, items)| scope_msg(sc, items, url))
                .collect();
            resource_msg(res, scopes, url)
        })
        .collect())
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
    let resource_logs = envelope(
        body,
        [
            ("resourceLogs", "resource_logs"),
            ("scopeLogs", "scope_logs"),
            ("logRecords", "log_records"),
        ],
        |r, p| log_record(tree(r)?, p),
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
