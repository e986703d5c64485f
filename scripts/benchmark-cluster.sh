#!/usr/bin/env bash
# A three-node cluster against a single node, back to back on this machine (the three
# nodes share the cores one node had alone): write-conditional-1 at 64 clients and
# write-conditional-100 at 16 through every node (two thirds of the writes are forwarded
# by followers), read-conditional at 16 through the followers only. Each run starts
# fresh, seeds the boundary, and the pair runs in both orders (single, cluster, cluster,
# single) so drift on a shared machine shows. Results: $OUT (default
# bench-results/cluster-<timestamp>/), one JSON report per run and summary.txt.
#
#   scripts/benchmark-cluster.sh            # 100k seed, 2 s warm-up, 10 s measured
#   DURATION=20 ROUNDS=2 scripts/benchmark-cluster.sh
#   PROFILE=1 scripts/benchmark-cluster.sh  # also perf-record the leader (needs perf)
#
# Needs release builds: make build (cairn, cairn-bench).
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--help]" >&2; exit 2 ;;
esac

out=${OUT:-bench-results/cluster-$(date -u +%Y%m%dT%H%M%SZ)}
seed=${SEED:-100000}
warmup=${WARMUP:-2}
duration=${DURATION:-10}
rounds=${ROUNDS:-1}
. scripts/lib/bench-nodes.sh
trap stop_nodes EXIT

run=0
# run_bench <label> <scenario> <clients> <endpoints>
run_bench() {
  local name="$out/$run-$1-$2-$3"
  "$bench" --endpoints "$4" --seed-events "$seed" --scenarios "$2" --clients "$3" \
    --warmup-secs "$warmup" --duration-secs "$duration" --quiet \
    --json "$name.json" >"$name.log" 2>&1
  python3 - "$name.json" "$1" <<'PY' | tee -a "$out/summary.txt"
import json, sys
r = json.load(open(sys.argv[1]))[0]
print(f"{sys.argv[2]:<8} {r['scenario']:<22} {r['clients']:>3} clients "
      f"{r['requests_per_second']:>9.0f} req/s {r['events_per_second']:>9.0f} events/s "
      f"p99 {r['p99_ms']:.2f} ms errors {r['errors']}")
PY
}

single() {
  run=$((run + 1))
  work=$(mktemp -d /var/tmp/cairn-bench-single.XXXXXX)
  "$cairn" serve --data-dir "$work/data" --listen 127.0.0.1:15105 \
    --http-listen 127.0.0.1:19564 --log warn,cairn_server::server=info >"$work/node.log" 2>&1 &
  pids=($!)
  wait_serving "$work/node.log" "${pids[0]}"
  local ep=http://127.0.0.1:15105
  run_bench single write-conditional-1 64 "$ep"
  run_bench single write-conditional-100 16 "$ep"
  run_bench single read-conditional 16 "$ep"
  stop_nodes
}

cluster() {
  run=$((run + 1))
  work=$(mktemp -d /var/tmp/cairn-bench-cluster.XXXXXX)
  head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$work/secret"
  local members="1=127.0.0.1:15206,2=127.0.0.1:15216,3=127.0.0.1:15226" id offset
  for id in 1 2 3; do
    offset=$(( (id - 1) * 10 ))
    "$cairn" serve --node-id "$id" --data-dir "$work/node-$id" \
      --listen "127.0.0.1:$(( 15205 + offset ))" --peer-listen "127.0.0.1:$(( 15206 + offset ))" \
      --http-listen "127.0.0.1:$(( 19664 + offset ))" --initial-members "$members" \
      --cluster-secret-file "$work/secret" --allow-default-password --log warn,cairn_server::server=info \
      >"$work/node-$id.log" 2>&1 &
    pids+=($!)
  done
  for id in 1 2 3; do wait_serving "$work/node-$id.log" "${pids[$((id - 1))]}"; done
  local leader
  leader=$("$cairn" cluster status --endpoint 127.0.0.1:15206 --cluster-secret-file "$work/secret" \
    --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader_id"])')
  local all="" followers=""
  for id in 1 2 3; do
    local ep="http://127.0.0.1:$(( 15205 + (id - 1) * 10 ))"
    all="${all:+$all,}$ep"
    [ "$id" != "$leader" ] && followers="${followers:+$followers,}$ep"
  done
  echo "cluster: leader is node $leader" >>"$out/summary.txt"
  if [ "${PROFILE:-0}" = 1 ] && command -v perf >/dev/null 2>&1; then
    perf record -F 499 -g -o "$out/$run-leader.perf.data" -p "${pids[$((leader - 1))]}" \
      >/dev/null 2>&1 &
    local perf_pid=$!
  fi
  run_bench cluster write-conditional-1 64 "$all"
  run_bench cluster write-conditional-100 16 "$all"
  run_bench cluster read-conditional 16 "$followers"
  if [ -n "${perf_pid:-}" ]; then
    kill -INT "$perf_pid"; wait "$perf_pid" || true
    perf report -i "$out/$run-leader.perf.data" --no-children --sort dso,symbol --stdio \
      2>/dev/null | head -80 >"$out/$run-leader.perf.txt" || true
  fi
  for id in 1 2 3; do
    # CPU seconds each node used over the whole run (utime + stime, in clock ticks).
    awk -v id="$id" -v hz="$(getconf CLK_TCK)" \
      '{printf "cluster: node %s cpu %.1f s\n", id, ($14 + $15) / hz}' \
      "/proc/${pids[$((id - 1))]}/stat" >>"$out/summary.txt"
  done
  stop_nodes
}

for round in $(seq "$rounds"); do
  single
  cluster
  cluster
  single
done
echo "results in $out"
cat "$out/summary.txt"
