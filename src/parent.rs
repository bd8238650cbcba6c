//! `--exit-with-parent`: notice at once when the process that started stallwatch dies (a
//! Tauri app may SIGKILL its sidecars) and shut down in order, so spawned runners are
//! stopped with the normal termination sequence instead of being orphaned.
//!
//! A pidfd on the parent (`pidfd_open(2)`, Linux 5.3+) becomes readable when the parent
//! exits; tokio's `AsyncFd` waits on it without a thread or polling. `PR_SET_PDEATHSIG` was
//! not used: it fires when the parent *thread* that forked us exits, which in a
//! multi-threaded parent is not the parent process's death.

use anyhow::{bail, Context, Result};
use rustix::process::{getppid, pidfd_open, PidfdFlags};
use tokio::io::unix::AsyncFd;

/// Resolves when the parent process exits. Errors when there is no parent to watch
/// (already re-parented to init or a subreaper's pid 1) or pidfds are unavailable.
pub async fn parent_exited() -> Result<u32> {
    let ppid = getppid().context("stallwatch has no parent process to watch")?;
    let raw = ppid.as_raw_nonzero().get() as u32;
    if raw == 1 {
        bail!("--exit-with-parent: the parent is already gone (re-parented to pid 1)");
    }
    let fd = pidfd_open(ppid, PidfdFlags::empty())
        .with_context(|| format!("--exit-with-parent: cannot open a pidfd on parent pid {raw}"))?;
    // SAFETY: `fd` is an `OwnedFd` moved into the `AsyncFd`: it stays open and refers to
    // the same pidfd until the `AsyncFd` is dropped, and `as_raw_fd` always returns it.
    #[allow(unsafe_code)]
    let fd = unsafe { AsyncFd::register(fd) }
        .map_err(|e| anyhow::anyhow!("--exit-with-parent: cannot register the pidfd: {e}"))?;
    // Between getppid and pidfd_open the parent may have died and the pid been reused:
    // re-check that we still have that parent.
    if getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(raw) {
        return Ok(raw);
    }
    let _guard = fd
        .readable()
        .await
        .context("--exit-with-parent: pidfd wait failed")?;
    Ok(raw)
}
