# Sourced by scripts/java-interop-gc and scripts/interop-db (after benchmarks/java_common.sh): one bookie
# id ($bookie) on one set of directories ($work), run as bkctl ($work/bkctl.conf) or Java ($work/java.conf)
# in turn, and the Java client reading ledgers back. Defines registered, wait_registered, stop_bookie,
# kill_bookie, start_bkctl, start_java, java_client, read_all and `expected` (ledger id -> entries).
registered() { "$bk" bookie list --metadata "$uri" -o plain 2>/dev/null | grep -q "$bookie"; }
wait_registered() {
  for _ in $(seq 300); do registered && return 0; sleep 0.2; done
  echo "RESULT fail $1 bookie never registered; its log:" && tail -30 "$work/$1.log" && exit 1
}
stop_bookie() {
  kill -TERM "$bookie_pid"
  wait "$bookie_pid" || true
  for _ in $(seq 150); do registered || return 0; sleep 0.2; done
  echo "RESULT fail bookie still registered after its stop" && exit 1
}
start_bkctl() {
  "$bk" -v bookie start --conf "$work/bkctl.conf" >> "$work/bkctl.log" 2>&1 &
  bookie_pid=$!
  wait_registered bkctl
}
start_java() {
  java $JAVA_OPTS_SMALL -Xmx512m -cp "$BK_CP" org.apache.bookkeeper.server.Main --conf "$work/java.conf" \
    >> "$work/java.log" 2>&1 &
  bookie_pid=$!
  wait_registered java
}
java_client() {
  java $JAVA_OPTS_SMALL -Densemble=1 -Dwq=1 -Daq=1 -Dv2=true -cp "$BKJAVA/client/classes:$BK_CP" \
    BkClientTest "127.0.0.1:$zk_port" "$@" 2>/dev/null
}
declare -A expected # ledger id -> entries
read_all() {
  for ledger in "${!expected[@]}"; do
    out=$(java_client read "$ledger")
    verified=$(echo "$out" | sed -n 's/^verifiedEntries=//p')
    echo "$1: ledger $ledger $(echo "$out" | grep RESULT) verified=$verified"
    if [ "$verified" != "${expected[$ledger]}" ] || ! echo "$out" | grep -q "RESULT ok"; then
      echo "RESULT fail $1: ledger $ledger: $verified of ${expected[$ledger]} entries" && exit 1
    fi
  done
}
kill_bookie() {  # kill -9, then wait for the registration (an ephemeral znode) to expire
  kill -KILL "$bookie_pid"
  wait "$bookie_pid" 2>/dev/null || true
  for _ in $(seq 300); do registered || return 0; sleep 0.2; done
  echo "RESULT fail bookie still registered after kill -9" && exit 1
}
