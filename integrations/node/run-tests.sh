#!/usr/bin/env bash
# Install the locked dependencies (npm ci) and run the node:test suite.
# Exits non-zero on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"
npm ci --no-audit --no-fund --loglevel=error
exec node --test test/*.test.js
