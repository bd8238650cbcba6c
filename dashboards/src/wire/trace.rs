//! A whole trace in one answer (`GET /api/v1/traces/{id}`): each distinct resource and
//! scope listed once, inferred parents first, then the stored spans with their parent's
//! state, and the trace's logs; streamed through the span and log serializers of `wire`.

use super::*;

/// Distinct values, found by pointer first (one `Arc` per stored batch) then by value.
struct Distinct<'a, T: PartialEq> {
    items: Vec<&'a T>,
    last: Option<(*const T, usize)>,
}

impl<'a, T: PartialEq> Distinct<'a, T> {
    fn new() -> Self {
        Self {
            items: Vec::new(),
            last: None,
        }
    }

    fn index(&mut self, v: &'a T) -> usize {
        let p = v as *const T;
        if let Some((lp, i)) = self.last {
            if std::ptr::eq(lp, p) {
                return i;
            }
        }
        let i = match self.items.iter().position(|x| *x == v) {
            Some(i) => i,
            None => {
                self.items.push(v);
                self.items.len() - 1
            }
        };
        self.last = Some((p, i));
        i
    }
}

/// `{"service_name","attributes","dropped_attributes_count","schema_url"}`.
struct ResEntry<'a>(&'a Resource);
impl Serialize for ResEntry<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("service_name", self.0.service_name())?;
        m.serialize_entry("attributes", &Attrs(&self.0.attributes))?;
        m.serialize_entry("dropped_attributes_count", &self.0.dropped_attributes_count)?;
        m.serialize_entry("schema_url", &self.0.schema_url)?;
        m.end()
    }
}

/// `{"trace_id","span_count","resources","scopes","spans","logs"}`: each distinct resource
/// and scope is listed once and spans and logs point at them by `resource_index`/
/// `scope_index` (issue 13: repeating the resource cost ~970 bytes per span). Parents named
/// by an open span but never stored come first, as `inferred` spans, then the stored spans
/// in storage order (by start time), each with its `parent_state`. A parent that no open
/// child names is *missing* (a remote parent), never made up as running. A Logfire
/// `pending_span` twin whose real span is stored is evidence for the open-span ledger only:
/// kept in storage, not drawn and not counted in `span_count` (issue 12 #5).
pub(crate) struct TraceJ<'a> {
    view: &'a TraceView,
    inferred: Vec<Span>,
    /// Per stored span: drawn or not, and its parent's state.
    shown: Vec<Option<ParentState>>,
    resources: Vec<&'a Resource>,
    scopes: Vec<&'a Scope>,
    span_idx: Vec<(usize, usize)>,
    log_idx: Vec<(usize, usize)>,
    lean: bool,
}

impl<'a> TraceJ<'a> {
    /// The lean form of the spans (`GET /api/v1/traces/{id}?lean=true`, for the trace
    /// view: ~40% of the bytes on a 10,000-span trace): a span leaves out `trace_id`
    /// (the answer's), `kind_name`, `duration_ns` (`duration_ms` stays), `service_name`
    /// and `received_unix_nano` (its resource has the name), `status.code_name`, and every
    /// key holding its default: `parent_span_id` null, `trace_state` "", `flags` 0,
    /// `clock_skewed` false, `tool_name` null, `dropped_*_count` 0, `events` and `links`
    /// empty, `status.message` "".
    pub(crate) fn lean(mut self, on: bool) -> Self {
        self.lean = on;
        self
    }

    /// Prepares a trace view: its inferred and missing parents, its twins, and its
    /// distinct resources and scopes.
    pub(crate) fn new(view: &'a TraceView) -> Self {
        let present: std::collections::HashSet<SpanId> = view
            .spans
            .iter()
            .filter(|s| !is_pending_twin(&s.span))
            .map(|s| s.span.span_id)
            .collect();
        // parent id → (earliest child start, some child is open)
        let mut missing: std::collections::BTreeMap<SpanId, (u64, bool)> = Default::default();
        let mut hidden = vec![false; view.spans.len()];
        for (i, s) in view.spans.iter().enumerate() {
            let twin = is_pending_twin(&s.span);
            if let Some(p) = s.span.parent_span_id {
                if twin && present.contains(&p) {
                    hidden[i] = true; // the real span is known
                    continue;
                }
                if !present.contains(&p) {
                    let e = missing.entry(p).or_insert((u64::MAX, false));
                    e.0 = e.0.min(s.span.start_time_unix_nano);
                    // a twin says its parent (the real span) is running
                    e.1 |= s.state == SpanState::Open || twin;
                }
            }
        }
        let shown = view
            .spans
            .iter()
            .zip(&hidden)
            .map(|(s, h)| {
                (!h).then(|| match s.span.parent_span_id {
                    None => ParentState::Root,
                    Some(p) if present.contains(&p) => ParentState::Present,
                    Some(p) if missing.get(&p).is_some_and(|m| m.1) => ParentState::Inferred,
                    Some(_) => ParentState::Missing,
                })
            })
            .collect();
        let inferred = missing
            .into_iter()
            .filter(|(_, (_, open))| *open)
            .map(|(id, (start, _))| inferred(view.trace_id, id, start))
            .collect();
        let mut res = Distinct::new();
        let mut scp = Distinct::new();
        let span_idx = view
            .spans
            .iter()
            .map(|s| (res.index(&*s.resource), scp.index(&*s.scope)))
            .collect();
        let log_idx = view
            .logs
            .iter()
            .map(|l| (res.index(&*l.resource), scp.index(&*l.scope)))
            .collect();
        Self {
            view,
            inferred,
            shown,
            resources: res.items,
            scopes: scp.items,
            span_idx,
            log_idx,
            lean: false,
        }
    }

    /// Spans drawn: the stored ones minus hidden twins (inferred parents not counted).
    pub(crate) fn span_count(&self) -> usize {
        self.shown.iter().filter(|s| s.is_some()).count()
    }
}

impl Serialize for TraceJ<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Spans<'a>(&'a TraceJ<'a>);
        impl Serialize for Spans<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let t = self.0;
                let mut q = s.serialize_seq(Some(t.inferred.len() + t.span_count()))?;
                for sp in &t.inferred {
                    q.serialize_element(&SpanJ {
                        span: sp,
                        state: SpanState::Inferred,
                        stored: None,
                        parent_state: Some(ParentState::Root),
                        indexed: Some((0, 0)),
                        lean: t.lean,
                    })?;
                }
                for ((sp, shown), ix) in t.view.spans.iter().zip(&t.shown).zip(&t.span_idx) {
                    if let Some(ps) = shown {
                        q.serialize_element(&SpanJ {
                            parent_state: Some(*ps),
                            indexed: Some(*ix),
                            lean: t.lean,
                            ..SpanJ::stored(sp)
                        })?;
                    }
                }
                q.end()
            }
        }
        struct Logs<'a>(&'a TraceJ<'a>);
        impl Serialize for Logs<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let t = self.0;
                let mut q = s.serialize_seq(Some(t.view.logs.len()))?;
                for (l, ix) in t.view.logs.iter().zip(&t.log_idx) {
                    q.serialize_element(&LogJ(l, Some(*ix)))?;
                }
                q.end()
            }
        }
        struct List<'a, T>(&'a [&'a T], fn(&'a T) -> Item<'a>);
        enum Item<'a> {
            R(ResEntry<'a>),
            S(Scp<'a>),
        }
        impl Serialize for Item<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                match self {
                    Item::R(r) => r.serialize(s),
                    Item::S(x) => x.serialize(s),
                }
            }
        }
        impl<T> Serialize for List<'_, T> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut q = s.serialize_seq(Some(self.0.len()))?;
                for v in self.0 {
                    q.serialize_element(&(self.1)(v))?;
                }
                q.end()
            }
        }
        let mut m = s.serialize_map(Some(6))?;
        m.serialize_entry("trace_id", &Hex(&self.view.trace_id.0))?;
        m.serialize_entry("span_count", &self.span_count())?;
        m.serialize_entry(
            "resources",
            &List(&self.resources, |r| Item::R(ResEntry(r))),
        )?;
        m.serialize_entry("scopes", &List(&self.scopes, |x| Item::S(Scp(x))))?;
        m.serialize_entry("spans", &Spans(self))?;
        m.serialize_entry("logs", &Logs(self))?;
        m.end()
    }
}
