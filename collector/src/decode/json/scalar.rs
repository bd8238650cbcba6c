//! JSON scalars as OTLP/JSON gives them: members by either name, integers exact from
//! numbers or decimal strings, doubles with the proto3-JSON special strings, enums by
//! number or name, hex ids (rules in the parent module's header).

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use serde_json::{Map, Value};

use crate::decode::path::Path;
use crate::decode::DecodeError;

pub(super) type Obj = Map<String, Value>;

const B64_CONFIG: GeneralPurposeConfig = GeneralPurposeConfig::new()
    .with_encode_padding(true)
    .with_decode_padding_mode(DecodePaddingMode::Indifferent);
pub(super) const B64_STANDARD: GeneralPurpose =
    GeneralPurpose::new(&alphabet::STANDARD, B64_CONFIG);
pub(super) const B64_URL_SAFE: GeneralPurpose =
    GeneralPurpose::new(&alphabet::URL_SAFE, B64_CONFIG);

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Removes a member by its lowerCamelCase or snake_case name; `null` counts as absent.
pub(super) fn take(o: &mut Obj, camel: &'static str, snake: &'static str) -> Option<Value> {
    let v = match o.remove(camel) {
        Some(Value::Null) | None if camel != snake => o.remove(snake),
        v => v,
    };
    match v {
        Some(Value::Null) | None => None,
        v => v,
    }
}

pub(super) fn object(v: Value, p: &Path) -> Result<Obj, DecodeError> {
    match v {
        Value::Object(o) => Ok(o),
        other => Err(DecodeError::at(
            p,
            format!("expected an object, got {}", kind(&other)),
        )),
    }
}

pub(super) fn opt_object(
    o: &mut Obj,
    camel: &'static str,
    snake: &'static str,
    p: &Path,
) -> Result<Option<Obj>, DecodeError> {
    take(o, camel, snake)
        .map(|v| object(v, &p.field(camel)))
        .transpose()
}

pub(super) fn list(
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

pub(super) fn string(
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

pub(super) fn boolean(v: Value, p: &Path) -> Result<bool, DecodeError> {
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
pub(super) fn integer(v: &Value, p: &Path, type_name: &str) -> Result<i128, DecodeError> {
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
                } else if f.abs() < 1.8e19 {
                    // in range, but a double cannot say which integer it was
                    Err(bad(format!(
                        "{type_name} {n} is in exponent or fraction notation, exact only below \
                         2^53: send it as a decimal integer (string or number)"
                    )))
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

pub(super) fn ranged<T: TryFrom<i128>>(
    v: Value,
    p: &Path,
    type_name: &str,
) -> Result<T, DecodeError> {
    let i = integer(&v, p, type_name)?;
    T::try_from(i).map_err(|_| DecodeError::at(p, format!("{type_name} out of range: {i}")))
}

pub(super) fn u64_field(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<u64, DecodeError> {
    take(o, c, s).map_or(Ok(0), |v| ranged(v, &p.field(c), "uint64"))
}

pub(super) fn u32_field(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<u32, DecodeError> {
    take(o, c, s).map_or(Ok(0), |v| ranged(v, &p.field(c), "uint32"))
}

pub(super) fn i32_field(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<i32, DecodeError> {
    take(o, c, s).map_or(Ok(0), |v| ranged(v, &p.field(c), "int32"))
}

/// A double: a JSON number, a numeric string, or `"NaN"`, `"Infinity"`, `"-Infinity"`.
pub(super) fn double(v: Value, p: &Path) -> Result<f64, DecodeError> {
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

pub(super) fn f64_field(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<f64, DecodeError> {
    take(o, c, s).map_or(Ok(0.0), |v| double(v, &p.field(c)))
}

pub(super) fn opt_f64_field(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<Option<f64>, DecodeError> {
    take(o, c, s).map(|v| double(v, &p.field(c))).transpose()
}

/// An enum given as an integer (any `int32`, unknown values kept) or as its proto name.
pub(super) fn enumeration(
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
pub(super) fn hex_id(
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
