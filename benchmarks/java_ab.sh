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
"$py" -m tests.tls_certs "$work/certs" > /dev/null
c=$work/certs
"$py" -m bkctl cluster init --metadata "$uri" > /dev/null
client_tls=()
if [ "$mode" = tls ]; then
  client_tls=(-Dorg.apache.bookkeeper.conf.readsystemproperties=true
    -DtlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory -DtlsProvider=JDK
    -DtlsTrustStoreType=PEM "-DtlsTrustStore=$c/ca.pem")
fi
listed() { "$py" -m bkctl bookie list --metadata "$uri" -o plain 2>/dev/null | grep -q ":$1"; }
run=0
for tree in "$@"; do
  run=$((run + 1))
  dir=$work/run$run
  mkdir -p "$dir"
  port=$(free_port)
  : > "$dir/bk.conf"
  if [ "$mode" = tls ]; then
    printf 'tlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory\ntlsProvider=JDK\n' > "$dir/bk.conf"
    printf 'tlsCertificatePath=%s/bookie.pem\ntlsKeyStoreType=PEM\ntlsKeyStore=%s/bookie.key.pem\n' "$c" "$c" >> "$dir/bk.conf"
  fi
  (cd "$tree" && exec "$py" -m bkctl bookie start -c "$dir/bk.conf" -p "$port" -j "$dir/journal" \
    -l "$dir/ledgers" --metadata "$uri" > "$dir/log" 2>&1) &
  pid=$!
  for _ in $(seq 300); do listed "$port" && break; sleep 0.2; done
  bpid=$(pgrep -f -- "-p $port -j" | head -1)
  r=$(java $JAVA_OPTS_SMALL -Xmx1g "-Dzk=127.0.0.1:$zk_port" "-Dv2=$v2" "${client_tls[@]}" \
    -cp "$BKPERF/client/classes:$BK_CP" BkBench bench 1 1 1 1024 512 15 "$window" "$bpid" 2>/dev/null | tail -1)
  echo "$tree: $r | load: $(uptime | sed 's/.*average: //')" | sed 's/"p999.*"errors": 0, //'
  kill "$bpid" 2>/dev/null
  wait "$pid" 2>/dev/null
  for _ in $(seq 100); do listed "$port" || break; sleep 0.2; done
done
