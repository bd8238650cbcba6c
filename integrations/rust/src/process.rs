//! Reads a process's start time from `/proc/PID/stat` (field 22, clock ticks since boot),
//! which stallwatch uses to prove a pid was not recycled before it signals an attached
//! runner (docs/design.md, Reaper). Linux only, like version 1 of stallwatch.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Field 22 (`starttime`) of `/proc/<pid>/stat`, in clock ticks since boot. Errors with
/// [`Error::Io`] when the process does not exist, [`Error::Decode`] when the file has an
/// unexpected shape.
pub fn process_start_time_ticks(pid: u32) -> Result<u64> {
    let path = PathBuf::from(format!("/proc/{pid}/stat"));
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    parse_start_time(&text).ok_or_else(|| {
        Error::decode(
            path.display().to_string(),
            "no numeric field 22 after the command name",
        )
    })
}

/// Field 22 of one `/proc/PID/stat` text. The command name (field 2) is in parentheses and
/// may contain spaces and `)`, so fields are counted after the last `)`.
pub(crate) fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")" come fields 3 (state), 4, ...; field 22 is the 20th of them.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_fields_after_the_last_parenthesis() {
        let stat =
            "4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 50";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("1 (x) S 0"), None);
        assert_eq!(parse_start_time("garbage"), None);
    }

    #[test]
    fn reads_our_own_start_time_and_fails_for_a_missing_pid() {
        let me = process_start_time_ticks(std::process::id()).unwrap();
        assert!(me > 0);
        // Stable: reading twice gives the same start time.
        assert_eq!(process_start_time_ticks(std::process::id()).unwrap(), me);
        // pid_max is at most 2^22; this pid cannot exist.
        assert!(matches!(
            process_start_time_ticks(4_194_305 + 7),
            Err(Error::Io { .. })
        ));
    }
}
