#!/usr/bin/env bash
# Install, build the real tools (cached), then run every test, the engine tier included.
# pytest's exit 5 (nothing collected) is a failure here, like any non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if command -v go >/dev/null 2>&1; then
  bash scripts/tools.sh
elif [ -n "${CI:-}" ]; then
  echo "scripts/test.sh: no Go toolchain: CI must build the real tools (scripts/tools.sh)" >&2
  exit 1
else
  echo "scripts/test.sh: NO GO TOOLCHAIN: the real tools are not built, so the engine tier and the Talos oracle FAIL (install Go 1.26+ and run again)" >&2
fi
exec .venv/bin/python -m pytest "$@"
