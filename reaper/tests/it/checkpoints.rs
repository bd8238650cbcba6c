//! Checkpoints: commit validates and moves files; rollback leaves the workspace identical;
//! path escapes are refused; a commit aborted half-way (failpoint) is rolled forward.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use stallwatch_reaper::checkpoint::{Checkpoints, HDF5_SIGNATURE};
use stallwatch_reaper::ReaperStats;
use stallwatch_storage::checkpoints::CheckpointState;
use stallwatch_storage::control::{ControlReply, ControlRequest};
use stallwatch_storage::{EventBus, Storage, StorageConfig};
use tokio::sync::oneshot;

use crate::common::*;

/// Every file under `root` (except `.workbench/`) with its SHA-256.
fn hash_tree(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if rel.starts_with(".workbench") {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                out.insert(rel, hex::encode(Sha256::digest(std::fs::read(&p).unwrap())));
            }
        }
    }
    out
}

async fn call(
    h: &Harness,
    f: impl FnOnce(oneshot::Sender<ControlReply>) -> ControlRequest,
) -> ControlReply {
    let (tx, rx) = oneshot::channel();
    h.handle.handle(f(tx)).await;
    rx.await.unwrap()
}

async fn create(h: &Harness, ws: &Path) -> (String, PathBuf) {
    let v = call(h, |reply| ControlRequest::CreateCheckpoint {
        runner_id: "r".into(),
        workspace: ws.to_path_buf(),
        reply,
    })
    .await
    .unwrap();
    (
        v["id"].as_str().unwrap().into(),
        PathBuf::from(v["path"].as_str().unwrap()),
    )
}

/// A process attached as runner "r" (watched, never signalled), killed on drop:
/// checkpoints are opened for registered runners only.
struct RunnerR(std::process::Child);

impl Drop for RunnerR {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn cp_harness() -> (Harness, RunnerR) {
    let h = harness(200).await;
    let child = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let r = RunnerR(child);
    h.register(attach_spec("r", r.0.id())).await.unwrap();
    (h, r)
}

fn attach_spec(id: &str, pid: u32) -> stallwatch_storage::control::RunnerSpec {
    stallwatch_storage::control::RunnerSpec {
        id: id.into(),
        heartbeat_socket: None,
        spawn: None,
        attach: Some(stallwatch_storage::control::AttachSpec {
            pid,
            start_time_ticks: None,
        }),
    }
}

fn workspace() -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join("data")).unwrap();
    std::fs::write(ws.path().join("data/table.csv"), "a,b\n1,2\n").unwrap();
    std::fs::write(ws.path().join("notes.json"), "{\"v\": 1}").unwrap();
    ws
}

#[tokio::test]
async fn rollback_leaves_the_workspace_byte_for_byte_identical() {
    let (h, _r) = cp_harness().await;
    let ws = workspace();
    let before = hash_tree(ws.path());
    let (id, staging) = create(&h, ws.path()).await;
    assert!(staging.starts_with(
        std::fs::canonicalize(ws.path())
            .unwrap()
            .join(".workbench/checkpoints")
    ));
    std::fs::create_dir_all(staging.join("data")).unwrap();
    std::fs::write(staging.join("data/table.csv"), "a,b\n9,9\n").unwrap();
    std::fs::write(staging.join("new.json"), "[1]").unwrap();
    let v = call(&h, |reply| ControlRequest::RollbackCheckpoint {
        id: id.clone(),
        reply,
    })
    .await
    .unwrap();
    assert_eq!(v["state"], "rolled_back");
    assert!(!staging.exists());
    assert_eq!(hash_tree(ws.path()), before);
    let row = h.storage.checkpoint(id).await.unwrap().unwrap();
    assert_eq!(row.state, CheckpointState::RolledBack);
}

#[tokio::test]
async fn commit_validates_then_moves_every_file() {
    let (h, _r) = cp_harness().await;
    let ws = workspace();
    // Invalid content: nothing moves.
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty.json", vec![]),
        ("broken.json", b"{\"a\":".to_vec()),
        ("nb.ipynb", b"{\"metadata\": {}}".to_vec()),
        ("wide.csv", b"a,b\n1,2,3\n".to_vec()),
        ("x.h5", vec![0u8; 2048]),
    ];
    for (name, content) in cases {
        let before = hash_tree(ws.path());
        let (id, staging) = create(&h, ws.path()).await;
        std::fs::write(staging.join("ok.txt"), "fine").unwrap();
        std::fs::write(staging.join(name), &content).unwrap();
        let err = call(&h, |reply| ControlRequest::CommitCheckpoint {
            id: id.clone(),
            reply,
        })
        .await
        .unwrap_err();
        assert_eq!(err.status, 422, "{name}: {err}");
        assert!(err.message.contains(name), "{err}");
        assert_eq!(hash_tree(ws.path()), before, "{name}: workspace untouched");
        call(&h, |reply| ControlRequest::RollbackCheckpoint { id, reply })
            .await
            .unwrap();
    }
    // Valid content: everything lands.
    let (id, staging) = create(&h, ws.path()).await;
    std::fs::create_dir_all(staging.join("pkg")).unwrap();
    std::fs::write(staging.join("pkg/__init__.py"), "").unwrap();
    std::fs::create_dir_all(staging.join("data")).unwrap();
    std::fs::write(staging.join("data/table.csv"), "a,b\n\"x,y\",2\n").unwrap();
    let mut h5 = vec![0u8; 1024];
    h5.extend_from_slice(&HDF5_SIGNATURE);
    std::fs::write(staging.join("arr.h5"), &h5).unwrap();
    std::fs::write(staging.join("nb.ipynb"), "{\"cells\": []}").unwrap();
    let v = call(&h, |reply| ControlRequest::CommitCheckpoint {
        id: id.clone(),
        reply,
    })
    .await
    .unwrap();
    assert_eq!(v["files"], 4);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("data/table.csv")).unwrap(),
        "a,b\n\"x,y\",2\n"
    );
    assert!(ws.path().join("pkg/__init__.py").exists());
    assert_eq!(std::fs::read(ws.path().join("arr.h5")).unwrap(), h5);
    assert!(!staging.exists());
    let again = call(&h, |reply| ControlRequest::CommitCheckpoint { id, reply })
        .await
        .unwrap_err();
    assert_eq!(again.status, 409);
}

#[tokio::test]
async fn path_escapes_are_refused_with_a_clear_error() {
    let (h, _r) = cp_harness().await;
    let ws = workspace();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "s").unwrap();
    // Relative and `..` workspaces.
    let err = call(&h, |reply| ControlRequest::CreateCheckpoint {
        runner_id: "r".into(),
        workspace: "rel/ws".into(),
        reply,
    })
    .await
    .unwrap_err();
    assert_eq!(err.status, 400);
    let dotdot = ws.path().join("data/../..");
    let err = call(&h, |reply| ControlRequest::CreateCheckpoint {
        runner_id: "r".into(),
        workspace: dotdot,
        reply,
    })
    .await
    .unwrap_err();
    assert_eq!(err.code, "path_escape");
    // A staged symlink pointing outside.
    let (id, staging) = create(&h, ws.path()).await;
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), staging.join("link.txt"))
        .unwrap();
    let err = call(&h, |reply| ControlRequest::CommitCheckpoint { id, reply })
        .await
        .unwrap_err();
    assert_eq!(err.code, "path_escape");
    assert!(
        err.message.contains("points outside the workspace"),
        "{err}"
    );
    assert!(!ws.path().join("link.txt").exists());
    // A destination folder that is a symlink to outside.
    std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).unwrap();
    let (id, staging) = create(&h, ws.path()).await;
    std::fs::create_dir_all(staging.join("out")).unwrap();
    std::fs::write(staging.join("out/evil.txt"), "x").unwrap();
    let err = call(&h, |reply| ControlRequest::CommitCheckpoint { id, reply })
        .await
        .unwrap_err();
    assert_eq!(err.code, "path_escape", "{err}");
    assert!(!outside.path().join("evil.txt").exists());
}

#[tokio::test]
async fn a_symlinked_staging_folder_is_never_followed() {
    let (h, _r) = cp_harness().await;
    let ws = workspace();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "s").unwrap();
    // The staging folder replaced by a symlink to outside: commit and rollback refuse,
    // nothing is moved or deleted through it.
    let (id, staging) = create(&h, ws.path()).await;
    std::fs::remove_dir(&staging).unwrap();
    std::os::unix::fs::symlink(outside.path(), &staging).unwrap();
    let cid = id.clone();
    let err = call(&h, |reply| ControlRequest::CommitCheckpoint {
        id: cid,
        reply,
    })
    .await
    .unwrap_err();
    assert_eq!(err.code, "path_escape", "{err}");
    assert!(err.message.contains("symlink"), "{err}");
    assert!(outside.path().join("secret.txt").exists());
    assert!(!ws.path().join("secret.txt").exists());
    let cid = id.clone();
    let err = call(&h, |reply| ControlRequest::RollbackCheckpoint {
        id: cid,
        reply,
    })
    .await
    .unwrap_err();
    assert_eq!(err.code, "path_escape", "{err}");
    assert!(outside.path().join("secret.txt").exists());
    // `.workbench/checkpoints` replaced by a symlink: the parent check refuses too.
    let (id2, staging2) = create(&h, ws.path()).await;
    let cps = staging2.parent().unwrap().to_path_buf();
    let moved = outside.path().join("cps");
    std::fs::rename(&cps, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &cps).unwrap();
    std::fs::write(moved.join(&id2).join("other.txt"), "o").unwrap();
    let cid = id2.clone();
    let err = call(&h, |reply| ControlRequest::CommitCheckpoint {
        id: cid,
        reply,
    })
    .await
    .unwrap_err();
    assert_eq!(err.code, "path_escape", "{err}");
    assert!(moved.join(&id2).join("other.txt").exists());
    assert!(!ws.path().join("other.txt").exists());
}

#[tokio::test]
async fn a_symlinked_workbench_is_refused_on_create() {
    let (h, _r) = cp_harness().await;
    for link in [".workbench", ".workbench/checkpoints"] {
        let ws = workspace();
        let outside = tempfile::tempdir().unwrap();
        if link != ".workbench" {
            std::fs::create_dir_all(ws.path().join(".workbench")).unwrap();
        }
        std::os::unix::fs::symlink(outside.path(), ws.path().join(link)).unwrap();
        let err = call(&h, |reply| ControlRequest::CreateCheckpoint {
            runner_id: "r".into(),
            workspace: ws.path().to_path_buf(),
            reply,
        })
        .await
        .unwrap_err();
        assert_eq!(err.code, "path_escape", "{link}: {err}");
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "{link}: nothing created outside the workspace"
        );
    }
}

/// Child side of the failpoint test: commits `STALLWATCH_TEST_COMMIT=<db>|<id>` with
/// `STALLWATCH_FAILPOINTS` set by the parent (the process aborts mid-commit).
#[tokio::test]
async fn failpoint_child_commit() {
    let Ok(arg) = std::env::var("STALLWATCH_TEST_COMMIT") else {
        return;
    };
    let (db, id) = arg.split_once('|').unwrap();
    let storage = Storage::open(StorageConfig::new(db)).unwrap();
    let cps = Checkpoints::new(
        storage.clone(),
        EventBus::new(storage),
        Arc::new(ReaperStats::default()),
    );
    let r = cps.commit(id).await;
    panic!("the failpoint should have aborted the commit: {r:?}");
}

#[tokio::test]
async fn commit_aborted_after_the_third_rename_is_rolled_forward_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace();
    let db = dir.path().join("stallwatch.db");
    let (id, staging) = {
        let storage = Storage::open(StorageConfig::new(&db)).unwrap();
        let cps = Checkpoints::new(
            storage.clone(),
            EventBus::new(storage.clone()),
            Arc::new(ReaperStats::default()),
        );
        let v = cps.create("r", ws.path()).await.unwrap();
        storage.shutdown().await;
        (v.id, v.path)
    };
    for i in 0..10 {
        std::fs::write(
            staging.join(format!("f{i}.json")),
            format!("{{\"i\": {i}}}"),
        )
        .unwrap();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "checkpoints::failpoint_child_commit",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STALLWATCH_TEST_COMMIT", format!("{}|{id}", db.display()))
        .env("STALLWATCH_FAILPOINTS", "checkpoint.after_rename:3")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(6),
        "child must abort: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let landed = (0..10)
        .filter(|i| ws.path().join(format!("f{i}.json")).exists())
        .count();
    assert_eq!(landed, 3, "exactly three renames before the abort");
    // Restart: the sweep rolls the commit forward.
    let cfg = config(dir.path(), 200);
    let h = harness_with(dir, cfg).await;
    let storage = h.storage.clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let row = storage.checkpoint(id.clone()).await.unwrap().unwrap();
        if row.state == CheckpointState::Committed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not rolled forward: {:?}",
            row.state
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for i in 0..10 {
        assert_eq!(
            std::fs::read_to_string(ws.path().join(format!("f{i}.json"))).unwrap(),
            format!("{{\"i\": {i}}}")
        );
    }
    assert!(!staging.exists());
}
