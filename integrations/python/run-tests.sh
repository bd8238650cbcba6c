#!/usr/bin/env bash
# Create/refresh the venv, install the kit (editable, with test extras) and run its tests.
# Venv: $STALLWATCH_VENV, default <repo>/.venv. Exits non-zero on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${STALLWATCH_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$HERE/constraints.txt" -e "$HERE[test]"
cd "$HERE"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
