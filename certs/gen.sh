#!/usr/bin/env bash
# Make a throw-away local CA, a server certificate for localhost/127.0.0.1/::1 and
# a client certificate, for TLS tests of FerryMQ (mqtts) and its clients.
#
#   certs/gen.sh            # into certs/out/
#   certs/gen.sh DIR        # into DIR
#   FORCE=1 certs/gen.sh    # regenerate everything
#
# Output (PEM): ca.pem ca.key server.pem server.key server-fullchain.pem
#               client.pem client.key
# Private keys are unencrypted PKCS#8 ("BEGIN PRIVATE KEY", what rustls reads), mode 600.
# Idempotent: a run with a complete, valid set (verifies against the CA, not
# expiring within 30 days) changes nothing; a missing or bad leaf is re-issued
# from the existing CA; a missing or bad CA re-makes everything.
# These are test credentials only: never use them for a real deployment.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/out}"
days_ca=3650
days_leaf=825
bits=2048
force="${FORCE:-0}"

command -v openssl >/dev/null || { echo "gen.sh: openssl not found (apt-get install -y openssl)" >&2; exit 1; }
mkdir -p "$out"
umask 077
cd "$out"

log() { printf '[certs] %s\n' "$*" >&2; }

newkey() { openssl genpkey -algorithm RSA -pkeyopt "rsa_keygen_bits:$bits" -out "$1" 2>/dev/null; chmod 600 "$1"; }

serial() { echo "0x$(openssl rand -hex 16)"; }

valid_cert() {  # valid_cert CERT KEY [CAFILE]: exists, matches its key, verifies, not expiring soon
    local cert="$1" key="$2" ca="${3:-}"
    [[ -s "$cert" && -s "$key" ]] || return 1
    openssl x509 -in "$cert" -noout -checkend $((30 * 86400)) >/dev/null 2>&1 || return 1
    [[ "$(openssl x509 -in "$cert" -noout -pubkey 2>/dev/null)" == "$(openssl pkey -in "$key" -pubout 2>/dev/null)" ]] || return 1
    if [[ -n "$ca" ]]; then openssl verify -CAfile "$ca" "$cert" >/dev/null 2>&1 || return 1; fi
    return 0
}

# ---- CA -----------------------------------------------------------------------
if [[ "$force" == "1" ]] || ! valid_cert ca.pem ca.key ca.pem; then
    log "making CA in $out"
    rm -f ca.pem ca.key server.pem server.key server-fullchain.pem client.pem client.key
    newkey ca.key
    cat > ca.ext <<'EXT'
[req]
distinguished_name = dn
x509_extensions = v3_ca
prompt = no
[dn]
CN = FerryMQ Test CA (not for production)
O = FerryMQ interop tests
[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EXT
    openssl req -new -x509 -key ca.key -sha256 -days "$days_ca" -set_serial "$(serial)" \
        -config ca.ext -out ca.pem
    rm -f ca.ext
fi

# ---- leaves ---------------------------------------------------------------------
issue() {  # issue NAME CN EXTENSIONS
    local name="$1" cn="$2" ext="$3"
    log "issuing $name.pem ($cn)"
    newkey "$name.key"
    printf '%s\n' "$ext" > "$name.ext"
    openssl req -new -key "$name.key" -subj "/CN=$cn/O=FerryMQ interop tests" -out "$name.csr"
    openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -set_serial "$(serial)" \
        -days "$days_leaf" -sha256 -extfile "$name.ext" -out "$name.pem" 2>/dev/null
    rm -f "$name.csr" "$name.ext"
}

if [[ "$force" == "1" ]] || ! valid_cert server.pem server.key ca.pem \
        || ! openssl verify -CAfile ca.pem -purpose sslserver server.pem >/dev/null 2>&1; then
    issue server localhost "basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1, IP:::1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer"
fi
cat server.pem ca.pem > server-fullchain.pem

if [[ "$force" == "1" ]] || ! valid_cert client.pem client.key ca.pem \
        || ! openssl verify -CAfile ca.pem -purpose sslclient client.pem >/dev/null 2>&1; then
    issue client ferrymq-test-client "basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectAltName = DNS:ferrymq-test-client
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer"
fi

chmod 600 ./*.key
chmod 644 ./*.pem

# ---- check ----------------------------------------------------------------------
openssl verify -CAfile ca.pem -purpose sslserver server.pem >/dev/null
openssl verify -CAfile ca.pem -purpose sslclient client.pem >/dev/null
openssl x509 -in server.pem -noout -checkhost localhost | grep -q "does match"
openssl x509 -in server.pem -noout -checkip 127.0.0.1 | grep -q "does match"
for k in ca.key server.key client.key; do
    head -1 "$k" | grep -q -- "-----BEGIN PRIVATE KEY-----" || { log "$k is not PKCS#8 PEM"; exit 1; }
done
log "ok: $out/{ca,server,client}.pem + keys (test credentials only)"
