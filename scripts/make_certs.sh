#!/usr/bin/env bash
# Makes a private CA and one certificate for the fp8rl services (PEM files, EC P-256), for TLS and
# mutual TLS between them (docs/deploy.md "Authentication and TLS"):
#   scripts/make_certs.sh OUT_DIR [NAME...]
# OUT_DIR/ca.pem, ca.key        the CA (ca.key stays with whoever signs; services get ca.pem)
# OUT_DIR/service.pem, .key     a certificate for every service, valid for localhost, 127.0.0.1,
#                               fp8rl-service (for --tls-server-name) and each NAME, usable as
#                               server and client certificate (mutual TLS)
# Keys are written mode 0600. Valid 365 days. Needs the openssl command.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [NAME...]" >&2
  exit 2
fi
out=$1
shift
command -v openssl >/dev/null || { echo "$0: openssl not found (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$out"
umask 077
san="DNS:localhost,IP:127.0.0.1,DNS:fp8rl-service"
for name in "$@"; do san="$san,DNS:$name"; done

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 \
  -subj "/CN=fp8rl test CA" -keyout "$out/ca.key" -out "$out/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -subj "/CN=fp8rl-service" -keyout "$out/service.key" -out "$out/service.csr" 2>/dev/null
cat > "$out/service.ext" <<EXT
subjectAltName=$san
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
EXT
openssl x509 -req -in "$out/service.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
  -CAcreateserial -days 365 -extfile "$out/service.ext" -out "$out/service.pem" 2>/dev/null
rm -f "$out/service.csr" "$out/service.ext" "$out/ca.srl"
chmod 0644 "$out/ca.pem" "$out/service.pem"
echo "wrote $out/ca.pem $out/service.pem $out/service.key (SAN $san)"
