#!/usr/bin/env bash
# Install the locked dependencies (npm ci) and run the node:test suite, including:
#  - test/stallwatch.test.js against the real stallwatch binary: $STALLWATCH_BIN, else
#    $CARGO_TARGET_DIR/debug/stallwatch or <repo>/target/debug/stallwatch (built with
#    `cargo build -p stallwatch` when missing);
#  - test/pack.test.js: `npm pack`, installed from the npm registry into fresh ESM and CJS
#    projects at the newest and oldest OpenTelemetry SDK the kit declares.
# Exits non-zero on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$HERE"
npm ci --no-audit --no-fund --loglevel=error
if [ -z "${STALLWATCH_BIN:-}" ]; then
  STALLWATCH_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/stallwatch"
  if [ ! -x "$STALLWATCH_BIN" ]; then
    (cd "$ROOT" && cargo build -q -p stallwatch --bin stallwatch)
  fi
fi
export STALLWATCH_BIN
exec node --test test/*.test.js
