#!/usr/bin/env bash
# Reproduces docs/benchmarks.md on this machine: the disk's group-commit baseline
# (RocksDB db_bench, Debian package rocksdb-tools), then cairn-bench against a fresh
# single node. Results go to $OUT (default bench-results/<timestamp>/).
#
#   scripts/benchmark.sh                 # full table: 1M seed, all scenarios, 1..256 clients
#   QUICK=1 scripts/benchmark.sh         # 100k seed, 5 s per run, 1/16/64 clients
#
# Needs release builds: cargo build --release --bin cairn --bin cairn-bench
set -euo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-target}
cairn=${CAIRN_BIN:-$target/release/cairn}
bench=${CAIRN_BENCH_BIN:-$target/release/cairn-bench}
out=${OUT:-bench-results/$(date -u +%Y%m%dT%H%M%SZ)}
data=${DATA_DIR:-$(mktemp -d /var/tmp/cairn-bench-data.XXXXXX)}
mkdir -p "$out"

if [ "${QUICK:-0}" = 1 ]; then
  seed=100000 clients=1,16,64 warmup=1 duration=5
else
  seed=1000000 clients=1,4,16,64,256 warmup=3 duration=15
fi
scenarios=${SCENARIOS:-}

if ! command -v db_bench >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rocksdb-tools >/dev/null
  fi
fi
if command -v db_bench >/dev/null 2>&1; then
  echo "== baseline: db_bench fillrandom, sync, 32 threads (the disk's group-commit limit)"
  dbdir=$(mktemp -d /var/tmp/db_bench.XXXXXX)
  db_bench --benchmarks=fillrandom --sync=1 --threads=32 --num=6000 --value_size=256 \
    --db="$dbdir" 2>&1 | tee "$out/db_bench.txt" | grep fillrandom
  rm -rf "$dbdir"
else
  echo "db_bench not found (Debian: apt-get install rocksdb-tools); no baseline" >&2
fi

echo "== cairn serve on $data"
"$cairn" serve --data-dir "$data" --listen 127.0.0.1:15005 --http-listen 127.0.0.1:19464 \
  --log warn >"$out/server.log" 2>&1 &
server=$!
for _ in $(seq 600); do curl -sf http://127.0.0.1:19464/readyz >/dev/null && break; sleep 0.1; done
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; [ -n "${KEEP_DATA:-}" ] || rm -rf "$data"' EXIT

args=(--endpoints http://127.0.0.1:15005 --seed-events "$seed" --clients "$clients"
  --warmup-secs "$warmup" --duration-secs "$duration" --csv "$out/cairn.csv" --json "$out/cairn.json")
[ -n "$scenarios" ] && args+=(--scenarios "$scenarios")
"$bench" "${args[@]}" 2>&1 | tee "$out/cairn-bench.log"
echo "results in $out"
