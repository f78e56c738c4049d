#!/usr/bin/env bash
# Mutation testing of the pure core (mutmut), per module; see bench/mutation_score.py.
# Not part of CI: a module takes minutes to an hour on 2 cores. Usage: scripts/mutation.sh [module...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/mutmut ] || bash scripts/setup.sh
exec .venv/bin/python bench/mutation_score.py "$@"
