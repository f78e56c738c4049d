#!/usr/bin/env bash
# Install, then run every test. pytest's exit 5 (nothing collected) is a failure here, like any non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
