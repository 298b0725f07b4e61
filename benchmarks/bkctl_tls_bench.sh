#!/usr/bin/env bash
# bkctl's own client with and without TLS against one bkctl bookie with TLS configured (not required):
# `bkctl bench write`, 1 KiB entries, 512 in flight, ensemble 1, DURATION_S each, alternating
# plain / --tls PAIRS times. Prints per run: adds/s, p99, the client's and the bookie's CPU per add
# (user + system, from /usr/bin/time and /proc/<bookie>/stat) and the load. Not part of the test suite.
#   benchmarks/bkctl_tls_bench.sh [DURATION_S] [PAIRS]
set -uo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10}
pairs=${2:-2}
py=${PY:-.venv/bin/python}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; sleep 1; rm -rf "$work"' EXIT
"$py" -m tests.tls_certs "$work/certs" > /dev/null
c=$work/certs
uri="sqlite://$work/metadata.db"
"$py" -m bkctl cluster init --metadata "$uri" > /dev/null
printf 'tlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory\ntlsCertificatePath=%s\ntlsKeyStore=%s\n' \
  "$c/bookie.pem" "$c/bookie.key.pem" > "$work/bk.conf"
"$py" -m bkctl bookie start -c "$work/bk.conf" -p 0 -j "$work/journal" -l "$work/ledgers" --metadata "$uri" \
  --port-file "$work/port" > "$work/log" 2>&1 &
bookie=$!
for _ in $(seq 150); do [ -s "$work/port" ] && break; sleep 0.2; done
ticks() { awk '{print $14 + $15}' "/proc/$bookie/stat"; }
hz=$(getconf CLK_TCK)
bench=(bench write -E 1 -Qw 1 -Qa 1 -s 1024 -D 512 -t "$duration" --metadata "$uri" -o json)
for _ in $(seq "$pairs"); do
  for mode in plain tls; do
    options=()
    [ "$mode" = tls ] && options=(--tls --tls-trust-store "$c/ca.pem")
    before=$(ticks)
    /usr/bin/time -f "%U %S" -o "$work/time" "$py" -m bkctl "${options[@]}" "${bench[@]}" > "$work/out" 2> "$work/err" \
      || { tail -2 "$work/err"; continue; }
    after=$(ticks)
    "$py" - "$mode" "$work/out" "$work/time" "$((after - before))" "$hz" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
mode, out, times, ticks, hz, load = sys.argv[1:]
run = json.load(open(out))
client_s = sum(map(float, open(times).read().split()[:2]))
ops = run["ops"]
print(f"{mode}: {run['ops_per_s']:,.0f} adds/s, p99 {run['latency_ms']['p99']} ms, "
      f"client {client_s / ops * 1e6:.1f} us/add, bookie {int(ticks) / int(hz) / ops * 1e6:.1f} us/add, load {load}")
PY
  done
done
