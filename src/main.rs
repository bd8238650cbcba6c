//! The `stallwatch` binary: CLI, config merge, wiring of stages, ordered shutdown. No
//! domain logic lives here; see ARCHITECTURE.md for the map.

mod cli;
mod config;
mod datadir;
mod demo;
mod parent;
mod selftrace;
mod serve;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Serve(args) => serve::run(args),
        cli::Command::Demo(args) => demo::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Print the whole context chain once, then map to an exit code.
            eprintln!("stallwatch: error: {err:#}");
            ExitCode::from(1)
        }
    }
}
