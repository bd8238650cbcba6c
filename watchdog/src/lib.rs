//! stallwatch watchdog (filled by its issue).
