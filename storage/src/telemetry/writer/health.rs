//! The writer's view of its own health: the database file moved away, the disk full,
//! degraded (transient) conditions published for `/readyz`, and the idle probe that
//! notices recovery (docs/design.md, Durability and limits).

use crate::config::{wal_budget_bytes, CONTROL_RESERVE_BYTES};
use crate::error::{transient_kind, Transient, WriteError};
use crate::telemetry::stats::RefusedReason;

use super::{Degraded, WriteRequest, Writer};

/// The database file's identity (device, inode), to notice it being deleted or replaced.
#[cfg(unix)]
pub(super) fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The database file's identity on Windows: (volume serial number, 64-bit file index) from
/// `GetFileInformationByHandle`, the analogue of (device, inode). Not the creation time:
/// NTFS tunnelling can give a re-created file the old one, and Wine reports a creation time
/// that moves with every write (docs/platforms.md).
#[cfg(windows)]
pub(super) fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::windows::fs::OpenOptionsExt;
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem::{
        GetFileInformationByHandle, BY_HANDLE_FILE_INFORMATION, FILE_FLAG_BACKUP_SEMANTICS,
    };
    // Access 0: attributes only, and std's default sharing, so SQLite's handle is not
    // disturbed.
    let file = std::fs::OpenOptions::new()
        .access_mode(0)
        .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)
        .ok()?;
    // SAFETY: the handle is live for the call (owned by `file`); the structure is plain
    // data the call fills.
    #[allow(unsafe_code)]
    let info = unsafe {
        let mut info: BY_HANDLE_FILE_INFORMATION = std::mem::zeroed();
        if GetFileInformationByHandle(file.as_raw_handle() as _, &mut info) == 0 {
            return None;
        }
        info
    };
    let index = (u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow);
    Some((u64::from(info.dwVolumeSerialNumber), index))
}

impl Writer {
    pub(super) fn full_reason(&self) -> String {
        format!(
            "telemetry reached its share of max_db_bytes ({} of {} bytes in use; {} bytes are kept for control records and {} for the write-ahead log) and retention could not yet delete enough of the oldest",
            self.used_bytes,
            self.budget_bytes,
            CONTROL_RESERVE_BYTES,
            wal_budget_bytes(self.max_db_bytes)
        )
    }

    pub(in crate::telemetry) fn set_full(&mut self, reason: Option<String>) {
        match &reason {
            Some(r) => self.set_degraded(Some(Degraded {
                kind: Transient::Full,
                detail: r.clone(),
            })),
            None => {
                if self.degraded_tx.borrow().as_ref().map(|d| d.kind) == Some(Transient::Full) {
                    self.set_degraded(None);
                }
            }
        }
        self.full_tx.send_if_modified(|cur| {
            if *cur == reason {
                false
            } else {
                if let Some(r) = &reason {
                    tracing::warn!(reason = %r, "telemetry storage full");
                } else {
                    tracing::info!("telemetry storage has room again");
                }
                *cur = reason;
                true
            }
        });
    }

    /// Publishes the writer's condition (`None` = healthy); logs each change once.
    pub(super) fn set_degraded(&mut self, to: Option<Degraded>) {
        if to.is_some() && self.degraded_tx.borrow().is_none() {
            // The idle thread's first probe comes a probe interval after the condition
            // began, not at once (it would wait out `busy_timeout` again straight away).
            self.next_probe = std::time::Instant::now() + super::DEGRADED_PROBE_EVERY;
        }
        self.degraded_tx.send_if_modified(|cur| {
            if cur.as_ref().map(|d| d.kind) == to.as_ref().map(|d| d.kind) {
                return false;
            }
            match &to {
                Some(d) if d.kind == Transient::Gone => tracing::error!(
                    condition = d.kind.as_str(),
                    detail = %d.detail,
                    "storage gone: telemetry is refused with 503 / UNAVAILABLE; restart stallwatch on a data folder that exists"
                ),
                Some(d) => tracing::warn!(
                    condition = d.kind.as_str(),
                    detail = %d.detail,
                    "storage degraded: telemetry is refused with 503 / UNAVAILABLE until it passes"
                ),
                None => tracing::info!("storage recovered: telemetry is accepted again"),
            }
            *cur = to;
            true
        });
    }

    /// `Some` when the database file is no longer the one opened (deleted, or replaced).
    pub(super) fn moved_away(&self) -> Option<Degraded> {
        let now = file_identity(&self.db_path);
        if self.identity.is_some() && now == self.identity {
            return None;
        }
        let detail = match now {
            None => format!("database file {} was deleted while running; acknowledging into the unlinked file would lose the data", self.db_path.display()),
            Some(_) => format!("database file {} was replaced while running", self.db_path.display()),
        };
        Some(Degraded {
            kind: Transient::Gone,
            detail,
        })
    }

    /// While degraded and idle: checks whether storage is back (an empty write transaction)
    /// so `/readyz` recovers even when no exporter is retrying.
    pub(super) fn probe(&mut self) {
        if let Some(gone) = self.moved_away() {
            // logged once, when the condition begins (`set_degraded`), not every probe
            self.set_degraded(Some(gone));
            return;
        }
        if self.full_tx.borrow().is_some() {
            // Full episodes end through a successful commit or retention.
            return;
        }
        let r = self
            .conn
            .execute_batch("BEGIN IMMEDIATE; ROLLBACK")
            .inspect_err(|_| {
                let _ = self.conn.execute_batch("ROLLBACK");
            });
        match r {
            Ok(()) => self.set_degraded(None),
            Err(e) => {
                if let Some(kind) = transient_kind(&e) {
                    self.set_degraded(Some(Degraded {
                        kind,
                        detail: e.to_string(),
                    }));
                }
            }
        }
    }

    /// Answers every request of a group with a transient refusal, counted by its reason.
    pub(super) fn refuse_unavailable(&mut self, reqs: Vec<WriteRequest>, why: Degraded) {
        self.stats
            .count_refused(RefusedReason::from(why.kind), reqs.len() as u64);
        for r in reqs {
            let _ = r.reply.send(Err(WriteError::Unavailable {
                kind: why.kind,
                detail: why.detail.clone(),
            }));
        }
        self.set_degraded(Some(why));
    }
}
