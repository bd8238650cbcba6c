//! Kernel evidence about a process that needs no cooperation from it: per thread its state,
//! `wchan`, current system call and CPU ticks; per process its RSS, open fd count and
//! context switches. Everything comes from `/proc` (proc(5): `/proc/PID/task/TID/stat`,
//! `wchan`, `syscall`, `status`; `/proc/PID/fd`).
//!
//! Reads are best effort: a field the kernel refuses (an `EACCES` on `syscall` without
//! ptrace rights, a `wchan` of `0`) is left out, never guessed.

use std::path::Path;

use serde::Serialize;

/// Most threads read per process (a runner with more is summarised by the first ones).
pub const MAX_THREADS: usize = 256;

/// What the kernel says about one thread at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ThreadSnapshot {
    /// Thread id (the pid of the main thread).
    pub tid: u32,
    /// `comm` of the thread (at most 15 bytes, set by the runtime: `python3`, `node`, ...).
    pub name: String,
    /// True for the main thread (tid = pid).
    pub main: bool,
    /// State letter from `stat` field 3: `R` running, `S` sleeping, `D` uninterruptible,
    /// `T` stopped, `t` traced, `Z` zombie.
    pub state: char,
    /// The kernel function it sleeps in (`futex_wait_queue`, `do_epoll_wait`, ...), when the
    /// kernel shows it (`wchan` reads `0` for a running thread or without rights).
    pub wchan: Option<String>,
    /// Number of the system call it is blocked in (`syscall` field 1); `None` when running
    /// in user space or unreadable.
    pub syscall_nr: Option<i64>,
    /// Its name (`futex`, `read`, ...) for the architectures we know; else `syscall_<nr>`.
    pub syscall: Option<String>,
    /// The first three arguments of that call (hex in `/proc`), for fd and timeout checks.
    #[serde(skip)]
    pub syscall_args: Vec<u64>,
    /// For a call on a file descriptor: what it names (`socket:[1234]`, `pipe:[99]`, a path).
    pub syscall_fd_target: Option<String>,
    /// For `futex`: true when the wait has no timeout (argument 4 is NULL).
    pub futex_untimed: Option<bool>,
    /// User-mode CPU, clock ticks (`stat` field 14).
    pub utime_ticks: u64,
    /// Kernel-mode CPU, clock ticks (`stat` field 15).
    pub stime_ticks: u64,
    /// Voluntary context switches (`status`).
    pub voluntary_ctxt_switches: Option<u64>,
    /// Involuntary context switches (`status`).
    pub nonvoluntary_ctxt_switches: Option<u64>,
    /// Time on a CPU plus time waiting on a run queue, ns (`schedstat` fields 1 + 2): what
    /// the thread *wanted* to run, which on a loaded machine exceeds what it got.
    pub demand_ns: Option<u64>,
}

impl ThreadSnapshot {
    /// utime + stime, clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        self.utime_ticks + self.stime_ticks
    }
}

/// What the kernel says about the whole process at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProcessSnapshot {
    /// Pid.
    pub pid: u32,
    /// State letter of the main thread.
    pub state: char,
    /// Resident set size, bytes (`VmRSS` of `status`).
    pub rss_bytes: Option<u64>,
    /// Open file descriptors (entries of `/proc/PID/fd`).
    pub fd_count: Option<usize>,
    /// Threads, main first, at most [`MAX_THREADS`].
    pub threads: Vec<ThreadSnapshot>,
    /// Threads the process has (may exceed `threads.len()`).
    pub thread_count: usize,
}

impl ProcessSnapshot {
    /// utime + stime summed over the read threads, clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        self.threads.iter().map(ThreadSnapshot::cpu_ticks).sum()
    }
    /// Run + run-queue time summed over the read threads, ns (`None` without schedstat).
    pub fn demand_ns(&self) -> Option<u64> {
        self.threads.iter().map(|t| t.demand_ns).sum()
    }
    /// The main thread, when read.
    pub fn main_thread(&self) -> Option<&ThreadSnapshot> {
        self.threads.iter().find(|t| t.main)
    }
}

/// Fields of a `stat` line after the command name: (state, utime, stime).
pub fn parse_task_stat(text: &str) -> Option<(String, char, u64, u64)> {
    let open = text.find('(')?;
    let (head, rest) = text.rsplit_once(')')?;
    let name = head.get(open + 1..)?.to_string();
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state); field N is f[N - 3].
    let state = f.first()?.chars().next()?;
    let utime = f.get(11)?.parse().ok()?;
    let stime = f.get(12)?.parse().ok()?;
    Some((name, state, utime, stime))
}

/// Parses `/proc/PID/task/TID/syscall`: `running`, `-1 sp pc` (not in a call), or
/// `nr a1 a2 a3 a4 a5 a6 sp pc` (hex arguments). Answers (nr, args).
pub fn parse_syscall(text: &str) -> Option<(i64, Vec<u64>)> {
    let mut it = text.split_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    if nr < 0 {
        return None;
    }
    let args = it
        .take(6)
        .filter_map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .collect();
    Some((nr, args))
}

/// `schedstat` (`on_cpu_ns wait_ns timeslices`) → on_cpu + wait, ns.
pub fn parse_schedstat(text: &str) -> Option<u64> {
    let mut it = text.split_whitespace();
    let run: u64 = it.next()?.parse().ok()?;
    let wait: u64 = it.next()?.parse().ok()?;
    Some(run + wait)
}

fn read_demand(pid: u32, tid: u32) -> Option<u64> {
    parse_schedstat(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?)
}

/// A `status` field as a number (`VmRSS:  1234 kB` → 1234).
fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The name of system call `nr` on this architecture (the calls a stuck runner sits in).
pub fn syscall_name(nr: i64) -> String {
    #[cfg(target_arch = "x86_64")]
    let known: &[(i64, &str)] = &[
        (0, "read"),
        (1, "write"),
        (7, "poll"),
        (17, "pread64"),
        (19, "readv"),
        (23, "select"),
        (34, "pause"),
        (35, "nanosleep"),
        (42, "connect"),
        (43, "accept"),
        (45, "recvfrom"),
        (47, "recvmsg"),
        (61, "wait4"),
        (130, "rt_sigsuspend"),
        (202, "futex"),
        (230, "clock_nanosleep"),
        (232, "epoll_wait"),
        (247, "waitid"),
        (270, "pselect6"),
        (271, "ppoll"),
        (281, "epoll_pwait"),
        (288, "accept4"),
        (441, "epoll_pwait2"),
        (449, "futex_waitv"),
    ];
    #[cfg(target_arch = "aarch64")]
    let known: &[(i64, &str)] = &[
        (22, "epoll_pwait"),
        (63, "read"),
        (64, "write"),
        (65, "readv"),
        (67, "pread64"),
        (72, "pselect6"),
        (73, "ppoll"),
        (95, "waitid"),
        (98, "futex"),
        (101, "nanosleep"),
        (115, "clock_nanosleep"),
        (133, "rt_sigsuspend"),
        (202, "accept"),
        (203, "connect"),
        (207, "recvfrom"),
        (212, "recvmsg"),
        (242, "accept4"),
        (260, "wait4"),
        (441, "epoll_pwait2"),
        (449, "futex_waitv"),
    ];
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let known: &[(i64, &str)] = &[];
    known
        .iter()
        .find(|(n, _)| *n == nr)
        .map(|(_, s)| (*s).to_string())
        .unwrap_or_else(|| format!("syscall_{nr}"))
}

/// Calls whose first argument is a file descriptor worth naming.
fn takes_fd(name: &str) -> bool {
    matches!(
        name,
        "read"
            | "readv"
            | "pread64"
            | "write"
            | "recvfrom"
            | "recvmsg"
            | "accept"
            | "accept4"
            | "connect"
    )
}

/// Reads one thread of `pid`. `None` when it is gone.
pub fn read_thread(pid: u32, tid: u32) -> Option<ThreadSnapshot> {
    let dir = format!("/proc/{pid}/task/{tid}");
    let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    let (name, state, utime, stime) = parse_task_stat(&stat)?;
    let wchan = std::fs::read_to_string(format!("{dir}/wchan"))
        .ok()
        .map(|w| w.trim().to_string())
        .filter(|w| !w.is_empty() && w != "0");
    let sc = std::fs::read_to_string(format!("{dir}/syscall"))
        .ok()
        .and_then(|t| parse_syscall(&t));
    let status = std::fs::read_to_string(format!("{dir}/status")).unwrap_or_default();
    let mut t = ThreadSnapshot {
        tid,
        name,
        main: tid == pid,
        state,
        wchan,
        utime_ticks: utime,
        stime_ticks: stime,
        voluntary_ctxt_switches: status_field(&status, "voluntary_ctxt_switches"),
        nonvoluntary_ctxt_switches: status_field(&status, "nonvoluntary_ctxt_switches"),
        demand_ns: read_demand(pid, tid),
        ..Default::default()
    };
    if let Some((nr, args)) = sc {
        let name = syscall_name(nr);
        if takes_fd(&name) {
            if let Some(fd) = args.first() {
                t.syscall_fd_target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                    .ok()
                    .map(|p| p.to_string_lossy().into_owned());
            }
        }
        if name == "futex" {
            // futex(uaddr, op, val, timeout, ...): a NULL timeout waits forever.
            t.futex_untimed = args.get(3).map(|a| *a == 0);
        }
        t.syscall_nr = Some(nr);
        t.syscall = Some(name);
        t.syscall_args = args;
    }
    Some(t)
}

/// Thread ids of `pid`, main first, at most [`MAX_THREADS`]; and how many there are.
pub fn thread_ids(pid: u32) -> (Vec<u32>, usize) {
    let mut ids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    ids.sort_unstable_by_key(|t| (*t != pid, *t));
    let n = ids.len();
    ids.truncate(MAX_THREADS);
    (ids, n)
}

/// Reads the process: every thread (bounded), RSS and fd count. `None` when it is gone.
pub fn read_process(pid: u32) -> Option<ProcessSnapshot> {
    let (ids, thread_count) = thread_ids(pid);
    if ids.is_empty() {
        return None;
    }
    let threads: Vec<ThreadSnapshot> = ids.iter().filter_map(|t| read_thread(pid, *t)).collect();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let state = threads.iter().find(|t| t.main).map_or('?', |t| t.state);
    Some(ProcessSnapshot {
        pid,
        state,
        rss_bytes: status_field(&status, "VmRSS").map(|kb| kb * 1024),
        fd_count: count_entries(Path::new(&format!("/proc/{pid}/fd"))),
        threads,
        thread_count,
    })
}

/// How many times [`read_settled`] reads again while the main thread is caught running.
pub const RUNNING_REREADS: usize = 4;
/// The pause between those reads.
pub const RUNNING_REREAD_GAP: std::time::Duration = std::time::Duration::from_millis(5);

/// Reads the process ([`read_process`]), and reads it again (up to [`RUNNING_REREADS`]
/// times, [`RUNNING_REREAD_GAP`] apart, at most 20 ms) while its main thread is running
/// (`R`): a waiting thread that one read catches woken (a timer, a heartbeat, or a loaded
/// machine's run queue) shows no system call and would read as "running at 0% CPU"; a
/// second read finds it back in its wait. A busy thread stays `R` and is answered as last
/// read. `None` when the process is gone before the first read.
pub fn read_settled(pid: u32) -> Option<ProcessSnapshot> {
    settle(|| read_process(pid), RUNNING_REREADS, RUNNING_REREAD_GAP)
}

fn settle(
    mut read: impl FnMut() -> Option<ProcessSnapshot>,
    rereads: usize,
    gap: std::time::Duration,
) -> Option<ProcessSnapshot> {
    let mut p = read()?;
    for _ in 0..rereads {
        if p.main_thread().is_none_or(|m| m.state != 'R') {
            break;
        }
        std::thread::sleep(gap);
        match read() {
            Some(q) => p = q,
            None => break,
        }
    }
    Some(p)
}

/// Only the CPU figures (the cheap read of the sampler): `(tid, ticks)` per thread, the
/// process total of ticks and of run + run-queue ns. `None` when the process is gone.
#[allow(clippy::type_complexity)]
pub fn read_cpu(pid: u32) -> Option<(u64, Option<u64>, Vec<(u32, u64)>, Vec<(u32, u64)>)> {
    let (ids, _) = thread_ids(pid);
    if ids.is_empty() {
        return None;
    }
    let per: Vec<(u32, u64)> = ids
        .iter()
        .filter_map(|tid| {
            let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
            let (_, _, u, st) = parse_task_stat(&s)?;
            Some((*tid, u + st))
        })
        .collect();
    let per_demand: Vec<(u32, u64)> = ids
        .iter()
        .filter_map(|tid| Some((*tid, read_demand(pid, *tid)?)))
        .collect();
    let demand = (!per_demand.is_empty()).then(|| per_demand.iter().map(|(_, d)| d).sum());
    Some((per.iter().map(|(_, t)| t).sum(), demand, per, per_demand))
}

fn count_entries(dir: &Path) -> Option<usize> {
    std::fs::read_dir(dir).ok().map(|d| d.count())
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
pub fn ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_spaces_and_parens_in_the_name() {
        let line = "4242 (py (worker) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 731 42 0 0 20 0 3 0 5000 0 0";
        let (name, state, u, s) = parse_task_stat(line).unwrap();
        assert_eq!(name, "py (worker) 1");
        assert_eq!((state, u, s), ('S', 731, 42));
    }

    #[test]
    fn syscall_lines() {
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(parse_syscall("-1 0x7ffc 0x7f00\n"), None);
        let (nr, args) = parse_syscall("202 0x7f1 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f2\n").unwrap();
        assert_eq!(nr, 202);
        assert_eq!(args, vec![0x7f1, 0x80, 0, 0, 0, 0]);
    }

    #[test]
    fn a_main_thread_caught_running_is_read_again_until_it_waits() {
        let snap = |state| ProcessSnapshot {
            pid: 7,
            state,
            threads: vec![ThreadSnapshot {
                tid: 7,
                main: true,
                state,
                ..Default::default()
            }],
            thread_count: 1,
            ..Default::default()
        };
        let gap = std::time::Duration::ZERO;
        // Woken for a moment: the third read finds it back in its wait.
        let mut states = ['R', 'R', 'S', 'R'].into_iter();
        let mut reads = 0;
        let p = settle(
            || {
                reads += 1;
                states.next().map(snap)
            },
            4,
            gap,
        )
        .unwrap();
        assert_eq!((p.state, reads), ('S', 3));
        // Busy: read 1 + 4 times, answered as running.
        let mut reads = 0;
        let p = settle(
            || {
                reads += 1;
                Some(snap('R'))
            },
            4,
            gap,
        )
        .unwrap();
        assert_eq!((p.state, reads), ('R', 5));
        // Waiting at once: one read.
        let mut reads = 0;
        settle(
            || {
                reads += 1;
                Some(snap('S'))
            },
            4,
            gap,
        )
        .unwrap();
        assert_eq!(reads, 1);
        // Gone between reads: the last read stands.
        let mut states = [Some('R'), None].into_iter();
        let p = settle(|| states.next().flatten().map(snap), 4, gap).unwrap();
        assert_eq!(p.state, 'R');
    }

    #[test]
    fn this_process_is_readable() {
        let p = read_process(std::process::id()).unwrap();
        assert!(p.threads[0].main);
        assert!(p.rss_bytes.unwrap() > 0);
        assert!(p.fd_count.unwrap() >= 3);
        assert!(p.thread_count >= 1);
        assert!(read_cpu(std::process::id()).is_some());
        assert!(read_process(u32::MAX - 1).is_none());
        assert_eq!(parse_schedstat("10 5 3\n"), Some(15));
        assert!(p.threads[0].demand_ns.is_some());
    }
}
