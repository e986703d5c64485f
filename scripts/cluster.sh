#!/usr/bin/env bash
# A three-node Cairn cluster on this machine, in one command (`make cluster`).
#
#   node 1: clients 127.0.0.1:5005, peers 127.0.0.1:5006, metrics http://127.0.0.1:9464
#   node 2: clients 127.0.0.1:5015, peers 127.0.0.1:5016, metrics http://127.0.0.1:9474
#   node 3: clients 127.0.0.1:5025, peers 127.0.0.1:5026, metrics http://127.0.0.1:9484
#
# Data and logs go to $CAIRN_CLUSTER_DIR (default ./cluster-data): node-N/ and node-N.log.
# The cluster secret is generated once into $CAIRN_CLUSTER_DIR/secret. Ctrl-C stops every
# node (SIGTERM, clean shutdown); running the script again restarts them on their data.
# --tls: the client ports speak TLS and the peer ports mutual TLS, with development
# certificates made once into $CAIRN_CLUSTER_DIR/tls (scripts/dev-certs.sh); clients trust
# tls/ca.crt. (The three nodes share one host, so they share one certificate naming it.)
set -euo pipefail

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  echo
  echo "usage: $0 [--tls] [--help]   (env: CAIRN_BIN=path/to/cairn, CAIRN_CLUSTER_DIR=dir)"
}
use_tls=false
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --tls) use_tls=true ;;
  "") ;;
  *) usage >&2; exit 2 ;;
esac

dir="${CAIRN_CLUSTER_DIR:-./cluster-data}"
bin="${CAIRN_BIN:-${CARGO_TARGET_DIR:-target}/release/cairn}"
if [ ! -x "$bin" ]; then
  echo "no cairn binary at $bin: run 'make build' (or set CAIRN_BIN)" >&2
  exit 1
fi
mkdir -p "$dir"
if [ ! -s "$dir/secret" ]; then
  (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$dir/secret")
fi
members="1=127.0.0.1:5006,2=127.0.0.1:5016,3=127.0.0.1:5026"
scheme=""
tls=()
cli_tls=()
if $use_tls; then
  "$(dirname "$0")/dev-certs.sh" "$dir/tls"
  tls=(--tls-cert "$dir/tls/node.crt" --tls-key "$dir/tls/node.key"
       --peer-tls-cert "$dir/tls/node.crt" --peer-tls-key "$dir/tls/node.key"
       --peer-tls-ca "$dir/tls/ca.crt")
  cli_tls=(--tls-ca "$dir/tls/ca.crt" --tls-cert "$dir/tls/node.crt" --tls-key "$dir/tls/node.key")
  scheme="https://"
fi

pids=()
stop() {
  echo "stopping the cluster"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait
}
trap stop INT TERM

for id in 1 2 3; do
  offset=$(( (id - 1) * 10 ))
  "$bin" serve \
    --node-id "$id" \
    --data-dir "$dir/node-$id" \
    --listen "127.0.0.1:$(( 5005 + offset ))" \
    --peer-listen "127.0.0.1:$(( 5006 + offset ))" \
    --http-listen "127.0.0.1:$(( 9464 + offset ))" \
    --initial-members "$members" \
    --cluster-secret-file "$dir/secret" \
    --allow-default-password \
    "${tls[@]}" \
    >"$dir/node-$id.log" 2>&1 &
  pids+=($!)
done

echo "waiting for the cluster to serve (logs: $dir/node-N.log)"
for id in 1 2 3; do
  until grep -q "cairn is serving" "$dir/node-$id.log"; do
    if ! kill -0 "${pids[$((id - 1))]}" 2>/dev/null; then
      echo "node $id exited; its log:" >&2
      cat "$dir/node-$id.log" >&2
      stop
      exit 1
    fi
    sleep 0.2
  done
done
"$bin" cluster status --endpoint 127.0.0.1:5006 --cluster-secret-file "$dir/secret" "${cli_tls[@]}"
echo "clients: ${scheme}127.0.0.1:5005, ${scheme}127.0.0.1:5015, ${scheme}127.0.0.1:5025 (admin / changeit)"
[ -n "$scheme" ] && echo "TLS: trust $dir/tls/ca.crt (grpcurl -cacert $dir/tls/ca.crt 127.0.0.1:5005 list)"
echo "Ctrl-C stops"
wait
