//! stallwatch reaper (filled by its issue).
