//! Every Windows process call of the reaper (docs/platforms.md, Windows): the Job Object a
//! runner lives in, its console process group, the console break, and thread resumption.
//!
//! Identity on Windows is a handle, never a pid: the runner's process handle (held by
//! tokio's `Child` since `CreateProcessW`) and the Job Object handle. `TerminateJobObject`
//! reaches only the job's members, so a reused pid is never touched; the runner's children
//! are members too (a child joins its parent's job at creation, and breakaway is not
//! allowed), so the whole tree ends with the job, escaped children included.

use std::io;
use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle, RawHandle};

use windows_sys::Win32::Foundation::{CloseHandle, HANDLE};
use windows_sys::Win32::System::Console::{GenerateConsoleCtrlEvent, CTRL_BREAK_EVENT};
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, Thread32First, Thread32Next, TH32CS_SNAPTHREAD, THREADENTRY32,
};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JobObjectBasicProcessIdList,
    JobObjectExtendedLimitInformation, QueryInformationJobObject, SetInformationJobObject,
    TerminateJobObject, JOBOBJECT_BASIC_PROCESS_ID_LIST, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
};
use windows_sys::Win32::System::Threading::{OpenThread, ResumeThread, THREAD_SUSPEND_RESUME};

/// The exit code `TerminateJobObject` gives every member: 137, the shell's code for a
/// SIGKILLed process, so "killed by stallwatch" reads the same on both platforms.
pub const KILLED_EXIT_CODE: u32 = 137;

/// A Job Object with `JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`: when stallwatch exits (even when
/// it is killed) the kernel closes the handle and ends every member, so runners never
/// outlive stallwatch.
#[derive(Debug)]
pub struct Job(OwnedHandle);

fn check(ok: i32) -> io::Result<()> {
    if ok == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Job {
    /// Creates an anonymous job that kills its members when its last handle closes.
    pub fn new() -> io::Result<Job> {
        // SAFETY: null name and attributes are allowed; a null result is checked.
        #[allow(unsafe_code)]
        let h = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if h.is_null() {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `h` is a fresh handle that nothing else owns.
        #[allow(unsafe_code)]
        let job = Job(unsafe { OwnedHandle::from_raw_handle(h as RawHandle) });
        // SAFETY: the structure is plain data, zeroed then given one flag; its exact size
        // is passed.
        #[allow(unsafe_code)]
        unsafe {
            let mut info: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = std::mem::zeroed();
            info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
            check(SetInformationJobObject(
                job.raw(),
                JobObjectExtendedLimitInformation,
                (&info as *const JOBOBJECT_EXTENDED_LIMIT_INFORMATION).cast(),
                std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
            ))?;
        }
        Ok(job)
    }

    fn raw(&self) -> HANDLE {
        self.0.as_raw_handle() as HANDLE
    }

    /// Puts the process behind `process` (a handle held since spawn) into the job.
    pub fn assign(&self, process: RawHandle) -> io::Result<()> {
        // SAFETY: both handles are live: the job is owned by `self`, the process handle by
        // the caller's `Child` for the duration of the call.
        #[allow(unsafe_code)]
        check(unsafe { AssignProcessToJobObject(self.raw(), process as HANDLE) })
    }

    /// Ends every member of the job with [`KILLED_EXIT_CODE`].
    pub fn terminate(&self) -> io::Result<()> {
        // SAFETY: the job handle is live and owned by `self`.
        #[allow(unsafe_code)]
        check(unsafe { TerminateJobObject(self.raw(), KILLED_EXIT_CODE) })
    }

    /// The pids of the job's live members (at most 1024).
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        const MAX: usize = 1024;
        // JOBOBJECT_BASIC_PROCESS_ID_LIST is two u32 counts then usize pids: a u64 buffer
        // keeps it aligned.
        let mut buf = vec![0u64; 1 + MAX];
        // SAFETY: the buffer is large enough for the header and MAX pids, and its size is
        // passed; the result is read only within the count the call wrote.
        #[allow(unsafe_code)]
        unsafe {
            check(QueryInformationJobObject(
                self.raw(),
                JobObjectBasicProcessIdList,
                buf.as_mut_ptr().cast(),
                (buf.len() * 8) as u32,
                std::ptr::null_mut(),
            ))?;
            let list = &*(buf.as_ptr() as *const JOBOBJECT_BASIC_PROCESS_ID_LIST);
            let n = (list.NumberOfProcessIdsInList as usize).min(MAX);
            let first = list.ProcessIdList.as_ptr();
            Ok((0..n).map(|i| *first.add(i) as u32).collect())
        }
    }
}

/// Sends `CTRL_BREAK_EVENT` to the console process group `pgid` (the runner's pid, since it
/// was created with `CREATE_NEW_PROCESS_GROUP`): the console analogue of SIGTERM. Fails
/// when stallwatch shares no console with the runner.
pub fn ctrl_break(pgid: u32) -> io::Result<()> {
    // SAFETY: no memory is passed; the group id is a number.
    #[allow(unsafe_code)]
    check(unsafe { GenerateConsoleCtrlEvent(CTRL_BREAK_EVENT, pgid) })
}

/// Resumes the threads of `pid`, a process created with `CREATE_SUSPENDED` (one thread) and
/// already assigned to its job, so no child could start before the assignment.
pub fn resume_threads(pid: u32) -> io::Result<usize> {
    let mut resumed = 0;
    // SAFETY: the snapshot and thread handles are checked and closed; the entry is plain
    // data with its size set.
    #[allow(unsafe_code)]
    unsafe {
        let snap = CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0);
        if snap.is_null() || snap as isize == -1 {
            return Err(io::Error::last_os_error());
        }
        let mut e: THREADENTRY32 = std::mem::zeroed();
        e.dwSize = std::mem::size_of::<THREADENTRY32>() as u32;
        let mut ok = Thread32First(snap, &mut e) != 0;
        while ok {
            if e.th32OwnerProcessID == pid {
                let t = OpenThread(THREAD_SUSPEND_RESUME, 0, e.th32ThreadID);
                if !t.is_null() {
                    if ResumeThread(t) != u32::MAX {
                        resumed += 1;
                    }
                    CloseHandle(t);
                }
            }
            ok = Thread32Next(snap, &mut e) != 0;
        }
        CloseHandle(snap);
    }
    if resumed == 0 {
        return Err(io::Error::other(format!("no thread of pid {pid} resumed")));
    }
    Ok(resumed)
}

/// Creation time of the process behind `process`, 100 ns ticks since 1601-01-01
/// (`GetProcessTimes`): with the pid, what identifies it across a pid reuse.
pub fn creation_time(process: RawHandle) -> io::Result<u64> {
    use windows_sys::Win32::Foundation::FILETIME;
    use windows_sys::Win32::System::Threading::GetProcessTimes;
    let zero = FILETIME {
        dwLowDateTime: 0,
        dwHighDateTime: 0,
    };
    let (mut c, mut e, mut k, mut u) = (zero, zero, zero, zero);
    // SAFETY: the handle is live (held by the caller); the four FILETIMEs are written.
    #[allow(unsafe_code)]
    check(unsafe { GetProcessTimes(process as HANDLE, &mut c, &mut e, &mut k, &mut u) })?;
    Ok((u64::from(c.dwHighDateTime) << 32) | u64::from(c.dwLowDateTime))
}
