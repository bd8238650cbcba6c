//! The `stallwatch` command line: version, config errors, one instance per data folder,
//! schema versions.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

#[test]
fn version_flag_prints_the_version() {
    let out = Command::new(bin()).arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim(),
        format!("stallwatch {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn unknown_config_key_is_refused_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[otlp]\nmax_requst_bytes = 10\n").unwrap();
    let out = Command::new(bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("d"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_requst_bytes"), "{err}");
}

/// A listen address that is a host name is refused naming the flag and saying why (an
/// address is bound, not resolved); from the environment as well; an IP address starts.
#[test]
fn a_host_name_as_listen_address_is_refused_saying_an_ip_is_needed() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, env) in [
        ("--otlp-grpc-listen", None),
        ("--dashboard-listen", Some("STALLWATCH_DASHBOARD_LISTEN")),
    ] {
        let mut cmd = Command::new(bin());
        cmd.args(["serve", "--data-dir"]).arg(dir.path().join("d"));
        match env {
            Some(var) => cmd.env(var, "localhost:0"),
            None => cmd.args([flag, "localhost:0"]),
        };
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains("IP:PORT"), "{err}");
        assert!(err.contains("host name"), "{err}");
        // a value from the environment says so (clap names only the flag)
        let from_env = err.contains("came from the environment variable");
        assert_eq!(from_env, env.is_some(), "{err}");
        if let Some(var) = env {
            assert!(err.contains(var), "{err}");
        }
    }
    assert!(
        !dir.path().join("d").exists(),
        "refused before anything is made"
    );
    // the same words from the config file, for each listener's key
    for (section, key) in [
        ("otlp", "grpc_listen"),
        ("otlp", "http_listen"),
        ("dashboard", "listen"),
    ] {
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, format!("[{section}]\n{key} = \"localhost:1\"\n")).unwrap();
        let out = Command::new(bin())
            .args(["serve", "--config"])
            .arg(&cfg)
            .arg("--data-dir")
            .arg(dir.path().join("d"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(key) && err.contains("IP:PORT") && err.contains("host name"),
            "{key}: {err}"
        );
    }
}

/// A value that parses but is out of range is refused like a parse error: named, and
/// before the data folder, its database, token and reserve are created (they were made
/// first). A valid file starts and creates them.
#[test]
fn an_out_of_range_value_is_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (toml, named)) in [
        ("[watchdog]\nheartbeat_interval_ms = 0\n", "heartbeat_interval_ms"),
        ("[dashboard]\nmax_connections = 0\n", "max_connections"),
        ("[[alerts.webhook]]\nurl = \"ftp://x\"\nsecret = \"0123456789abcdef0123456789abcdef\"\n", "url"),
        ("[[watchdog.sla_rule]]\ntool = \"[\"\nsla_ms = 5\n", "["),
    ]
    .into_iter()
    .enumerate()
    {
        let cfg = dir.path().join(format!("c{i}.toml"));
        std::fs::write(&cfg, toml).unwrap();
        let data = dir.path().join(format!("d{i}"));
        let out = Command::new(bin())
            .args(["serve", "--config"])
            .arg(&cfg)
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{toml}: {err}");
        assert!(err.contains(named), "{toml}: {err}");
        assert!(!data.exists(), "{toml}: the data folder was created: {err}");
    }
}

/// With `--log-format json` every stderr line is JSON, the fatal error too: a bad config
/// (before logging starts) and a port in use (after it started). Text logs keep the plain
/// `stallwatch: error:` line.
#[test]
fn with_json_logs_a_fatal_error_is_a_json_line_too() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[otlp]\nmax_requst_bytes = 10\n").unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().map(|a| (a, taken)).unwrap();
    let runs: [(&str, Vec<String>); 2] = [
        (
            "max_requst_bytes",
            vec!["--config".into(), cfg.display().to_string()],
        ),
        (
            "cannot bind",
            vec!["--otlp-http-listen".into(), taken.0.to_string()],
        ),
    ];
    for (i, (names, extra)) in runs.iter().enumerate() {
        let out = Command::new(bin())
            .args(["serve", "--log-format", "json", "--data-dir"])
            .arg(dir.path().join(format!("d{i}")))
            .args([
                "--otlp-grpc-listen",
                "127.0.0.1:0",
                "--dashboard-listen",
                "127.0.0.1:0",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<serde_json::Value> = err
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        // the fatal line, not the first ERROR: a disk that is nearly full when the test
        // runs adds an ERROR line of its own ("the disk is full at start") before it
        let fatal = lines
            .iter()
            .find(|l| {
                l["level"] == "ERROR"
                    && l["fields"]["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("stallwatch: error: "))
            })
            .unwrap_or_else(|| panic!("no fatal ERROR line: {err}"));
        let message = fatal["fields"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{message}");
    }
    // a usage error (clap's) while JSON logs were asked for: JSON too, exit code 2
    for env in [None, Some("json")] {
        let mut cmd = Command::new(bin());
        cmd.args(["serve", "--bogus-flag"]);
        match env {
            Some(v) => cmd.env("STALLWATCH_LOG_FORMAT", v),
            None => cmd.args(["--log-format", "json"]),
        };
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        let line: serde_json::Value = serde_json::from_str(err.trim())
            .unwrap_or_else(|e| panic!("not one JSON line ({e}): {err}"));
        assert_eq!(line["level"], "ERROR");
        let message = line["fields"]["message"].as_str().unwrap();
        assert!(message.contains("--bogus-flag"), "{message}");
    }
    // text logs: the plain line as before
    let out = Command::new(bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("d9"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("stallwatch: error: "), "{err}");
    drop(taken);
}

#[test]
fn a_second_instance_on_the_same_data_dir_names_the_holder_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = Server::start(&data);
    let out = Command::new(bin())
        .arg("serve")
        .arg("--data-dir")
        .arg(&data)
        .args([
            "--otlp-grpc-listen",
            "127.0.0.1:0",
            "--otlp-http-listen",
            "127.0.0.1:0",
        ])
        .args(["--dashboard-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("pid {}", first.child.id())), "{err}");
    // A crashed instance's lock is taken over.
    first.crash();
    let second = Server::start(&data);
    assert_eq!(second.stop(), Some(0));
}

#[test]
fn cli_flags_win_over_env_and_toml() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[otlp]\nhttp_listen = \"127.0.0.1:1\"\n").unwrap();
    // TOML says port 1, env says port 2, the CLI flag (port 0 in Server) wins over both.
    let server = Server::start_with(ServerOpts {
        data_dir: data,
        config: Some("[otlp]\ngrpc_listen = \"127.0.0.1:1\"\n".into()),
        env: vec![("STALLWATCH_OTLP_GRPC_LISTEN".into(), "127.0.0.1:2".into())],
    });
    assert_ne!(server.grpc.port(), 1);
    assert_ne!(server.grpc.port(), 2);
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn a_database_from_a_newer_stallwatch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    assert_eq!(server.stop(), Some(0));
    let conn = rusqlite::Connection::open(data.join("stallwatch.db")).unwrap();
    conn.pragma_update(None, "user_version", 999).unwrap();
    drop(conn);
    let out = Command::new(bin())
        .arg("serve")
        .arg("--data-dir")
        .arg(&data)
        .args([
            "--otlp-grpc-listen",
            "127.0.0.1:0",
            "--otlp-http-listen",
            "127.0.0.1:0",
        ])
        .args(["--dashboard-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("newer"), "{err}");
}

#[test]
fn env_wins_over_toml_when_no_flag_is_given() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    // TOML asks for port 1 (root could bind it); the environment asks for any free port.
    std::fs::write(&cfg, "[otlp]\ngrpc_listen = \"127.0.0.1:1\"\n").unwrap();
    let mut child = Command::new(bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("d"))
        .args([
            "--otlp-http-listen",
            "127.0.0.1:0",
            "--dashboard-listen",
            "127.0.0.1:0",
        ])
        .env("STALLWATCH_OTLP_GRPC_LISTEN", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert!(child.wait().unwrap().success());
    let ready: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    let grpc: std::net::SocketAddr = ready["otlp_grpc"].as_str().unwrap().parse().unwrap();
    assert_ne!(grpc.port(), 1, "TOML won over the environment");
}

#[test]
fn an_invalid_rust_log_is_reported_in_the_log_format_and_the_default_filter_used() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = ServerOpts::new(&dir.path().join("data"));
    opts.env = vec![("RUST_LOG".into(), "debug,foo[".into())];
    let server = Server::start_with(opts);
    // stderr is read by a thread: what start-up logged may still be on its way
    wait_until!(
        Duration::from_secs(10),
        "an INFO line on stderr",
        server.stderr().contains(" INFO ")
    );
    let err = server.stderr();
    let line = err
        .lines()
        .find(|l| l.contains("RUST_LOG is not a valid filter"))
        .unwrap_or_else(|| panic!("no warning naming RUST_LOG:\n{err}"));
    assert!(
        line.contains("WARN") && line.contains("debug,foo["),
        "{line}"
    );
    // the default filter (info): info lines, no debug ones
    assert!(err.contains(" INFO "), "{err}");
    assert!(!err.contains(" DEBUG "), "{err}");
    assert_eq!(server.stop(), Some(0));

    // a valid filter is used as written: its debug events appear
    let mut opts = ServerOpts::new(&dir.path().join("data2"));
    opts.env = vec![("RUST_LOG".into(), "warn,stallwatch=debug".into())];
    let server = Server::start_with(opts);
    wait_until!(
        Duration::from_secs(10),
        "a DEBUG line on stderr",
        server.stderr().contains(" DEBUG ")
    );
    let err = server.stderr();
    assert!(err.contains(" DEBUG "), "{err}");
    assert!(!err.contains("not a valid filter"), "{err}");
    assert_eq!(server.stop(), Some(0));
}

/// A relative `XDG_DATA_HOME` is ignored (XDG Base Directory Specification): the data
/// folder went under whatever folder stallwatch was started from.
#[test]
fn a_relative_xdg_data_home_is_ignored() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let (home, cwd) = (dir.path().join("home"), dir.path().join("cwd"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    let mut child = Command::new(bin())
        .arg("serve")
        .args(["--otlp-grpc-listen", "127.0.0.1:0"])
        .args(["--otlp-http-listen", "127.0.0.1:0"])
        .args(["--dashboard-listen", "127.0.0.1:0"])
        .env_remove("STALLWATCH_DATA_DIR")
        .env("XDG_DATA_HOME", "relative/data")
        .env("HOME", &home)
        .current_dir(&cwd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let ready: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert_eq!(
        ready["data_dir"].as_str(),
        Some(home.join(".local/share/stallwatch").to_str().unwrap()),
        "{ready}"
    );
    assert!(!cwd.join("relative").exists());
}

/// An empty `STALLWATCH_*` variable counts as unset: `STALLWATCH_CONFIG=` was taken for
/// `--config` without a value ("a value is required for '--config'", a flag never passed).
#[test]
fn an_empty_stallwatch_variable_counts_as_unset() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin())
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--otlp-grpc-listen", "127.0.0.1:0"])
        .args(["--otlp-http-listen", "127.0.0.1:0"])
        .args(["--dashboard-listen", "127.0.0.1:0"])
        .env("STALLWATCH_CONFIG", "")
        .env("STALLWATCH_LOG_FORMAT", "")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(
        line.contains("\"event\":\"ready\""),
        "{line:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
