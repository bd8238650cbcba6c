//! Input validation of runner and checkpoint requests: each bad input is a 400 (or 404)
//! with a clear code and message, refused before anything is started or created.

use std::path::{Path, PathBuf};

use stallwatch_storage::control::{
    AttachSpec, CheckpointError, ControlRequest, RegisterError, RunnerSpec,
};
use tokio::sync::oneshot;

use crate::common::*;

async fn create_checkpoint(
    h: &Harness,
    runner: &str,
    ws: &Path,
) -> Result<stallwatch_storage::control::CheckpointCreated, CheckpointError> {
    let (reply, rx) = oneshot::channel();
    h.handle
        .handle(ControlRequest::CreateCheckpoint {
            runner_id: runner.into(),
            workspace: ws.to_path_buf(),
            reply,
        })
        .await;
    rx.await.unwrap()
}

fn attach(id: &str, pid: u32) -> RunnerSpec {
    RunnerSpec {
        id: id.into(),
        heartbeat_socket: None,
        spawn: None,
        attach: Some(AttachSpec {
            pid,
            start_time_ticks: None,
        }),
    }
}

#[tokio::test]
async fn checkpoints_need_a_registered_runner_and_a_real_project_folder() {
    let h = harness(200).await;
    let ws = tempfile::tempdir().unwrap();
    let err = create_checkpoint(&h, "ghost", ws.path()).await.unwrap_err();
    assert!(matches!(err, CheckpointError::RunnerNotFound(_)), "{err}");

    h.register(spawn_spec("cp", &["sleep", "600"]))
        .await
        .unwrap();
    let inside = h.dir.path().join("inside");
    std::fs::create_dir_all(&inside).unwrap();
    let file = ws.path().join("f.txt");
    std::fs::write(&file, "x").unwrap();
    let cases: [(PathBuf, &str); 5] = [
        ("/".into(), "filesystem root"),
        (inside, "data folder"),
        (h.dir.path().to_path_buf(), "data folder"),
        (ws.path().join("missing"), "missing"),
        (file, "not a folder"),
    ];
    for (p, why) in cases {
        let err = create_checkpoint(&h, "cp", &p).await.unwrap_err();
        assert!(
            matches!(err, CheckpointError::InvalidWorkspace(_)),
            "{}: {err}",
            p.display()
        );
        if why != "missing" {
            assert!(err.to_string().contains(why), "{}: {err}", p.display());
        }
    }
    assert!(!h.dir.path().join(".workbench").exists());
    // A plain project folder is accepted.
    create_checkpoint(&h, "cp", ws.path()).await.unwrap();
    h.delete("cp").await.unwrap();
}

#[tokio::test]
async fn bad_runner_specs_are_refused_with_invalid_runner() {
    let h = harness(200).await;
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("plain");
    std::fs::write(&file, "x").unwrap();
    // heartbeat_socket: absolute, and a socket or nothing yet.
    for (sock, why) in [
        (PathBuf::new(), "absolute"),
        (PathBuf::from("rel.sock"), "absolute"),
        (tmp.path().to_path_buf(), "not a socket"),
        (file.clone(), "not a socket"),
    ] {
        let mut spec = spawn_spec("hb", &["sleep", "600"]);
        spec.heartbeat_socket = Some(sock.clone());
        let err = h.register(spec).await.unwrap_err();
        assert!(matches!(err, RegisterError::Invalid(_)), "{sock:?}: {err}");
        assert!(err.to_string().contains(why), "{sock:?}: {err}");
    }
    // env keys: non-empty, no '=', no NUL.
    for key in ["", "A=B", "A\0B"] {
        let mut spec = spawn_spec("envy", &["sleep", "600"]);
        spec.spawn
            .as_mut()
            .unwrap()
            .env
            .insert(key.into(), "v".into());
        let err = h.register(spec).await.unwrap_err();
        assert!(matches!(err, RegisterError::Invalid(_)), "{key:?}: {err}");
        assert!(err.to_string().contains("env key"), "{key:?}: {err}");
    }
    // A missing cwd is named as such, not blamed on the program.
    let mut spec = spawn_spec("nocwd", &["sleep", "600"]);
    spec.spawn.as_mut().unwrap().cwd = Some(tmp.path().join("gone"));
    let err = h.register(spec).await.unwrap_err();
    assert!(matches!(err, RegisterError::Invalid(_)), "{err}");
    assert!(
        err.to_string().contains("cwd") && !err.to_string().contains("sleep"),
        "{err}"
    );
    // init, pid 2 (kthreadd) and stallwatch itself are never runners, with one code.
    for pid in [1, 2, std::process::id()] {
        let err = h.register(attach("att", pid)).await.unwrap_err();
        assert!(matches!(err, RegisterError::Invalid(_)), "pid {pid}: {err}");
    }
    // Any kernel thread visible here (PF_KTHREAD) is refused too.
    let kthreads = stallwatch_reaper::platform::all_processes()
        .into_iter()
        .filter(|p| p.is_kernel_thread() && p.pid > 2)
        .take(3);
    for k in kthreads {
        let err = h.register(attach("kt", k.pid)).await.unwrap_err();
        assert!(
            matches!(err, RegisterError::Invalid(_)),
            "kernel thread {}: {err}",
            k.pid
        );
    }
    // An absolute socket path that does not exist yet is fine.
    let mut spec = spawn_spec("hb", &["sleep", "600"]);
    spec.heartbeat_socket = Some(tmp.path().join("hb.sock"));
    h.register(spec).await.unwrap();
    h.delete("hb").await.unwrap();
}

/// A pid no process can have, a thread id, and a zombie are each refused with their own
/// answer, with and without a start time (a pid past `i32::MAX` panicked the handler; a
/// thread id was attached and never seen to exit, or answered 500; a zombie without a
/// start time was attached and shown exited at once).
#[tokio::test]
async fn pids_threads_and_zombies_are_refused_by_name() {
    let h = harness(200).await;
    for pid in [0, 2_147_483_648, u32::MAX] {
        let err = h.register(attach("big", pid)).await.unwrap_err();
        assert!(matches!(err, RegisterError::Invalid(_)), "pid {pid}: {err}");
        assert!(err.to_string().contains("not a process id"), "{err}");
    }

    let mut threaded = std::process::Command::new(python())
        .args([
            "-c",
            "import threading,time\nthreading.Thread(target=time.sleep,args=(600,),daemon=True).start()\nprint('up',flush=True)\ntime.sleep(600)",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(threaded.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let pid = threaded.id();
    let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|t| *t != pid)
        .expect("a second thread");
    let ticks = stallwatch_reaper::platform::proc_stat(tid)
        .unwrap()
        .start_time_ticks;
    for start in [None, Some(ticks)] {
        let mut spec = attach("tid", tid);
        spec.attach.as_mut().unwrap().start_time_ticks = start;
        let err = h.register(spec).await.unwrap_err();
        assert!(matches!(err, RegisterError::Invalid(_)), "{start:?}: {err}");
        assert!(
            err.to_string()
                .contains(&format!("is a thread of process {pid}")),
            "{err}"
        );
    }
    threaded.kill().unwrap();
    threaded.wait().unwrap();

    // A zombie: exited, not reaped yet by its parent (this test).
    let zombie = std::process::Command::new("true").spawn().unwrap();
    let zpid = zombie.id();
    wait_for("zombie", || {
        stallwatch_reaper::platform::proc_stat(zpid).is_ok_and(|s| s.state == 'Z')
    })
    .await;
    let zticks = stallwatch_reaper::platform::proc_stat(zpid)
        .unwrap()
        .start_time_ticks;
    for start in [None, Some(zticks)] {
        let mut spec = attach("zombie", zpid);
        spec.attach.as_mut().unwrap().start_time_ticks = start;
        let err = h.register(spec).await.unwrap_err();
        assert!(matches!(err, RegisterError::Gone(_)), "{start:?}: {err}");
    }
    let mut zombie = zombie;
    zombie.wait().unwrap();
}
