# Sourced by the Java interop scripts (java_v3_check.sh, java_*_bench.sh, java_ab.sh): the Java build's
# class path, a scratch dir removed at exit, and a throwaway ZooKeeper. Sets py, work, zk_port, uri;
# defines free_port, java_bookie_conf, tls_material, registered and bkbench. Needs BKJAVA
# (../shared/tools/java-bookkeeper/README.md); bkbench needs BKPERF.
: "${BKJAVA:?set BKJAVA to a Java BookKeeper build (see ../shared/tools/java-bookkeeper/README.md)}"
. "$BKJAVA/scripts/env.sh"
py=${PYTHON:-.venv/bin/python}  # the scripts run from the repository root
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; sleep 3; rm -rf "$work" 2>/dev/null || true' EXIT
free_port() { "$py" -c 'from bkctl.metadata.zk_server import free_port; print(free_port())'; }

zk_port=$(free_port)
printf 'tickTime=1000\ndataDir=%s/zk\nclientPort=%s\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=ruok\n' \
  "$work" "$zk_port" > "$work/zoo.cfg"
java -Xmx256m -cp /usr/share/java/zookeeper.jar org.apache.zookeeper.server.ZooKeeperServerMain "$work/zoo.cfg" \
  > "$work/zk.log" 2>&1 &
for _ in $(seq 100); do
  "$py" -c "from bkctl.metadata.zk_server import four_letter_word as w; import sys; sys.exit(w($zk_port, 'ruok') != 'imok')" && break
  sleep 0.2
done
uri="zk://127.0.0.1:$zk_port/ledgers"

java_bookie_conf() {  # java_bookie_conf PORT DIR: a Java bookie's bk.conf on stdout (InterleavedLedgerStorage)
  printf 'bookiePort=%s\nadvertisedAddress=127.0.0.1\nallowLoopback=true\nuseHostNameAsBookieID=false\njournalDirectories=%s/journal\nledgerDirectories=%s/ledgers\nmetadataServiceUri=zk+null://127.0.0.1:%s/ledgers\nledgerStorageClass=org.apache.bookkeeper.bookie.InterleavedLedgerStorage\nstatsProviderClass=org.apache.bookkeeper.stats.NullStatsProvider\nhttpServerEnabled=false\n' \
    "$1" "$2" "$2" "$zk_port"
}

tls_material() {  # certificates in $work/certs; sets tls_keys (bk.conf lines) and java_tls (client options)
  "$py" -m tests.tls_certs "$work/certs" > /dev/null
  local c=$work/certs
  tls_keys="tlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory
tlsProvider=JDK
tlsCertificatePath=$c/bookie.pem
tlsKeyStoreType=PEM
tlsKeyStore=$c/bookie.key.pem"
  java_tls=(-Dorg.apache.bookkeeper.conf.readsystemproperties=true
    -DtlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory -DtlsProvider=JDK
    -DtlsTrustStoreType=PEM "-DtlsTrustStore=$c/ca.pem")
}

registered() { "$py" -m bkctl bookie list --metadata "$uri" -o plain 2>/dev/null | grep -q ":$1"; }

# bkbench PORT PID WINDOW_S DIR [CLIENT_OPTION...]: once the bookie (process PID) is registered on PORT,
# Java's BkBench against it (1 KiB entries, 512 in flight, ensemble 1, 15 s warm-up, then WINDOW_S);
# prints its JSON line and the load average, then stops the bookie and waits for its registration to go.
bkbench() {
  local port=$1 pid=$2 window=$3 dir=$4 result
  shift 4
  for _ in $(seq 300); do registered "$port" && break; sleep 0.2; done
  result=$(java $JAVA_OPTS_SMALL -Xmx1g "-Dzk=127.0.0.1:$zk_port" "$@" -cp "$BKPERF/client/classes:$BK_CP" \
    BkBench bench 1 1 1 1024 512 15 "$window" "$pid" 2>"$dir/bench.err" | tail -1)
  echo "$result | load: $(uptime | sed 's/.*load average: //')"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  for _ in $(seq 100); do registered "$port" || break; sleep 0.2; done
}
