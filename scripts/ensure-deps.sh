#!/usr/bin/env bash
# Makes sure the system packages Cairn's build needs are present.
#
# RocksDB is compiled from source (C++) and its Rust bindings are generated with bindgen,
# which loads libclang at build time. The C++ is compiled with clang++ (.cargo/config.toml:
# faster than g++ on RocksDB's sources) unless CXX names another compiler.
# A fresh Debian/Ubuntu machine usually has gcc but neither libclang nor clang. As root we
# install what is missing; otherwise we say exactly what to install.
set -euo pipefail

missing=()
have_libclang() {
  [ -n "${LIBCLANG_PATH:-}" ] && return 0
  if command -v dpkg-query >/dev/null 2>&1; then
    # Debian/Ubuntu: bindgen needs the library *and* clang's builtin headers, which come
    # with libclang-dev. (libclang-cpp, often preinstalled, is a different library.)
    dpkg-query -W -f='${Status}\n' libclang-dev 2>/dev/null | grep -q "install ok installed"
    return
  fi
  local lib
  for lib in /usr/lib/llvm-*/lib/libclang.so* /usr/lib64/libclang.so* /usr/lib/libclang.so* \
    /usr/lib/*/libclang.so* /usr/lib/*/libclang-[0-9]*.so* /opt/homebrew/opt/llvm/lib/libclang.dylib; do
    [ -e "$lib" ] && return 0
  done
  [ "$(uname -s)" = "Darwin" ] && xcrun --find clang >/dev/null 2>&1 && return 0
  return 1
}
have_libclang || missing+=(libclang-dev)
cxx="${CXX:-clang++}"
if ! command -v "$cxx" >/dev/null 2>&1; then
  case "$cxx" in
    clang++*) missing+=(clang) ;;
    *) missing+=(g++) ;;
  esac
fi
command -v cc >/dev/null 2>&1 || missing+=(gcc)  # rustc links through cc
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
Cairn builds RocksDB from source with clang++; its Rust bindings need libclang.
Install them, then re-run (or build with g++, slower: CXX=g++ make ...):
  Debian/Ubuntu:  sudo apt-get install libclang-dev clang
  Fedora/RHEL:    sudo dnf install clang-devel clang
  macOS:          xcode-select --install
Or point LIBCLANG_PATH at a directory containing libclang.so.
MSG
exit 1
