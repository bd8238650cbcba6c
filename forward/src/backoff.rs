//! The retry delay: exponential from `retry_initial` doubling up to `retry_max`, replaced by
//! the server's own hint (HTTP `Retry-After`, gRPC RetryInfo) when it gives one, capped at
//! `retry_max` (OTLP exporter spec, "Retrying"). Pure: no clock, no I/O.

use std::time::Duration;

/// Back-off state across consecutive failures of the upstream.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    last: Option<Duration>,
    failures: u64,
}

impl Backoff {
    /// A fresh back-off (`initial` ≤ `max`).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            last: None,
            failures: 0,
        }
    }

    /// The delay before the next attempt after one more failure: `initial`, then double
    /// the previous computed delay, capped at `max`; a server `hint` wins, kept between
    /// `initial` and `max` (a `Retry-After` date already past, or 0, would otherwise
    /// retry at once, over and over, an upstream that said it is unavailable).
    pub fn next_delay(&mut self, hint: Option<Duration>) -> Duration {
        self.failures += 1;
        let base = match self.last {
            None => self.initial,
            Some(d) => d.saturating_mul(2).min(self.max),
        };
        self.last = Some(base);
        match hint {
            Some(h) => h.max(self.initial).min(self.max),
            None => base,
        }
    }

    /// Consecutive failures since the last success.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// After a success: the next failure starts again at `initial`.
    pub fn reset(&mut self) {
        self.last = None;
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_honours_hints_and_resets() {
        let s = Duration::from_secs;
        let mut b = Backoff::new(s(1), s(60));
        let seq: Vec<_> = (0..8).map(|_| b.next_delay(None)).collect();
        assert_eq!(seq, [s(1), s(2), s(4), s(8), s(16), s(32), s(60), s(60)]);
        assert_eq!(b.failures(), 8);
        b.reset();
        assert_eq!(b.next_delay(Some(s(7))), s(7), "the server's hint wins");
        assert_eq!(
            b.next_delay(Some(s(600))),
            s(60),
            "hint capped at retry_max"
        );
        assert_eq!(b.next_delay(None), s(4), "exponential sequence continued");
        assert_eq!(
            b.next_delay(Some(Duration::ZERO)),
            s(1),
            "a hint of 0 (a Retry-After date already past) waits retry_initial"
        );
        b.reset();
        assert_eq!(b.failures(), 0);
        assert_eq!(b.next_delay(None), s(1));
    }
}
