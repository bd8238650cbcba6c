//! Giving back the executable's start-up pages (issue 16, idle RSS ≤ 16 MiB).
//!
//! Measured on the dist binary (19.4 MB, 15 MB of it `.text`): idle, 8 s after start, RSS was
//! 18.7 MiB, of which 14.5 MiB file pages and 10.7 MiB the binary's own code. Start-up runs
//! code from all over the binary (CLI, config, migrations, every listener's setup, the
//! orphan sweep) and each page fault maps up to 64 KiB of neighbouring, already cached
//! pages too (the kernel's fault-around), so most of `.text` stays mapped although an idle
//! sidecar runs a few timers.
//!
//! Once started, [`release_code_pages`] unmaps those pages from the process
//! (`madvise(MADV_DONTNEED)`) in the executable's read-only, unmodified private mappings
//! only. They stay in the kernel's page cache: code that runs again maps them back with a
//! minor fault (no disk read). Mappings that hold private copies (`Anonymous:` above 0 kB
//! in `/proc/self/smaps`, e.g. the RELRO segment written by the dynamic loader) are never
//! touched, because dropping a modified private page would bring back the file's original
//! bytes.

/// Unmaps the executable's clean read-only pages from this process; answers the bytes
/// advised. Linux only; elsewhere answers `Ok(0)`.
///
/// Errors: `/proc/self/exe` or `/proc/self/smaps` unreadable, or `madvise` refused.
#[cfg(target_os = "linux")]
pub(crate) fn release_code_pages() -> std::io::Result<usize> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut done = 0usize;
    for m in clean_mappings(&smaps, &exe.to_string_lossy()) {
        // SAFETY: (start, len) is a whole mapping of this process read from smaps: a
        // read-only private mapping of the executable file with no private (modified)
        // page. MADV_DONTNEED only unmaps its pages; the next access maps the identical
        // file pages again, so no byte the process can observe changes.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::madvise(m.0 as *mut libc::c_void, m.1, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        done += m.1;
    }
    Ok(done)
}

/// Elsewhere there is nothing to do.
#[cfg(not(target_os = "linux"))]
pub(crate) fn release_code_pages() -> std::io::Result<usize> {
    Ok(0)
}

/// `(start, length)` of each mapping in `smaps` that maps file `path` privately, read-only
/// (no `w`) and holds no private copy of any page (`Anonymous: 0 kB`).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn clean_mappings(smaps: &str, path: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // the current mapping: (start, len, a candidate so far)
    let mut cur: Option<(usize, usize, bool)> = None;
    let flush = |cur: &mut Option<(usize, usize, bool)>, out: &mut Vec<(usize, usize)>| {
        if let Some((start, len, true)) = cur.take() {
            out.push((start, len));
        }
    };
    for line in smaps.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                flush(&mut cur, &mut out);
                let perms = parts.next().unwrap_or("");
                // offset, device, inode, then the path (may hold spaces)
                let rest: Vec<&str> = parts.skip(3).collect();
                let candidate = perms.starts_with('r')
                    && !perms.contains('w')
                    && perms.ends_with('p')
                    && rest.join(" ") == path
                    && b > a;
                cur = Some((a, b.saturating_sub(a), candidate));
                continue;
            }
        }
        if first == "Anonymous:" {
            let kb: u64 = parts
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX);
            if kb != 0 {
                if let Some(c) = cur.as_mut() {
                    c.2 = false;
                }
            }
        }
    }
    flush(&mut cur, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0000000-55d0c0400000 r--p 00000000 fd:01 1234 /opt/sw/stallwatch
Size:               4096 kB
Anonymous:             0 kB
55d0c0400000-55d0c1000000 r-xp 00400000 fd:01 1234 /opt/sw/stallwatch
Size:              12288 kB
Anonymous:             0 kB
55d0c1000000-55d0c1100000 r--p 01000000 fd:01 1234 /opt/sw/stallwatch
Size:               1024 kB
Anonymous:           128 kB
55d0c1100000-55d0c1110000 rw-p 01100000 fd:01 1234 /opt/sw/stallwatch
Size:                 64 kB
Anonymous:            64 kB
7f0000000000-7f0000100000 r-xp 00000000 fd:01 99 /usr/lib/libc.so.6
Size:               1024 kB
Anonymous:             0 kB
7f0000200000-7f0000300000 r--s 00000000 fd:01 1234 /opt/sw/stallwatch
Size:               1024 kB
Anonymous:             0 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
Size:                132 kB
Anonymous:           132 kB
";

    #[test]
    fn only_the_executables_clean_private_read_only_mappings_are_chosen() {
        assert_eq!(
            clean_mappings(SMAPS, "/opt/sw/stallwatch"),
            vec![(0x55d0_c000_0000, 0x40_0000), (0x55d0_c040_0000, 0xc0_0000)],
            "not the RELRO copy (Anonymous > 0), the data segment, a shared mapping, or libc"
        );
        assert!(clean_mappings(SMAPS, "/opt/other").is_empty());
    }

    #[test]
    fn a_mapping_path_with_spaces_is_matched_whole() {
        let smaps = "1000-3000 r-xp 00000000 fd:01 7 /home/a b/stallwatch\nAnonymous: 0 kB\n";
        assert_eq!(
            clean_mappings(smaps, "/home/a b/stallwatch"),
            vec![(0x1000, 0x2000)]
        );
        assert!(clean_mappings(smaps, "/home/a").is_empty());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn releasing_this_test_binarys_code_pages_keeps_it_running() {
        fn busy(n: u64) -> u64 {
            (0..n).fold(0u64, |a, x| a.wrapping_mul(31).wrapping_add(x))
        }
        let before = busy(1000);
        let advised = release_code_pages().expect("madvise");
        assert!(advised > 0, "the test binary maps its own code");
        assert_eq!(
            busy(1000),
            before,
            "code runs the same after its pages come back"
        );
    }
}
