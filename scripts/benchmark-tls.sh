#!/usr/bin/env bash
# What TLS costs: write-conditional-1 at 64 clients over plaintext and over TLS, back to
# back, in both orders (plain, tls, tls, plain), on a single node and on a three-node
# cluster (clients spread over every node; with TLS the peer ports speak mutual TLS too).
# Both transports use tonic's client (`--transport tonic`), so only the TLS layer differs.
# Each run starts fresh and seeds the boundary. Certificates: scripts/dev-certs.sh.
# Results: $OUT (default bench-results/tls-<timestamp>/), JSON per run and summary.txt,
# which ends with the TLS ÷ plaintext ratios.
#
#   scripts/benchmark-tls.sh                 # 100k seed, 2 s warm-up, 10 s measured
#   DURATION=20 TOPOLOGIES=single scripts/benchmark-tls.sh
#
# Needs release builds: make build (cairn, cairn-bench), and openssl. Helpers: scripts/lib/bench-nodes.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--help]" >&2; exit 2 ;;
esac

out=${OUT:-bench-results/tls-$(date -u +%Y%m%dT%H%M%SZ)}
seed=${SEED:-100000}
warmup=${WARMUP:-2}
duration=${DURATION:-10}
topologies=${TOPOLOGIES:-single cluster}
. scripts/lib/bench-nodes.sh

pki=$(mktemp -d /var/tmp/cairn-bench-pki.XXXXXX)
scripts/dev-certs.sh "$pki"
trap 'stop_nodes; rm -rf "$pki"' EXIT

run=0
# run_bench <topology> <transport> <endpoints>
run_bench() {
  run=$((run + 1))
  local name="$out/$run-$1-$2" tls=()
  [ "$2" = tls ] && tls=(--tls-ca "$pki/ca.crt")
  "$bench" --endpoints "$3" "${tls[@]}" --transport tonic --seed-events "$seed" \
    --scenarios write-conditional-1 --clients 64 --warmup-secs "$warmup" \
    --duration-secs "$duration" --quiet --json "$name.json" >"$name.log" 2>&1
  python3 - "$name.json" "$1" "$2" <<'PY' | tee -a "$out/summary.txt"
import json, sys
r = json.load(open(sys.argv[1]))[0]
print(f"{sys.argv[2]:<8} {sys.argv[3]:<6} {r['scenario']} {r['clients']} clients "
      f"{r['requests_per_second']:.0f} req/s p99 {r['p99_ms']:.2f} ms errors {r['errors']}")
PY
}

# start <topology> <transport>: fresh node(s); prints the endpoints
start() {
  local scheme=http tls=()
  if [ "$2" = tls ]; then scheme=https; tls=(--tls-cert "$pki/node.crt" --tls-key "$pki/node.key"); fi
  work=$(mktemp -d /var/tmp/cairn-bench-tls.XXXXXX)
  if [ "$1" = single ]; then
    "$cairn" serve --data-dir "$work/data" --listen 127.0.0.1:15305 --http-listen 127.0.0.1:19764 \
      "${tls[@]}" --log warn,cairn_server::server=info >"$work/node.log" 2>&1 &
    pids=($!)
    wait_serving "$work/node.log" "${pids[0]}"
    endpoints="$scheme://127.0.0.1:15305"
    return
  fi
  head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$work/secret"
  local peer_tls=()
  [ "$2" = tls ] && peer_tls=(--peer-tls-cert "$pki/node.crt" --peer-tls-key "$pki/node.key" --peer-tls-ca "$pki/ca.crt")
  local members="1=127.0.0.1:15406,2=127.0.0.1:15416,3=127.0.0.1:15426" id offset
  endpoints=""
  for id in 1 2 3; do
    offset=$(( (id - 1) * 10 ))
    "$cairn" serve --node-id "$id" --data-dir "$work/node-$id" \
      --listen "127.0.0.1:$(( 15405 + offset ))" --peer-listen "127.0.0.1:$(( 15406 + offset ))" \
      --http-listen "127.0.0.1:$(( 19864 + offset ))" --initial-members "$members" \
      --cluster-secret-file "$work/secret" --allow-default-password "${tls[@]}" "${peer_tls[@]}" \
      --log warn,cairn_server::server=info \
      >"$work/node-$id.log" 2>&1 &
    pids+=($!)
    endpoints="${endpoints:+$endpoints,}$scheme://127.0.0.1:$(( 15405 + offset ))"
  done
  for id in 1 2 3; do wait_serving "$work/node-$id.log" "${pids[$((id - 1))]}"; done
}

for topology in $topologies; do
  for transport in plain tls tls plain; do
    start "$topology" "$transport"
    run_bench "$topology" "$transport" "$endpoints"
    stop_nodes
  done
done

python3 - "$out/summary.txt" <<'PY' | tee -a "$out/summary.txt"
import collections, sys
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) > 5 and f[1] in ("plain", "tls"):
        rates[(f[0], f[1])].append(float(f[5]))
for topology in sorted({t for t, _ in rates}):
    plain, tls = rates[(topology, "plain")], rates[(topology, "tls")]
    if plain and tls:
        print(f"{topology}: TLS / plaintext = {sum(tls) / sum(plain):.3f} "
              f"(plain {' '.join(f'{r:.0f}' for r in plain)}, tls {' '.join(f'{r:.0f}' for r in tls)})")
PY
echo "results in $out"
