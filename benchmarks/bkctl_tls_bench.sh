#!/usr/bin/env bash
# bkctl's own client with and without TLS against one bkctl bookie with TLS configured (not required):
# `bkctl bench write`, 1 KiB entries, 512 in flight, ensemble 1, DURATION_S each, alternating
# plain / --tls PAIRS times. Prints one JSON line per run with `uptime`. Not part of the test suite.
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
for _ in $(seq 150); do [ -s "$work/port" ] && break; sleep 0.2; done
bench=(bench write -E 1 -Qw 1 -Qa 1 -s 1024 -D 512 -t "$duration" --metadata "$uri" -o json)
for _ in $(seq "$pairs"); do
  for mode in plain tls; do
    options=()
    [ "$mode" = tls ] && options=(--tls --tls-trust-store "$c/ca.pem")
    result=$("$py" -m bkctl "${options[@]}" "${bench[@]}" 2> "$work/bench.err" | tr -d '\n') || tail -2 "$work/bench.err"
    echo "$mode: $result | load: $(uptime | sed 's/.*load average: //')"
  done
done
