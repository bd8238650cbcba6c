//! The one writer of the Prometheus text exposition format (`GET /metrics`), used by every
//! crate's [`crate::MetricsSource`] so no crate hand-writes `# HELP` / `# TYPE` lines.
//!
//! Format: Prometheus "Exposition formats", text format 0.0.4: one `# HELP <name> <text>`
//! and one `# TYPE <name> counter|gauge|histogram` line per family, then its samples
//! `<name>[{label="value",...}] <value>`. In HELP text `\` and newline are escaped; in
//! label values `\`, `"` and newline are. Names are written as given: callers use fixed
//! `stallwatch_<name>_<unit>[_total]` names (STYLE, internal telemetry).

use std::fmt::{Display, Write};

/// The `# TYPE` of a metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A monotonically increasing count (`_total` names).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Cumulative `_bucket{le=...}` samples plus `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family being written into an exposition: its header is out, samples follow.
pub struct Family<'a> {
    out: &'a mut String,
    name: &'a str,
}

/// Starts the family `name` of `kind` with its `# HELP` and `# TYPE` lines.
pub fn family<'a>(out: &'a mut String, name: &'a str, kind: Kind, help: &str) -> Family<'a> {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {}", kind.as_str());
    Family { out, name }
}

impl Family<'_> {
    /// Appends the sample `<name>{labels} value`; no braces when `labels` is empty.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl Display) -> &mut Self {
        self.suffixed("", labels, value)
    }

    /// Appends a sample of the name plus `suffix` (`_bucket`, `_sum`, `_count` of a
    /// histogram).
    pub fn suffixed(
        &mut self,
        suffix: &str,
        labels: &[(&str, &str)],
        value: impl Display,
    ) -> &mut Self {
        let _ = write!(self.out, "{}{suffix}", self.name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }
}

/// A whole counter family with one unlabelled sample.
pub fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    family(out, name, Kind::Counter, help).sample(&[], value);
}

/// A whole gauge family with one unlabelled sample.
pub fn gauge(out: &mut String, name: &str, help: &str, value: impl Display) {
    family(out, name, Kind::Gauge, help).sample(&[], value);
}

/// A label value escaped for the text format: `\` → `\\`, `"` → `\"`, newline → `\n`.
pub fn escape_label(v: &str) -> std::borrow::Cow<'_, str> {
    if v.contains(['\\', '"', '\n']) {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
            .into()
    } else {
        v.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_headers_samples_and_escapes() {
        let mut out = String::new();
        counter(&mut out, "a_total", "As.", 3);
        family(&mut out, "b", Kind::Gauge, "Back\\slash\nnewline.")
            .sample(&[("k", "x\"y\\z\n")], 1.5)
            .sample(&[("k", "p"), ("j", "q")], 2);
        family(&mut out, "h_seconds", Kind::Histogram, "H.")
            .suffixed("_bucket", &[("le", "+Inf")], 1)
            .suffixed("_sum", &[], 0.25)
            .suffixed("_count", &[], 1);
        assert_eq!(
            out,
            "# HELP a_total As.\n# TYPE a_total counter\na_total 3\n\
             # HELP b Back\\\\slash\\nnewline.\n# TYPE b gauge\n\
             b{k=\"x\\\"y\\\\z\\n\"} 1.5\nb{k=\"p\",j=\"q\"} 2\n\
             # HELP h_seconds H.\n# TYPE h_seconds histogram\n\
             h_seconds_bucket{le=\"+Inf\"} 1\nh_seconds_sum 0.25\nh_seconds_count 1\n"
        );
    }
}
