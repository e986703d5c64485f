# Sourced by the benchmark scripts (not run): the release binaries, the output directory,
# and starting and stopping fresh nodes. Expects $out set; sets $cairn, $bench, $pids, $work.

target=${CARGO_TARGET_DIR:-target}
cairn=${CAIRN_BIN:-$target/release/cairn}
bench=${CAIRN_BENCH_BIN:-$target/release/cairn-bench}
for bin in "$cairn" "$bench"; do
  [ -x "$bin" ] || { echo "no binary at $bin: run 'make build'" >&2; exit 1; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The running nodes and their scratch directory, stopped and removed by stop_nodes.
pids=()
work=""
stop_nodes() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
  [ -n "$work" ] && rm -rf "$work"
  work=""
}

wait_serving() { # log pid
  until grep -q "cairn is serving" "$1"; do
    kill -0 "$2" 2>/dev/null || { echo "a node exited; its log:" >&2; cat "$1" >&2; exit 1; }
    sleep 0.2
  done
}
