# Cairn developer entry points. `make run` and `make test` work on a fresh machine: they
# first install (as root) or name (otherwise) the system packages the build needs.

CARGO ?= cargo
# Keep the build outside the clone if you like: CARGO_TARGET_DIR=/var/tmp/cairn-target make test
export CARGO_TARGET_DIR ?= target

.PHONY: help deps run test verify fix bench-build

help: ## List targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

deps: ## Install or name missing system packages (libclang for RocksDB's bindgen, a C++ compiler)
	@scripts/ensure-deps.sh

run: deps ## Build (release) and run a one-node Cairn on :5005 with data in ./data
	$(CARGO) run --release --bin cairn -- serve

test: deps ## Run the whole test suite
	$(CARGO) test --workspace

verify: deps ## Read-only checks: formatting and lints
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fix: deps ## Apply formatting and automatic lint fixes
	$(CARGO) fmt --all
	$(CARGO) clippy --workspace --all-targets --fix --allow-dirty -- -D warnings
