//! Heartbeat failures against real sockets: each is a distinct, named failure.

use std::time::Duration;

use stallwatch_watchdog::heartbeat::{ping, HeartbeatFailure};

use crate::common::*;

const T: Duration = Duration::from_millis(800);

#[tokio::test]
async fn each_failure_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // ok
    let sock = dir.path().join("ok.sock");
    let _ok = PyRunner::start(&sock, "pong");
    let rtt = ping(&sock, T).await.expect("PONG");
    assert!(rtt < T);
    // socket_missing
    let e = ping(&dir.path().join("nobody.sock"), T).await.unwrap_err();
    assert_eq!(e, HeartbeatFailure::SocketMissing);
    // connection_refused: a stale socket file left by a runner that died
    let stale = dir.path().join("stale.sock");
    let mut dead = PyRunner::start(&stale, "pong");
    dead.kill();
    assert!(stale.exists(), "the stale socket file stays behind");
    assert_eq!(
        ping(&stale, T).await.unwrap_err(),
        HeartbeatFailure::ConnectionRefused
    );
    // bad_answer
    let bad = dir.path().join("bad.sock");
    let _bad = PyRunner::start(&bad, "garbage");
    assert_eq!(
        ping(&bad, T).await.unwrap_err(),
        HeartbeatFailure::BadAnswer("PANG".into())
    );
    // timeout
    let silent = dir.path().join("silent.sock");
    let _silent = PyRunner::start(&silent, "silent");
    assert_eq!(
        ping(&silent, T).await.unwrap_err(),
        HeartbeatFailure::Timeout
    );
}

/// (f) C29 / s_long_socket_path: a 120-byte path is a named failure saying why, computed
/// before any bind or connect, and the runner shows it on the board.
#[tokio::test]
async fn socket_path_over_107_bytes_is_path_too_long() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d".repeat(60)).join("e".repeat(20));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("runner-0001.sock");
    assert!(sock.as_os_str().len() > 107);
    let e = ping(&sock, T).await.unwrap_err();
    assert_eq!(e.as_str(), "path_too_long");
    let msg = e.to_string();
    assert!(
        msg.contains("107 bytes") && msg.contains(&sock.as_os_str().len().to_string()),
        "{msg}"
    );

    let mut rig = Rig::start(fast_config()).await;
    rig.register("long", Some(std::process::id()), Some(&sock), false)
        .await;
    let mut board = rig.handle.board();
    let status = wait_for("board line of runner long", Duration::from_secs(10), || {
        let b = board.borrow_and_update().clone();
        async move { b.get("long").cloned() }
    })
    .await;
    assert_eq!(status.heartbeat, "path_too_long");
    // past the start-up grace nothing trips: the heartbeat counts as not configured
    assert!(rig.next_trip(Duration::from_millis(3500)).await.is_none());
    let status = rig.handle.board().borrow().get("long").cloned().unwrap();
    assert_eq!(status.verdict, "healthy");
    rig.stop().await;
}
