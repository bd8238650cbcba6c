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
    let mut sse = SseLines::default();
    while let Ok(Some(chunk)) = resp.chunk().await {
        for data in sse.push(&chunk) {
            if let Ok(v) = serde_json::from_str::<Value>(&data) {
                if tx.send(Ok(v)).is_err() {
                    return;
                }
            }
        }
    }
}

/// Server-sent events read line by line (the WHATWG HTML "Server-sent events" stream
/// format, `event:` and `data:` fields only): gives the data of each event but `board`.
#[derive(Default)]
struct SseLines {
    /// Bytes after the last line end.
    partial: Vec<u8>,
    event: String,
    data: String,
}

impl SseLines {
    /// Takes the next bytes of the stream; returns the data of the events they complete.
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.partial.extend_from_slice(bytes);
        let mut done = Vec::new();
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.partial.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line);
            if line.is_empty() {
                if self.event != "board" && !self.data.is_empty() {
                    done.push(std::mem::take(&mut self.data));
                }
                self.event.clear();
                self.data.clear();
            } else if let Some(v) = line.strip_prefix("event:") {
                self.event = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        done
    }
}

/// The last `n` lines of a file.
pub(super) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::SseLines;

    #[test]
    fn sse_events_are_given_whole_across_chunks_without_board_events() {
        let mut sse = SseLines::default();
        assert!(sse.push(b"event: incident\r\ndata: {\"a\":").is_empty());
        assert!(sse.push(b"1}\r\n").is_empty());
        assert_eq!(sse.push(b"\r\n"), vec!["{\"a\":1}".to_string()]);
        // A board snapshot is skipped; two data lines join with a newline.
        let got = sse.push(b"event: board\ndata: {}\n\ndata: [1,\ndata:2]\n\n");
        assert_eq!(got, vec!["[1,\n2]".to_string()]);
        // A comment (keep-alive) line and an event with no data give nothing.
        assert!(sse.push(b": ping\n\nevent: incident\n\n").is_empty());
    }
}
