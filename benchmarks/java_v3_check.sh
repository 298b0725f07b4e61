#!/usr/bin/env bash
# v3 interop check against a real Java BookKeeper 4.14.8: bkctl bookies only, Java tools with
# their DEFAULT wire protocol (v3, protobuf). Not part of the test suite or CI: runs only with BKJAVA set
# (../shared/tools/java-bookkeeper/README.md builds it). Steps, each printing RESULT lines:
#   1. BkClientTest -Dv2=false: write-read 1000, fence-test 100, read (a second client); then
#      benchmarks/java/V3Ops.java: GET_BOOKIE_INFO, a long-poll read, explicit LAC, force
#   2. a bookie of ledger 1's ensemble is killed -9; Java's shell `recover -f` copies its fragments
#      (BookKeeperAdmin over v3); every ledger read back by the Java client
#   3. Java's AutoRecoveryMain runs; another bookie is killed -9; once nothing is under-replicated the
#      Java client reads every ledger back
#   4. two Java bookies join (a mixed cluster): bkctl's client with --protocol v3 writes and reads on all
#      five bookies, the Java client reads that ledger and recovers (fences) one bkctl left open
#   PYTHON (default .venv/bin/python of the main checkout) runs bkctl from this tree.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/java_common.sh
bk() { "$py" -m bkctl "$@"; }
java_client() { java $JAVA_OPTS_SMALL -Dv2=false -cp "$BKJAVA/client/classes:$BK_CP" BkClientTest "127.0.0.1:$zk_port" "$@" 2>>"$work/java.err"; }

# Not through `bk`: a function in the background is a subshell, and the exit trap's kill would reach it,
# not the sandbox (which then ran on, its bookies retrying a ZooKeeper gone for good).
"$py" -m bkctl sandbox --processes --no-restart --no-autorecovery --bookies 5 --base-port 0 \
  --data-dir "$work/sb" --metadata "$uri" -o json > "$work/sandbox.json" 2> "$work/sandbox.err" &
for _ in $(seq 150); do [ -s "$work/sandbox.json" ] && break; sleep 0.2; done
cat > "$work/bk.conf" <<CONF
metadataServiceUri=zk+null://127.0.0.1:$zk_port/ledgers
zkServers=127.0.0.1:$zk_port
allowLoopback=true
useHostNameAsBookieID=false
statsProviderClass=org.apache.bookkeeper.stats.NullStatsProvider
httpServerEnabled=false
auditorPeriodicCheckInterval=0
auditorPeriodicBookieCheckInterval=0
lostBookieRecoveryDelay=0
CONF

echo "== 1. Java client, v3: write-read, fence-test, read"
ledgers=()
for mode in "write-read 1000" "fence-test 100" "write-read 300"; do
  out=$(java_client $mode)
  echo "$mode: $(echo "$out" | grep -v '^ledger=' | tr '\n' ' ')"
  ledgers+=("$(echo "$out" | sed -n 's/^ledger=//p')")
done
for ledger in "${ledgers[@]}"; do echo "read $ledger: $(java_client read "$ledger" | grep RESULT)"; done

pid_of() {  # the pid of the sandbox bookie process serving bookie id $1
  "$py" - "$work/sb" "$1" <<'PY'
import sys
from pathlib import Path
root, victim = sys.argv[1], sys.argv[2]
for proc in Path("/proc").iterdir():
    try:
        argv = (proc / "cmdline").read_bytes().decode().split("\0")
        if "--port-file" in argv and root in argv[argv.index("--port-file") + 1]:
            if f"127.0.0.1:{Path(argv[argv.index('--port-file') + 1]).read_text().strip()}" == victim:
                print(proc.name)
    except (OSError, ValueError):
        continue
PY
}
ensemble_of() {  # bookie $2 (0-based) of ledger $1's first segment
  bk ledger inspect "$1" --metadata "$uri" -o json | "$py" -c "import json,sys; print(json.load(sys.stdin)['segments'][0]['ensemble'][$2])"
}
kill_bookie() {
  kill -9 "$(pid_of "$1")"
  for _ in $(seq 150); do bk bookie list --metadata "$uri" -o plain | grep -q "$1" || break; sleep 0.2; done
}

echo "== 1b. Java client, v3: GET_BOOKIE_INFO, long-poll read, WRITE_LAC/READ_LAC, FORCE_LEDGER (benchmarks/java/V3Ops.java)"
mkdir -p "$work/classes"
javac -nowarn -d "$work/classes" -cp "$BK_CP" benchmarks/java/V3Ops.java
java $JAVA_OPTS_SMALL -cp "$work/classes:$BK_CP" V3Ops "127.0.0.1:$zk_port" 2>>"$work/java.err" | grep RESULT

echo "== 2. Java shell recover (BookKeeperAdmin, v3) of a killed bkctl bookie"
victim=$(ensemble_of "${ledgers[0]}" 0)
kill_bookie "$victim"
java $JAVA_OPTS_SMALL -cp "$BK_CP" org.apache.bookkeeper.bookie.BookieShell -conf "$work/bk.conf" recover -f "$victim" \
  > "$work/recover.log" 2>&1 && echo "recover $victim: exit 0" || echo "RESULT fail recover exit $? (see $work/recover.log)"
grep -i "recover.*\(complete\|finish\|success\|fail\)" "$work/recover.log" | tail -3 || true
for ledger in "${ledgers[@]}"; do
  still=$(bk ledger inspect "$ledger" --metadata "$uri" -o json | grep -c "$victim" || true)
  echo "read $ledger after recover: $(java_client read "$ledger" | grep RESULT) (victim in metadata: $still)"
done

echo "== 3. Java AutoRecoveryMain heals a killed bkctl bookie"
java $JAVA_OPTS_SMALL -cp "$BK_CP" org.apache.bookkeeper.replication.AutoRecoveryMain --conf "$work/bk.conf" \
  > "$work/autorecovery.log" 2>&1 &
sleep 5
victim2=$(ensemble_of "${ledgers[0]}" 1)
kill_bookie "$victim2"
healed=no
for _ in $(seq 120); do
  left=0
  for ledger in "${ledgers[@]}"; do
    bk ledger inspect "$ledger" --metadata "$uri" -o json | grep -q "$victim2" && left=$((left + 1))
  done
  [ "$left" = 0 ] && { healed=yes; break; }
  sleep 1
done
echo "autorecovery replaced $victim2 in every ledger: $healed"
for ledger in "${ledgers[@]}"; do echo "read $ledger after autorecovery: $(java_client read "$ledger" | grep RESULT)"; done
echo "== 4. Mixed cluster: 2 Java bookies join the 3 bkctl ones; bkctl's client over v3 on all five"
for n in 1 2; do
  jport=$(free_port)
  mkdir -p "$work/java$n"
  java_bookie_conf "$jport" "$work/java$n" > "$work/java$n/bk.conf"
  java $JAVA_OPTS_SMALL -cp "$BK_CP" org.apache.bookkeeper.server.Main --conf "$work/java$n/bk.conf" > "$work/java$n.log" 2>&1 &
  for _ in $(seq 300); do bk bookie list --metadata "$uri" -o plain 2>/dev/null | grep -q ":$jport" && break; sleep 0.2; done
done
echo "bookies: $(bk bookie list --metadata "$uri" -o plain | tr '\n' ' ')"
opts=(-E 5 -Qw 5 -Qa 5 --digest crc32 --password testpasswd --protocol v3 --metadata "$uri" -o json)
mixed=$(bk ledger write -n 200 "${opts[@]}" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["ledger_id"])')
count=$(bk ledger read "$mixed" --protocol v3 --password testpasswd --metadata "$uri" -o json | "$py" -c 'import json,sys; print(len(json.load(sys.stdin)))')
echo "bkctl v3 write 200 to all 5, read back: $count entries; Java client read: $(java_client read "$mixed" | grep RESULT)"
open_one=$(bk ledger write -n 50 --no-close "${opts[@]}" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["ledger_id"])')
echo "an open ledger (bkctl writer gone) recovered by the Java client: $(java_client read "$open_one" | grep RESULT)"
echo "  its metadata after recovery: $(bk ledger inspect "$open_one" --metadata "$uri" -o json | "$py" -c 'import json,sys; d=json.load(sys.stdin); print(d["state"], d["last_entry_id"])')"

echo "autorecovery log: $(grep -c ERROR "$work/autorecovery.log" || true) ERROR lines, the most frequent:"
grep ERROR "$work/autorecovery.log" | sed 's/^.*ERROR //; s/[0-9]\+/N/g' | sort | uniq -c | sort -rn | head -5 || true
if [ -n "${KEEP_LOGS:-}" ]; then mkdir -p "$KEEP_LOGS" && cp "$work"/*.log "$work"/*.err "$KEEP_LOGS"/ 2>/dev/null || true; fi
