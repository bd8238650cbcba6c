//! The Windows side of the test runner (see main.rs).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::windows::named_pipe::ServerOptions;
use windows_sys::Win32::System::Console::{SetConsoleCtrlHandler, CTRL_BREAK_EVENT};

static IGNORE_BREAK: AtomicBool = AtomicBool::new(false);
static BREAK_SEEN: AtomicBool = AtomicBool::new(false);

/// Console control handler: a break (or Ctrl-C) is recorded; unless ignoring, the process
/// exits 0 from the main loop.
extern "system" fn on_ctrl(kind: u32) -> i32 {
    if kind == CTRL_BREAK_EVENT || kind == 0 {
        BREAK_SEEN.store(true, Ordering::SeqCst);
        return 1; // handled
    }
    0
}

fn write(dir: &Path, name: &str, text: &str) {
    let _ = std::fs::write(dir.join(name), text);
}

pub fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).cloned().unwrap_or_else(|| "healthy".into());
    let dir = PathBuf::from(args.get(2).cloned().unwrap_or_else(|| ".".into()));
    write(
        &dir,
        &format!("{mode}.pid"),
        &std::process::id().to_string(),
    );
    // A runner spawned with a workspace stages its result where stallwatch says
    // (`STALLWATCH_CHECKPOINT_DIR`), as a tool would.
    if let Some(staging) = std::env::var_os("STALLWATCH_CHECKPOINT_DIR") {
        let id = std::env::var("STALLWATCH_CHECKPOINT_ID").unwrap_or_default();
        write(
            Path::new(&staging),
            "runner.json",
            &format!("{{\"mode\": \"{mode}\", \"checkpoint\": \"{id}\"}}"),
        );
    }
    IGNORE_BREAK.store(
        matches!(mode.as_str(), "ignore-break" | "escape" | "child"),
        Ordering::SeqCst,
    );
    // SAFETY: registers a handler function with the right signature for the process.
    #[allow(unsafe_code)]
    unsafe {
        SetConsoleCtrlHandler(Some(on_ctrl), 1);
    }
    if mode == "child" {
        // Proof of life the test can read from Linux: one byte appended every 200 ms.
        loop {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("child.alive"))
            {
                let _ = f.write_all(b".");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    if mode == "escape" {
        spawn_child(&dir);
    }
    if mode == "exit" {
        // A runner that ends by itself, cleanly, soon after it started.
        std::thread::sleep(Duration::from_millis(
            std::env::var("EXIT_AFTER_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(800),
        ));
        eprintln!("windows-runner exit: exiting");
        std::process::exit(0);
    }
    let stall_after = match mode.as_str() {
        "healthy" => None,
        _ => Some(Duration::from_millis(
            std::env::var("STALL_AFTER_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000),
        )),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pipe = std::env::var("STALLWATCH_HEARTBEAT_SOCKET").unwrap_or_default();
    let started = Instant::now();
    let stalled = Arc::new(move || stall_after.is_some_and(|d| started.elapsed() >= d));
    if !pipe.is_empty() {
        let s = stalled.clone();
        rt.spawn(async move { serve(pipe, s).await });
    }
    eprintln!("windows-runner {mode} started, pid {}", std::process::id());
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if BREAK_SEEN.swap(false, Ordering::SeqCst) {
            write(&dir, "break", &mode);
            eprintln!("windows-runner {mode}: CTRL_BREAK received");
            if !IGNORE_BREAK.load(Ordering::SeqCst) {
                std::process::exit(0);
            }
        }
    }
}

async fn serve(path: String, stalled: Arc<dyn Fn() -> bool + Send + Sync>) {
    let mut server = match ServerOptions::new().first_pipe_instance(true).create(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("windows-runner: cannot create pipe {path}: {e}");
            return;
        }
    };
    loop {
        if server.connect().await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let Ok(next) = ServerOptions::new().create(&path) else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let mut conn = std::mem::replace(&mut server, next);
        let stalled = stalled.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut n = 0;
            while n < buf.len() {
                match conn.read(&mut buf[n..]).await {
                    Ok(0) | Err(_) => return,
                    Ok(k) => n += k,
                }
                if buf[..n].contains(&b'\n') {
                    break;
                }
            }
            if &buf[..n] != b"PING\n" {
                return;
            }
            if stalled() {
                // Stuck: hold the connection and never answer.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
            let _ = conn.write_all(b"PONG\n").await;
            let _ = conn.flush().await;
        });
    }
}

fn spawn_child(dir: &Path) {
    use std::os::windows::process::CommandExt;
    use windows_sys::Win32::System::Threading::{
        CREATE_BREAKAWAY_FROM_JOB, CREATE_NEW_PROCESS_GROUP, DETACHED_PROCESS,
    };
    let exe = std::env::current_exe().unwrap();
    let flags = DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("child").arg(dir);
    // Try to break away from the job first (refused unless the job allows it).
    let child = cmd
        .creation_flags(flags | CREATE_BREAKAWAY_FROM_JOB)
        .spawn()
        .or_else(|_| {
            std::process::Command::new(&exe)
                .arg("child")
                .arg(dir)
                .creation_flags(flags)
                .spawn()
        });
    match child {
        Ok(c) => write(dir, "child.pid", &c.id().to_string()),
        Err(e) => eprintln!("windows-runner: cannot start the child: {e}"),
    }
}
