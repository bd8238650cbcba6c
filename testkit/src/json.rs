//! Reading the JSON API's answers: spans by name, attributes by key, nanosecond strings.

use serde_json::Value;

/// Looks up a span by name in a `GET /api/v1/traces/{id}` answer.
pub fn span_named<'a>(trace: &'a Value, name: &str) -> &'a Value {
    trace["spans"]
        .as_array()
        .unwrap_or_else(|| panic!("no spans in {trace}"))
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no span named {name} in {trace:#}"))
}

/// The value of attribute `key` in an OTLP KeyValue list, as its AnyValue JSON.
pub fn attr<'a>(attrs: &'a Value, key: &str) -> &'a Value {
    attrs
        .as_array()
        .unwrap_or_else(|| panic!("attributes are not a list: {attrs}"))
        .iter()
        .find(|kv| kv["key"] == key)
        .map(|kv| &kv["value"])
        .unwrap_or_else(|| panic!("no attribute {key} in {attrs}"))
}

/// A `*_unix_nano` value (a decimal string, as the API writes them, or a JSON number), ns.
/// Panics naming the value when it is neither.
pub fn nanos(v: &Value) -> u64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_u64())
        .unwrap_or_else(|| panic!("not a nanosecond value: {v}"))
}

/// Now, ns since the Unix epoch.
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}
