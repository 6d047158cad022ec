#!/usr/bin/env bash
# The GPU kit's device run, on a GPU machine whose python3 has torch 2.11.0
# (CUDA 13) and no vLLM. From the checkout's root, with the kit carried:
#
#   bash .gpu-kit/device.sh [run.py's options]
#
# It unpacks the kit's vLLM and packages to $GPU_KIT_WORK (default
# /tmp/gpu-kit; kept while the machine stays warm, so a second call skips it),
# installs this project's wheel there, restores a Triton cache the kit carries
# (.gpu-kit/triton-cache.tar.xz, from an earlier run's $OUT), runs run.py, and
# packs the Triton cache into $OUT when it fits the 16 MiB a returned file may
# have. Exit statuses: run.py's (0 passed, 1 a check failed, 3 not judged);
# 4 this machine lacks what the kit needs (python3 with torch 2.11.0, a GPU).
set -u
KIT=$(cd "$(dirname "$0")" && pwd)
WORK=${GPU_KIT_WORK:-/tmp/gpu-kit}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$WORK" "$OUT"
exec > >(tee "$OUT/run-output.txt") 2>&1

say() { echo "device.sh: $*"; }
if ! python3 -c 'import sys, torch; sys.exit(not (torch.__version__.startswith("2.11.0") and torch.cuda.is_available()))'; then
    say "this machine's python3 lacks torch 2.11.0 with a visible GPU; the kit's vLLM needs both"
    exit 4
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

if ! cmp -s "$KIT/manifest.json" "$WORK/manifest.json"; then
    rm -rf "$WORK/site" && mkdir -p "$WORK/site"
    started=$SECONDS
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
        "$KIT/site.tar.xz" "$WORK/site" || { say "the kit's archive did not unpack"; exit 4; }
    cp "$KIT/manifest.json" "$WORK/manifest.json"
    say "unpacked the kit in $((SECONDS - started)) s"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$WORK/site" \
    "$KIT"/vllm_graphsafe-*.whl || { say "this project's wheel did not install"; exit 4; }
if [ -f "$KIT/triton-cache.tar.xz" ] && [ ! -d "$WORK/triton-cache" ]; then
    if python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
        "$KIT/triton-cache.tar.xz" "$WORK/triton-cache"; then
        say "restored the carried Triton cache"
    else
        rm -rf "$WORK/triton-cache"
        say "the carried Triton cache did not unpack: Triton compiles afresh"
    fi
fi

# The checkout too: the step recorder and the tiny model are tests/support's.
export PYTHONPATH="$WORK/site:$PWD"
python3 "$KIT/run.py" --work "$WORK" --out "$OUT" "$@"
status=$?

cache="$OUT/triton-cache.tar.xz"
if [ -d "$WORK/triton-cache" ] && command -v xz >/dev/null; then
    if ! (set -o pipefail; timeout 40 tar -C "$WORK/triton-cache" -cf - . | xz -T0 -6 > "$cache") \
        || [ "$(stat -c %s "$cache")" -gt $((16 << 20)) ]; then
        rm -f "$cache"
        say "the Triton cache was not returned (over 16 MiB compressed, or not packed in 40 s)"
    fi
fi
exit $status
