//! (checkpoints: filled by its domain's work.)

/// DDL for this module's tables (part of migration 1).
pub(crate) const SCHEMA: &str = "";
