//! Server-sent events from `GET /api/v1/events`: an incremental parser of the
//! `text/event-stream` format (WHATWG HTML, "Server-sent events", event stream
//! interpretation) and the stream of [`Event`]s built on it.
//!
//! The parser takes bytes as they arrive (frames may be split anywhere, even inside a
//! `\r\n`), understands `id:`, `event:`, `data:` (several `data:` lines join with `\n`),
//! `retry:` and `:` comments (keep-alives), and dispatches an event at each blank line. The
//! stream carries the incident id as `id:` so a follower can resume with `Last-Event-ID`
//! (docs/design.md, event vocabulary).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;

use crate::error::{Error, Result};
use crate::types::Incident;

/// One dispatched event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The last event id seen on the stream (the incident id), if any was sent.
    pub id: Option<i64>,
    /// The event name (`event:`), e.g. `runner.terminated`; `message` when none was given.
    pub event: String,
    /// The `data:` lines joined with `\n` (an incident as JSON).
    pub data: String,
}

impl Event {
    /// Decodes [`Event::data`] as an incident. Errors with [`Error::Decode`] when it is not
    /// one.
    pub fn incident(&self) -> Result<Incident> {
        serde_json::from_str(&self.data)
            .map_err(|e| Error::decode(format!("event {} data as an incident", self.event), e))
    }
}

/// What the parser found: an event, or a `retry:` reconnection delay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A dispatched event.
    Event(Event),
    /// The server's reconnection delay (`retry:` field, ms).
    Retry(Duration),
}

/// Incremental `text/event-stream` parser. Feed bytes with [`SseParser::push`]; it returns
/// the frames completed by them. A pure state machine (no I/O).
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    skip_lf: bool,
    data: String,
    has_data: bool,
    event: String,
    last_id: Option<String>,
    bad_id: Option<String>,
}

impl SseParser {
    /// A parser with no last event id.
    pub fn new() -> Self {
        Self::default()
    }

    /// The last event id seen (what to send as `Last-Event-ID` when reconnecting).
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// Feeds `bytes`; answers the frames they complete, in order. An `id:` that is not an
    /// integer is answered as [`Error::Decode`] when its event is dispatched (stallwatch's
    /// ids are incident ids).
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Result<Frame>> {
        let mut out = Vec::new();
        for &b in bytes {
            if self.skip_lf {
                self.skip_lf = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\r' => {
                    self.skip_lf = true;
                    self.end_line(&mut out);
                }
                b'\n' => self.end_line(&mut out),
                _ => self.line.push(b),
            }
        }
        out
    }

    fn end_line(&mut self, out: &mut Vec<Result<Frame>>) {
        let line = std::mem::take(&mut self.line);
        let line = String::from_utf8_lossy(&line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.starts_with(':') {
            return; // comment / keep-alive
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = value.to_string(),
            "id" if !value.contains('\0') => {
                if value.is_empty() || value.parse::<i64>().is_ok() {
                    self.bad_id = None;
                } else {
                    self.bad_id = Some(value.to_string());
                }
                self.last_id = (!value.is_empty()).then(|| value.to_string());
            }
            "retry" if !value.is_empty() && value.bytes().all(|c| c.is_ascii_digit()) => {
                if let Ok(ms) = value.parse::<u64>() {
                    out.push(Ok(Frame::Retry(Duration::from_millis(ms))));
                }
            }
            _ => {} // unknown fields are ignored
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Result<Frame>>) {
        let event = std::mem::take(&mut self.event);
        if !self.has_data {
            return; // an event without data is not dispatched (the id still counts)
        }
        let data = std::mem::take(&mut self.data);
        self.has_data = false;
        let event = if event.is_empty() {
            "message".to_string()
        } else {
            event
        };
        if let Some(bad) = &self.bad_id {
            out.push(Err(Error::decode(
                format!("event {event} id"),
                format!("{bad:?} is not an integer"),
            )));
            return;
        }
        let id = self.last_id.as_deref().and_then(|s| s.parse::<i64>().ok());
        out.push(Ok(Frame::Event(Event { id, event, data })));
    }
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// The events of one `GET /api/v1/events` connection, in order. Ends when the server
/// closes the connection (e.g. at shutdown); an I/O failure is yielded once as
/// [`Error::Transport`] and then the stream ends. Reconnecting is the caller's choice:
/// [`EventStream::last_event_id`] says where to resume, or use
/// [`crate::Client::events_from`], which does it.
pub struct EventStream {
    body: Option<ByteStream>,
    parser: SseParser,
    pending: std::collections::VecDeque<Result<Event>>,
    retry: Option<Duration>,
}

impl EventStream {
    pub(crate) fn new(body: ByteStream) -> Self {
        Self {
            body: Some(body),
            parser: SseParser::new(),
            pending: Default::default(),
            retry: None,
        }
    }

    /// The id of the last event received (or given by the server), to pass as
    /// `last_event_id` when reconnecting.
    pub fn last_event_id(&self) -> Option<i64> {
        self.parser.last_event_id().and_then(|s| s.parse().ok())
    }

    /// The reconnection delay the server asked for with `retry:`, if it did.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// The next event; `None` when the connection has ended. Same as `StreamExt::next`,
    /// without importing `futures`.
    pub async fn next_event(&mut self) -> Option<Result<Event>> {
        futures::StreamExt::next(self).await
    }
}

/// The events of [`crate::Client::events_from`]: follows the stream across reconnections,
/// resuming from the last id seen. Never ends by itself except after
/// [`Error::Unauthorized`]; drop it to stop.
pub struct EventFollower {
    inner: Pin<Box<dyn Stream<Item = Result<Event>> + Send>>,
}

impl EventFollower {
    pub(crate) fn new(inner: Pin<Box<dyn Stream<Item = Result<Event>> + Send>>) -> Self {
        Self { inner }
    }

    /// The next event or connection error (the follower reconnects after an error).
    pub async fn next_event(&mut self) -> Option<Result<Event>> {
        futures::StreamExt::next(self).await
    }
}

impl Stream for EventFollower {
    type Item = Result<Event>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl Stream for EventStream {
    type Item = Result<Event>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(ev) = this.pending.pop_front() {
                return Poll::Ready(Some(ev));
            }
            let Some(body) = this.body.as_mut() else {
                return Poll::Ready(None);
            };
            match body.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.body = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => {
                    this.body = None;
                    return Poll::Ready(Some(Err(Error::from_reqwest(e, "event stream"))));
                }
                Poll::Ready(Some(Ok(chunk))) => {
                    for f in this.parser.push(&chunk) {
                        match f {
                            Ok(Frame::Event(e)) => this.pending.push_back(Ok(e)),
                            Ok(Frame::Retry(d)) => this.retry = Some(d),
                            Err(e) => this.pending.push_back(Err(e)),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(frames: Vec<Result<Frame>>) -> Vec<Event> {
        frames
            .into_iter()
            .filter_map(|f| match f.unwrap() {
                Frame::Event(e) => Some(e),
                Frame::Retry(_) => None,
            })
            .collect()
    }

    const TWO: &str = "id: 7\nevent: runner.started\ndata: {\"id\":7}\n\n\
                       : keep-alive\n\n\
                       id:8\nevent:runner.exited\ndata:{\"id\":8}\n\n";

    #[test]
    fn parses_ids_names_and_data() {
        let mut p = SseParser::new();
        let got = events(p.push(TWO.as_bytes()));
        assert_eq!(
            got,
            vec![
                Event {
                    id: Some(7),
                    event: "runner.started".into(),
                    data: "{\"id\":7}".into()
                },
                Event {
                    id: Some(8),
                    event: "runner.exited".into(),
                    data: "{\"id\":8}".into()
                },
            ]
        );
        assert_eq!(p.last_event_id(), Some("8"));
    }

    #[test]
    fn frames_split_at_every_byte_give_the_same_events() {
        let whole = events(SseParser::new().push(TWO.as_bytes()));
        let mut p = SseParser::new();
        let mut split = Vec::new();
        for b in TWO.as_bytes() {
            split.extend(events(p.push(std::slice::from_ref(b))));
        }
        assert_eq!(split, whole);
        assert_eq!(split.len(), 2);
    }

    #[test]
    fn crlf_split_between_chunks_is_one_line_end() {
        let mut p = SseParser::new();
        let mut got = events(p.push(b"id: 3\r"));
        got.extend(events(p.push(b"\ndata: x\r")));
        assert!(got.is_empty());
        got.extend(events(p.push(b"\n\r")));
        got.extend(events(p.push(b"\n")));
        assert_eq!(
            got,
            vec![Event {
                id: Some(3),
                event: "message".into(),
                data: "x".into()
            }]
        );
    }

    #[test]
    fn multi_line_data_joins_with_newlines() {
        let got = events(SseParser::new().push(b"data: {\ndata:  \"a\": 1\ndata\ndata: }\n\n"));
        assert_eq!(got.len(), 1);
        // One leading space is stripped, a second is kept; a bare `data` is an empty line.
        assert_eq!(got[0].data, "{\n \"a\": 1\n\n}");
        assert_eq!(got[0].id, None);
    }

    #[test]
    fn comments_and_events_without_data_dispatch_nothing() {
        let mut p = SseParser::new();
        let got = events(p.push(b": hello\n\nevent: x\n\nid: 5\n\n"));
        assert!(got.is_empty());
        // The id still counts for the next event and for resuming.
        assert_eq!(p.last_event_id(), Some("5"));
        let got = events(p.push(b"data: y\n\n"));
        assert_eq!(got[0].id, Some(5));
        assert_eq!(got[0].event, "message");
    }

    #[test]
    fn event_name_does_not_leak_into_the_next_event() {
        let got = events(SseParser::new().push(b"event: a\ndata: 1\n\ndata: 2\n\n"));
        assert_eq!(got[0].event, "a");
        assert_eq!(got[1].event, "message");
    }

    #[test]
    fn retry_is_reported_and_bad_retry_ignored() {
        let frames: Vec<Frame> = SseParser::new()
            .push(b"retry: 1500\nretry: soon\n\n")
            .into_iter()
            .map(|f| f.unwrap())
            .collect();
        assert_eq!(frames, vec![Frame::Retry(Duration::from_millis(1500))]);
    }

    #[test]
    fn a_non_integer_id_is_a_decode_error() {
        let mut f = SseParser::new().push(b"id: abc\ndata: x\n\n");
        assert!(matches!(f.pop(), Some(Err(Error::Decode { .. }))));
    }

    #[test]
    fn incident_data_decodes() {
        let data = r#"{"id":4,"event":"runner.started","runner_id":"r","reason":"","evidence":{},"at_unix_nano":"5"}"#;
        let e = Event {
            id: Some(4),
            event: "runner.started".into(),
            data: data.into(),
        };
        let i = e.incident().unwrap();
        assert_eq!((i.id, i.at_unix_nano), (4, 5));
        let e = Event {
            data: "nope".into(),
            ..e
        };
        assert!(matches!(e.incident(), Err(Error::Decode { .. })));
    }
}
