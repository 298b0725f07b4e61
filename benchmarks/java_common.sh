# Sourced by the Java interop scripts (java_v3_check.sh, java_v3_bench.sh): the Java build's class path,
# a scratch dir removed at exit, and a throwaway ZooKeeper. Sets py, work, zk_port, uri; defines
# free_port, java_bookie_conf. Needs BKJAVA (../shared/tools/java-bookkeeper/README.md).
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
