#!/usr/bin/env bash
# Create/refresh the venv, install the kit (editable, with test extras), type-check it with
# `mypy --strict` and run its tests; then the same tests against the OLDEST OpenTelemetry
# SDK the kit declares (opentelemetry-* 1.30.0, constraints-oldest.txt) in a second venv.
# Venv: $STALLWATCH_VENV, default <repo>/.venv; oldest: $STALLWATCH_VENV_OLDEST, default
# integrations/python/.venv-otel-oldest. STALLWATCH_OTEL_MATRIX=newest skips the oldest run.
# Exits non-zero on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${STALLWATCH_VENV:-$ROOT/.venv}"
OLDEST="${STALLWATCH_VENV_OLDEST:-$HERE/.venv-otel-oldest}"

install() { # venv constraints
  if [ ! -x "$1/bin/python" ]; then
    python3 -m venv "$1"
  fi
  "$1/bin/python" -m pip install -q --disable-pip-version-check -c "$2" -e "$HERE[test]"
}

install "$VENV" "$HERE/constraints.txt"
cd "$HERE"
"$VENV/bin/python" -m mypy --strict src/stallwatch_runner
echo "== OpenTelemetry SDK $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("opentelemetry-sdk"))') (newest tested)"
STALLWATCH_TEST_PYTHON="$VENV/bin/python" "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests "$@"

if [ "${STALLWATCH_OTEL_MATRIX:-all}" != newest ]; then
  install "$OLDEST" "$HERE/constraints-oldest.txt"
  "$OLDEST/bin/python" -m mypy --strict src/stallwatch_runner
  echo "== OpenTelemetry SDK $("$OLDEST/bin/python" -c 'from importlib.metadata import version; print(version("opentelemetry-sdk"))') (oldest declared)"
  STALLWATCH_TEST_PYTHON="$OLDEST/bin/python" "$OLDEST/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
fi
