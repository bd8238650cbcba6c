#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Integration tests of the reaper: real processes, real files, a real SQLite file, scaled
//! down grace periods. Scenario scripts are copied in `tests/scenarios/` (cases C22–C26, C29).

#[path = "it/checkpoints.rs"]
mod checkpoints;
#[path = "it/commit_fd.rs"]
mod commit_fd;
#[path = "it/common.rs"]
mod common;
#[path = "it/runners.rs"]
mod runners;
#[path = "it/scenarios.rs"]
mod scenarios;
#[path = "it/sweep.rs"]
mod sweep;
#[path = "it/validation.rs"]
mod validation;
