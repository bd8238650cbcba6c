//! The `stallwatch` binary: CLI, config merge, wiring of stages, ordered shutdown.

fn main() {
    println!("stallwatch {}", env!("CARGO_PKG_VERSION"));
}
