#!/usr/bin/env bash
# Durable add throughput of Java's client over the v3 (protobuf) protocol, its default: BkBench -Dv2=false,
# 1 KiB entries, 512 in flight, ensemble 1, against one bkctl bookie (A) and one Java 4.14.8 bookie (B)
# alternating A B A B in one run, each a fresh bookie with a 15 s warm-up then a WINDOW_S window; then
# one v2 pair for reference. Journal on the same disk with fsync on, each bookie's own defaults
# otherwise. Prints one line per run with the load average. Not part of the test suite.
#   BKJAVA=/tmp/bkjava BKPERF=/tmp/bkperf benchmarks/java_v3_bench.sh [WINDOW_S] [PAIRS]
set -uo pipefail
cd "$(dirname "$0")/.."
: "${BKPERF:?set BKPERF}"
window=${1:-20}
pairs=${2:-2}
. benchmarks/java_common.sh
"$py" -m bkctl cluster init --metadata "$uri" > /dev/null
run=0

bench() {  # bench KIND(bkctl|java) PROTOCOL(v3|v2)
  local kind=$1 protocol=$2 dir port v2=false
  run=$((run + 1))
  dir=$work/run$run
  mkdir -p "$dir"
  port=$(free_port)
  [ "$protocol" = v2 ] && v2=true
  if [ "$kind" = bkctl ]; then
    "$py" -m bkctl bookie start -p "$port" -j "$dir/journal" -l "$dir/ledgers" --metadata "$uri" > "$dir/log" 2>&1 &
  else
    java_bookie_conf "$port" "$dir" > "$dir/bk.conf"
    java $JAVA_OPTS_SMALL -Xmx1g -cp "$BK_CP" org.apache.bookkeeper.server.Main --conf "$dir/bk.conf" > "$dir/log" 2>&1 &
  fi
  echo -n "$kind $protocol: "
  bkbench "$port" $! "$window" "$dir" "-Dv2=$v2"
}

for _ in $(seq "$pairs"); do
  bench bkctl v3
  bench java v3
done
bench bkctl v2
bench java v2
