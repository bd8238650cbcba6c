//! Path safety of checkpoints (issue 17 #3, #4, #7; `docs/design.md`, Checkpoints).
//!
//! The workspace root is checked once by path (absolute, no `..`, canonical, a folder, not
//! the filesystem root) and opened; from then on the platform's arm reaches every folder
//! without following links: on Linux from a directory descriptor, one component at a time
//! (`paths/fd.rs`); on Windows through folders held open (`fs_windows.rs`). The rules here
//! are the same for both.

use std::ffi::OsStr;
use std::fs;
use std::path::{Component, Path, PathBuf};

use super::CheckpointError;

/// Staging folders live here, relative to the workspace root.
pub const STAGING_ROOT: &str = ".workbench/checkpoints";

/// The staging folder of transaction `id` under `workspace`.
pub fn staging_dir(workspace: &Path, id: &str) -> PathBuf {
    // One component at a time: a Windows verbatim path (`\\?\C:\...`) takes no `/`.
    staging_components(id)
        .iter()
        .fold(workspace.to_path_buf(), |p, c| p.join(c))
}

/// The components from the workspace root to the staging folder of `id`.
pub fn staging_components(id: &str) -> [&OsStr; 3] {
    [
        OsStr::new(".workbench"),
        OsStr::new("checkpoints"),
        OsStr::new(id),
    ]
}

pub(super) fn invalid_ws(why: String) -> CheckpointError {
    CheckpointError::InvalidWorkspace { why }
}

/// Checks a workspace root: absolute, no `..`, an existing folder, not `/`. Answers its
/// canonical path.
///
/// Errors: [`CheckpointError::InvalidWorkspace`], [`CheckpointError::PathEscape`] (`..`).
pub fn check_workspace(workspace: &Path) -> Result<PathBuf, CheckpointError> {
    if !workspace.is_absolute() {
        return Err(invalid_ws(format!(
            "workspace {} must be an absolute path",
            workspace.display()
        )));
    }
    if workspace
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(CheckpointError::PathEscape {
            path: workspace.to_path_buf(),
            why: format!("workspace {} contains '..'", workspace.display()),
        });
    }
    let canon = fs::canonicalize(workspace)
        .map_err(|e| invalid_ws(format!("workspace {}: {e}", workspace.display())))?;
    if !canon.is_dir() {
        return Err(invalid_ws(format!(
            "workspace {} is not a folder",
            workspace.display()
        )));
    }
    if canon.parent().is_none() {
        return Err(invalid_ws(format!(
            "workspace {} is the filesystem root; give the project folder",
            workspace.display()
        )));
    }
    Ok(canon)
}

/// Checks that `rel` is a plain relative path (only normal components, no `..`, not
/// absolute, not under `.workbench/`).
///
/// Errors: [`CheckpointError::PathEscape`].
pub fn check_relative(rel: &Path) -> Result<(), CheckpointError> {
    if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(CheckpointError::PathEscape {
            path: rel.to_path_buf(),
            why: format!(
                "path {} leaves the workspace root ('..' or absolute)",
                rel.display()
            ),
        });
    }
    // Windows file names are case-insensitive: `.WORKBENCH` is the same folder there.
    let first_is_workbench = rel.components().next().is_some_and(|c| {
        let name = c.as_os_str();
        if cfg!(windows) {
            name.eq_ignore_ascii_case(".workbench")
        } else {
            name == ".workbench"
        }
    });
    if first_is_workbench {
        return Err(CheckpointError::PathEscape {
            path: rel.to_path_buf(),
            why: format!(
                "path {} would overwrite stallwatch's .workbench folder",
                rel.display()
            ),
        });
    }
    Ok(())
}

#[cfg(unix)]
mod fd;
#[cfg(unix)]
pub use fd::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_must_stay_inside() {
        assert!(check_relative(Path::new("a/b.json")).is_ok());
        assert!(check_relative(Path::new("../x")).is_err());
        assert!(check_relative(Path::new("/etc/passwd")).is_err());
        assert!(check_relative(Path::new(".workbench/x")).is_err());
    }
}
