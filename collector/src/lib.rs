//! stallwatch collector (filled by its issue).
