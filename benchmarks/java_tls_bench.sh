#!/usr/bin/env bash
# Durable add throughput of Java's client (BkBench: 1 KiB entries, 512 in flight, ensemble 1) over TLS,
# against one bkctl bookie (A) and one Java 4.14.8 bookie (B), alternating A B A B in one run, each
# with a 15 s warm-up then a WINDOW_S window; then one plain-TCP pair for reference. Both bookies use
# Java's TLS keys with PEM files from tests/tls_certs.py (no client certificates), their journal on the
# same disk with fsync on, and their own defaults otherwise. Prints one line per run with `uptime`.
# Needs BKJAVA and BKPERF (../shared/tools/java-bookkeeper); not part of the test suite.
# V2=false makes the Java client speak v3 (bkctl bookies answer v3 once the v3 work is merged).
#   BKJAVA=/tmp/bkjava BKPERF=/tmp/bkperf [V2=false] benchmarks/java_tls_bench.sh [WINDOW_S] [PAIRS]
set -uo pipefail
cd "$(dirname "$0")/.."
: "${BKPERF:?set BKPERF}"
window=${1:-20}
pairs=${2:-2}
. benchmarks/java_common.sh
tls_material
"$py" -m bkctl cluster init --metadata "$uri" > /dev/null
run=0

bench() {  # bench KIND(bkctl|java) TLS(tls|plain)
  local kind=$1 mode=$2 dir port keys="" client_tls=()
  run=$((run + 1))
  dir=$work/run$run
  mkdir -p "$dir"
  port=$(free_port)
  if [ "$mode" = tls ]; then keys=$tls_keys; client_tls=("${java_tls[@]}"); fi
  if [ "$kind" = bkctl ]; then
    printf '%s\n' "$keys" > "$dir/bk.conf"
    "$py" -m bkctl bookie start -c "$dir/bk.conf" -p "$port" -j "$dir/journal" -l "$dir/ledgers" \
      --metadata "$uri" > "$dir/log" 2>&1 &
  else
    { java_bookie_conf "$port" "$dir"; printf '%s\n' "$keys"; } > "$dir/bk.conf"
    java $JAVA_OPTS_SMALL -Xmx1g -cp "$BK_CP" org.apache.bookkeeper.server.Main --conf "$dir/bk.conf" > "$dir/log" 2>&1 &
  fi
  echo -n "$kind $mode: "
  bkbench "$port" $! "$window" "$dir" "-Dv2=${V2:-true}" "${client_tls[@]}"
}

for _ in $(seq "$pairs"); do
  bench bkctl tls
  bench java tls
done
bench bkctl plain
bench java plain
