//! Windows file privacy (docs/platforms.md, private files): the analogue of mode 0700 / 0600
//! is a protected DACL (no inherited entries) that grants full control to the current user
//! and to SYSTEM only. Built from SDDL: `D:P(A;OICI;FA;;;<user SID>)(A;OICI;FA;;;SY)` on a
//! folder (inherited by what is created inside), without `OICI` on a file.

use std::io;
use std::os::windows::ffi::OsStrExt;
use std::path::Path;

use windows_sys::Win32::Foundation::{CloseHandle, LocalFree, HANDLE};
use windows_sys::Win32::Security::Authorization::{
    ConvertSidToStringSidW, ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
};
use windows_sys::Win32::Security::{
    GetTokenInformation, SetFileSecurityW, TokenUser, DACL_SECURITY_INFORMATION,
    PSECURITY_DESCRIPTOR, TOKEN_QUERY, TOKEN_USER,
};
use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

fn wide(s: &std::ffi::OsStr) -> Vec<u16> {
    s.encode_wide().chain(std::iter::once(0)).collect()
}

/// The current user's SID as an SDDL string (`S-1-5-21-...`).
fn user_sid() -> io::Result<String> {
    // SAFETY: every pointer handed to the calls is valid for the size given; the token
    // handle and the string SID are released on every path.
    #[allow(unsafe_code)]
    unsafe {
        let mut token: HANDLE = std::ptr::null_mut();
        if OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &mut token) == 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u64; 128]; // 1 KiB, 8-byte aligned: TOKEN_USER + SID
        let mut len = 0u32;
        let ok = GetTokenInformation(
            token,
            TokenUser,
            buf.as_mut_ptr().cast(),
            (buf.len() * 8) as u32,
            &mut len,
        );
        let err = io::Error::last_os_error();
        CloseHandle(token);
        if ok == 0 {
            return Err(err);
        }
        let user = &*(buf.as_ptr() as *const TOKEN_USER);
        let mut s: *mut u16 = std::ptr::null_mut();
        if ConvertSidToStringSidW(user.User.Sid, &mut s) == 0 {
            return Err(io::Error::last_os_error());
        }
        let mut n = 0;
        while *s.add(n) != 0 {
            n += 1;
        }
        let out = String::from_utf16_lossy(std::slice::from_raw_parts(s, n));
        LocalFree(s.cast());
        Ok(out)
    }
}

/// Replaces the DACL of `path` with a protected user-and-SYSTEM-only one; `inherit` makes
/// the entries inherited by files and folders created inside (for a folder).
pub fn restrict_to_user(path: &Path, inherit: bool) -> io::Result<()> {
    let sid = user_sid()?;
    let flags = if inherit { "OICI" } else { "" };
    let sddl = format!("D:P(A;{flags};FA;;;{sid})(A;{flags};FA;;;SY)");
    let sddl_w = wide(std::ffi::OsStr::new(&sddl));
    let path_w = wide(path.as_os_str());
    // SAFETY: both strings are NUL-terminated and outlive the calls; the descriptor the
    // first call allocates is freed with LocalFree as its documentation requires.
    #[allow(unsafe_code)]
    unsafe {
        let mut sd: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
        if ConvertStringSecurityDescriptorToSecurityDescriptorW(
            sddl_w.as_ptr(),
            SDDL_REVISION_1,
            &mut sd,
            std::ptr::null_mut(),
        ) == 0
        {
            return Err(io::Error::last_os_error());
        }
        let ok = SetFileSecurityW(path_w.as_ptr(), DACL_SECURITY_INFORMATION, sd);
        let err = io::Error::last_os_error();
        LocalFree(sd.cast());
        if ok == 0 {
            return Err(err);
        }
    }
    Ok(())
}
