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
venvs=()
installing=0
install_failed() { tail -n 30 "$VENVS"/*.install.log; exit 1; }
for release in $RELEASES; do
    dist=${release%%==*}
    version=${release##*==}
    name=$(releases venv-name "$release")
    venvs+=("$VENVS/$name")
    scripts/install-venv.sh "$dist" "$version" "$VENVS/$name" \
        > "$VENVS/$name.install.log" 2>&1 &
    installing=$((installing + 1))
    # Two installs at a time (two cores); the next starts as soon as one ends.
    if (( installing == 2 )); then
        wait -n || install_failed
        installing=$((installing - 1))
    fi
done
while (( installing > 0 )); do
    wait -n || install_failed
    installing=$((installing - 1))
done
stamp "installed: ${venvs[*]}"

# The unit tier, as the README tells a newcomer to run it (a fresh virtual
# environment, `pip install '.[test]'`, pytest), on the second core while
# pre-commit and the wheel build use the first; run_suite.py leaves it out.
readme_log=$VENVS/readme-unit-tier.log
stamp "unit tier as the README says (in the background; log: $readme_log)"
scripts/readme_unit_tier.sh > "$readme_log" 2>&1 &
readme_pid=$!
trap 'kill "$readme_pid" 2>/dev/null || true' EXIT

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
trap 'rm -rf "$scratch"; kill "$readme_pid" 2>/dev/null || true' EXIT
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

stamp "tests"
# Two releases at once (two cores): the newest CPU build first, with the full
# engine suite (the longest); the others (the older CPU build with the engine
# tests that show each bug and its fix, the CUDA builds at class level) in
# line, each as soon as a core is free.
ordered=("$ENGINE_VENV")
for venv in "${venvs[@]}"; do [[ $venv == "$ENGINE_VENV" ]] || ordered+=("$venv"); done
[[ " ${venvs[*]} " == *" $ENGINE_VENV "* ]] || ordered=("${venvs[@]}")
python3 scripts/run_suite.py --jobs 2 --unit-tier-ran --light-engine "$LIGHT_ENGINE_VENV" "${ordered[@]}"
