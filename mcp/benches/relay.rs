//! Relay overhead of `stallwatch mcp wrap`: request/response round trips and pipelined
//! messages per second, straight to a trivial stdio JSON-RPC server vs through the wrapper
//! (no sidecar: relay, parsing and bookkeeping; spans are not exported).
//!
//! Run: `cargo build -p stallwatch && cargo bench -p stallwatch-mcp --bench relay`. The
//! wrapper binary is `STALLWATCH_BIN`, else `<target dir>/{release,debug}/stallwatch`. The
//! server is this bench binary itself with `RELAY_BENCH_SERVER=1` (answers every request
//! with `{"result":{}}`).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROUND_TRIPS: usize = 2000;
const PIPELINED: usize = 20000;

fn serve() {
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout());
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let v: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => continue,
        };
        if let Some(id) = v.get("id") {
            if v.get("method").is_some() {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({"jsonrpc":"2.0","id":id,"result":{}})
                )
                .unwrap();
                out.flush().unwrap();
            }
        }
    }
}

fn wrapper_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("STALLWATCH_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    for profile in ["release", "debug"] {
        let p = target.join(profile).join("stallwatch");
        if p.exists() {
            return p;
        }
    }
    panic!("no stallwatch binary: run `cargo build -p stallwatch` or set STALLWATCH_BIN");
}

struct Measure {
    p50: Duration,
    p99: Duration,
    per_s: f64,
}

fn measure(mut cmd: Command) -> Measure {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut rtts = Vec::with_capacity(ROUND_TRIPS);
    for i in 0..ROUND_TRIPS {
        let t = Instant::now();
        writeln!(stdin, r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"echo","arguments":{{}}}}}}"#).unwrap();
        stdin.flush().unwrap();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        rtts.push(t.elapsed());
    }
    rtts.sort();
    // Pipelined: a writer thread floods requests while this thread reads the answers.
    let t = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut w = std::io::BufWriter::new(stdin);
        for i in 0..PIPELINED {
            writeln!(
                w,
                r#"{{"jsonrpc":"2.0","id":{},"method":"tools/list"}}"#,
                i + ROUND_TRIPS
            )
            .unwrap();
        }
        w.flush().unwrap();
        w
    });
    for _ in 0..PIPELINED {
        line.clear();
        stdout.read_line(&mut line).unwrap();
    }
    let per_s = PIPELINED as f64 / t.elapsed().as_secs_f64();
    drop(writer.join().unwrap());
    let _ = child.wait();
    Measure {
        p50: rtts[rtts.len() / 2],
        p99: rtts[rtts.len() * 99 / 100],
        per_s,
    }
}

fn main() {
    if std::env::var_os("RELAY_BENCH_SERVER").is_some() {
        serve();
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let direct = {
        let mut c = Command::new(&me);
        c.env("RELAY_BENCH_SERVER", "1");
        measure(c)
    };
    let no_sidecar = tempfile::tempdir().unwrap();
    let wrapped = {
        let mut c = Command::new(wrapper_bin());
        c.args(["mcp", "wrap", "--runner-id", "relay-bench", "--data-dir"])
            .arg(no_sidecar.path())
            .arg("--")
            .arg(&me)
            .env("RELAY_BENCH_SERVER", "1");
        measure(c)
    };
    println!("relay bench: {ROUND_TRIPS} round trips, {PIPELINED} pipelined requests");
    println!(
        "direct : p50 {:>8.1} us  p99 {:>8.1} us  {:>9.0} msg/s",
        direct.p50.as_secs_f64() * 1e6,
        direct.p99.as_secs_f64() * 1e6,
        direct.per_s
    );
    println!(
        "wrapped: p50 {:>8.1} us  p99 {:>8.1} us  {:>9.0} msg/s",
        wrapped.p50.as_secs_f64() * 1e6,
        wrapped.p99.as_secs_f64() * 1e6,
        wrapped.per_s
    );
    println!(
        "added  : p50 {:>8.1} us  p99 {:>8.1} us",
        (wrapped.p50.as_secs_f64() - direct.p50.as_secs_f64()) * 1e6,
        (wrapped.p99.as_secs_f64() - direct.p99.as_secs_f64()) * 1e6
    );
}
