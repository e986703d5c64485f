#!/usr/bin/env bash
# Makes sure the system packages Cairn's build needs are present.
#
# RocksDB is compiled from source (C++) and its Rust bindings are generated with bindgen,
# which loads libclang at build time. A fresh Debian/Ubuntu machine usually has gcc but
# not libclang. As root we install what is missing; otherwise we say exactly what to install.
set -euo pipefail

missing=()
have_libclang() {
  [ -n "${LIBCLANG_PATH:-}" ] && return 0
  compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null && return 0
  compgen -G "/usr/lib/*/libclang*.so*" >/dev/null && return 0
  compgen -G "/usr/lib64/libclang*.so*" >/dev/null && return 0
  compgen -G "/opt/homebrew/opt/llvm/lib/libclang*" >/dev/null && return 0
  [ "$(uname -s)" = "Darwin" ] && xcrun --find clang >/dev/null 2>&1 && return 0
  return 1
}
have_libclang || missing+=(libclang-dev)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure-deps: installing ${missing[*]} (needed to build RocksDB and its bindings)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  exit 0
fi

cat >&2 <<MSG
ensure-deps: missing system packages: ${missing[*]}
Cairn builds RocksDB from source; its Rust bindings need libclang and a C++ compiler.
Install them, then re-run:
  Debian/Ubuntu:  sudo apt-get install libclang-dev g++
  Fedora/RHEL:    sudo dnf install clang-devel gcc-c++
  macOS:          xcode-select --install
Or point LIBCLANG_PATH at a directory containing libclang.so.
MSG
exit 1
