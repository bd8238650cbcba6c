//! Every Linux process call of stallwatch in one module: pidfds, `/proc` reads, `waitid`,
//! the child-subreaper flag, and [`send_signal`], the one funnel through which a signal is
//! ever sent (`clippy.toml` `disallowed-methods` bans the raw calls everywhere else).
//!
//! Keeping these here is what makes a later macOS port (kqueue, no pidfd) one module of
//! work (docs/design.md, Linux notes). The rules of the funnel come from docs/design.md, Reaper: never PID 0
//! or 1, never stallwatch itself or its parent, never our own process group, never a group
//! id <= 1. Identity (pidfd held since registration, or start time + boot id) is proven by
//! the callers in `terminate.rs` before they call the funnel; a pidfd target carries that
//! proof with it, since a pidfd can only ever reach the process it was opened for.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::process::{Pid, PidfdFlags, Signal};
use serde::{Deserialize, Serialize};

/// The signals the reaper sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Sig {
    /// SIGTERM: please stop.
    Term,
    /// SIGCONT, sent right after SIGTERM: a SIGSTOPped runner cannot act on SIGTERM until it
    /// runs again, so without it a stopped runner would always wait out the grace period
    /// (issue 11).
    Cont,
    /// SIGKILL: stop now.
    Kill,
}

impl Sig {
    fn raw(self) -> Signal {
        match self {
            Sig::Term => Signal::TERM,
            Sig::Cont => Signal::CONT,
            Sig::Kill => Signal::KILL,
        }
    }
    /// `SIGTERM`, `SIGCONT` or `SIGKILL`.
    pub fn name(self) -> &'static str {
        match self {
            Sig::Term => "SIGTERM",
            Sig::Cont => "SIGCONT",
            Sig::Kill => "SIGKILL",
        }
    }
}

/// Whom a signal goes to.
#[derive(Clone, Copy, Debug)]
pub enum SignalTarget<'a> {
    /// One process, through a pidfd opened for it (identity pinned by the fd). `pid` is only
    /// checked against the forbidden set.
    Pidfd {
        /// The pidfd.
        fd: BorrowedFd<'a>,
        /// Its pid.
        pid: u32,
    },
    /// A whole process group, `kill(-pgid)`. Callers may use it only while the group leader
    /// is an unreaped child of stallwatch (so the group id cannot be reused).
    Group {
        /// The process group id (the leader's pid).
        pgid: u32,
    },
}

/// Why the funnel refused to send a signal.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// The target is PID 0/1, stallwatch, one of its ancestors, its own group, or a group id
    /// <= 1.
    #[error("refusing to signal {0}: protected process")]
    Protected(String),
    /// The kernel refused (ESRCH: it is already gone; EPERM: not ours).
    #[error("signal failed: {0}")]
    Os(#[from] io::Error),
}

fn protected(id: u32) -> bool {
    let me = std::process::id();
    let parent = rustix::process::getppid().map(|p| p.as_raw_pid() as u32);
    id <= 1 || id == me || Some(id) == parent || is_own_ancestor(id)
}

/// stallwatch's ancestors, nearest first (the parent-pid chain read from `/proc`, ending
/// below pid 1; capped at 4096 links so a corrupt read cannot loop).
pub fn own_ancestors() -> Vec<u32> {
    let mut out = Vec::new();
    let mut cur = std::process::id();
    while out.len() < 4096 {
        match proc_stat(cur) {
            Ok(st) if st.ppid > 1 && st.ppid != cur => {
                out.push(st.ppid);
                cur = st.ppid;
            }
            _ => break,
        }
    }
    out
}

/// True when `pid` is stallwatch's parent, grandparent, ... (issue 17 #9: an ancestor is
/// never attached and never signalled).
pub fn is_own_ancestor(pid: u32) -> bool {
    own_ancestors().contains(&pid)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (issue 17 #11: stallwatch's own fd
/// shortage must not show up as runners failing their heartbeats). Answers `(old, new)`
/// soft limits; `None` stands for unlimited.
pub fn raise_nofile_limit() -> io::Result<(Option<u64>, Option<u64>)> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    if cur.current == cur.maximum {
        return Ok((cur.current, cur.current));
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: cur.maximum,
            maximum: cur.maximum,
        },
    )?;
    Ok((cur.current, getrlimit(Resource::Nofile).current))
}

/// The one function that sends signals. Refuses protected targets (docs/design.md, Reaper).
///
/// Errors: [`SignalError::Protected`], or [`SignalError::Os`] with the kernel's error.
#[allow(clippy::disallowed_methods)]
pub fn send_signal(target: SignalTarget<'_>, sig: Sig) -> Result<(), SignalError> {
    match target {
        SignalTarget::Pidfd { fd, pid } => {
            if protected(pid) {
                return Err(SignalError::Protected(format!("pid {pid}")));
            }
            rustix::process::pidfd_send_signal(fd, sig.raw()).map_err(io::Error::from)?;
        }
        SignalTarget::Group { pgid } => {
            let own_group = rustix::process::getpgrp().as_raw_pid() as u32;
            if protected(pgid) || pgid == own_group {
                return Err(SignalError::Protected(format!("process group {pgid}")));
            }
            let pg = raw_pid(pgid)
                .ok_or_else(|| SignalError::Protected(format!("process group {pgid}")))?;
            rustix::process::kill_process_group(pg, sig.raw()).map_err(io::Error::from)?;
        }
    }
    Ok(())
}

/// Sends SIGUSR2 (the stall-forensics dump request) to one process through its pidfd, so
/// it can only reach the process the fd was opened for. Callers send it only to a runner
/// whose kit announced a SIGUSR2 handler (SIGUSR2 ends a process without one).
///
/// Errors: [`SignalError::Protected`], or [`SignalError::Os`] with the kernel's error.
#[allow(clippy::disallowed_methods)]
pub fn send_dump_signal(fd: BorrowedFd<'_>, pid: u32) -> Result<(), SignalError> {
    if protected(pid) {
        return Err(SignalError::Protected(format!("pid {pid}")));
    }
    rustix::process::pidfd_send_signal(fd, Signal::USR2).map_err(io::Error::from)?;
    Ok(())
}

/// Opens a pidfd for `pid` (Linux >= 5.3).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let p = raw_pid(pid).ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    Ok(rustix::process::pidfd_open(p, PidfdFlags::empty())?)
}

/// `pid` as the kernel's `pid_t`: `None` for 0 and for values past `i32::MAX`, which no
/// process has (Linux `PID_MAX_LIMIT` is 2^22) and which, cast, would be negative: a
/// process group, or every process, to `kill`.
fn raw_pid(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().and_then(Pid::from_raw)
}

/// The thread group (the process) that `pid` belongs to, from `/proc/PID/status`
/// (`Tgid:`): `pid` itself for a process, another id for one of its threads, whose
/// `/proc/TID` entries exist too.
pub fn thread_group(pid: u32) -> io::Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no Tgid in /proc status"))
}

/// True when the process behind `fd` has exited (pidfd readable), without waiting.
pub fn pidfd_exited(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&zero)) {
        Ok(n) => n > 0,
        Err(_) => false,
    }
}

/// Wraps a pidfd for async waiting: it becomes readable when the process exits.
///
/// tokio 1.54 deprecated the safe `AsyncFd` constructors because a `T` that does not own
/// its fd could close it while registered; an `OwnedFd` owns it, so this use is sound.
#[allow(deprecated)]
pub fn async_pidfd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    tokio::io::unix::AsyncFd::with_interest(fd, tokio::io::Interest::READABLE)
}

/// Marks stallwatch as a child subreaper (`PR_SET_CHILD_SUBREAPER`): orphaned descendants
/// of runners are re-parented to it, so it can reap them.
pub fn set_child_subreaper() -> io::Result<()> {
    Ok(rustix::process::set_child_subreaper(Some(
        rustix::process::getpid(),
    ))?)
}

/// `/proc/sys/kernel/random/boot_id`, trimmed.
pub fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_string())
}

/// The fields of `/proc/PID/stat` the reaper uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Pid.
    pub pid: u32,
    /// State letter (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
    /// Process group id.
    pub pgid: u32,
    /// Start time, clock ticks since boot (field 22).
    pub start_time_ticks: u64,
    /// Kernel `PF_*` flags (field 9); see [`PF_KTHREAD`].
    pub flags: u32,
}

/// `PF_KTHREAD` (linux/sched.h): set in `/proc/PID/stat` field 9 on kernel threads.
pub const PF_KTHREAD: u32 = 0x0020_0000;

impl ProcStat {
    /// True for a kernel thread (the `PF_KTHREAD` flag). A ppid of 2 alone is not used:
    /// inside a pid namespace pid 2 is an ordinary process.
    pub fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }
}

/// Parses the text of `/proc/PID/stat` (the command name may contain spaces and parens).
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let (head, rest) = text.rsplit_once(')')?;
    let pid = head.split_whitespace().next()?.parse().ok()?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): index i holds field i + 3.
    Some(ProcStat {
        pid,
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgid: f.get(2)?.parse().ok()?,
        start_time_ticks: f.get(19)?.parse().ok()?,
        flags: f.get(6)?.parse().ok()?,
    })
}

/// Reads `/proc/PID/stat`. `NotFound` when the process is gone.
pub fn proc_stat(pid: u32) -> io::Result<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad /proc stat"))
}

/// Opens a pidfd for `pid` and proves it is the process that started at
/// `start_time_ticks` and is not a zombie. `Ok(None)` when it is gone or is another process
/// (a recycled pid); the fd is opened first and the start time read after, so the answer
/// cannot race with a recycle.
pub fn open_verified(pid: u32, start_time_ticks: u64) -> io::Result<Option<OwnedFd>> {
    let fd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) => return Err(e),
    };
    match proc_stat(pid) {
        Ok(st) if st.start_time_ticks == start_time_ticks && st.state != 'Z' => Ok(Some(fd)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit code when it exited normally.
    pub code: Option<i32>,
    /// Signal number when a signal ended it.
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// True for exit code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
    /// `exit code N` or `signal N`.
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (_, Some(s)) => format!("signal {s}"),
            _ => "unknown".into(),
        }
    }
}

fn to_exit(st: WaitStatus) -> Option<ExitInfo> {
    match st {
        WaitStatus::Exited(_, code) => Some(ExitInfo {
            code: Some(code),
            signal: None,
        }),
        WaitStatus::Signaled(_, sig, _) => Some(ExitInfo {
            code: None,
            signal: Some(sig as i32),
        }),
        _ => None,
    }
}

/// Peeks whether child `pid` has exited without reaping it (`waitid(P_PID, WEXITED |
/// WNOHANG | WNOWAIT)`).
pub fn peek_child(pid: u32) -> io::Result<Option<ExitInfo>> {
    let p = nix::unistd::Pid::from_raw(pid as i32);
    let st = waitid(
        Id::Pid(p),
        WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
    )
    .map_err(io::Error::from)?;
    Ok(to_exit(st))
}

/// Reaps child `pid` if it has exited (`waitid(P_PID, WEXITED | WNOHANG)`); never
/// `waitpid(-1)`.
pub fn reap_child(pid: u32) -> io::Result<Option<ExitInfo>> {
    let p = nix::unistd::Pid::from_raw(pid as i32);
    let st =
        waitid(Id::Pid(p), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG).map_err(io::Error::from)?;
    Ok(to_exit(st))
}

/// True when some child of stallwatch is waitable (`waitid(P_ALL, WEXITED | WNOHANG |
/// WNOWAIT)`, which reaps nothing).
pub fn any_child_exited() -> bool {
    matches!(
        waitid(
            Id::All,
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT
        ),
        Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..))
    )
}

/// Every process in `/proc` (pid, stat) readable now. Vanishing entries are skipped.
pub fn all_processes() -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter_map(|pid| proc_stat(pid).ok())
        .collect()
}

/// Zombie children of stallwatch (state `Z`, parent = us).
pub fn zombie_children() -> Vec<u32> {
    let me = std::process::id();
    all_processes()
        .into_iter()
        .filter(|p| p.ppid == me && p.state == 'Z')
        .map(|p| p.pid)
        .collect()
}

/// True when `/proc/PID/environ` holds exactly `key=value`.
pub fn environ_has(pid: u32, key: &str, value: &str) -> bool {
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let want = format!("{key}={value}");
    env.split(|b| *b == 0).any(|kv| kv == want.as_bytes())
}

/// The effective uid a process runs as (the owner of its `/proc/PID` folder); `None` when
/// there is no such process.
pub fn process_uid(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

/// The real and effective uids of a process (`Uid:` of `/proc/PID/status`); `None` when
/// there is no such process or the line does not parse.
pub fn process_uids(pid: u32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let mut ids = line.split_whitespace().map(|v| v.parse::<u32>().ok());
    Some((ids.next()??, ids.next()??))
}

/// The environment variable that marks every process of one spawned runner instance
/// (a UUID per spawn, injected next to `STALLWATCH_RUNNER_ID`; issue 17 #8).
pub const INSTANCE_ENV: &str = "STALLWATCH_RUNNER_INSTANCE";

/// One read of `/proc`: every process with its parent links, so many runners can find
/// their descendants without scanning `/proc` once each (ordered shutdown of thousands).
pub struct ProcTable {
    procs: HashMap<u32, ProcStat>,
    by_parent: HashMap<u32, Vec<u32>>,
    /// Every process of stallwatch's user, by its `STALLWATCH_RUNNER_INSTANCE` (indexed so thousands of runners each find their marked
    /// processes in `O(1)`, not by a scan each). Not only stallwatch's own children: a
    /// marked process that double-forked away while stallwatch was down is re-parented to
    /// init (or to a user's subreaper), and was never found.
    marks: HashMap<String, Vec<u32>>,
    me: u32,
    ancestors: Vec<u32>,
}

/// The value of `key` in `/proc/PID/environ`, if set.
pub fn environ_value(pid: u32, key: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{key}=");
    env.split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

impl ProcTable {
    /// Reads `/proc` now.
    pub fn snapshot() -> Self {
        let me = std::process::id();
        let procs: HashMap<u32, ProcStat> =
            all_processes().into_iter().map(|p| (p.pid, p)).collect();
        let mut by_parent: HashMap<u32, Vec<u32>> = HashMap::new();
        for p in procs.values() {
            by_parent.entry(p.ppid).or_default().push(p.pid);
        }
        let mut marks: HashMap<String, Vec<u32>> = HashMap::new();
        // Only stallwatch's own user's processes: another user's is never a runner's (as
        // for attach), even when stallwatch runs as root and can read its environment.
        let uid = rustix::process::geteuid().as_raw();
        let candidates = procs
            .values()
            .filter(|p| p.pid != me && p.state != 'Z')
            .filter(|p| process_uid(p.pid) == Some(uid));
        for p in candidates {
            if let Some(m) = environ_value(p.pid, INSTANCE_ENV) {
                marks.entry(m).or_default().push(p.pid);
            }
        }
        Self {
            procs,
            by_parent,
            marks,
            me,
            ancestors: own_ancestors(),
        }
    }

    /// `roots` and every process below them in the process tree: the other registered
    /// runners and their own processes, which a termination of one runner spares.
    pub fn trees_of(&self, roots: &[u32]) -> HashSet<u32> {
        let mut out: HashSet<u32> = roots.iter().copied().collect();
        for r in roots {
            self.subtree(*r, &mut out);
        }
        out
    }

    fn subtree(&self, root: u32, out: &mut HashSet<u32>) {
        let mut stack = vec![root];
        while let Some(p) = stack.pop() {
            for c in self.by_parent.get(&p).into_iter().flatten() {
                if *c != root && out.insert(*c) {
                    stack.push(*c);
                }
            }
        }
    }

    /// The proven descendants of runner `root` (issue 17 #8, #9): live (non-zombie)
    /// processes found below `root` by parent links. For a spawned runner, `mark` is its
    /// instance id: then a process counts only if it also carries
    /// `STALLWATCH_RUNNER_INSTANCE=<mark>`, and every other live process carrying the mark
    /// is included wherever it is now (orphans re-parented to stallwatch, a child
    /// subreaper, or, when stallwatch was down, to init). An attached
    /// runner (`mark = None`) has only its process tree. stallwatch itself and its ancestors
    /// are never included, whatever the tree says.
    pub fn descendants(&self, root: u32, mark: Option<&str>) -> Vec<ProcStat> {
        self.descendants_and_unproven(root, mark).0
    }

    /// [`Self::descendants`], and beside them the live processes found below `root` in the
    /// process tree, outside its process group, that do not carry `mark`: they left the
    /// runner's group and its mark (a `setsid` and an `execve` with a fresh environment),
    /// so they are not proven to be its own and are left alone, but named in the report.
    /// Empty for an attached runner (`mark = None`), whose tree is proof enough.
    pub fn descendants_and_unproven(
        &self,
        root: u32,
        mark: Option<&str>,
    ) -> (Vec<ProcStat>, Vec<ProcStat>) {
        let mut found = HashSet::new();
        self.subtree(root, &mut found);
        if let Some(m) = mark {
            let orphans: Vec<u32> = self
                .marks
                .get(m)
                .into_iter()
                .flatten()
                .copied()
                .filter(|pid| *pid != root)
                .collect();
            for o in orphans {
                found.insert(o);
                self.subtree(o, &mut found);
            }
        }
        let root_pgid = self.procs.get(&root).map(|p| p.pgid).unwrap_or(root);
        let (mut out, mut unproven): (Vec<ProcStat>, Vec<ProcStat>) = found
            .into_iter()
            .filter(|p| *p != self.me && !self.ancestors.contains(p))
            .filter_map(|p| self.procs.get(&p).copied())
            .filter(|p| p.state != 'Z')
            .partition(|p| mark.is_none_or(|m| environ_has(p.pid, INSTANCE_ENV, m)));
        // Unmarked members of the runner's own group get the group's signal anyway.
        unproven.retain(|p| p.pgid != root_pgid);
        out.sort_by_key(|p| p.pid);
        unproven.sort_by_key(|p| p.pid);
        (out, unproven)
    }
}

/// [`ProcTable::descendants`] on a fresh snapshot.
pub fn descendants(root: u32, mark: Option<&str>) -> Vec<ProcStat> {
    ProcTable::snapshot().descendants(root, mark)
}

/// True when the process recorded as (`pid`, `start_time_ticks`) is still alive (not a
/// zombie).
pub fn alive(pid: u32, start_time_ticks: u64) -> bool {
    matches!(proc_stat(pid), Ok(st) if st.start_time_ticks == start_time_ticks && st.state != 'Z')
}

/// Borrows an owned fd (helper for callers holding `OwnedFd`).
pub fn borrow(fd: &OwnedFd) -> BorrowedFd<'_> {
    fd.as_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_spaces_and_parens_in_the_name() {
        let s = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 98765 0 0";
        let st = parse_stat(s).unwrap();
        assert_eq!((st.pid, st.state, st.ppid, st.pgid), (1234, 'S', 1, 1234));
        assert_eq!(st.start_time_ticks, 98765);
        assert!(!st.is_kernel_thread());
        let k = "77 (kworker/0:1) I 2 0 0 0 -1 69238880 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0";
        assert!(parse_stat(k).unwrap().is_kernel_thread());
    }

    #[test]
    fn funnel_refuses_protected_targets() {
        for pgid in [0, 1, std::process::id()] {
            assert!(matches!(
                send_signal(SignalTarget::Group { pgid }, Sig::Term),
                Err(SignalError::Protected(_))
            ));
        }
        let own = rustix::process::getpgrp().as_raw_pid() as u32;
        assert!(send_signal(SignalTarget::Group { pgid: own }, Sig::Term).is_err());
        let me = pidfd_open(std::process::id()).unwrap();
        assert!(send_signal(
            SignalTarget::Pidfd {
                fd: me.as_fd(),
                pid: std::process::id()
            },
            Sig::Term
        )
        .is_err());
    }

    #[test]
    fn verified_open_rejects_wrong_start_time() {
        let me = std::process::id();
        let st = proc_stat(me).unwrap();
        assert!(open_verified(me, st.start_time_ticks).unwrap().is_some());
        assert!(open_verified(me, st.start_time_ticks + 1)
            .unwrap()
            .is_none());
    }
}
