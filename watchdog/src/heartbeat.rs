//! Socket heartbeats (docs/design.md, Heartbeat; Interfaces: Heartbeat details).
//!
//! [`ping`] is the only I/O: a fresh connection per ping (a UNIX socket; on Windows a named
//! pipe `\\.\pipe\...`, docs/platforms.md, through the `transport` seam), write `PING\n`, read at most
//! 64 bytes up to `\n`, accept exactly `PONG`, close; every failure is a named
//! [`HeartbeatFailure`]. [`HeartbeatTracker`] is the pure per-runner state: *lost* means no
//! PONG for the timeout since the last PONG (pings may overlap), and a new runner has a
//! start-up grace before its first PONG is due. Pings are plain futures: thousands of
//! runners share the runtime's few worker threads, never a thread each.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::path::Path;
use std::time::{Duration, Instant};

use stallwatch_storage::labels::HeartbeatLabel;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Usable bytes of `sun_path` on Linux (108 including the terminating NUL).
pub const MAX_SOCKET_PATH_BYTES: usize = 107;
/// Longest named-pipe path on Windows, characters (`CreateNamedPipeW`: 256).
pub const MAX_PIPE_PATH_CHARS: usize = 256;
/// Longest answer read from a heartbeat socket, bytes (docs/design.md: "read at most 64 bytes").
pub const MAX_ANSWER_BYTES: usize = 64;
/// Round-trip samples kept per runner for the dashboard.
pub const RTT_RING: usize = 32;

/// Why one ping failed. Each is a distinct, named failure (`as_str`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeartbeatFailure {
    /// The path does not fit `sun_path`; no connection was attempted.
    #[error("socket path is {len} bytes; a UNIX socket path holds at most 107 bytes on Linux (108 with the NUL), so it cannot be connected: register a shorter path (stallwatch's own fallback is /tmp/stallwatch-$UID/<hash>.sock)")]
    PathTooLong {
        /// Length of the path in bytes.
        len: usize,
    },
    /// No socket file at the path (the runner has not bound it, or it is gone).
    #[error("no socket at the heartbeat path")]
    SocketMissing,
    /// A socket file exists but nobody accepts on it (a stale file of a dead runner).
    #[error("connection refused: a stale socket file or a runner not listening")]
    ConnectionRefused,
    /// The runner answered something other than `PONG`.
    #[error("bad answer {0:?}, expected \"PONG\"")]
    BadAnswer(String),
    /// No complete answer within the heartbeat timeout.
    #[error("no answer within the heartbeat timeout")]
    Timeout,
    /// Any other I/O error (permission denied, not a socket, ...).
    #[error("heartbeat i/o error: {0}")]
    Io(String),
    /// The runner answered `BYE`: it is exiting deliberately (its goodbye). Not a lost
    /// heartbeat: the runner becomes `stopping` (`docs/design.md`, Runner lifecycle).
    #[error("the runner said goodbye (BYE): it is exiting")]
    Goodbye,
    /// The ping failed for a reason that is stallwatch's own (`EMFILE`/`ENFILE`/`ENOBUFS`/
    /// `ENOMEM` creating or connecting the socket): it says nothing about the runner, so the
    /// heartbeat is *unknown*, never lost (issue 17 #11).
    #[error("stallwatch itself could not ping: {0}")]
    OwnFault(String),
}

impl HeartbeatFailure {
    /// Every failure name, for counters (the `reason` label of
    /// `stallwatch_watchdog_heartbeats_failed_total`), in [`HeartbeatFailure::index`] order.
    pub const NAMES: [HeartbeatLabel; 8] = HeartbeatLabel::FAILURES;

    /// The failure's label: `path_too_long`, `socket_missing`, `connection_refused`,
    /// `bad_answer`, `timeout`, `io_error`, `goodbye` or `sidecar_fault`.
    pub fn label(&self) -> HeartbeatLabel {
        match self {
            HeartbeatFailure::PathTooLong { .. } => HeartbeatLabel::PathTooLong,
            HeartbeatFailure::SocketMissing => HeartbeatLabel::SocketMissing,
            HeartbeatFailure::ConnectionRefused => HeartbeatLabel::ConnectionRefused,
            HeartbeatFailure::BadAnswer(_) => HeartbeatLabel::BadAnswer,
            HeartbeatFailure::Timeout => HeartbeatLabel::Timeout,
            HeartbeatFailure::Io(_) => HeartbeatLabel::IoError,
            HeartbeatFailure::Goodbye => HeartbeatLabel::Goodbye,
            HeartbeatFailure::OwnFault(_) => HeartbeatLabel::SidecarFault,
        }
    }

    /// The failure's name: [`HeartbeatFailure::label`] as its wire string.
    pub fn as_str(&self) -> &'static str {
        self.label().as_str()
    }

    /// True when the failure is stallwatch's own, not the runner's.
    pub fn is_own_fault(&self) -> bool {
        matches!(self, HeartbeatFailure::OwnFault(_))
    }

    /// Index into [`HeartbeatFailure::NAMES`].
    pub fn index(&self) -> usize {
        match self {
            HeartbeatFailure::PathTooLong { .. } => 0,
            HeartbeatFailure::SocketMissing => 1,
            HeartbeatFailure::ConnectionRefused => 2,
            HeartbeatFailure::BadAnswer(_) => 3,
            HeartbeatFailure::Timeout => 4,
            HeartbeatFailure::Io(_) => 5,
            HeartbeatFailure::Goodbye => 6,
            HeartbeatFailure::OwnFault(_) => 7,
        }
    }
}

/// Checks a socket path against the `sun_path` limit before any syscall (on Windows: the
/// named-pipe limit, [`MAX_PIPE_PATH_CHARS`]).
pub fn check_path(path: &Path) -> Result<(), HeartbeatFailure> {
    let len = path.as_os_str().len();
    let limit = if cfg!(windows) {
        MAX_PIPE_PATH_CHARS
    } else {
        MAX_SOCKET_PATH_BYTES
    };
    if len > limit {
        return Err(HeartbeatFailure::PathTooLong { len });
    }
    Ok(())
}

/// Maps an I/O error of our own socket calls: resource exhaustion inside stallwatch
/// (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`; on Windows `ERROR_TOO_MANY_OPEN_FILES`,
/// `ERROR_NOT_ENOUGH_MEMORY`, `ERROR_OUTOFMEMORY`, `ERROR_NO_SYSTEM_RESOURCES`) is
/// [`HeartbeatFailure::OwnFault`], anything else `other(e)`.
fn own_or(
    e: std::io::Error,
    other: impl FnOnce(std::io::Error) -> HeartbeatFailure,
) -> HeartbeatFailure {
    if transport::is_own_exhaustion(&e) {
        HeartbeatFailure::OwnFault(e.to_string())
    } else {
        other(e)
    }
}

/// The heartbeat transport seam (docs/platforms.md, heartbeat transport): a UNIX domain
/// socket on Unix, a named pipe on Windows; both carry the same bytes.
mod transport {
    use std::path::Path;

    /// Connects to the runner's UNIX socket.
    #[cfg(unix)]
    pub async fn connect(path: &Path) -> std::io::Result<tokio::net::UnixStream> {
        tokio::net::UnixStream::connect(path).await
    }

    /// Opens the runner's named pipe as a client. A pipe whose every instance is busy
    /// (`ERROR_PIPE_BUSY`: the kit is between accepts) is retried every 5 ms; the caller's
    /// timeout bounds the wait. A pipe that does not exist is `ERROR_FILE_NOT_FOUND`, which
    /// std maps to `NotFound`, the same as a missing socket file.
    #[cfg(windows)]
    pub async fn connect(
        path: &Path,
    ) -> std::io::Result<tokio::net::windows::named_pipe::NamedPipeClient> {
        use tokio::net::windows::named_pipe::ClientOptions;
        use windows_sys::Win32::Foundation::ERROR_PIPE_BUSY;
        loop {
            match ClientOptions::new().open(path) {
                Ok(c) => return Ok(c),
                Err(e) if e.raw_os_error() == Some(ERROR_PIPE_BUSY as i32) => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// True for resource exhaustion inside stallwatch itself.
    #[cfg(unix)]
    pub fn is_own_exhaustion(e: &std::io::Error) -> bool {
        use rustix::io::Errno;
        matches!(
            Errno::from_io_error(e),
            Some(Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM)
        )
    }

    /// True for resource exhaustion inside stallwatch itself.
    #[cfg(windows)]
    pub fn is_own_exhaustion(e: &std::io::Error) -> bool {
        use windows_sys::Win32::Foundation::{
            ERROR_NOT_ENOUGH_MEMORY, ERROR_NO_SYSTEM_RESOURCES, ERROR_OUTOFMEMORY,
            ERROR_TOO_MANY_OPEN_FILES,
        };
        matches!(
            e.raw_os_error().map(|c| c as u32),
            Some(
                ERROR_TOO_MANY_OPEN_FILES
                    | ERROR_NOT_ENOUGH_MEMORY
                    | ERROR_OUTOFMEMORY
                    | ERROR_NO_SYSTEM_RESOURCES
            )
        )
    }
}

/// One ping: connect to `path`, write `PING\n`, read at most 64 bytes up to `\n`, accept
/// exactly `PONG` (`BYE` is the runner's goodbye, [`HeartbeatFailure::Goodbye`]). Answers the round-trip time, or the named failure; the whole exchange is
/// bounded by `timeout`.
pub async fn ping(path: &Path, timeout: Duration) -> Result<Duration, HeartbeatFailure> {
    check_path(path)?;
    let start = Instant::now();
    match tokio::time::timeout(timeout, exchange(path)).await {
        Ok(Ok(())) => Ok(start.elapsed()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(HeartbeatFailure::Timeout),
    }
}

async fn exchange(path: &Path) -> Result<(), HeartbeatFailure> {
    let mut stream = transport::connect(path).await.map_err(|e| {
        own_or(e, |e| match e.kind() {
            ErrorKind::NotFound => HeartbeatFailure::SocketMissing,
            ErrorKind::ConnectionRefused => HeartbeatFailure::ConnectionRefused,
            _ => HeartbeatFailure::Io(e.to_string()),
        })
    })?;
    talk(&mut stream).await
}

/// One PING and its answer on a connected stream.
async fn talk<S>(stream: &mut S) -> Result<(), HeartbeatFailure>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // A runner may answer before it reads our PING (write `PONG`, close): our write then
    // fails (EPIPE, ECONNRESET) while its answer already waits in the socket. The answer
    // is what counts, so it is read first; the write's error stands only when none came.
    let written = stream.write_all(b"PING\n").await;
    let mut buf = [0u8; MAX_ANSWER_BYTES];
    let mut n = 0;
    loop {
        if n == buf.len() {
            return Err(HeartbeatFailure::BadAnswer(lossy(&buf[..n])));
        }
        let got = match stream.read(&mut buf[n..]).await {
            Ok(got) => got,
            Err(e) => {
                return Err(HeartbeatFailure::Io(match &written {
                    Err(w) if n == 0 => w.to_string(),
                    _ => e.to_string(),
                }))
            }
        };
        if got == 0 {
            if n == 0 {
                if let Err(w) = written {
                    return Err(HeartbeatFailure::Io(w.to_string()));
                }
            }
            // closed before a newline: judge what came
            break;
        }
        n += got;
        if buf[..n].contains(&b'\n') {
            break;
        }
    }
    let line = buf[..n].split(|b| *b == b'\n').next().unwrap_or_default();
    // A line ended CRLF is the same answer (a runner written for a CRLF protocol).
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line == b"PONG" {
        Ok(())
    } else if line == b"BYE" {
        Err(HeartbeatFailure::Goodbye)
    } else {
        Err(HeartbeatFailure::BadAnswer(lossy(line)))
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The heartbeat state the fusion table reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatState {
    /// The runner has no heartbeat socket (or one stallwatch cannot connect to by
    /// construction, e.g. a path over 107 bytes).
    NotConfigured,
    /// Registered recently; its first PONG is not due yet.
    Starting,
    /// A PONG arrived within the timeout.
    Ok,
    /// No PONG for the timeout since the last one (or since the grace ended); `since` is
    /// when the deadline passed.
    Lost {
        /// When the heartbeat became lost.
        since: Instant,
    },
    /// The latest ping failed for a reason that is stallwatch's own (fd exhaustion, our
    /// task starved): nothing is known about the runner, and nothing trips on it.
    Unknown,
}

impl HeartbeatState {
    /// The state's label: `not_configured`, `starting`, `ok`, `lost` or `unknown`.
    pub fn label(&self) -> HeartbeatLabel {
        match self {
            HeartbeatState::NotConfigured => HeartbeatLabel::NotConfigured,
            HeartbeatState::Starting => HeartbeatLabel::Starting,
            HeartbeatState::Ok => HeartbeatLabel::Ok,
            HeartbeatState::Lost { .. } => HeartbeatLabel::Lost,
            HeartbeatState::Unknown => HeartbeatLabel::Unknown,
        }
    }

    /// [`HeartbeatState::label`] as its wire string.
    pub fn as_str(&self) -> &'static str {
        self.label().as_str()
    }
}

/// Per-runner heartbeat bookkeeping. Pure: every method takes `now`.
#[derive(Clone, Debug)]
pub struct HeartbeatTracker {
    configured: bool,
    registered_at: Instant,
    last_pong: Option<Instant>,
    last_failure: Option<HeartbeatFailure>,
    last_result_ok: bool,
    /// Latest instant at which stallwatch itself could not judge the runner (an own-fault
    /// ping, or the watchdog task starved): the lost deadline never runs from before it.
    own_fault_at: Option<Instant>,
    next_ping: Instant,
    in_flight: u32,
    rtt: VecDeque<(u64, u64)>,
}

impl HeartbeatTracker {
    /// A tracker for a runner registered at `now`; `configured` when it has a usable socket.
    pub fn new(configured: bool, now: Instant) -> Self {
        Self {
            configured,
            registered_at: now,
            last_pong: None,
            last_failure: None,
            last_result_ok: false,
            own_fault_at: None,
            next_ping: now,
            in_flight: 0,
            rtt: VecDeque::new(),
        }
    }

    /// Restarts the start-up grace at `now` (a restart or re-registration).
    pub fn restart(&mut self, configured: bool, now: Instant) {
        let rtt = std::mem::take(&mut self.rtt);
        *self = Self::new(configured, now);
        self.rtt = rtt;
    }

    /// True when the runner has a usable heartbeat socket.
    pub fn configured(&self) -> bool {
        self.configured
    }

    /// The state at `now` (docs/design.md: lost = no PONG for `timeout` since the last PONG; before
    /// the first PONG, lost once `grace` has passed since registration).
    pub fn state(&self, now: Instant, timeout: Duration, grace: Duration) -> HeartbeatState {
        if !self.configured {
            return HeartbeatState::NotConfigured;
        }
        if self
            .current_failure()
            .is_some_and(HeartbeatFailure::is_own_fault)
        {
            return HeartbeatState::Unknown;
        }
        let Some(deadline) = self.lost_deadline(timeout, grace) else {
            return HeartbeatState::NotConfigured;
        };
        if now > deadline {
            HeartbeatState::Lost { since: deadline }
        } else if self.last_pong.is_some() {
            HeartbeatState::Ok
        } else {
            HeartbeatState::Starting
        }
    }

    /// Marks `now` as an instant at which stallwatch itself could not judge the runner (its
    /// own task was starved, or its own socket call failed): the lost deadline restarts
    /// from here, so our trouble is never counted as the runner's.
    pub fn own_fault(&mut self, now: Instant) {
        self.own_fault_at = Some(self.own_fault_at.map_or(now, |t| t.max(now)));
    }

    /// When the heartbeat will count as lost if no PONG arrives first (`None` when not
    /// configured). The state turns `Lost` strictly after this instant.
    pub fn lost_deadline(&self, timeout: Duration, grace: Duration) -> Option<Instant> {
        if !self.configured {
            return None;
        }
        let base = match self.last_pong {
            Some(p) => p + timeout,
            None => self.registered_at + grace,
        };
        Some(match self.own_fault_at {
            Some(f) => base.max(f + timeout),
            None => base,
        })
    }

    /// When the next scheduled ping is due.
    pub fn next_ping(&self) -> Instant {
        self.next_ping
    }

    /// Pings started and not yet finished.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Index of the current label for cheap change detection: 0..=3 the states of
    /// [`HeartbeatState`], 10 + [`HeartbeatFailure::index`] when the latest ping failed.
    pub fn label_code(&self, now: Instant, timeout: Duration, grace: Duration) -> u8 {
        if let Some(f) = self.current_failure() {
            return 10 + f.index() as u8;
        }
        match self.state(now, timeout, grace) {
            HeartbeatState::NotConfigured => 0,
            HeartbeatState::Starting => 1,
            HeartbeatState::Ok => 2,
            HeartbeatState::Lost { .. } => 3,
            HeartbeatState::Unknown => 4,
        }
    }

    /// When the latest PONG arrived.
    pub fn last_pong(&self) -> Option<Instant> {
        self.last_pong
    }

    /// The latest failure, if the latest finished ping failed.
    pub fn current_failure(&self) -> Option<&HeartbeatFailure> {
        if self.last_result_ok {
            None
        } else {
            self.last_failure.as_ref()
        }
    }

    /// True when a ping should start at `now`; `max_in_flight` bounds overlapping pings.
    pub fn due(&self, now: Instant, max_in_flight: u32) -> bool {
        self.configured && now >= self.next_ping && self.in_flight < max_in_flight
    }

    /// Records that a ping started at `now`; the next is due one `interval` later.
    pub fn ping_started(&mut self, now: Instant, interval: Duration) {
        self.in_flight += 1;
        self.next_ping = next_in_phase(self.next_ping, now, interval);
    }

    /// Records the outcome of a ping that started at `sent` and finished at `now`.
    /// `unix_ms` stamps the RTT sample.
    pub fn ping_finished(
        &mut self,
        sent: Instant,
        now: Instant,
        result: &Result<Duration, HeartbeatFailure>,
        unix_ms: u64,
    ) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match result {
            Ok(rtt) => {
                // a PONG proves liveness as of when the ping was sent at the latest
                let at = now.max(sent);
                self.last_pong = Some(self.last_pong.map_or(at, |p| p.max(at)));
                self.last_result_ok = true;
                self.rtt.push_back((unix_ms, rtt.as_micros() as u64));
                while self.rtt.len() > RTT_RING {
                    self.rtt.pop_front();
                }
            }
            Err(f) => {
                if f.is_own_fault() {
                    self.own_fault(now);
                }
                self.last_result_ok = false;
                self.last_failure = Some(f.clone());
            }
        }
    }

    /// Records a PONG at `now` obtained outside the schedule (the HALF_OPEN probe).
    pub fn pong_at(&mut self, now: Instant) {
        self.last_pong = Some(now);
        self.last_result_ok = true;
    }

    /// Recent (unix ms, µs) round trips, oldest first.
    pub fn rtt_samples(&self) -> Vec<(u64, u64)> {
        self.rtt.iter().copied().collect()
    }

    /// The latest round trip in µs.
    pub fn last_rtt_us(&self) -> Option<u64> {
        self.rtt.back().map(|(_, us)| *us)
    }
}

/// The next ping after one started at `now` whose slot was `slot`: one `interval` later,
/// or, after a stall that skipped slots, the first slot of the same phase after `now`. Each
/// runner keeps the phase it got at registration, so thousands of runners stay spread over
/// the interval instead of all pinging at the instant a stall ended (issue 17 #10), and
/// the schedule never drifts.
pub(crate) fn next_in_phase(slot: Instant, now: Instant, interval: Duration) -> Instant {
    let next = slot + interval;
    if next > now || interval.is_zero() {
        return next.max(now);
    }
    let behind = now.saturating_duration_since(next).as_nanos();
    let per = interval.as_nanos();
    let skip = behind / per + 1;
    next + Duration::from_nanos(u64::try_from(skip * per).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// After any stall the next ping is within one interval after `now`, strictly
        /// after it, and on the runner's own phase (a whole number of intervals after its
        /// previous slot).
        #[test]
        fn pings_keep_their_phase_after_a_stall(
            interval_ms in 1u64..5000,
            late_ms in 0u64..60_000,
        ) {
            let t0 = Instant::now();
            let interval = Duration::from_millis(interval_ms);
            let now = t0 + Duration::from_millis(late_ms);
            let next = next_in_phase(t0, now, interval);
            prop_assert!(next >= now);
            prop_assert!(next <= now + interval);
            let offset = next.duration_since(t0).as_nanos();
            prop_assert_eq!(offset % interval.as_nanos(), 0);
            prop_assert!(offset >= interval.as_nanos());
        }
    }

    #[test]
    fn two_runners_out_of_phase_stay_out_of_phase_after_a_stall() {
        let t0 = Instant::now();
        let i = Duration::from_millis(2000);
        let (a, b) = (t0, t0 + Duration::from_millis(700));
        let now = t0 + Duration::from_millis(9_100);
        let (na, nb) = (next_in_phase(a, now, i), next_in_phase(b, now, i));
        assert_eq!(na, t0 + Duration::from_millis(10_000));
        assert_eq!(nb, t0 + Duration::from_millis(10_700));
    }

    const T: Duration = Duration::from_millis(5000);
    const G: Duration = Duration::from_millis(30_000);

    #[test]
    fn grace_then_lost_then_ok() {
        let t0 = Instant::now();
        let mut h = HeartbeatTracker::new(true, t0);
        assert_eq!(
            h.state(t0 + Duration::from_secs(29), T, G),
            HeartbeatState::Starting
        );
        assert_eq!(
            h.state(t0 + Duration::from_secs(31), T, G),
            HeartbeatState::Lost { since: t0 + G }
        );
        let t1 = t0 + Duration::from_secs(1);
        h.ping_started(t1, Duration::from_secs(2));
        h.ping_finished(t1, t1, &Ok(Duration::from_micros(80)), 1);
        assert_eq!(h.state(t1 + T, T, G), HeartbeatState::Ok);
        assert_eq!(
            h.state(t1 + T + Duration::from_millis(1), T, G),
            HeartbeatState::Lost { since: t1 + T }
        );
        assert_eq!(h.rtt_samples(), vec![(1, 80)]);
        // a failure is named but does not by itself make the heartbeat lost
        h.ping_finished(t1, t1, &Err(HeartbeatFailure::ConnectionRefused), 2);
        assert_eq!(
            h.current_failure().map(|f| f.as_str()),
            Some("connection_refused")
        );
        assert_eq!(
            h.state(t1 + Duration::from_secs(1), T, G),
            HeartbeatState::Ok
        );
        let h = HeartbeatTracker::new(false, t0);
        assert_eq!(h.state(t0 + G + T, T, G), HeartbeatState::NotConfigured);
    }

    /// A runner that answers without reading our PING (writes `PONG`, closes) is healthy:
    /// our write fails with EPIPE, but its answer waits in the socket and counts. A CRLF
    /// line is the same answer; a closed socket with no answer is still an i/o failure.
    #[cfg(unix)]
    #[tokio::test]
    async fn an_answer_sent_before_our_ping_was_read_counts() {
        use tokio::io::AsyncWriteExt;
        for answer in [&b"PONG\n"[..], &b"PONG\r\n"[..]] {
            let (mut ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
            theirs.write_all(answer).await.unwrap();
            drop(theirs);
            assert_eq!(talk(&mut ours).await, Ok(()), "{answer:?}");
        }
        let (mut ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        drop(theirs);
        assert!(matches!(
            talk(&mut ours).await,
            Err(HeartbeatFailure::Io(e)) if e.contains("roken pipe")
        ));
    }

    #[test]
    fn long_path_is_named_before_any_syscall() {
        let p = std::path::PathBuf::from(format!("/tmp/{}/r.sock", "d".repeat(120)));
        let e = check_path(&p).unwrap_err();
        assert_eq!(e.as_str(), "path_too_long");
        assert!(e.to_string().contains("107 bytes"));
    }
}
