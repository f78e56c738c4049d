#!/usr/bin/env bash
# Make .venv with the program's dependencies and the tests' tools (requirements-test.txt). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r requirements-test.txt
