#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, cargo-fuzz on the nightly toolchain) for a few seconds on
# its checked-in seed corpus: a target that stopped building or a seed that crashes fails.
#
#   scripts/fuzz-smoke.sh            # FUZZ_SECS=5 per target
#   FUZZ_SECS=600 scripts/fuzz-smoke.sh   # the 10-minute runs of docs/security.md
#
# Inputs the runs find go to $FUZZ_CORPUS/<target> (outside the clone), not to the seeds.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${FUZZ_SECS:-5}
corpus=${FUZZ_CORPUS:-/var/tmp/cairn-fuzz-corpus}
export CARGO_TARGET_DIR=${CAIRN_FUZZ_TARGET_DIR:-/var/tmp/cairn-fuzz-target}
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz (once per machine)"
  cargo install --quiet --locked cargo-fuzz --target-dir /var/tmp/cairn-tools-target
fi
for target in $(cargo +nightly fuzz list); do
  mkdir -p "$corpus/$target"
  echo "== fuzz $target for ${secs}s"
  log="$corpus/$target.log"
  if ! cargo +nightly fuzz run "$target" "$corpus/$target" "corpus/$target" -- \
    -max_total_time="$secs" >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz target $target failed (the crashing input is under fuzz/artifacts/$target)" >&2
    exit 1
  fi
  grep -E "^Done" "$log"
done
