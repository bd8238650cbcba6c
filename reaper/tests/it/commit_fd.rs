//! The descriptor-level commit rules of issue 17, driven step by step so the race windows
//! are hit deterministically: a staged file swapped for a symlink between validation and
//! move (#3), a staged relative symlink (#4), a hard link to an outside file (#5), a folder
//! that appears at a destination during the moves (#6), and a symlinked workspace folder
//! on the way (#7). Real files in temporary folders; no mocks.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use stallwatch_reaper::checkpoint::{commit, paths, CheckpointError};

struct Ws {
    _dir: tempfile::TempDir,
    root_path: PathBuf,
    root: OwnedFd,
    staging: PathBuf,
    id: String,
}

fn ws() -> Ws {
    let dir = tempfile::tempdir().unwrap();
    let root_path = std::fs::canonicalize(dir.path()).unwrap();
    let root = paths::open_root(&root_path).unwrap();
    let id = "t1".to_string();
    paths::create_staging(&root, &root_path, &id).unwrap();
    let staging = paths::staging_dir(&root_path, &id);
    Ws {
        _dir: dir,
        root_path,
        root,
        staging,
        id,
    }
}

impl Ws {
    fn stage(&self, rel: &str, body: &str) {
        let p = self.staging.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    fn prepare(&self) -> Result<commit::Plan, CheckpointError> {
        let st = paths::open_staging(&self.root, &self.root_path, &self.id)
            .unwrap()
            .unwrap();
        commit::prepare(&self.root, &self.root_path, st, &self.staging)
    }
    fn apply(&self, plan: &commit::Plan) -> Result<commit::Applied, CheckpointError> {
        commit::apply(&self.root, &self.root_path, plan)
    }
    /// Every entry of the workspace outside `.workbench`, with `l` for symlinks.
    fn listing(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![self.root_path.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                let rel = e
                    .path()
                    .strip_prefix(&self.root_path)
                    .unwrap()
                    .to_path_buf();
                if rel.starts_with(".workbench") {
                    continue;
                }
                let ft = e.file_type().unwrap();
                if ft.is_dir() {
                    stack.push(e.path());
                    out.push(format!("d {}", rel.display()));
                } else if ft.is_symlink() {
                    out.push(format!("l {}", rel.display()));
                } else {
                    let body = std::fs::read_to_string(e.path()).unwrap_or_default();
                    out.push(format!("f {} {body}", rel.display()));
                }
            }
        }
        out.sort();
        out
    }
}

fn outside_file() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("secret.txt");
    std::fs::write(&p, "secret").unwrap();
    (d, p)
}

#[test]
fn the_healthy_commit_moves_everything_and_replaces_files_in_place() {
    let w = ws();
    std::fs::write(w.root_path.join("keep.txt"), "old").unwrap();
    w.stage("keep.txt", "new");
    w.stage("a/b/c.json", "[1]");
    let plan = w.prepare().unwrap();
    assert_eq!(plan.files.len(), 2);
    assert_eq!(w.apply(&plan).unwrap().moved, 2);
    assert_eq!(
        w.listing(),
        vec!["d a", "d a/b", "f a/b/c.json [1]", "f keep.txt new"]
    );
}

#[test]
fn a_staged_file_swapped_for_a_symlink_after_validation_never_lands() {
    let (_o, secret) = outside_file();
    for victim in ["f0.txt", "f5.txt", "f9.txt"] {
        let w = ws();
        std::fs::write(w.root_path.join("f5.txt"), "before").unwrap();
        for i in 0..10 {
            w.stage(&format!("f{i}.txt"), &format!("{i}"));
        }
        let before = w.listing();
        let plan = w.prepare().unwrap();
        // The attacker swaps the validated file for a symlink to an outside file.
        let p = w.staging.join(victim);
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&secret, &p).unwrap();
        let err = w.apply(&plan).unwrap_err();
        assert!(
            matches!(err, CheckpointError::Validation { .. }),
            "{victim}: {err}"
        );
        assert_eq!(w.listing(), before, "{victim}: the workspace is as it was");
    }
}

#[test]
fn a_staged_file_swapped_for_a_hard_link_after_validation_never_lands() {
    let (_o, secret) = outside_file();
    let w = ws();
    w.stage("a.txt", "a");
    w.stage("b.txt", "b");
    let plan = w.prepare().unwrap();
    let p = w.staging.join("b.txt");
    std::fs::remove_file(&p).unwrap();
    if std::fs::hard_link(&secret, &p).is_err() {
        eprintln!("skip: the temporary folders are on different filesystems (no hard link)");
        return;
    }
    let err = w.apply(&plan).unwrap_err();
    assert!(matches!(err, CheckpointError::Validation { .. }), "{err}");
    assert!(w.listing().is_empty(), "{:?}", w.listing());
}

#[test]
fn staged_symlinks_are_refused_even_when_harmless_in_staging() {
    for (target, escapes) in [("../../../a", true), ("sibling.txt", false)] {
        let w = ws();
        w.stage("sibling.txt", "s");
        std::os::unix::fs::symlink(target, w.staging.join("link")).unwrap();
        let err = w.prepare().err().expect("a staged symlink is refused");
        let CheckpointError::PathEscape { why, .. } = &err else {
            panic!("{target}: {err}");
        };
        assert_eq!(
            why.contains("points outside the workspace"),
            escapes,
            "{why}"
        );
        assert!(w.listing().is_empty());
    }
}

#[test]
fn a_hard_link_to_an_outside_file_is_refused() {
    let (_o, secret) = outside_file();
    let w = ws();
    if std::fs::hard_link(&secret, w.staging.join("h.txt")).is_err() {
        eprintln!("skip: the temporary folders are on different filesystems (no hard link)");
        return;
    }
    let err = w.prepare().err().expect("refused");
    let CheckpointError::Validation { why, .. } = &err else {
        panic!("{err}");
    };
    assert!(why.contains("hard link"), "{why}");
    // A staged file with a single link is fine.
    let w = ws();
    w.stage("one.txt", "1");
    assert!(w.prepare().is_ok());
}

#[test]
fn a_folder_that_appears_at_a_destination_during_the_moves_undoes_the_commit() {
    let w = ws();
    std::fs::write(w.root_path.join("f3.txt"), "user's").unwrap();
    for i in 0..8 {
        w.stage(&format!("d/f{i}.txt"), &format!("{i}"));
        w.stage(&format!("f{i}.txt"), &format!("{i}"));
    }
    let before = w.listing();
    let plan = w.prepare().unwrap();
    // Someone creates a folder where a file will land, after validation.
    std::fs::create_dir(w.root_path.join("f6.txt")).unwrap();
    let err = w.apply(&plan).unwrap_err();
    assert!(matches!(err, CheckpointError::Conflict { .. }), "{err}");
    let mut expect = before.clone();
    expect.push("d f6.txt".into());
    expect.sort();
    assert_eq!(
        w.listing(),
        expect,
        "every move undone, the created folder d/ removed"
    );
    // The staged files are all back, so a retry after the conflict is fixed succeeds.
    std::fs::remove_dir(w.root_path.join("f6.txt")).unwrap();
    let plan = w.prepare().unwrap();
    assert_eq!(w.apply(&plan).unwrap().moved, 16);
    assert_eq!(
        std::fs::read_to_string(w.root_path.join("f3.txt")).unwrap(),
        "3"
    );
}

#[test]
fn a_symlinked_workspace_folder_refuses_the_plan_before_anything_is_created() {
    let outside = tempfile::tempdir().unwrap();
    let w = ws();
    std::os::unix::fs::symlink(outside.path(), w.root_path.join("out")).unwrap();
    w.stage("a.txt", "first in order");
    w.stage("out/sub/deep/x.txt", "x");
    let err = w.prepare().err().expect("refused");
    assert!(matches!(err, CheckpointError::PathEscape { .. }), "{err}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    assert_eq!(w.listing(), vec!["l out"], "a.txt was not moved either");
}

#[test]
fn roll_forward_is_idempotent_and_skips_what_it_cannot_prove() {
    let w = ws();
    for i in 0..5 {
        w.stage(&format!("f{i}.txt"), &format!("{i}"));
    }
    let plan = w.prepare().unwrap();
    // Two moved before a "crash".
    for f in &plan.files[..2] {
        std::fs::rename(w.staging.join(&f.rel), w.root_path.join(&f.rel)).unwrap();
    }
    // One replaced in staging by another file: not the validated inode.
    std::fs::remove_file(w.staging.join("f4.txt")).unwrap();
    std::fs::write(w.staging.join("f4.txt"), "evil").unwrap();
    let st = paths::open_staging(&w.root, &w.root_path, &w.id).unwrap();
    let (moved, skipped) =
        commit::roll_forward(&w.root, &w.root_path, st.as_ref(), &w.staging, &plan.files).unwrap();
    assert_eq!((moved, skipped.len()), (2, 1), "{skipped:?}");
    let again =
        commit::roll_forward(&w.root, &w.root_path, st.as_ref(), &w.staging, &plan.files).unwrap();
    assert_eq!(again.0, 0);
    assert!(!w.root_path.join("f4.txt").exists());
}
