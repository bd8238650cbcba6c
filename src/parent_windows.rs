//! `--exit-with-parent` on Windows (docs/platforms.md, parent watch): wait on the parent's
//! process handle, so stallwatch notices at once when the app that started it dies and
//! shuts down in order.
//!
//! Windows has no `getppid`: the parent pid comes from a toolhelp snapshot
//! (`PROCESSENTRY32W::th32ParentProcessID`). That pid is only a number which a dead parent's
//! successor may have reused, so the handle opened on it is accepted only when that process
//! was created before stallwatch (`GetProcessTimes`); a younger process is not our parent,
//! and the parent counts as gone.

use anyhow::{bail, Context, Result};
use windows_sys::Win32::Foundation::{CloseHandle, FILETIME, HANDLE, WAIT_OBJECT_0};
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, Process32FirstW, Process32NextW, PROCESSENTRY32W, TH32CS_SNAPPROCESS,
};
use windows_sys::Win32::System::Threading::{
    GetCurrentProcess, GetProcessTimes, OpenProcess, WaitForSingleObject, INFINITE,
    PROCESS_QUERY_LIMITED_INFORMATION, PROCESS_SYNCHRONIZE,
};

/// An owned process handle, closed on drop.
struct Owned(HANDLE);

// SAFETY: a process handle is a kernel object reference usable from any thread.
#[allow(unsafe_code)]
unsafe impl Send for Owned {}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: the handle was returned by OpenProcess and is closed exactly once.
        #[allow(unsafe_code)]
        unsafe {
            CloseHandle(self.0);
        }
    }
}

/// The parent pid of this process from a toolhelp snapshot.
fn parent_pid() -> Option<u32> {
    let me = std::process::id();
    // SAFETY: the snapshot handle is checked, walked with a correctly sized entry, and
    // closed; the entry is plain data.
    #[allow(unsafe_code)]
    unsafe {
        let snap = CreateToolhelp32Snapshot(TH32CS_SNAPPROCESS, 0);
        if snap.is_null() || snap as isize == -1 {
            return None;
        }
        let mut entry: PROCESSENTRY32W = std::mem::zeroed();
        entry.dwSize = std::mem::size_of::<PROCESSENTRY32W>() as u32;
        let mut found = None;
        let mut ok = Process32FirstW(snap, &mut entry) != 0;
        while ok {
            if entry.th32ProcessID == me {
                found = Some(entry.th32ParentProcessID);
                break;
            }
            ok = Process32NextW(snap, &mut entry) != 0;
        }
        CloseHandle(snap);
        found
    }
}

/// Creation time of a process, 100 ns ticks since 1601.
fn creation_time(h: HANDLE) -> Option<u64> {
    let zero = FILETIME {
        dwLowDateTime: 0,
        dwHighDateTime: 0,
    };
    let (mut c, mut e, mut k, mut u) = (zero, zero, zero, zero);
    // SAFETY: `h` is a live process handle; the four FILETIMEs are written by the call.
    #[allow(unsafe_code)]
    let ok = unsafe { GetProcessTimes(h, &mut c, &mut e, &mut k, &mut u) } != 0;
    ok.then(|| (u64::from(c.dwHighDateTime) << 32) | u64::from(c.dwLowDateTime))
}

/// Resolves when the parent process exits. Errors when there is no parent to watch or its
/// handle cannot be opened.
pub async fn parent_exited() -> Result<u32> {
    let ppid = parent_pid().context("stallwatch has no parent process to watch")?;
    if ppid == 0 {
        bail!("--exit-with-parent: the parent is already gone");
    }
    // SAFETY: OpenProcess has no memory preconditions; a null result is checked.
    #[allow(unsafe_code)]
    let h = unsafe {
        OpenProcess(
            PROCESS_SYNCHRONIZE | PROCESS_QUERY_LIMITED_INFORMATION,
            0,
            ppid,
        )
    };
    if h.is_null() {
        // Gone between the snapshot and the open: that is the exit we wait for.
        return Ok(ppid);
    }
    let parent = Owned(h);
    // SAFETY: GetCurrentProcess returns a pseudo handle that needs no closing.
    #[allow(unsafe_code)]
    let me = creation_time(unsafe { GetCurrentProcess() });
    match (creation_time(parent.0), me) {
        (Some(p), Some(m)) if p <= m => {}
        // A process younger than us holds the pid: our parent is already gone.
        (Some(_), Some(_)) => return Ok(ppid),
        _ => bail!("--exit-with-parent: cannot read the creation time of parent pid {ppid}"),
    }
    let waited = tokio::task::spawn_blocking(move || {
        // SAFETY: the handle stays open (owned by the closure) for the whole wait.
        #[allow(unsafe_code)]
        let r = unsafe { WaitForSingleObject(parent.0, INFINITE) };
        drop(parent);
        r
    })
    .await
    .context("--exit-with-parent: the wait task failed")?;
    if waited != WAIT_OBJECT_0 {
        bail!("--exit-with-parent: waiting on the parent's handle failed ({waited})");
    }
    Ok(ppid)
}
