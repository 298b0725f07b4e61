#!/usr/bin/env bash
# A/B of bkctl versions under Java's client: one fresh bkctl bookie per TREE argument, in the order given
# (alternate them: A B A B ...), each measured by BkBench (1 KiB entries, 512 in flight, ensemble 1, a 15 s
# warm-up then a WINDOW_S window). A TREE is a checkout of bkctl (a git worktree; copy the built
# bkctl/protocol/_fastadd*.so into it); the bookie runs from it with this repository's .venv. Prints one
# line per run: adds/s, p50/p99, the bookie's and the client's CPU per add, `uptime`'s load.
# Needs BKJAVA and BKPERF (../shared/tools/java-bookkeeper); not part of the test suite.
#   BKJAVA=/tmp/bkjava BKPERF=/tmp/bkperf benchmarks/java_ab.sh true|false tls|plain WINDOW_S TREE...
# (true: the client speaks v2; false: v3.)
set -uo pipefail
cd "$(dirname "$0")/.."
: "${BKPERF:?set BKPERF}"
v2=$1
mode=$2
window=$3
shift 3
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
. benchmarks/java_common.sh
tls_material
"$py" -m bkctl cluster init --metadata "$uri" > /dev/null
keys="" client_tls=()
if [ "$mode" = tls ]; then keys=$tls_keys; client_tls=("${java_tls[@]}"); fi
run=0
for tree in "$@"; do
  run=$((run + 1))
  dir=$work/run$run
  mkdir -p "$dir"
  port=$(free_port)
  printf '%s\n' "$keys" > "$dir/bk.conf"
  (cd "$tree" && exec "$py" -m bkctl bookie start -c "$dir/bk.conf" -p "$port" -j "$dir/journal" \
    -l "$dir/ledgers" --metadata "$uri" > "$dir/log" 2>&1) &
  echo -n "$tree: "
  bkbench "$port" $! "$window" "$dir" "-Dv2=$v2" "${client_tls[@]}"
done
