//! The Windows counterpart of the Linux `platform` module, for what `src/` calls.

use std::io;

/// Windows has no `RLIMIT_NOFILE`: a process's handles are bounded by memory, not a soft
/// limit. Answers `(None, None)` (unlimited, unchanged).
pub fn raise_nofile_limit() -> io::Result<(Option<u64>, Option<u64>)> {
    Ok((None, None))
}
