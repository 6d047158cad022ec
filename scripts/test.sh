#!/usr/bin/env bash
# The whole test suite, from a fresh machine: one virtual environment per vLLM
# release CI tests, pre-commit (ruff, mypy), every test, the negative controls,
# and the benchmarks in quick mode. Exits non-zero on any failure.
#
#   GRAPHSAFE_RELEASES   which rows to run (default: the "ci_releases" of
#                        src/vllm_graphsafe/data/releases.json, the one list)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENVS=${GRAPHSAFE_VENVS:-$ROOT/.venvs}
# The release list and the venv names come from src/vllm_graphsafe/data/releases.json
# (read with the system Python: no venv exists yet).
releases() { PYTHONPATH="$ROOT/src" python3 -m vllm_graphsafe.releases "$@"; }
RELEASES=${GRAPHSAFE_RELEASES:-$(releases ci-releases)}
for release in $RELEASES; do releases venv-name "$release" > /dev/null || exit 2; done
ENGINE_VENV=$VENVS/$(releases venv-name "$(releases engine)")
LIGHT_ENGINE_VENV=$VENVS/$(releases venv-name "$(releases light-engine)")
export VLLM_GRAPHSAFE_CACHE=$ROOT/.cache/models
export VLLM_CACHE_ROOT=$ROOT/.cache/vllm
started=$(date +%s)
stamp() { echo "[test.sh +$(($(date +%s) - started)) s] $*"; }

mkdir -p "$VENVS"
# A CPU build's venv takes ~3.5 GB, a CUDA build's ~9.5 GB. Check the space
# first: a full disk otherwise shows up as a pip OSError deep in a log.
need_gb=2
for release in $RELEASES; do
    name=$(releases venv-name "$release")
    case $name in cpu-*) size=4 ;; *) size=10 ;; esac
    [[ -d "$VENVS/$name" ]] || need_gb=$((need_gb + size))
done
free_gb=$(df -P -BG "$VENVS" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
if (( free_gb < need_gb )); then
    echo "test.sh: only ${free_gb} GB are free under $VENVS and installing the missing vLLM releases needs about ${need_gb} GB; free some space or set GRAPHSAFE_RELEASES to fewer releases." >&2
    exit 1
fi
stamp "installing the tested releases (logs: $VENVS/*.install.log; ${free_gb} GB free, ~${need_gb} GB needed)"
# The CPU builds first: the steps before the tests need them. The CUDA builds
# then install while those steps run (each install keeps one core busy, so the
# two cores have work throughout); the tests wait for every venv.
venvs=()
cpu_builds=()
cuda_builds=()
for release in $RELEASES; do
    name=$(releases venv-name "$release")
    venvs+=("$VENVS/$name")
    case $name in cpu-*) cpu_builds+=("$release") ;; *) cuda_builds+=("$release") ;; esac
done
# Whatever ends this script stops what it started in the background.
background=()
stop_background() {
    for pid in "${background[@]}"; do kill -- "-$pid" 2> /dev/null || kill "$pid" 2> /dev/null || true; done
}
trap stop_background EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
install_in_background() {
    scripts/install-venvs.sh "$VENVS" "$@" &
    installs=$!
    background+=("$installs")
}
installs=
if (( ${#cpu_builds[@]} )); then
    install_in_background "${cpu_builds[@]}"
    wait "$installs" || exit 1
    stamp "installed: ${cpu_builds[*]}"
    installs=
fi
if (( ${#cuda_builds[@]} )); then
    install_in_background "${cuda_builds[@]}"
    stamp "installing ${cuda_builds[*]} in the background"
fi

# The unit tier, as the README tells a newcomer to run it (a fresh virtual
# environment, `pip install '.[test]'`, pytest), on the second core while
# pre-commit and the wheel build use the first; run_suite.py leaves it out.
readme_log=$VENVS/readme-unit-tier.log
stamp "unit tier as the README says (in the background; log: $readme_log)"
scripts/readme_unit_tier.sh > "$readme_log" 2>&1 &
readme_pid=$!
background+=("$readme_pid")

stamp "pre-commit"
# The tools venv: pre-commit, and the ruff that verify_backport.py runs with
# vLLM's rule set over the edited files.
if [[ ! -x "$VENVS/tools/bin/pre-commit" || ! -x "$VENVS/tools/bin/ruff" ]]; then
    [[ -x "$VENVS/tools/bin/pip" ]] || python3.11 -m venv "$VENVS/tools"
    "$VENVS/tools/bin/pip" install -q --progress-bar off pre-commit ruff==0.17.6 2>&1 | grep -v "^WARNING: Location" || true
fi
"$VENVS/tools/bin/pre-commit" run --all-files --show-diff-on-failure

stamp "wheel (built from a copy of the commit: committed files only)"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"; stop_background' EXIT
mkdir -p "$scratch/src"
git archive HEAD | tar -x -C "$scratch/src"
"$VENVS/tools/bin/python" -m pip wheel -q --no-deps -w "$scratch/dist" "$scratch/src" 2>&1 | grep -v "^WARNING: Location" || true
"$VENVS/tools/bin/python" - "$scratch"/dist/vllm_graphsafe-*.whl <<'PY'
import sys
import zipfile

names = set(zipfile.ZipFile(sys.argv[1]).namelist())
needed = {"vllm_graphsafe/py.typed", "vllm_graphsafe/data/releases.json"}
entry_points = [n for n in names if n.endswith("entry_points.txt")]
missing = sorted(needed - names) + ([] if entry_points else ["entry_points.txt"])
if missing:
    sys.exit(f"test.sh: the wheel {sys.argv[1]} lacks {', '.join(missing)}")
print(f"wheel {sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files, data and entry points in")
PY

if ! wait "$readme_pid"; then
    tail -n 60 "$readme_log"
    echo "test.sh: the README's unit-tier commands failed in a fresh environment (log: $readme_log)." >&2
    exit 1
fi
stamp "unit tier as the README says: $(grep -E '^=+ .*(passed|failed).* in ' "$readme_log" | tail -n 1)"

stamp "the release-day command on the newest CI release (download included)"
"$ENGINE_VENV/bin/python" - <<'PY'
import json
import subprocess
import sys

sys.path.insert(0, "src")
from vllm_graphsafe.releases import release_key, release_table

row = max((r for r in release_table() if r.ci), key=lambda r: release_key(r.version))
done = subprocess.run(
    [sys.executable, "scripts/release_day.py", row.version, "--distribution", row.distribution, "--json"],
    capture_output=True, text=True, check=False,
)
if done.returncode != 0:
    sys.exit(f"test.sh: scripts/release_day.py {row.version} failed: {done.stderr.strip()}")
judged = json.loads(done.stdout)["patches"]
if judged != row.patches:
    sys.exit(f"test.sh: the release-day row for {row.label} is {judged}, the table's {row.patches}")
print(f"release-day row for {row.label} matches the table: {judged}")
PY

stamp "benchmarks (quick mode, so that they cannot rot)"
"${venvs[0]}/bin/python" bench/run.py --quick --out "$ROOT/.cache/bench-quick"

if [[ -n $installs ]]; then
    stamp "waiting for the installs of ${cuda_builds[*]}"
    wait "$installs" || exit 1
    stamp "installed: ${cuda_builds[*]}"
fi
stamp "tests"
# Two releases at once (two cores): the newest CPU build first, with the full
# engine suite (the longest); the others (the older CPU build with the engine
# tests that show each bug and its fix, the CUDA builds at class level) in
# line, each as soon as a core is free.
ordered=("$ENGINE_VENV")
for venv in "${venvs[@]}"; do [[ $venv == "$ENGINE_VENV" ]] || ordered+=("$venv"); done
[[ " ${venvs[*]} " == *" $ENGINE_VENV "* ]] || ordered=("${venvs[@]}")
python3 scripts/run_suite.py --jobs 2 --unit-tier-ran --light-engine "$LIGHT_ENGINE_VENV" "${ordered[@]}"
