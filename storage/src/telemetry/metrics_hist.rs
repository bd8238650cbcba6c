//! Histogram points as distributions: reading a point's buckets, adding delta points,
//! subtracting cumulative ones, and estimating quantiles from the buckets (the methods are
//! named in `metrics_read.rs`'s module doc).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::MetricKind;

/// A number in a point's `detail` JSON (numbers, or `"NaN"`/`"Infinity"`/`"-Infinity"`).
fn jnum(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            other => other.parse().ok(),
        },
        _ => None,
    }
}

fn ju64s(v: Option<&Value>) -> Vec<u64> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|x| x.as_u64().or_else(|| x.as_str()?.parse().ok()).unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}

/// A histogram's buckets, in a form that can be added, subtracted and ranked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Dist {
    /// Explicit bounds; `counts.len() == bounds.len() + 1`.
    Explicit {
        /// Upper bounds.
        bounds: Vec<f64>,
        /// Counts per bucket.
        counts: Vec<u64>,
    },
    /// Exponential buckets at `scale`, by bucket index.
    Exp {
        /// Scale.
        scale: i32,
        /// Zero bucket count.
        zero: u64,
        /// Positive buckets, index → count.
        pos: BTreeMap<i32, u64>,
        /// Negative buckets (by magnitude index) → count.
        neg: BTreeMap<i32, u64>,
    },
}

/// The observed part of a histogram point: its distribution, count, sum, min, max.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Hist {
    pub(crate) dist: Dist,
    pub(crate) count: u64,
    pub(crate) sum: Option<f64>,
    pub(crate) min: Option<f64>,
    pub(crate) max: Option<f64>,
}

fn exp_buckets(v: Option<&Value>) -> BTreeMap<i32, u64> {
    let Some(v) = v else { return BTreeMap::new() };
    // An offset or a bucket index outside i32 (the OTLP field is a sint32) is no bucket.
    let Ok(off) = i32::try_from(v.get("offset").and_then(Value::as_i64).unwrap_or(0)) else {
        return BTreeMap::new();
    };
    ju64s(v.get("bucket_counts"))
        .into_iter()
        .enumerate()
        .filter(|(_, c)| *c > 0)
        .filter_map(|(i, c)| Some((off.checked_add(i32::try_from(i).ok()?)?, c)))
        .collect()
}

impl Hist {
    /// Reads a histogram or exponential histogram point.
    #[cfg(test)]
    pub(crate) fn from_point(p: &crate::model::MetricPoint) -> Option<Hist> {
        Self::from_detail(p.kind, p.count, p.sum, &p.detail)
    }

    /// Reads a histogram or exponential histogram from a point's kind, `count`, `sum` and
    /// `detail` JSON (what [`Hist::from_point`] reads of the point).
    pub(crate) fn from_detail(
        kind: MetricKind,
        count: Option<u64>,
        sum: Option<f64>,
        detail: &str,
    ) -> Option<Hist> {
        let d: Value = serde_json::from_str(detail).ok()?;
        let dist = match kind {
            MetricKind::Histogram => Dist::Explicit {
                bounds: d
                    .get("explicit_bounds")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(jnum).collect())
                    .unwrap_or_default(),
                counts: ju64s(d.get("bucket_counts")),
            },
            MetricKind::ExponentialHistogram => Dist::Exp {
                scale: d.get("scale").and_then(Value::as_i64).unwrap_or(0) as i32,
                zero: d.get("zero_count").and_then(Value::as_u64).unwrap_or(0),
                pos: exp_buckets(d.get("positive")),
                neg: exp_buckets(d.get("negative")),
            },
            _ => return None,
        };
        Some(Hist {
            dist,
            count: count.unwrap_or(0),
            sum,
            min: d.get("min").and_then(jnum),
            max: d.get("max").and_then(jnum),
        })
    }

    /// `self + other` (delta points of one step), `None` when the layouts differ.
    pub(crate) fn add(&self, o: &Hist) -> Option<Hist> {
        Some(Hist {
            dist: self.dist.bucketwise(&o.dist, |a, b| a.checked_add(b))?,
            count: self.count.checked_add(o.count)?,
            sum: match (self.sum, o.sum) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            },
            min: opt_fold(self.min, o.min, f64::min),
            max: opt_fold(self.max, o.max, f64::max),
        })
    }

    /// `self - earlier` (cumulative points), `None` when the layouts differ or a count
    /// went down (a reset).
    pub(crate) fn minus(&self, e: &Hist) -> Option<Hist> {
        Some(Hist {
            dist: self.dist.bucketwise(&e.dist, u64::checked_sub)?,
            count: self.count.checked_sub(e.count)?,
            sum: match (self.sum, e.sum) {
                (Some(a), Some(b)) => Some(a - b),
                _ => None,
            },
            // min/max of a cumulative point cover its whole window: not of the step
            min: None,
            max: None,
        })
    }

    /// The `q` quantile (0..=1) estimated from the buckets (see the module doc), clamped to
    /// `min`/`max` when known; `None` when the distribution is empty.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        let v = self.dist.quantile(q)?;
        let v = match self.min {
            Some(m) if v < m => m,
            _ => v,
        };
        Some(match self.max {
            Some(m) if v > m => m,
            _ => v,
        })
    }
}

fn opt_fold(a: Option<f64>, b: Option<f64>, f: fn(f64, f64) -> f64) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(f(a, b)),
        (x, None) | (None, x) => x,
    }
}

impl Dist {
    /// `op` applied bucket by bucket to `self` and `other` (the one bookkeeping behind
    /// [`Hist::add`] and [`Hist::minus`]): explicit layouts must have the same bounds;
    /// exponential ones are first downscaled to the smaller scale, a bucket missing on
    /// one side counts 0 and empty buckets are dropped. `None` when the layouts differ or
    /// `op` refuses a bucket (an overflow, or a count that went down).
    fn bucketwise(&self, other: &Dist, op: impl Fn(u64, u64) -> Option<u64>) -> Option<Dist> {
        match (self, other) {
            (
                Dist::Explicit { bounds, counts },
                Dist::Explicit {
                    bounds: b2,
                    counts: c2,
                },
            ) if bounds == b2 && counts.len() == c2.len() => Some(Dist::Explicit {
                bounds: bounds.clone(),
                counts: counts
                    .iter()
                    .zip(c2)
                    .map(|(a, b)| op(*a, *b))
                    .collect::<Option<_>>()?,
            }),
            (Dist::Exp { scale: s1, .. }, Dist::Exp { scale: s2, .. }) => {
                let s = (*s1).min(*s2);
                let (
                    Dist::Exp { zero, pos, neg, .. },
                    Dist::Exp {
                        zero: z2,
                        pos: p2,
                        neg: n2,
                        ..
                    },
                ) = (self.downscale(s), other.downscale(s))
                else {
                    return None;
                };
                let each = |mut a: BTreeMap<i32, u64>, b: BTreeMap<i32, u64>| {
                    for (k, v) in b {
                        let x = a.entry(k).or_default();
                        *x = op(*x, v)?;
                    }
                    a.retain(|_, v| *v > 0);
                    Some(a)
                };
                Some(Dist::Exp {
                    scale: s,
                    zero: op(zero, z2)?,
                    pos: each(pos, p2)?,
                    neg: each(neg, n2)?,
                })
            }
            _ => None,
        }
    }

    /// The same distribution at a smaller (or equal) `scale`: index `i` becomes
    /// `i >> (old - new)` (OTLP data model, exponential histogram downscaling).
    fn downscale(&self, to: i32) -> Dist {
        match self {
            Dist::Exp {
                scale,
                zero,
                pos,
                neg,
            } if *scale > to => {
                let shift = scale.saturating_sub(to).min(31) as u32;
                let down = |m: &BTreeMap<i32, u64>| {
                    let mut out = BTreeMap::<i32, u64>::new();
                    for (k, v) in m {
                        let x = out.entry(k >> shift).or_default();
                        *x = x.saturating_add(*v);
                    }
                    out
                };
                Dist::Exp {
                    scale: to,
                    zero: *zero,
                    pos: down(pos),
                    neg: down(neg),
                }
            }
            other => other.clone(),
        }
    }

    fn quantile(&self, q: f64) -> Option<f64> {
        let q = q.clamp(0.0, 1.0);
        match self {
            Dist::Explicit { bounds, counts } => {
                // Counts are any u64 (a hostile or broken exporter may send u64::MAX):
                // sums in u128 cannot overflow.
                let total: u128 = counts.iter().map(|c| u128::from(*c)).sum();
                if total == 0 || bounds.len() + 1 != counts.len() {
                    return None;
                }
                let rank = q * total as f64;
                let mut cum = 0u128;
                for (i, c) in counts.iter().enumerate() {
                    let before = cum;
                    cum += u128::from(*c);
                    if (cum as f64) < rank || *c == 0 {
                        continue;
                    }
                    if i == bounds.len() {
                        // the +Inf bucket: answer the highest finite bound
                        return bounds.last().copied();
                    }
                    let upper = bounds[i];
                    let lower = if i == 0 {
                        if upper > 0.0 {
                            0.0
                        } else {
                            return Some(upper);
                        }
                    } else {
                        bounds[i - 1]
                    };
                    let f = (rank - before as f64) / *c as f64;
                    return Some(lower + (upper - lower) * f);
                }
                bounds.last().copied()
            }
            Dist::Exp {
                scale,
                zero,
                pos,
                neg,
            } => {
                let total: u128 = pos
                    .values()
                    .chain(neg.values())
                    .chain(std::iter::once(zero))
                    .map(|c| u128::from(*c))
                    .sum();
                if total == 0 {
                    return None;
                }
                let base_log2 = (-f64::from(*scale)).exp2(); // log2(base)
                let pow = |x: f64| (x * base_log2).exp2(); // base^x
                let rank = q * total as f64;
                let mut cum = 0u128;
                // ascending values: negatives by decreasing magnitude, zero, positives
                for (i, c) in neg.iter().rev() {
                    let before = cum;
                    cum += u128::from(*c);
                    if (cum as f64) >= rank {
                        let f = (rank - before as f64) / *c as f64;
                        return Some(-pow(f64::from(*i) + 1.0 - f));
                    }
                }
                cum += u128::from(*zero);
                if *zero > 0 && (cum as f64) >= rank {
                    return Some(0.0);
                }
                for (i, c) in pos {
                    let before = cum;
                    cum += u128::from(*c);
                    if (cum as f64) >= rank {
                        let f = (rank - before as f64) / *c as f64;
                        return Some(pow(f64::from(*i) + f));
                    }
                }
                pos.keys().next_back().map(|i| pow(f64::from(*i) + 1.0))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn explicit(bounds: &[f64], counts: &[u64]) -> Hist {
        Hist {
            dist: Dist::Explicit {
                bounds: bounds.to_vec(),
                counts: counts.to_vec(),
            },
            count: counts.iter().sum(),
            sum: None,
            min: None,
            max: None,
        }
    }

    /// Counts are any u64 and offsets any sint32 on the wire: a step's quantiles are
    /// computed without overflowing (a debug build panicked, which also left the read's
    /// transaction open; a release build answered wrong quantiles).
    #[test]
    fn counts_and_offsets_at_the_ends_of_their_types_never_overflow() {
        let max = u64::MAX;
        let h = Hist::from_detail(
            MetricKind::Histogram,
            Some(1),
            None,
            &format!(r#"{{"explicit_bounds":[1.0],"bucket_counts":[{max},1]}}"#),
        )
        .unwrap();
        // all but one observation are in (0, 1]: the median is in it
        let p50 = h.quantile(0.5).unwrap();
        assert!(p50 > 0.0 && p50 <= 1.0, "{p50}");
        assert_eq!(h.quantile(1.0), Some(1.0));

        let exp = |scale: i32, offset: i64, counts: &str| {
            Hist::from_detail(
                MetricKind::ExponentialHistogram,
                None,
                None,
                &format!(
                    r#"{{"scale":{scale},"zero_count":{max},"positive":{{"offset":{offset},"bucket_counts":[{counts}]}}}}"#
                ),
            )
            .unwrap()
        };
        // buckets past i32::MAX are no buckets; the one at i32::MAX stays
        let h = exp(0, i64::from(i32::MAX), "1,1,1");
        let Dist::Exp { pos, .. } = &h.dist else {
            panic!("{h:?}")
        };
        assert_eq!(pos.keys().copied().collect::<Vec<_>>(), vec![i32::MAX]);
        assert_eq!(h.quantile(0.5), Some(0.0));
        assert!(h.quantile(1.0).is_some());
        // an offset outside sint32: no positive buckets at all
        let h = exp(0, i64::from(i32::MAX) + 1, "1");
        let Dist::Exp { pos, .. } = &h.dist else {
            panic!("{h:?}")
        };
        assert!(pos.is_empty());
        // downscaling merges two full buckets into one: it saturates
        let fine = exp(1, 0, &format!("{max},{max}"));
        let coarse = exp(0, 0, "0");
        let Dist::Exp { pos, .. } = fine.dist.downscale(0) else {
            panic!()
        };
        assert_eq!(pos.get(&0), Some(&max));
        // adding them overflows the zero bucket (max + max): refused, not wrapped
        assert_eq!(fine.add(&coarse), None);
        assert!(fine.quantile(0.9).is_some());
    }

    #[test]
    fn explicit_quantiles_interpolate_linearly_like_histogram_quantile() {
        // 10 in (0,10], 10 in (10,20]: the median is the top of the first bucket
        let h = explicit(&[10.0, 20.0], &[10, 10, 0]);
        assert_eq!(h.quantile(0.5), Some(10.0));
        assert_eq!(h.quantile(0.75), Some(15.0));
        assert_eq!(h.quantile(0.25), Some(5.0));
        // everything in +Inf: the highest finite bound
        let h = explicit(&[10.0, 20.0], &[0, 0, 5]);
        assert_eq!(h.quantile(0.99), Some(20.0));
        assert_eq!(explicit(&[1.0], &[0, 0]).quantile(0.5), None);
    }

    #[test]
    fn quantiles_are_clamped_to_min_and_max() {
        let mut h = explicit(&[100.0], &[4, 0]);
        h.min = Some(30.0);
        h.max = Some(40.0);
        assert_eq!(h.quantile(0.01), Some(30.0));
        assert_eq!(h.quantile(0.99), Some(40.0));
    }

    #[test]
    fn exponential_quantiles_interpolate_geometrically() {
        // scale 0: base 2; bucket 1 covers (2, 4], bucket 2 covers (4, 8]
        let h = Hist {
            dist: Dist::Exp {
                scale: 0,
                zero: 0,
                pos: [(1, 10), (2, 10)].into_iter().collect(),
                neg: BTreeMap::new(),
            },
            count: 20,
            sum: None,
            min: None,
            max: None,
        };
        assert_eq!(h.quantile(0.5), Some(4.0));
        let p75 = h.quantile(0.75).unwrap();
        assert!((p75 - 4.0 * 2f64.sqrt()).abs() < 1e-9, "{p75}");
    }

    #[test]
    fn cumulative_histograms_subtract_and_refuse_resets() {
        let a = explicit(&[10.0], &[2, 1]);
        let b = explicit(&[10.0], &[5, 1]);
        let d = b.minus(&a).unwrap();
        assert_eq!(d.count, 3);
        assert_eq!(d.dist, explicit(&[10.0], &[3, 0]).dist);
        assert!(a.minus(&b).is_none(), "a count that went down is a reset");
        assert!(
            explicit(&[5.0], &[1, 1]).minus(&a).is_none(),
            "other bounds"
        );
    }

    #[test]
    fn exponential_merge_downscales_to_the_smaller_scale() {
        let fine = Hist {
            dist: Dist::Exp {
                scale: 1,
                zero: 1,
                pos: [(2, 3), (3, 4)].into_iter().collect(),
                neg: BTreeMap::new(),
            },
            count: 8,
            sum: Some(1.0),
            min: None,
            max: None,
        };
        let coarse = Hist {
            dist: Dist::Exp {
                scale: 0,
                zero: 0,
                pos: [(1, 1)].into_iter().collect(),
                neg: BTreeMap::new(),
            },
            count: 1,
            sum: Some(2.0),
            min: None,
            max: None,
        };
        let m = fine.add(&coarse).unwrap();
        assert_eq!(m.count, 9);
        assert_eq!(m.sum, Some(3.0));
        match m.dist {
            Dist::Exp {
                scale, zero, pos, ..
            } => {
                assert_eq!(scale, 0);
                assert_eq!(zero, 1);
                // scale-1 indices 2 and 3 both fold into scale-0 index 1
                assert_eq!(pos.into_iter().collect::<Vec<_>>(), vec![(1, 8)]);
            }
            other => panic!("{other:?}"),
        }
    }
}
