#!/usr/bin/env bash
# Development certificates for local nodes: a CA and one server certificate for 127.0.0.1
# and localhost, ECDSA P-256, valid for $DAYS (default 30) days. Writes DIR/ca.crt,
# DIR/ca.key, DIR/node.crt, DIR/node.key (keys 0600); keeps files that already exist.
# Never for production: the CA key sits beside the certificates.
#
#   scripts/dev-certs.sh DIR
#
# Used by scripts/cluster.sh --tls and scripts/benchmark-tls.sh. Needs openssl.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") echo "usage: $0 DIR" >&2; exit 2 ;;
esac
dir=$1
days=${DAYS:-30}
mkdir -p "$dir"
umask 077
if [ ! -s "$dir/ca.crt" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
    -subj "/CN=cairn development CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
fi
if [ ! -s "$dir/node.crt" ]; then
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
    -keyout "$dir/node.key" -out "$dir/node.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$dir/san.ext"
  openssl x509 -req -in "$dir/node.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days "$days" -extfile "$dir/san.ext" -out "$dir/node.crt" 2>/dev/null
  rm -f "$dir/node.csr" "$dir/san.ext"
fi
chmod 644 "$dir/ca.crt" "$dir/node.crt"
