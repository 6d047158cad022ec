#!/usr/bin/env bash
# Create a Python venv holding the CUDA build of vLLM (PyPI "vllm") at an
# exact version, plus wrapt and pytest, for binding/import tests on a
# CPU-only machine. No GPU and no special environment are needed: the CUDA
# wheels import vllm.v1.worker.gpu_model_runner, vllm.v1.worker.gpu.* and the
# spec-decode speculators on CPU (current_platform is UnspecifiedPlatform).
#
# usage: install-cuda-venv.sh VERSION DEST
#   VERSION  vllm version, e.g. 0.22.1 (torch 2.11.0) or 0.33.0 (torch 2.14.0)
#   DEST     venv directory (e.g. .venvs/cuda-0.22.1); ~9 GB on disk
#
# Idempotent: if DEST's python already imports vllm at VERSION (and wrapt,
# pytest), nothing is done. An existing venv at another version is
# re-pointed in place with pip.
#
# Environment:
#   PIP_CACHE_DIR  honoured when set (passed through to pip). NOTE: on this
#                  workplace PyPI's file responses carry no Cache-Control/ETag
#                  headers, so pip's HTTP cache stores nothing and a rerun
#                  downloads everything again. Use WHEELHOUSE for real reuse.
#   WHEELHOUSE     optional persistent folder: wheels are first fetched there
#                  with `pip download` (files already present are not fetched
#                  again), then installed from it with --no-index.
#   PYTHON         interpreter used to create the venv (default python3.11).
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 VERSION DEST" >&2
    exit 2
fi
VERSION=$1
DEST=$2
PYTHON=${PYTHON:-python3.11}

log() { echo "[install-cuda-venv] $*" >&2; }

check_venv() {
    # Succeeds iff DEST's python imports vllm at exactly VERSION, plus wrapt
    # and pytest; with "full", also the runner modules the patches bind to
    # (about 15 s more).
    [[ -x "$DEST/bin/python" ]] || return 1
    "$DEST/bin/python" -c '
import importlib, sys
import vllm
want, full = sys.argv[1], sys.argv[2] == "full"
assert vllm.__version__ == want, (vllm.__version__, want)
import wrapt, pytest  # noqa: F401
if full:
    importlib.import_module("vllm.v1.worker.gpu_model_runner")
    importlib.import_module("vllm.v1.worker.gpu.model_runner")
' "$VERSION" "${1:-}" >/dev/null 2>&1
}

if check_venv; then
    log "$DEST already has vllm==$VERSION; skipping"
    exit 0
fi

start=$(date +%s)
if [[ ! -x "$DEST/bin/python" ]]; then
    log "creating venv $DEST with $PYTHON"
    mkdir -p "$(dirname "$DEST")"
    "$PYTHON" -m venv "$DEST"
fi

PIP=("$DEST/bin/python" -m pip)
if [[ -n "${PIP_CACHE_DIR:-}" ]]; then
    mkdir -p "$PIP_CACHE_DIR"
    log "using PIP_CACHE_DIR=$PIP_CACHE_DIR"
fi

PKGS=("vllm==$VERSION" wrapt pytest)
if [[ -n "${WHEELHOUSE:-}" ]]; then
    mkdir -p "$WHEELHOUSE"
    log "pip download ${PKGS[*]} into WHEELHOUSE=$WHEELHOUSE"
    "${PIP[@]}" download --progress-bar off -d "$WHEELHOUSE" "${PKGS[@]}"
    log "pip install ${PKGS[*]} from $WHEELHOUSE (offline)"
    "${PIP[@]}" install --progress-bar off --no-index --find-links "$WHEELHOUSE" \
        "${PKGS[@]}"
else
    log "pip install ${PKGS[*]} (several GB; about 5-7 minutes)"
    "${PIP[@]}" install --progress-bar off "${PKGS[@]}"
fi

# torchvision/torchaudio built for another torch can break `import vllm`;
# the runner modules do not need them. (With 0.22.1 and 0.33.0 they import
# fine, so this normally does nothing.)
if ! "$DEST/bin/python" -c "import vllm" >/dev/null 2>&1; then
    for pkg in torchvision torchaudio; do
        if "${PIP[@]}" show "$pkg" >/dev/null 2>&1; then
            log "import vllm fails; uninstalling $pkg"
            "${PIP[@]}" uninstall -y "$pkg"
        fi
    done
fi

if ! check_venv full; then
    log "ERROR: $DEST does not import vllm==$VERSION and its runner modules"
    "$DEST/bin/python" -c "import vllm, vllm.v1.worker.gpu_model_runner; print(vllm.__version__)" || true
    exit 1
fi
log "done: vllm==$VERSION in $DEST in $(($(date +%s) - start))s"
