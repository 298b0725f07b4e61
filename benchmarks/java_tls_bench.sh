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
"$py" -m tests.tls_certs "$work/certs" > /dev/null
c=$work/certs
"$py" -m bkctl cluster init --metadata "$uri" > /dev/null
tls_keys="tlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory
tlsProvider=JDK
tlsCertificatePath=$c/bookie.pem
tlsKeyStoreType=PEM
tlsKeyStore=$c/bookie.key.pem"
java_tls=(-Dorg.apache.bookkeeper.conf.readsystemproperties=true
  -DtlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory -DtlsProvider=JDK
  -DtlsTrustStoreType=PEM "-DtlsTrustStore=$c/ca.pem")
run=0

bench() {  # bench KIND(bkctl|java) TLS(tls|plain)
  local kind=$1 mode=$2 dir port pid keys="" client_tls=()
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
  pid=$!
  for _ in $(seq 300); do "$py" -m bkctl bookie list --metadata "$uri" -o plain 2>/dev/null | grep -q ":$port" && break; sleep 0.2; done
  local result
  result=$(java $JAVA_OPTS_SMALL -Xmx1g "-Dzk=127.0.0.1:$zk_port" "-Dv2=${V2:-true}" "${client_tls[@]}" \
    -cp "$BKPERF/client/classes:$BK_CP" BkBench bench 1 1 1 1024 512 15 "$window" "$pid" 2>"$dir/bench.err" | tail -1)
  echo "$kind $mode: $result | load: $(uptime | sed 's/.*load average: //')"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  for _ in $(seq 100); do "$py" -m bkctl bookie list --metadata "$uri" -o plain 2>/dev/null | grep -q ":$port" || break; sleep 0.2; done
}

for _ in $(seq "$pairs"); do
  bench bkctl tls
  bench java tls
done
bench bkctl plain
bench java plain
