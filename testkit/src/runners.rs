//! Runners through a running [`Server`]'s control API, and waits on what the API says about
//! them (lifecycle, incidents).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::server::{http_client, Server};

/// POST `body` to a control path with the bearer token; answers (status, JSON or null).
pub fn post_json(server: &Server, path: &str, body: &Value) -> (u16, Value) {
    let r = http_client()
        .post(server.api(path))
        .bearer_auth(server.token())
        .json(body)
        .send()
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().unwrap_or(Value::Null))
}

/// Registers a spawned runner `id` running `argv` (optionally in `workspace`, with extra
/// `env`); asserts 200/201 and answers the registration.
pub fn spawn_runner(
    server: &Server,
    id: &str,
    argv: &[&str],
    workspace: Option<&Path>,
    env: &[(&str, &str)],
) -> Value {
    let env: serde_json::Map<String, Value> = env
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    let mut spawn = serde_json::json!({ "argv": argv, "env": env });
    if let Some(w) = workspace {
        spawn["workspace"] = w.display().to_string().into();
    }
    let (st, body) = post_json(
        server,
        "/api/v1/runners",
        &serde_json::json!({ "id": id, "spawn": spawn }),
    );
    assert!(st == 200 || st == 201, "register {id}: {st} {body}");
    body
}

/// `GET /api/v1/runners/{id}`, asserting 200.
pub fn runner(server: &Server, id: &str) -> Value {
    let (st, v) = server.get_json(&format!("/api/v1/runners/{id}"));
    assert_eq!(st, 200, "{v}");
    v
}

/// Waits (polling every 25 ms) until runner `id`'s `lifecycle` is `want`.
pub fn wait_lifecycle(server: &Server, id: &str, want: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let v = runner(server, id);
        if v["lifecycle"] == want {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "runner {id} never became {want}: {v:#}\n{}",
                server.stderr()
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Incidents of `runner`, oldest first.
pub fn incidents(server: &Server, runner: &str) -> Vec<Value> {
    let (st, page) = server.get_json(&format!("/api/v1/incidents?runner_id={runner}&limit=200"));
    assert_eq!(st, 200, "{page}");
    let mut items = page["items"].as_array().unwrap().clone();
    items.reverse();
    items
}

/// Waits for the first incident `event` of `runner`; panics with every incident and the
/// server's stderr after `timeout`.
pub fn wait_incident(server: &Server, runner: &str, event: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(i) = incidents(server, runner)
            .into_iter()
            .find(|i| i["event"] == event)
        {
            return i;
        }
        if Instant::now() > deadline {
            panic!(
                "no {event} incident for {runner} within {timeout:?}; incidents: {:#}\nstderr:\n{}",
                Value::from(incidents(server, runner)),
                server.stderr()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// True while `pid` exists and is not a zombie (`/proc/<pid>/stat` state).
pub fn process_alive(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s[s.rfind(')').unwrap() + 2..].starts_with('Z'),
        Err(_) => false,
    }
}
