//! Persistable monotonic time. `Instant` cannot be written to disk, so the ledger stores
//! `CLOCK_MONOTONIC` nanoseconds together with the boot id they belong to
//! (`/proc/sys/kernel/random/boot_id`, docs/design.md, Durability levels). [`MonoClock`] pairs one
//! `Instant` with one `CLOCK_MONOTONIC` reading (std's `Instant` is `CLOCK_MONOTONIC` on
//! Linux) and converts both ways; a time from another boot converts to nothing.

use std::time::{Duration, Instant};

/// Where Linux publishes the id of the current boot.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Converts between `Instant` and (boot id, `CLOCK_MONOTONIC` ns).
#[derive(Clone, Debug)]
pub struct MonoClock {
    anchor: Instant,
    anchor_ns: u64,
    boot_id: String,
}

#[cfg(unix)]
fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Windows: the performance counter std's `Instant` is built on, in ns (docs/platforms.md).
#[cfg(windows)]
fn monotonic_ns() -> u64 {
    use windows_sys::Win32::System::Performance::{
        QueryPerformanceCounter, QueryPerformanceFrequency,
    };
    let (mut count, mut freq) = (0i64, 0i64);
    // SAFETY: both calls only write the one i64 they are given; they cannot fail on
    // Windows XP and later.
    #[allow(unsafe_code)]
    unsafe {
        QueryPerformanceCounter(&mut count);
        QueryPerformanceFrequency(&mut freq);
    }
    if freq <= 0 {
        return 0;
    }
    ((count as i128 * 1_000_000_000) / freq as i128) as u64
}

impl MonoClock {
    /// Reads the boot id (an empty id when `/proc` is unreadable, and always on Windows,
    /// which has no boot id: rows then never match a later boot, which is the safe side)
    /// and anchors the clock at now.
    pub fn new() -> Self {
        let boot_id = std::fs::read_to_string(BOOT_ID_PATH)
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Self::with_boot_id(boot_id)
    }

    /// A clock with an explicit boot id (tests).
    pub fn with_boot_id(boot_id: String) -> Self {
        let anchor = Instant::now();
        let anchor_ns = monotonic_ns();
        Self {
            anchor,
            anchor_ns,
            boot_id,
        }
    }

    /// The boot id the clock's readings belong to.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// `CLOCK_MONOTONIC` ns of `t`.
    pub fn to_mono_ns(&self, t: Instant) -> u64 {
        if t >= self.anchor {
            self.anchor_ns
                .saturating_add(t.duration_since(self.anchor).as_nanos() as u64)
        } else {
            self.anchor_ns
                .saturating_sub(self.anchor.duration_since(t).as_nanos() as u64)
        }
    }

    /// The `Instant` of `mono_ns` taken during boot `boot_id`; `None` for another boot (or
    /// an empty id) or a time this process cannot represent.
    pub fn to_instant(&self, boot_id: &str, mono_ns: u64) -> Option<Instant> {
        if boot_id.is_empty() || boot_id != self.boot_id {
            return None;
        }
        if mono_ns >= self.anchor_ns {
            self.anchor
                .checked_add(Duration::from_nanos(mono_ns - self.anchor_ns))
        } else {
            self.anchor
                .checked_sub(Duration::from_nanos(self.anchor_ns - mono_ns))
        }
    }
}

impl Default for MonoClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_within_a_boot_and_refusal_across_boots() {
        let c = MonoClock::new();
        assert!(!c.boot_id().is_empty(), "this is Linux: boot id readable");
        let t = Instant::now() - Duration::from_millis(1500);
        let ns = c.to_mono_ns(t);
        // a second clock (as after a restart of stallwatch) maps it back to the same instant
        let c2 = MonoClock::new();
        let back = c2.to_instant(c.boot_id(), ns).unwrap();
        let diff = if back > t { back - t } else { t - back };
        assert!(diff < Duration::from_millis(5), "drift {diff:?}");
        assert!(c2.to_instant("another-boot", ns).is_none());
    }
}
