//! One webhook delivery, as pure functions: the Standard Webhooks signature
//! (standardwebhooks.com, "Signature scheme") and the compatibility HMAC header, the
//! idempotency key, the JSON body, the retry policy (which answers deliver, retry or give
//! up, and when), and the text an answer leaves in the log and the attempt log (receiver
//! text escaped, URLs without their password). The worker in the parent module only moves
//! deliveries through them.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::{Digest, Sha256};
use stallwatch_storage::model::Incident;
use stallwatch_storage::outbox::AttemptOutcome;

use crate::config::{redact_url, WebhookConfig};

/// Signature header name.
pub const SIGNATURE_HEADER: &str = "X-Stallwatch-Signature";
/// Idempotency header name.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// Standard Webhooks message id header.
pub const WEBHOOK_ID_HEADER: &str = "webhook-id";
/// Standard Webhooks timestamp header (Unix seconds).
pub const WEBHOOK_TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// Standard Webhooks signature header (`v1,<base64>`).
pub const WEBHOOK_SIGNATURE_HEADER: &str = "webhook-signature";

/// The HMAC key of a configured secret: the base64 after `whsec_` (Standard Webhooks secret
/// format), else the secret's own bytes (a plain secret; the configuration refuses a
/// `whsec_` secret whose base64 is invalid, so that fallback is never taken for one).
pub fn signing_key(secret: &str) -> Vec<u8> {
    use base64::Engine as _;
    if let Some(b64) = secret.strip_prefix("whsec_") {
        if let Ok(k) = base64::engine::general_purpose::STANDARD.decode(b64) {
            return k;
        }
    }
    secret.as_bytes().to_vec()
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` (Standard Webhooks).
pub fn sign_standard(secret: &str, id: &str, timestamp_s: u64, body: &[u8]) -> String {
    use base64::Engine as _;
    let mut mac = match Hmac::<Sha256>::new_from_slice(&signing_key(secret)) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp_s.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// A receiver's `Retry-After` (delta seconds, or an HTTP-date, RFC 9110 section 10.2.3) as
/// a wait from `now`; `None` when absent or unreadable.
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `sha256=<lowercase hex HMAC-SHA256 of body keyed with secret>`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    // HMAC accepts keys of any length; the error arm cannot happen.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The `Idempotency-Key` of an incident: 32 hex characters derived from the incident's own
/// idempotency key, so a re-delivery (even after a restart) carries the same key.
pub fn idempotency_key(incident: &Incident) -> String {
    let digest = Sha256::digest(incident.incident.idempotency_key.as_bytes());
    hex::encode(&digest[..16])
}

/// Delay before attempt `attempts_made + 1`: `initial * 2^(attempts_made - 1)`, capped at
/// `max` (1 s, 2 s, 4 s ... 300 s with the defaults).
pub fn backoff(attempts_made: u32, initial: Duration, max: Duration) -> Duration {
    let exp = attempts_made.saturating_sub(1).min(30);
    initial.saturating_mul(1u32 << exp).min(max)
}

/// What follows an attempt that answered `status` (or failed in transport when `None`),
/// given the attempts made including this one; pure, `now` in ns since the Unix epoch.
///
/// 2xx → delivered; a 3xx → given up (redirects are not followed: the configured URL is
/// wrong, and a retry would get the same answer); a 4xx other than 408, 409, 425, 429 →
/// given up (the receiver refuses the message itself); else retry after the receiver's `retry_after` when it sent one
/// (kept between `retry_initial` and `retry_max`: a date already past, or 0, spent every
/// attempt within milliseconds and lost the event), otherwise after [`backoff`] scaled by
/// `jitter` in `[0, 1)` to 80–120 % (so receivers that failed together are not retried
/// together).
pub fn outcome(
    status: Option<u16>,
    attempts_made: u32,
    webhook: &WebhookConfig,
    now_unix_nano: u64,
    retry_after: Option<Duration>,
    jitter: f64,
) -> AttemptOutcome {
    if matches!(status, Some(200..=299)) {
        return AttemptOutcome::Delivered;
    }
    if matches!(status, Some(300..=399)) {
        return AttemptOutcome::GiveUp;
    }
    if matches!(status, Some(400..=499)) && !matches!(status, Some(408 | 409 | 425 | 429)) {
        return AttemptOutcome::GiveUp;
    }
    if attempts_made >= webhook.max_attempts {
        return AttemptOutcome::GiveUp;
    }
    let wait = match retry_after {
        Some(w) => w.max(webhook.retry_initial).min(webhook.retry_max),
        None => backoff(attempts_made, webhook.retry_initial, webhook.retry_max)
            .mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0)),
    };
    AttemptOutcome::RetryAt(now_unix_nano.saturating_add(wait.as_nanos() as u64))
}

/// Longest receiver text (a `Location`, a transport error's detail) kept, in characters.
const MAX_RECEIVER_TEXT: usize = 300;

/// Text from a receiver made safe for one log line: every character that is not printable
/// (line breaks, other control characters, bidirectional overrides) written as its Rust
/// escape (`\n`, `\u{202e}`), at most [`MAX_RECEIVER_TEXT`] characters of it kept (then
/// `…`). Quotes and backslashes are kept as they are.
pub(crate) fn escape_receiver_text(text: &str) -> String {
    cap(&escape_controls(text))
}

/// Every character of `text` that is not printable as its Rust escape; quotes and
/// backslashes kept.
fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '"' | '\'' | '\\') {
            out.push(c);
        } else {
            out.extend(c.escape_debug());
        }
    }
    out
}

/// `text` cut after [`MAX_RECEIVER_TEXT`] characters, marked with `…`.
fn cap(text: &str) -> String {
    match text.char_indices().nth(MAX_RECEIVER_TEXT) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The error recorded (and logged) for an answer that did not deliver, `status` not 2xx: a
/// 3xx names its `Location` (the raw header bytes; escaped, its password hidden) and says
/// that redirects are not followed; any other says the status.
pub(crate) fn answer_error(status: http::StatusCode, location: Option<&[u8]>) -> String {
    if !status.is_redirection() {
        return format!("receiver answered {status}");
    }
    match location {
        Some(l) => format!(
            "receiver answered {status}, a redirect to \"{}\"; redirects are not followed: \
             configure the webhook url as the receiver's final address",
            // escaped first, so the line breaks show; cut last, so no password part shows
            cap(&redact_url(&escape_controls(&String::from_utf8_lossy(l))))
        ),
        None => format!(
            "receiver answered {status} without a Location; redirects are not followed: \
             configure the webhook url as the receiver's final address"
        ),
    }
}

/// A number in `[0, 1)` that differs per delivery and attempt (randomly seeded per process).
pub(super) fn jitter_for(delivery: i64, attempts: u32) -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(delivery);
    h.write_u32(attempts);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The webhook body: what happened, to which runner, tool, trace and span, why, the
/// evidence, and links back to the dashboard (`base_url` without trailing `/`). An
/// incident with stall forensics (`evidence.classification`, issue 18) carries
/// `forensics: {summary, tool_frame, link}` and its evidence without the bulky `threads`
/// and `stacks` (the link leads to them).
pub fn body(incident: &Incident, base_url: &str) -> String {
    let n = &incident.incident;
    let trace = n.trace_id.map(|t| t.to_hex());
    let span = n.span_id.map(|s| s.to_hex());
    let mut links = serde_json::Map::new();
    links.insert(
        "incident".into(),
        format!("{base_url}/#/incident/{}", incident.id).into(),
    );
    links.insert(
        "incident_api".into(),
        format!("{base_url}/api/v1/incidents/{}", incident.id).into(),
    );
    if let Some(r) = &n.runner_id {
        links.insert("runner".into(), format!("{base_url}/#/runner/{r}").into());
    }
    if let Some(t) = &trace {
        links.insert("trace".into(), format!("{base_url}/#/trace/{t}").into());
        if let Some(s) = &span {
            links.insert("span".into(), format!("{base_url}/#/span/{t}/{s}").into());
        }
    }
    // Stall forensics (issue 18): a summary and a link instead of the threads and stacks.
    let mut evidence = n.evidence.clone();
    let forensics = n.evidence["classification"].as_str().map(|summary| {
        if let Some(e) = evidence.as_object_mut() {
            e.remove("threads");
            e.remove("stacks");
        }
        json!({
            "summary": summary,
            "tool_frame": n.evidence["stacks"]["tool_frame"],
            "link": format!("{base_url}/#/incident/{}", incident.id),
        })
    });
    json!({
        "event": n.kind.as_str(),
        "incident_id": incident.id,
        "at_unix_nano": n.at_unix_nano.to_string(),
        "runner_id": n.runner_id,
        "tool_name": n.tool_name,
        "trace_id": trace,
        "span_id": span,
        "reason": n.reason,
        "evidence": evidence,
        "forensics": forensics,
        "idempotency_key": idempotency_key(incident),
        "links": links,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook() -> WebhookConfig {
        WebhookConfig {
            url: "http://127.0.0.1:9/".into(),
            secret: "k".into(),
            events: vec![],
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            max_attempts: 5,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn backoff_doubles_from_one_second_to_the_cap() {
        let i = Duration::from_secs(1);
        let m = Duration::from_secs(300);
        let got: Vec<u64> = (1..=11).map(|n| backoff(n, i, m).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(backoff(u32::MAX, i, m), m);
    }

    #[test]
    fn outcome_table() {
        let h = hook();
        let o = |status, attempts, now, ra| outcome(status, attempts, &h, now, ra, 0.5);
        assert_eq!(o(Some(204), 1, 0, None), AttemptOutcome::Delivered);
        assert_eq!(
            o(Some(500), 1, 10, None),
            AttemptOutcome::RetryAt(10 + 1_000_000_000)
        );
        assert_eq!(o(None, 3, 0, None), AttemptOutcome::RetryAt(4_000_000_000));
        assert_eq!(o(Some(302), 5, 0, None), AttemptOutcome::GiveUp);
        // Redirects are not followed: a 3xx is final, from the first attempt.
        for redirect in [300, 301, 302, 303, 304, 307, 308] {
            assert_eq!(o(Some(redirect), 1, 0, None), AttemptOutcome::GiveUp);
        }
        // A 4xx is final, except the four that mean "later".
        for final_status in [400, 401, 403, 404, 410, 413, 422] {
            assert_eq!(o(Some(final_status), 1, 0, None), AttemptOutcome::GiveUp);
        }
        for later in [408, 409, 425, 429] {
            assert!(matches!(
                o(Some(later), 1, 0, None),
                AttemptOutcome::RetryAt(_)
            ));
        }
        // Retry-After wins over the back-off, capped at retry_max.
        let ra = Some(Duration::from_secs(42));
        assert_eq!(
            o(Some(503), 1, 0, ra),
            AttemptOutcome::RetryAt(42_000_000_000)
        );
        let ra = Some(Duration::from_secs(4000));
        assert_eq!(
            o(Some(429), 1, 0, ra),
            AttemptOutcome::RetryAt(300_000_000_000)
        );
        // A Retry-After of 0 (or a date already past) waits retry_initial at least.
        assert_eq!(
            o(Some(503), 1, 0, Some(Duration::ZERO)),
            AttemptOutcome::RetryAt(1_000_000_000)
        );
        // Jitter keeps the back-off within 80..=120 %.
        assert_eq!(
            outcome(Some(500), 2, &h, 0, None, 0.0),
            AttemptOutcome::RetryAt(1_600_000_000)
        );
        assert_eq!(
            outcome(Some(500), 2, &h, 0, None, 1.0),
            AttemptOutcome::RetryAt(2_400_000_000)
        );
    }

    #[test]
    fn a_redirect_answer_names_its_location_escaped_and_without_password() {
        let e = answer_error(
            http::StatusCode::FOUND,
            Some(b"http://mover:moverpass@elsewhere.example/hook"),
        );
        assert!(
            e.starts_with("receiver answered 302 Found, a redirect to \"http://mover:***@elsewhere.example/hook\"")
                && e.contains("redirects are not followed"),
            "{e}"
        );
        assert!(!e.contains("moverpass"), "{e}");
        let e = answer_error(http::StatusCode::PERMANENT_REDIRECT, None);
        assert!(
            e.contains("308 Permanent Redirect without a Location"),
            "{e}"
        );
        assert!(e.contains("redirects are not followed"), "{e}");
        // raw header bytes that would start a forged log line
        let e = answer_error(
            http::StatusCode::MOVED_PERMANENTLY,
            Some(b"/x\r\n2026-01-01T00:00:00Z  INFO forged\x1b[0m\xff"),
        );
        assert!(!e.contains(['\n', '\r', '\x1b']), "{e}");
        assert!(e.contains("/x\\r\\n2026"), "{e}");
        assert_eq!(
            answer_error(http::StatusCode::SERVICE_UNAVAILABLE, None),
            "receiver answered 503 Service Unavailable"
        );
    }

    #[test]
    fn receiver_text_cannot_break_a_log_line() {
        assert_eq!(
            escape_receiver_text("bad\nINFO forged\ttab\u{202e}\u{2028}é\"q\""),
            "bad\\nINFO forged\\ttab\\u{202e}\\u{2028}é\"q\""
        );
        let long = "a".repeat(1000);
        let cut = escape_receiver_text(&long);
        assert_eq!(cut.chars().count(), MAX_RECEIVER_TEXT + 1);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn standard_webhooks_signature_matches_the_reference_vector() {
        // The test vector of the Standard Webhooks reference libraries.
        let sig = sign_standard(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert_eq!(signing_key("plain"), b"plain".to_vec());
    }

    #[test]
    fn retry_after_seconds_and_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn signature_is_hmac_sha256_hex() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
