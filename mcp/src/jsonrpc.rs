//! Just enough JSON-RPC 2.0 to route MCP messages (JSON-RPC 2.0 spec §4, §5; MCP spec,
//! Basic: Messages). The relay forwards the original bytes; these views only read them.

use serde_json::Value;

/// What one line is.
#[derive(Debug, PartialEq)]
pub enum Kind {
    /// A request: `method` and `id`.
    Request {
        /// Canonical text of the id ([`id_key`]).
        id: String,
        /// The method, e.g. `tools/call`.
        method: String,
    },
    /// A notification: `method`, no `id`.
    Notification {
        /// The method, e.g. `notifications/progress`.
        method: String,
    },
    /// A response: `id` and `result` or `error`, no `method`.
    Response {
        /// Canonical text of the id ([`id_key`]).
        id: String,
    },
    /// Anything else (a response without `result` or `error`, ...): relayed untouched.
    Other,
}

/// The key under which an id is tracked: its JSON text, so `1` and `"1"` stay distinct
/// (JSON-RPC 2.0 §4: an id is a string or a number).
pub fn id_key(id: &Value) -> String {
    id.to_string()
}

/// Parses one line; `None` when it is not a JSON object.
pub fn parse(line: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(line).ok()?;
    v.is_object().then_some(v)
}

/// Parses one line that is a batch (JSON-RPC 2.0 §6: a non-empty array); its elements
/// as they are, objects or not. `None` for anything else.
pub fn parse_batch(line: &[u8]) -> Option<Vec<Value>> {
    let first = line.iter().find(|b| !b.is_ascii_whitespace())?;
    if *first != b'[' {
        return None;
    }
    match serde_json::from_slice(line).ok()? {
        Value::Array(items) if !items.is_empty() => Some(items),
        _ => None,
    }
}

/// Classifies a parsed message.
pub fn kind(msg: &Value) -> Kind {
    let method = msg.get("method").and_then(Value::as_str);
    let id = msg.get("id").filter(|v| !v.is_null());
    match (method, id) {
        (Some(m), Some(id)) => Kind::Request {
            id: id_key(id),
            method: m.to_string(),
        },
        (Some(m), None) => Kind::Notification {
            method: m.to_string(),
        },
        (None, Some(id)) if msg.get("result").is_some() || msg.get("error").is_some() => {
            Kind::Response { id: id_key(id) }
        }
        _ => Kind::Other,
    }
}

/// One JSON-RPC error response (JSON-RPC 2.0 §5.1): `{"jsonrpc", "id", "error": {"code",
/// "message", "data"}}`.
pub fn error_value(id: &Value, code: i64, message: &str, data: Value) -> Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message, "data": data},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn classifies_requests_notifications_responses() {
        let k = |s: &str| kind(&parse(s.as_bytes()).unwrap());
        assert_eq!(
            k(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#),
            Kind::Request {
                id: "1".into(),
                method: "tools/call".into()
            }
        );
        assert_eq!(
            k(r#"{"jsonrpc":"2.0","id":"1","method":"ping"}"#),
            Kind::Request {
                id: "\"1\"".into(),
                method: "ping".into()
            }
        );
        assert_eq!(
            k(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Kind::Notification {
                method: "notifications/initialized".into()
            }
        );
        assert_eq!(
            k(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#),
            Kind::Response { id: "7".into() }
        );
        assert_eq!(
            k(r#"{"jsonrpc":"2.0","id":7,"error":{"code":-1,"message":"x"}}"#),
            Kind::Response { id: "7".into() }
        );
        assert_eq!(k(r#"{"jsonrpc":"2.0","id":7}"#), Kind::Other);
        assert!(parse(b"[1,2]").is_none());
        assert_eq!(parse_batch(b" [1,{}]").map(|b| b.len()), Some(2));
        assert!(parse_batch(b"[]").is_none(), "an empty batch is not one");
        assert!(parse_batch(b"{}").is_none());
        assert!(parse_batch(b"[1,").is_none());
        assert!(parse(b"not json").is_none());
    }

    #[test]
    fn error_response_keeps_the_id_type() {
        let v = error_value(&json!("a"), -32001, "stopped", json!({"x": 1}));
        assert_eq!(v["id"], json!("a"));
        assert_eq!(v["error"]["code"], -32001);
        assert_eq!(v["error"]["data"]["x"], 1);
    }
}
