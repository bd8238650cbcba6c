//! The `stallwatch` binary: CLI, config merge, wiring of stages, ordered shutdown. No
//! domain logic lives here; see ARCHITECTURE.md for the map.

#[cfg(windows)]
mod acl;
mod cli;
mod config;
mod datadir;
mod demo;
mod logfilter;
#[cfg(unix)]
mod parent;
#[cfg(windows)]
#[path = "parent_windows.rs"]
mod parent;
mod residency;
mod selftrace;
mod serve;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc as the global allocator (feature `mimalloc`, default): decoding OTLP allocates
/// many small strings and vectors per span, and prost decoding ran ~1.8× faster with it
/// than with glibc malloc on the same machine (issue 16).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    unset_empty_stallwatch_variables();
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            let note = cli::value_from_env(&e)
                .map(|var| format!("note: that value came from the environment variable {var}"));
            if json_logs_asked() {
                // a usage error while JSON logs were asked for: one JSON line, as a fatal
                // error of `serve` is (help and version stay plain, on stdout)
                serve::init_json_fallback();
                let mut text = e.render().to_string().trim_end().to_string();
                if let Some(note) = note {
                    text = format!("{text}\n{note}");
                }
                tracing::error!("stallwatch: {text}");
            } else {
                // what `e.exit()` prints, then the note
                let _ = e.print();
                if let Some(note) = note {
                    eprintln!("{note}");
                }
            }
            return ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        cli::Command::Serve(args) => serve::run(args),
        cli::Command::Demo(args) => demo::run(args),
        cli::Command::Mcp(cli::McpCommand::Wrap(args)) => return mcp_wrap(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Print the whole context chain once (as a JSON log line when JSON logs were
            // asked for), then map to an exit code.
            if !serve::report_fatal(&err) {
                eprintln!("stallwatch: error: {}", error_chain(&err));
            }
            ExitCode::from(1)
        }
    }
}

/// An empty `STALLWATCH_*` variable counts as unset, as an empty `RUST_LOG` does: clap took
/// `STALLWATCH_DATA_DIR=` for a `--data-dir` given without a value, and its error named a
/// flag the user never passed. Runs first, while the process has one thread.
fn unset_empty_stallwatch_variables() {
    let empty: Vec<std::ffi::OsString> = std::env::vars_os()
        .filter(|(k, v)| v.is_empty() && k.to_string_lossy().starts_with("STALLWATCH_"))
        .map(|(k, _)| k)
        .collect();
    for k in empty {
        std::env::remove_var(k);
    }
}

/// `stallwatch mcp wrap`: runs the relay and leaves with the server's exit code (after
/// giving up on a server that kept failing, with its last one).
fn mcp_wrap(args: cli::McpWrapArgs) -> ExitCode {
    let run = || -> anyhow::Result<i32> {
        let mut cfg = stallwatch_mcp::WrapConfig::new(args.server, args.runner_id, args.data_dir)?;
        cfg.initialize_timeout = std::time::Duration::from_millis(args.initialize_timeout_ms);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let result = rt.block_on(stallwatch_mcp::wrap(cfg));
        // Not a plain drop: that waits for the blocking read of stdin, so after a signal or
        // giving up the wrapper lingered (its stdout open, the host seeing no EOF) until
        // the client wrote a line or closed its end.
        rt.shutdown_background();
        match result {
            Err(e @ stallwatch_mcp::Error::GaveUp { code, .. }) => {
                eprintln!("stallwatch mcp: error: {e}");
                Ok(code)
            }
            other => Ok(other?),
        }
    };
    match run() {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(err) => {
            eprintln!("stallwatch mcp: error: {}", error_chain(&err));
            ExitCode::from(1)
        }
    }
}

/// True when the command line or `STALLWATCH_LOG_FORMAT` asks for JSON logs, read without
/// clap (for clap's own errors): `--log-format json`, `--log-format=json`.
fn json_logs_asked() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let flag = args
        .windows(2)
        .any(|w| w[0] == "--log-format" && w[1] == "json")
        || args.iter().any(|a| a == "--log-format=json");
    flag || std::env::var("STALLWATCH_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"))
}

/// `err` and its causes joined by `: ` (as `{:#}` prints them), leaving out a cause whose
/// text already ends the line: many errors name their source in their own message too
/// (`cannot bind ... on 127.0.0.1:4318: Address already in use`), which `{:#}` printed
/// twice.
pub(crate) fn error_chain(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use");
        #[derive(Debug)]
        struct Bind {
            source: std::io::Error,
        }
        impl std::fmt::Display for Bind {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "cannot bind on 127.0.0.1:1: {}", self.source)
            }
        }
        impl std::error::Error for Bind {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.source)
            }
        }
        let err = anyhow::Error::new(Bind { source: io }).context("cannot bind the listeners");
        assert_eq!(
            super::error_chain(&err),
            "cannot bind the listeners: cannot bind on 127.0.0.1:1: Address already in use"
        );
        let err = anyhow::anyhow!("inner").context("outer");
        assert_eq!(super::error_chain(&err), "outer: inner");
    }
}
