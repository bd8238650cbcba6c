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
            Some(w) => suspect_until(since + w.sla.min(suspect_cap), now),
        },
    }
}

/// A lost heartbeat with a span still within its SLA: *suspect* until `deadline`, then
/// `suspect_timeout` (a trip).
fn suspect_until(deadline: Instant, now: Instant) -> Fused {
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

/// The verdict for a runner whose view is partial (`Ledger::partial_view`: one of its
/// tool spans was not tracked at the open-span ledger's bound): `f` as [`fuse`] gave it on
/// the spans the ledger does hold, with every trip held that a span missing from the view
/// could have prevented. Never kill on a partial view (docs/design.md, "Open spans").
///
/// A tracked span over its SLA still trips (the worst span of the whole view is at least
/// as far over). With the heartbeat lost, the most lenient whole view (a fresh untracked
/// span within a long SLA) is *suspect* until `since + suspect_cap`, then
/// `suspect_timeout`: so is this one. A stale tracked span (`not_configured`) trips no
/// more: an untracked span with a higher elapsed / SLA could be the worst one, and fresh.
/// Nothing that does not trip changes.
pub fn hold_for_partial_view(
    f: Fused,
    heartbeat: HeartbeatState,
    now: Instant,
    suspect_cap: Duration,
) -> Fused {
    if !f.trip || f.cause == Cause::OverSla {
        return f;
    }
    match heartbeat {
        HeartbeatState::Lost { since } => suspect_until(since + suspect_cap, now),
        _ => Fused {
            verdict: Verdict::Suspect,
            trip: false,
            cause: f.cause,
            trips_at: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    fn heartbeat(kind: u8, since_ago: u64, now: Instant) -> HeartbeatState {
        match kind % 5 {
            0 => HeartbeatState::Ok,
            1 => HeartbeatState::Starting,
            2 => HeartbeatState::NotConfigured,
            3 => HeartbeatState::Unknown,
            _ => HeartbeatState::Lost {
                since: now - ms(since_ago),
            },
        }
    }

    fn facts() -> impl Strategy<Value = Option<SpanFacts>> {
        proptest::option::of((0u64..200_000, 1_000u64..120_000, any::<bool>()).prop_map(
            |(elapsed, sla, stale)| SpanFacts {
                elapsed: ms(elapsed),
                sla: ms(sla),
                stale,
            },
        ))
    }

    fn ratio(f: &SpanFacts) -> f64 {
        f.elapsed.as_secs_f64() / f.sla.as_secs_f64()
    }

    proptest! {
        // the cases that matter (a lost heartbeat, nothing tracked, a fresh hidden span)
        // are a few in a hundred: enough cases that every run meets them
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Never kill on a partial view: whatever tool span the ledger did not track
        /// (`hidden`), a trip made on the tracked spans alone, once held, is a trip of the
        /// whole view too.
        #[test]
        fn a_held_partial_view_trips_only_when_the_whole_view_does(
            kind in 0u8..5,
            since_ago in 0u64..45_000,
            tracked in facts(),
            hidden in facts(),
        ) {
            let now = Instant::now() + ms(1_000_000);
            let cap = ms(30_000);
            let hb = heartbeat(kind, since_ago, now);
            // the whole view's worst span: the higher elapsed / SLA
            let whole = match (tracked, hidden) {
                (Some(t), Some(h)) => Some(if ratio(&h) > ratio(&t) { h } else { t }),
                (t, h) => t.or(h),
            };
            let held = hold_for_partial_view(fuse(hb, tracked, now, cap), hb, now, cap);
            if held.trip {
                prop_assert!(fuse(hb, whole, now, cap).trip, "held {held:?} on {tracked:?}, whole {whole:?}");
            }
            // a held suspect names when it trips, never later than the cap
            if let (HeartbeatState::Lost { since }, Some(t)) = (hb, held.trips_at) {
                prop_assert!(t <= since + cap);
            }
        }
    }

    /// The holds, one by one, each next to what still trips.
    #[test]
    fn a_partial_view_holds_only_what_a_missing_span_could_change() {
        let t0 = Instant::now();
        let now = t0 + ms(100_000);
        let cap = ms(30_000);
        let hold = |hb, worst| hold_for_partial_view(fuse(hb, worst, now, cap), hb, now, cap);
        // a tracked span over its SLA still trips, whatever the heartbeat
        for hb in [
            HeartbeatState::Ok,
            HeartbeatState::NotConfigured,
            HeartbeatState::Lost { since: now - ms(1) },
        ] {
            let f = hold(hb, span(60_001, 60_000, false));
            assert!(f.trip, "{hb:?}: {f:?}");
            assert_eq!(f.cause, Cause::OverSla);
        }
        // lost heartbeat, none tracked: suspect until the cap, then suspect_timeout
        let f = hold(HeartbeatState::Lost { since: now - ms(1) }, None);
        assert_eq!((f.verdict, f.trip), (Verdict::Suspect, false));
        assert_eq!(f.trips_at, Some(now - ms(1) + cap));
        let f = hold(HeartbeatState::Lost { since: now - cap }, None);
        assert_eq!((f.verdict, f.trip), (Verdict::SuspectTimeout, true));
        // lost and stale: held the same way
        let f = hold(
            HeartbeatState::Lost { since: now - ms(1) },
            span(10_000, 60_000, true),
        );
        assert_eq!((f.verdict, f.trip), (Verdict::Suspect, false));
        // not configured and stale: suspect, no trip
        let f = hold(HeartbeatState::NotConfigured, span(10_000, 60_000, true));
        assert_eq!(
            (f.verdict, f.trip, f.cause),
            (Verdict::Suspect, false, Cause::StaleSpan)
        );
        // nothing that did not trip changes
        let f = hold(HeartbeatState::Ok, span(10_000, 60_000, true));
        assert_eq!(
            f,
            fuse(HeartbeatState::Ok, span(10_000, 60_000, true), now, cap)
        );
    }
}
