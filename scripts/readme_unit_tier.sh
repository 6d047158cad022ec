#!/usr/bin/env bash
# The README's unit-tier commands, run as a newcomer runs them: the first
# ```bash block of its "## Tests" section, line for line, in a copy of the
# committed tree (no venv, no cache, nothing of this checkout's), then removed.
# CI runs this as its unit tier (scripts/test.sh), so that the README's steps
# are the ones that work.
#
# usage: scripts/readme_unit_tier.sh [--print]   (--print: show the block only)
#
# Exit status: the block's (pytest's, when it gets there); 2 when the README
# has no such block.
set -euo pipefail
cd "$(dirname "$0")/.."

block=$(awk '
    /^## Tests/ { in_tests = 1; next }
    in_tests && /^## / { exit }
    in_tests && /^```bash$/ { in_block = 1; next }
    in_block && /^```$/ { exit }
    in_block { print }
' README.md)
if [[ -z "$block" ]]; then
    echo "readme_unit_tier.sh: README.md has no \`\`\`bash block under \"## Tests\"." >&2
    exit 2
fi
if [[ ${1:-} == --print ]]; then
    echo "$block"
    exit 0
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
git archive HEAD | tar -x -C "$scratch"
echo "In a copy of $(git rev-parse --short HEAD), as the README says:"
echo "$block" | sed 's/^/  $ /'
cd "$scratch"
# A clean shell: no virtual environment or pip setting of the caller's but its
# index configuration, as a newcomer's machine has.
env -u VIRTUAL_ENV -u PYTHONPATH bash -euo pipefail -c "$block"
