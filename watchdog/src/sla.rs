//! SLA resolution for one tool span: a pure function of the policy, the tool name and the
//! span's own `stallwatch.sla_ms` attribute (docs/design.md, Interfaces: SLA and staleness).
//!
//! Precedence: the span's override (never below `min_sla_ms`), else the first rule whose
//! glob matches the tool name, else the default; the result is then capped by the
//! rendering / I/O class cap (when the tool is in that class) and by `max_sla_ms`.

use std::time::Duration;

use crate::config::SlaPolicy;

/// Where an effective SLA came from (evidence in incidents).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlaSource {
    /// The span's `stallwatch.sla_ms` attribute.
    Override,
    /// Rule number `n` (0-based) of `[[watchdog.sla_rule]]`.
    Rule(usize),
    /// `default_sla_ms`.
    Default,
}

impl SlaPolicy {
    /// The effective SLA of a tool span named `tool` whose `stallwatch.sla_ms` attribute is
    /// `override_ms` (negative values are ignored). Pure.
    pub fn resolve(&self, tool: &str, override_ms: Option<i64>) -> (Duration, SlaSource) {
        let (base, source) = match override_ms.filter(|v| *v >= 0) {
            Some(v) => (
                Duration::from_millis(v as u64).max(self.min_sla),
                SlaSource::Override,
            ),
            None => match self.rules.iter().position(|r| r.matches(tool)) {
                Some(i) => (self.rules[i].sla, SlaSource::Rule(i)),
                None => (self.default_sla, SlaSource::Default),
            },
        };
        let mut sla = base;
        if self.in_capped_class(tool) {
            sla = sla.min(self.class_cap);
        }
        (sla.min(self.max_sla), source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SlaRule;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn policy() -> SlaPolicy {
        SlaPolicy::new(
            ms(60_000),
            vec![
                SlaRule::new(0, "train_*", ms(600_000)).unwrap(),
                SlaRule::new(1, "train_small*", ms(5_000)).unwrap(),
                SlaRule::new(2, "render_big", ms(120_000)).unwrap(),
                SlaRule::new(3, "huge", ms(9_000_000)).unwrap(),
            ],
            vec!["render*".into(), "*read_file*".into()],
            ms(30_000),
            ms(1_000),
            ms(3_600_000),
        )
        .unwrap()
    }

    #[test]
    fn precedence_table() {
        let p = policy();
        // (tool, override, expected ms, expected source)
        let rows: &[(&str, Option<i64>, u64, SlaSource)] = &[
            ("analyze", None, 60_000, SlaSource::Default),
            ("analyze", Some(5_000), 5_000, SlaSource::Override),
            ("analyze", Some(10), 1_000, SlaSource::Override), // floor min_sla_ms
            ("analyze", Some(0), 1_000, SlaSource::Override),
            ("analyze", Some(-5), 60_000, SlaSource::Default), // nonsense ignored
            ("train_small_net", None, 600_000, SlaSource::Rule(0)), // first match wins
            ("train_x", Some(2_000), 2_000, SlaSource::Override), // override beats rule
            ("render_big", None, 30_000, SlaSource::Rule(2)),  // class cap beats rule
            ("render_plot", Some(90_000), 30_000, SlaSource::Override), // cap beats override
            ("render_plot", None, 30_000, SlaSource::Default),
            ("read_file_fast", Some(2_000), 2_000, SlaSource::Override),
            ("huge", None, 3_600_000, SlaSource::Rule(3)), // max_sla_ms
            ("analyze", Some(i64::MAX), 3_600_000, SlaSource::Override),
        ];
        for (tool, ov, want, src) in rows {
            let (got, s) = p.resolve(tool, *ov);
            assert_eq!(got, ms(*want), "tool {tool} override {ov:?}");
            assert_eq!(s, *src, "tool {tool} override {ov:?}");
        }
    }

    #[test]
    fn default_policy_caps_rendering_tools() {
        let p = SlaPolicy::default();
        assert_eq!(p.resolve("render_figure", None).0, ms(30_000));
        assert_eq!(p.resolve("run_notebook", None).0, ms(60_000));
    }
}
