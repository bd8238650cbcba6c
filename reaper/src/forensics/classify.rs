//! Says in plain words why a runner is stuck, from kernel evidence only (pure: no I/O).
//!
//! The rules, first match wins: a stopped main thread (`T`/`t`); a busy process (at least
//! [`BUSY_PCT`] of a core over the recent window: a busy loop, in user space or the kernel);
//! an uninterruptible main thread (`D`); then, at low CPU, what the main thread is blocked
//! in: a futex with no timeout shared by two or more threads (likely deadlock), a read on a
//! socket or pipe, a sleep (a native call), an event-loop wait (epoll/poll: a promise or I/O
//! that never completes), a lone futex (a lock, a join, a condition), a wait for a child.
//! Thread states are those of proc(5) (`/proc/PID/stat` field 3).

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use super::procfs::{ProcessSnapshot, ThreadSnapshot};

/// CPU share of one core, percent, at or above which the runner counts as busy.
pub const BUSY_PCT: u32 = 80;

/// A classification: a short machine kind and the sentence shown to people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Classification {
    /// `stopped`, `zombie`, `busy_loop`, `uninterruptible`, `deadlock`, `blocked_read`,
    /// `native_sleep`, `idle_event_loop`, `lock_wait`, `child_wait`, `blocked`, `unknown`.
    pub kind: &'static str,
    /// The sentence, e.g. "2 threads waiting in futex for 58 s, 0% CPU (likely deadlock)".
    pub summary: String,
}

/// CPU figures the rules use.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuFacts {
    /// Percent of one core used over the recent window (`None`: no history yet).
    pub recent_pct: Option<u32>,
    /// Percent of one core wanted (run + run-queue time) over the same window.
    pub recent_demand_pct: Option<u32>,
    /// How long the process has been at or over [`BUSY_PCT`].
    pub busy_for: Duration,
    /// Share of user time in the busiest thread's lifetime CPU, percent.
    pub user_share_pct: u32,
    /// How far back the CPU history reaches ([`super::cpu::History::reach`]): a duration
    /// that long is shown as "for at least" (sampling starts with the tool span, a sample
    /// period late, so the wait may be older than the history).
    pub history: Duration,
}

/// Seconds for people: `58 s`, `2.4 s`.
pub fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 10.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

fn for_dur(d: Option<Duration>, history: Duration) -> String {
    match d {
        Some(d) if !d.is_zero() && !history.is_zero() && d >= history => {
            format!(" for at least {}", secs(d))
        }
        Some(d) if !d.is_zero() => format!(" for {}", secs(d)),
        _ => String::new(),
    }
}

fn fd_kind(t: &ThreadSnapshot) -> String {
    match t.syscall_fd_target.as_deref() {
        Some(s) if s.starts_with("socket:") => " on a socket".into(),
        Some(s) if s.starts_with("pipe:") => " on a pipe".into(),
        Some(s) if s.starts_with("anon_inode:") => format!(" on {}", &s[11..]),
        Some(s) => format!(" on {s}"),
        None => String::new(),
    }
}

/// Classifies `p` given the CPU facts and how long each thread has not run.
pub fn classify(
    p: &ProcessSnapshot,
    cpu: CpuFacts,
    idle: &HashMap<u32, Duration>,
) -> Classification {
    let c = |kind, summary: String| Classification { kind, summary };
    let Some(main) = p.main_thread() else {
        return c("unknown", "the runner's threads could not be read".into());
    };
    let pct = cpu.recent_pct;
    let pct_text = pct.map_or("CPU unknown".to_string(), |p| format!("{p}% CPU"));
    match main.state {
        'T' => {
            return c(
                "stopped",
                "stopped (T): the runner was stopped by a signal (SIGSTOP/SIGTSTP) and cannot run"
                    .into(),
            )
        }
        't' => {
            return c(
                "stopped",
                "stopped (t): the runner is held by a debugger".into(),
            )
        }
        'Z' | 'X' => {
            return c(
                "zombie",
                "the runner has exited (Z) and is not yet reaped".into(),
            )
        }
        _ => {}
    }
    let wanted = cpu.recent_demand_pct.max(pct);
    if let (Some(p), Some(w)) = (pct, wanted.filter(|w| *w >= BUSY_PCT)) {
        let (space, what) = if cpu.user_share_pct >= 50 {
            ("in user space", "busy loop")
        } else {
            ("in the kernel", "busy in system calls")
        };
        let starved = if p < BUSY_PCT {
            format!(", runnable {w}% of the time on a loaded machine")
        } else {
            String::new()
        };
        return c(
            "busy_loop",
            format!(
                "{p}% CPU {space}{} ({what}{starved})",
                for_dur(Some(cpu.busy_for), cpu.history)
            ),
        );
    }
    let idle_of = |t: &ThreadSnapshot| idle.get(&t.tid).copied();
    if main.state == 'D' {
        let w = main.wchan.as_deref().unwrap_or("the kernel");
        return c(
            "uninterruptible",
            format!(
                "main thread in uninterruptible wait (D) in {w}{}, {pct_text} (stuck I/O or a hung file system)",
                for_dur(idle_of(main), cpu.history)
            ),
        );
    }
    let untimed_futex: Vec<&ThreadSnapshot> = p
        .threads
        .iter()
        .filter(|t| t.syscall.as_deref() == Some("futex") && t.futex_untimed != Some(false))
        .collect();
    let other_futex = p
        .threads
        .iter()
        .filter(|t| !t.main && t.syscall.as_deref() == Some("futex"))
        .count();
    let main_call = main.syscall.as_deref().unwrap_or("");
    let main_idle = for_dur(idle_of(main), cpu.history);
    match main_call {
        "futex" if untimed_futex.len() >= 2 && untimed_futex.iter().any(|t| t.main) => {
            let shortest = untimed_futex.iter().filter_map(|t| idle_of(t)).min();
            c(
                "deadlock",
                format!(
                    "{} threads waiting in futex{}, {pct_text} (likely deadlock)",
                    untimed_futex.len(),
                    for_dur(shortest, cpu.history)
                ),
            )
        }
        "read" | "readv" | "pread64" | "recvfrom" | "recvmsg" => c(
            "blocked_read",
            format!("main thread in {main_call}(){}{main_idle}, {pct_text}", fd_kind(main)),
        ),
        "accept" | "accept4" | "connect" => c(
            "blocked_read",
            format!("main thread in {main_call}(){}{main_idle}, {pct_text}", fd_kind(main)),
        ),
        "nanosleep" | "clock_nanosleep" | "pause" => {
            let others = if other_futex > 0 {
                format!("; {other_futex} other threads wait in futex (for the GIL or a lock)")
            } else {
                String::new()
            };
            c(
                "native_sleep",
                format!("main thread in {main_call}(){main_idle}, {pct_text} (sleeping inside a native call){others}"),
            )
        }
        "epoll_wait" | "epoll_pwait" | "epoll_pwait2" | "poll" | "ppoll" | "select"
        | "pselect6" => c(
            "idle_event_loop",
            format!(
                "main thread idle in {main_call}(){main_idle}, {pct_text} (event loop waiting: a promise or I/O that never completes)"
            ),
        ),
        "futex" | "futex_waitv" => c(
            "lock_wait",
            format!(
                "main thread waiting in futex{main_idle}, {pct_text} (waiting on a lock, a thread join or a condition)"
            ),
        ),
        "wait4" | "waitid" => c(
            "child_wait",
            format!("main thread waiting for a child process in {main_call}(){main_idle}, {pct_text}"),
        ),
        "" => match main.wchan.as_deref() {
            Some(w) if main.state == 'S' => c(
                "blocked",
                format!("main thread sleeping in {w}{main_idle}, {pct_text}"),
            ),
            _ => c(
                "unknown",
                format!("main thread {} at {pct_text}", state_name(main.state)),
            ),
        },
        other => c(
            "blocked",
            format!("main thread in {other}(){main_idle}, {pct_text}"),
        ),
    }
}

/// proc(5) name of a state letter.
pub fn state_name(s: char) -> &'static str {
    match s {
        'R' => "running",
        'S' => "sleeping",
        'D' => "in uninterruptible wait",
        'T' => "stopped",
        't' => "traced",
        'Z' => "zombie",
        'X' => "dead",
        'I' => "idle",
        _ => "in an unknown state",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(tid: u32, state: char, call: Option<&str>) -> ThreadSnapshot {
        ThreadSnapshot {
            tid,
            main: tid == 1,
            state,
            syscall: call.map(str::to_string),
            futex_untimed: call.filter(|c| *c == "futex").map(|_| true),
            ..Default::default()
        }
    }

    fn proc_of(threads: Vec<ThreadSnapshot>) -> ProcessSnapshot {
        ProcessSnapshot {
            pid: 1,
            state: threads[0].state,
            thread_count: threads.len(),
            threads,
            ..Default::default()
        }
    }

    fn idle(secs: u64, n: u32) -> HashMap<u32, Duration> {
        (1..=n).map(|t| (t, Duration::from_secs(secs))).collect()
    }

    #[test]
    fn the_stall_kinds_in_plain_words() {
        let low = CpuFacts {
            recent_pct: Some(0),
            ..Default::default()
        };
        let dead = proc_of(vec![
            thread(1, 'S', Some("futex")),
            thread(2, 'S', Some("futex")),
        ]);
        let k = classify(&dead, low, &idle(58, 2));
        assert_eq!(k.kind, "deadlock");
        assert_eq!(
            k.summary,
            "2 threads waiting in futex for 58 s, 0% CPU (likely deadlock)"
        );
        // Idle for as long as the history reaches: the wait may be older than sampling.
        let reach = CpuFacts {
            history: Duration::from_secs(58),
            ..low
        };
        assert_eq!(
            classify(&dead, reach, &idle(58, 2)).summary,
            "2 threads waiting in futex for at least 58 s, 0% CPU (likely deadlock)"
        );
        let longer = CpuFacts {
            history: Duration::from_secs(90),
            ..low
        };
        assert_eq!(
            classify(&dead, longer, &idle(58, 2)).summary,
            "2 threads waiting in futex for 58 s, 0% CPU (likely deadlock)"
        );

        let mut sock = thread(1, 'S', Some("read"));
        sock.syscall_fd_target = Some("socket:[991]".into());
        let k = classify(&proc_of(vec![sock]), low, &idle(30, 1));
        assert_eq!(
            k.summary,
            "main thread in read() on a socket for 30 s, 0% CPU"
        );

        let busy = CpuFacts {
            recent_pct: Some(100),
            recent_demand_pct: Some(100),
            busy_for: Duration::from_secs(30),
            user_share_pct: 99,
            history: Duration::from_secs(60),
        };
        let k = classify(&proc_of(vec![thread(1, 'R', None)]), busy, &HashMap::new());
        assert_eq!(k.summary, "100% CPU in user space for 30 s (busy loop)");
        let starved = CpuFacts {
            recent_pct: Some(35),
            recent_demand_pct: Some(99),
            ..busy
        };
        let k = classify(
            &proc_of(vec![thread(1, 'R', None)]),
            starved,
            &HashMap::new(),
        );
        assert_eq!(
            k.summary,
            "35% CPU in user space for 30 s (busy loop, runnable 99% of the time on a loaded machine)"
        );

        let k = classify(&proc_of(vec![thread(1, 'T', None)]), low, &HashMap::new());
        assert!(k.summary.starts_with("stopped (T)"), "{k:?}");

        let gil = proc_of(vec![
            thread(1, 'S', Some("clock_nanosleep")),
            thread(2, 'S', Some("futex")),
        ]);
        let k = classify(&gil, low, &idle(3, 2));
        assert_eq!(k.kind, "native_sleep");
        assert!(k.summary.contains("1 other threads wait in futex"), "{k:?}");

        let k = classify(
            &proc_of(vec![thread(1, 'S', Some("epoll_wait"))]),
            low,
            &idle(9, 1),
        );
        assert_eq!(k.kind, "idle_event_loop");
    }

    #[test]
    fn healthy_looking_processes_are_not_called_deadlocked() {
        let low = CpuFacts {
            recent_pct: Some(1),
            ..Default::default()
        };
        // A main thread in a timed futex wait (a condition with a timeout) and a worker in
        // an untimed one: one untimed waiter is not a deadlock.
        let mut main = thread(1, 'S', Some("futex"));
        main.futex_untimed = Some(false);
        let k = classify(
            &proc_of(vec![main, thread(2, 'S', Some("futex"))]),
            low,
            &idle(5, 2),
        );
        assert_eq!(k.kind, "lock_wait");
        // Moderate CPU is not a busy loop.
        let mid = CpuFacts {
            recent_pct: Some(40),
            ..Default::default()
        };
        let k = classify(&proc_of(vec![thread(1, 'R', None)]), mid, &HashMap::new());
        assert_eq!(k.kind, "unknown");
        assert!(k.summary.contains("40% CPU"));
    }
}
