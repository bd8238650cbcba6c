//! The demo's plumbing: the throw-away workspace and its hashes, the sidecar's ready
//! line and incident stream, and small process helpers.

use super::*;

/// A few files a research workspace holds: a CSV, a notebook, notes.
pub(super) fn make_workspace(ws: &Path) -> Result<()> {
    std::fs::create_dir_all(ws.join("notebooks"))
        .with_context(|| format!("cannot create {}", ws.display()))?;
    let notebook = json!({
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Loss curve\n"]},
            {"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [],
             "source": ["import pandas as pd\n", "df = pd.read_csv('../results.csv')\n", "df.plot(x='step', y='loss')\n"]}
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5
    });
    let files: [(&str, String); 3] = [
        (
            "results.csv",
            "step,loss,accuracy\n1,0.912,0.104\n2,0.655,0.387\n3,0.481,0.562\n".to_string(),
        ),
        ("notebooks/analysis.ipynb", format!("{notebook:#}\n")),
        (
            "notes.md",
            "# Run 14\n\nStable at step 3. Next: longer warm-up.\n".to_string(),
        ),
    ];
    for (rel, body) in files {
        std::fs::write(ws.join(rel), body).with_context(|| format!("cannot write {rel}"))?;
    }
    Ok(())
}

/// SHA-256 (hex) of every file under `root`, keyed by its relative path.
pub(super) fn hash_tree(root: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?
        {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                out.insert(rel, hex::encode(Sha256::digest(&bytes)));
            }
        }
    }
    Ok(out)
}

/// Relative paths added, removed or changed between two hashed trees.
pub(super) fn differing(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> Vec<String> {
    let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| match (before.contains_key(k), after.contains_key(k)) {
            (true, false) => format!("{k} (removed)"),
            (false, true) => format!("{k} (added)"),
            _ => format!("{k} (changed)"),
        })
        .collect()
}

/// Whether `python -c "import MODULE"` works.
pub(super) fn python_has(python: &Path, module: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {module}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Reads `serve`'s JSON ready line (first stdout line) within [`READY_TIMEOUT`].
pub(super) fn read_ready(child: &mut Child) -> Result<Value> {
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout from the sidecar"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    let line = rx
        .recv_timeout(READY_TIMEOUT)
        .map_err(|_| anyhow!("stallwatch serve printed no ready line within {READY_TIMEOUT:?}"))?;
    let ready: Value =
        serde_json::from_str(&line).with_context(|| format!("ready line is not JSON: {line}"))?;
    if ready["event"] != "ready" || ready["dashboard"].as_str().is_none() {
        bail!("unexpected first line from stallwatch serve: {line}");
    }
    Ok(ready)
}

/// Follows `GET /api/v1/events` and sends each incident JSON; an `Err` ends the stream.
/// Runs on its own thread, with its own current-thread runtime.
pub(super) fn read_sse(url: &str, tx: mpsc::Sender<std::result::Result<Value, String>>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = tx.send(Err(format!("cannot start the event reader: {e}")));
            return;
        }
    };
    rt.block_on(follow_sse(url, &tx));
}

async fn follow_sse(url: &str, tx: &mpsc::Sender<std::result::Result<Value, String>>) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        .build();
    let resp = match client {
        Ok(c) => {
            c.get(url)
                .header("accept", "text/event-stream")
                .send()
                .await
        }
        Err(e) => Err(e),
    };
    let mut resp = match resp {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            let _ = tx.send(Err(format!("GET /api/v1/events answered {}", r.status())));
            return;
        }
        Err(e) => {
            let _ = tx.send(Err(format!("GET /api/v1/events failed: {e}")));
            return;
        }
    };
    // the incidents; `board` snapshots and frames the parser refuses are skipped
    let mut sse = stallwatch_client::SseParser::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        for frame in sse.push(&chunk) {
            let Ok(stallwatch_client::Frame::Event(e)) = frame else {
                continue;
            };
            if e.event == "board" {
                continue;
            }
            if let Ok(v) = serde_json::from_str::<Value>(&e.data) {
                if tx.send(Ok(v)).is_err() {
                    return;
                }
            }
        }
    }
}

/// The last `n` lines of a file.
pub(super) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
