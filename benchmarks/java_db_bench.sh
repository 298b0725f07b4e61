#!/usr/bin/env bash
# The db engine (DbLedgerStorage) beside the interleaved one under Java's client: one fresh bkctl bookie
# per STORAGE argument, in the order given (alternate them: interleaved db interleaved db ...), each measured
# by BkBench (1 KiB entries, 512 in flight, ensemble 1, a 15 s warm-up then a WINDOW_S window). Prints one
# line per run: adds/s, p50/p99, CPU per add, `uptime`'s load.
# Needs BKJAVA and BKPERF (../shared/tools/java-bookkeeper); not part of the test suite.
#   BKJAVA=/tmp/bkjava BKPERF=/tmp/bkperf benchmarks/java_db_bench.sh WINDOW_S STORAGE...
set -uo pipefail
cd "$(dirname "$0")/.."
: "${BKPERF:?set BKPERF}"
window=$1
shift
. benchmarks/java_common.sh
"$py" -m bkctl cluster init --metadata "$uri" > /dev/null
run=0
for storage in "$@"; do
  run=$((run + 1))
  dir=$work/run$run
  mkdir -p "$dir"
  port=$(free_port)
  "$py" -m bkctl bookie start --storage "$storage" -p "$port" -j "$dir/journal" -l "$dir/ledgers" \
    --metadata "$uri" > "$dir/log" 2>&1 &
  echo -n "$storage: "
  bkbench "$port" $! "$window" "$dir" "-Dv2=true"
done
