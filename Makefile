# Cairn developer entry points. `make run` and `make test` work on a fresh machine: they
# first install (as root) or name (otherwise) the system packages the build needs.

CARGO ?= cargo
# Keep the build outside the clone if you like: CARGO_TARGET_DIR=/var/tmp/cairn-target make test
export CARGO_TARGET_DIR ?= target

# Every target builds with the release profile, so `make run`, `make test` and `make verify`
# share ONE optimised build of the dependencies (RocksDB's C++ is most of a cold build; a
# second profile would compile it a second time). For tests, Cairn's own crates are built
# as a debug build would build them: opt-level 0, overflow checks and debug assertions on.
# Measured on 2 cores: the test targets compile in 66 s at opt-level 0 against 252 s at
# opt-level 1, and the suite runs ~35 s longer, since the hot paths are in the optimised
# dependencies (RocksDB, tonic, prost's runtime). The dependencies keep the release
# settings (per-package overrides only: changing the profile's root or "*" values would
# rebuild them, RocksDB included).
# cairn-powercut (a test's FUSE disk) is left out on purpose: optimised, it keeps up with
# three nodes' RocksDB traffic in the power-cut suites.
WORKSPACE_CRATES := cairn-core cairn-store cairn-raft cairn-proto cairn-server cairn-bench cairn-operator cairn-client cairn-tests
# Dependencies only the operator and the tests use (none is in the `cairn` binary, so
# `make run`'s build stays shared): unoptimised, they compile in a fraction of the time,
# and nothing they do is hot in a test. k8s-openapi alone took 154 s at opt-level 3.
TEST_ONLY_DEPS := k8s-openapi kube-core kube-client kube-runtime serde-saphyr jsonpath-rust rustls jiff proptest schemars
PROFILE := --release
CHECKED := $(PROFILE) \
	$(foreach crate,$(WORKSPACE_CRATES) $(TEST_ONLY_DEPS),--config 'profile.release.package.$(crate).opt-level=0') \
	--config 'profile.release.overflow-checks=true' \
	--config 'profile.release.debug-assertions=true' \
	--config 'profile.release.package."*".overflow-checks=false' \
	--config 'profile.release.package."*".debug-assertions=false'

.PHONY: help deps run cluster build test test-real-servers verify fix proto

help: ## List targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

deps: ## Install or name missing system packages (libclang for RocksDB's bindgen, clang++ for its C++)
	@scripts/ensure-deps.sh

run: deps ## Build (release) and run a one-node Cairn on :5005 with data in ./data
	$(CARGO) run $(PROFILE) --bin cairn -- serve

cluster: build ## Run a three-node cluster on this machine (scripts/cluster.sh: ports 5005/5015/5025)
	scripts/cluster.sh

build: deps ## Build the release binaries (cairn, cairn-bench) into $CARGO_TARGET_DIR/release
	$(CARGO) build $(PROFILE) --bins

test: deps ## Run the whole test suite (Cairn's crates with overflow checks and debug assertions)
	$(CARGO) test $(CHECKED)

test-real-servers: deps ## The suites gated on real servers and tools (Prometheus and kube-apiserver via CAIRN_SHARED_TOOLS, grpcurl, moto_server for S3)
	$(CARGO) test $(CHECKED) -- --ignored

# Clippy runs on the default members and on the proto generator separately: in one
# invocation, the generator's build tools change the features cargo unifies for RocksDB's
# bindgen, and RocksDB would be compiled a second time (20 minutes). The client is linted
# without its default `tls` feature too, so a build without rustls keeps compiling.
verify: deps ## Read-only checks: formatting, lints, unused dependencies, generated code up to date
	$(CARGO) fmt --all -- --check
	scripts/check-unused-deps.py
	$(CARGO) clippy $(CHECKED) --all-targets -- -D warnings
	$(CARGO) clippy $(CHECKED) -p cairn-proto-gen --all-targets -- -D warnings
	$(CARGO) clippy $(CHECKED) -p cairn-client --no-default-features -- -D warnings
	$(CARGO) run $(PROFILE) -q -p cairn-proto-gen -- --check

proto: ## Regenerate crates/cairn-proto/src/generated from proto/
	$(CARGO) run $(PROFILE) -q -p cairn-proto-gen

fix: deps ## Apply formatting and automatic lint fixes
	$(CARGO) fmt --all
	$(CARGO) clippy $(CHECKED) --all-targets --fix --allow-dirty -- -D warnings
