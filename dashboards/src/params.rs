//! Strict query-string parsing: every parameter is taken by name, validated with a 400 that
//! names it, and anything left over is refused as unknown.

use std::collections::BTreeMap;

use crate::error::DashboardError;

/// Query parameters of one request, consumed by name.
pub(crate) struct Params {
    map: BTreeMap<String, String>,
    /// Values of parameters that may repeat ([`Params::repeatable`]).
    multi: BTreeMap<String, Vec<String>>,
}

impl Params {
    /// Builds from the raw pairs; a repeated parameter is a 400.
    pub(crate) fn new(pairs: Vec<(String, String)>) -> Result<Self, DashboardError> {
        Self::repeatable(pairs, &[])
    }

    /// Builds from the raw pairs; the parameters named in `repeat` may be given more than
    /// once (read them with [`Params::all`]), any other repeated one is a 400.
    pub(crate) fn repeatable(
        pairs: Vec<(String, String)>,
        repeat: &[&str],
    ) -> Result<Self, DashboardError> {
        let mut map = BTreeMap::new();
        let mut multi: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in pairs {
            if repeat.contains(&k.as_str()) {
                multi.entry(k).or_default().push(v);
                continue;
            }
            if map.insert(k.clone(), v).is_some() {
                return Err(DashboardError::bad_param(format!(
                    "query parameter {k:?} given more than once"
                )));
            }
        }
        Ok(Self { map, multi })
    }

    /// Every non-empty value of a repeatable parameter, in order (at most 16).
    pub(crate) fn all(&mut self, name: &str) -> Result<Vec<String>, DashboardError> {
        let vals: Vec<String> = self
            .multi
            .remove(name)
            .unwrap_or_default()
            .into_iter()
            .filter(|v| !v.is_empty())
            .collect();
        if vals.len() > 16 {
            return Err(DashboardError::bad_param(format!(
                "query parameter {name:?} given more than 16 times"
            )));
        }
        if let Some(v) = vals.iter().find(|v| v.len() > 1024) {
            return Err(DashboardError::bad_param(format!(
                "query parameter {name:?} is longer than 1024 bytes ({} bytes)",
                v.len()
            )));
        }
        Ok(vals)
    }

    /// A non-empty string parameter.
    pub(crate) fn string(&mut self, name: &str) -> Result<Option<String>, DashboardError> {
        match self.map.remove(name) {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) if v.len() > 1024 => Err(DashboardError::bad_param(format!(
                "query parameter {name:?} is longer than 1024 bytes"
            ))),
            Some(v) => Ok(Some(v)),
        }
    }

    /// An unsigned integer parameter within `min..=max`.
    pub(crate) fn u64_in(
        &mut self,
        name: &str,
        min: u64,
        max: u64,
    ) -> Result<Option<u64>, DashboardError> {
        let Some(v) = self.string(name)? else {
            return Ok(None);
        };
        match v.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(DashboardError::bad_param(format!(
                "query parameter {name:?} must be an integer from {min} to {max}, got {v:?}"
            ))),
        }
    }

    /// A page size: default `default`, 1..=`max`.
    pub(crate) fn limit(&mut self, default: u64, max: u64) -> Result<usize, DashboardError> {
        Ok(self.u64_in("limit", 1, max)?.unwrap_or(default) as usize)
    }

    /// Refuses parameters nobody took.
    pub(crate) fn finish(self) -> Result<(), DashboardError> {
        match self.map.keys().chain(self.multi.keys()).next() {
            None => Ok(()),
            Some(k) => Err(DashboardError::bad_param(format!(
                "unknown query parameter {k:?}"
            ))),
        }
    }
}

/// The `Last-Event-ID` header of an SSE reconnect (WHATWG HTML, "Server-sent events":
/// the last event id the client saw), as a row or incident id: `None` when absent or
/// empty. `what` names the id in errors ("an incident id", "a log row id").
///
/// Errors: an `invalid_parameter` 400 when the header is given more than once, is not
/// text, or is not an id from 0 to `i64::MAX`.
pub(crate) fn last_event_id(
    headers: &http::HeaderMap,
    what: &str,
) -> Result<Option<i64>, DashboardError> {
    let mut values = headers.get_all("last-event-id").iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    let n = 1 + values.count();
    if n > 1 {
        return Err(DashboardError::bad_param(format!(
            "Last-Event-ID is given {n} times; give it once"
        )));
    }
    let s = v
        .to_str()
        .map_err(|_| {
            DashboardError::bad_param(format!(
                "Last-Event-ID must be {what}, got bytes that are not text"
            ))
        })?
        .trim();
    if s.is_empty() {
        return Ok(None);
    }
    s.parse::<i64>()
        .ok()
        .filter(|n| *n >= 0)
        .map(Some)
        .ok_or_else(|| {
            DashboardError::bad_param(format!("Last-Event-ID must be {what}, got {s:?}"))
        })
}

/// An extractor for routes that take no query parameter (the control routes): any is a 400
/// naming it, as [`Params::finish`] answers on the read routes.
pub(crate) struct NoQuery;

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for NoQuery {
    type Rejection = DashboardError;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(pairs) =
            axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
                .map_err(|e| DashboardError::bad_param(format!("invalid query string: {e}")))?;
        Params::new(pairs)?.finish()?;
        Ok(NoQuery)
    }
}
