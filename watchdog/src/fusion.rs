//! The fusion verdict: the design's "Fusion and breakers" table as a pure function of (the
//! runner's heartbeat state, its worst open tool span, now). No I/O, no clock reads.
//!
//! | heartbeat | worst open tool span | verdict | trip |
//! | --- | --- | --- | --- |
//! | ok / starting | none, or within SLA and fresh | `healthy` | no |
//! | ok / starting | within SLA, stale | `suspect` | no |
//! | ok / starting | over SLA | `tool_overrun` | yes |
//! | lost | fresh and within SLA | `suspect` for min(SLA, suspect cap), then `suspect_timeout` | then |
//! | lost | over SLA, or none open | `unresponsive` | yes |
//! | lost | stale | `stalled` | yes |
//! | not configured | over SLA | `tool_overrun` | yes |
//! | not configured | stale | `stalled` | yes |
//! | not configured | none, or within SLA and fresh | `healthy` | no |
//! | unknown (stallwatch's own fault) | over SLA | `tool_overrun` | yes |
//! | unknown | stale | `suspect` | no |
//! | unknown | none, or within SLA and fresh | `unknown` | no |
//!
//! *Unknown* is issue 17 #11: when the ping failed for a reason that is stallwatch's own
//! (`EMFILE`/`ENFILE` on connect, the watchdog task starved), the heartbeat says nothing
//! about the runner and never trips it; only the span's own SLA still can.
//!
//! "Over SLA" is elapsed > SLA (strictly); "stale" is decided by the ledger (refreshed at
//! least once, then silent past `staleness_ms`). Over SLA wins over stale.

use std::time::{Duration, Instant};

use crate::heartbeat::HeartbeatState;

/// A fused verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Nothing wrong.
    Healthy,
    /// Something looks wrong but does not trip (yet): a stale span, or a lost heartbeat
    /// while the worst span is fresh and within its SLA.
    Suspect,
    /// The worst tool span ran past its SLA while the runner otherwise looks alive.
    ToolOverrun,
    /// The heartbeat is lost and no open span explains it (none open, or over SLA).
    Unresponsive,
    /// The worst span's refreshes stopped (stale) and nothing else shows life.
    Stalled,
    /// A lost heartbeat stayed *suspect* for min(SLA, suspect cap).
    SuspectTimeout,
    /// stallwatch itself could not judge the runner (its own fault): never trips.
    Unknown,
}

impl Verdict {
    /// Every verdict, for counters.
    pub const ALL: [Verdict; 7] = [
        Verdict::Healthy,
        Verdict::Suspect,
        Verdict::ToolOverrun,
        Verdict::Unresponsive,
        Verdict::Stalled,
        Verdict::SuspectTimeout,
        Verdict::Unknown,
    ];

    /// `healthy`, `suspect`, `tool_overrun`, `unresponsive`, `stalled`, `suspect_timeout`,
    /// `unknown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Suspect => "suspect",
            Verdict::ToolOverrun => "tool_overrun",
            Verdict::Unresponsive => "unresponsive",
            Verdict::Stalled => "stalled",
            Verdict::SuspectTimeout => "suspect_timeout",
            Verdict::Unknown => "unknown",
        }
    }

    /// Index into [`Verdict::ALL`].
    pub fn index(&self) -> usize {
        Verdict::ALL.iter().position(|v| v == self).unwrap_or(0)
    }
}

/// What the fusion table needs about the worst open tool span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanFacts {
    /// Time since the span first arrived.
    pub elapsed: Duration,
    /// Its effective SLA.
    pub sla: Duration,
    /// Refreshed at least once, then silent past the staleness limit.
    pub stale: bool,
}

/// Why a verdict was reached, in words fit for an incident reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Nothing to say.
    None,
    /// The worst span is over its SLA.
    OverSla,
    /// The worst span is stale.
    StaleSpan,
    /// The heartbeat is lost.
    LostHeartbeat,
    /// The heartbeat is lost and no tool span is open.
    LostNoSpan,
    /// stallwatch's own trouble (fd exhaustion, task starved) hides the heartbeat.
    SidecarFault,
    /// A runner that said goodbye did not exit within `stopping_timeout_ms`.
    StoppingTimeout,
}

impl Cause {
    /// `none`, `over_sla`, `stale_span`, `lost_heartbeat`, `lost_no_span`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Cause::None => "none",
            Cause::OverSla => "over_sla",
            Cause::StaleSpan => "stale_span",
            Cause::LostHeartbeat => "lost_heartbeat",
            Cause::LostNoSpan => "lost_no_span",
            Cause::SidecarFault => "sidecar_fault",
            Cause::StoppingTimeout => "stopping_timeout",
        }
    }
}

/// The fusion outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fused {
    /// The verdict.
    pub verdict: Verdict,
    /// True when the breaker must trip.
    pub trip: bool,
    /// Why.
    pub cause: Cause,
    /// For a lost-heartbeat *suspect*: when it will trip if nothing changes.
    pub trips_at: Option<Instant>,
}

const fn fused(verdict: Verdict, trip: bool, cause: Cause) -> Fused {
    Fused {
        verdict,
        trip,
        cause,
        trips_at: None,
    }
}

/// The verdict for one runner at `now`. `suspect_cap` is the 30 s of "trip after
/// min(SLA, 30 s)" (docs/design.md, Interfaces: Heartbeat details).
pub fn fuse(
    heartbeat: HeartbeatState,
    worst: Option<SpanFacts>,
    now: Instant,
    suspect_cap: Duration,
) -> Fused {
    let over = worst.map(|w| w.elapsed > w.sla);
    let stale = worst.map(|w| w.stale);
    match heartbeat {
        HeartbeatState::Ok | HeartbeatState::Starting => match (over, stale) {
            (Some(true), _) => fused(Verdict::ToolOverrun, true, Cause::OverSla),
            (Some(false), Some(true)) => fused(Verdict::Suspect, false, Cause::StaleSpan),
            _ => fused(Verdict::Healthy, false, Cause::None),
        },
        HeartbeatState::NotConfigured => match (over, stale) {
            (Some(true), _) => fused(Verdict::ToolOverrun, true, Cause::OverSla),
            (Some(false), Some(true)) => fused(Verdict::Stalled, true, Cause::StaleSpan),
            _ => fused(Verdict::Healthy, false, Cause::None),
        },
        HeartbeatState::Unknown => match (over, stale) {
            (Some(true), _) => fused(Verdict::ToolOverrun, true, Cause::OverSla),
            (Some(false), Some(true)) => fused(Verdict::Suspect, false, Cause::StaleSpan),
            _ => fused(Verdict::Unknown, false, Cause::SidecarFault),
        },
        HeartbeatState::Lost { since } => match worst {
            None => fused(Verdict::Unresponsive, true, Cause::LostNoSpan),
            Some(w) if w.elapsed > w.sla => fused(Verdict::Unresponsive, true, Cause::OverSla),
            Some(w) if w.stale => fused(Verdict::Stalled, true, Cause::StaleSpan),
            Some(w) => {
                let deadline = since + w.sla.min(suspect_cap);
                if now >= deadline {
                    fused(Verdict::SuspectTimeout, true, Cause::LostHeartbeat)
                } else {
                    Fused {
                        verdict: Verdict::Suspect,
                        trip: false,
                        cause: Cause::LostHeartbeat,
                        trips_at: Some(deadline),
                    }
                }
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn span(elapsed: u64, sla: u64, stale: bool) -> Option<SpanFacts> {
        Some(SpanFacts {
            elapsed: ms(elapsed),
            sla: ms(sla),
            stale,
        })
    }

    /// One row per row of the design's table, plus the edges.
    #[test]
    fn design_table() {
        let t0 = Instant::now();
        let now = t0 + ms(100_000);
        let cap = ms(30_000);
        let ok = HeartbeatState::Ok;
        let nc = HeartbeatState::NotConfigured;
        let lost_at = |ago: u64| HeartbeatState::Lost {
            since: now - ms(ago),
        };
        use Verdict::*;
        let rows: &[(&str, HeartbeatState, Option<SpanFacts>, Verdict, bool)] = &[
            (
                "ok, within SLA, fresh",
                ok,
                span(10_000, 60_000, false),
                Healthy,
                false,
            ),
            ("ok, no span", ok, None, Healthy, false),
            (
                "ok, within SLA, stale",
                ok,
                span(10_000, 60_000, true),
                Suspect,
                false,
            ),
            (
                "ok, over SLA",
                ok,
                span(60_001, 60_000, false),
                ToolOverrun,
                true,
            ),
            (
                "ok, exactly at SLA is within",
                ok,
                span(60_000, 60_000, false),
                Healthy,
                false,
            ),
            (
                "ok, over SLA and stale: overrun wins",
                ok,
                span(70_000, 60_000, true),
                ToolOverrun,
                true,
            ),
            (
                "starting behaves as ok",
                HeartbeatState::Starting,
                span(61_000, 60_000, false),
                ToolOverrun,
                true,
            ),
            (
                "starting, no span",
                HeartbeatState::Starting,
                None,
                Healthy,
                false,
            ),
            (
                "lost, fresh within SLA, before min(SLA,30s)",
                lost_at(29_000),
                span(10_000, 60_000, false),
                Suspect,
                false,
            ),
            (
                "lost, fresh within SLA, after 30 s cap",
                lost_at(30_000),
                span(10_000, 60_000, false),
                SuspectTimeout,
                true,
            ),
            (
                "lost, short SLA bounds the suspect period",
                lost_at(5_000),
                span(4_000, 5_000, false),
                SuspectTimeout,
                true,
            ),
            (
                "lost, short SLA not yet",
                lost_at(4_999),
                span(4_000, 5_000, false),
                Suspect,
                false,
            ),
            (
                "lost, over SLA",
                lost_at(1),
                span(60_001, 60_000, false),
                Unresponsive,
                true,
            ),
            (
                "lost, stale",
                lost_at(1),
                span(10_000, 60_000, true),
                Stalled,
                true,
            ),
            ("lost, none open", lost_at(1), None, Unresponsive, true),
            (
                "not configured, over SLA",
                nc,
                span(60_001, 60_000, false),
                ToolOverrun,
                true,
            ),
            (
                "not configured, stale",
                nc,
                span(10_000, 60_000, true),
                Stalled,
                true,
            ),
            (
                "not configured, fresh within SLA",
                nc,
                span(10_000, 60_000, false),
                Healthy,
                false,
            ),
            ("not configured, none", nc, None, Healthy, false),
        ];
        for (name, hb, worst, verdict, trip) in rows {
            let f = fuse(*hb, *worst, now, cap);
            assert_eq!((f.verdict, f.trip), (*verdict, *trip), "row: {name}");
        }
    }

    #[test]
    fn suspect_names_its_trip_deadline() {
        let t0 = Instant::now();
        let f = fuse(
            HeartbeatState::Lost { since: t0 },
            span(1_000, 60_000, false),
            t0 + ms(1),
            ms(30_000),
        );
        assert_eq!(f.trips_at, Some(t0 + ms(30_000)));
        assert_eq!(f.cause, Cause::LostHeartbeat);
    }
}
