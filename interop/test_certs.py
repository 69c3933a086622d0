"""certs/gen.sh makes a CA, a server certificate for localhost/127.0.0.1 and a
client certificate that a TLS stack accepts (Python's ssl, i.e. OpenSSL) for
mutual TLS over loopback.  Runs without any broker."""

from __future__ import annotations

import hashlib
import shutil
import socket
import ssl
import subprocess
import threading

import pytest

from brokers import REPO_ROOT

GEN = REPO_ROOT / "certs" / "gen.sh"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(GEN), str(out)], check=True, capture_output=True, timeout=120)
    return out


def digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_files_and_key_format(certs):
    names = {p.name for p in certs.iterdir()}
    assert {"ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key"} <= names
    for k in ("ca.key", "server.key", "client.key"):
        assert (certs / k).read_text().startswith("-----BEGIN PRIVATE KEY-----"), f"{k} not PKCS#8 PEM"
        assert (certs / k).stat().st_mode & 0o077 == 0, f"{k} readable by others"


def test_idempotent(certs):
    before = digest(certs)
    subprocess.run(["bash", str(GEN), str(certs)], check=True, capture_output=True, timeout=120)
    assert digest(certs) == before


@pytest.mark.parametrize("server_name", ["localhost", "127.0.0.1"])
def test_mutual_tls_handshake(certs, server_name):
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(certs / "server.pem", certs / "server.key")
    server_ctx.load_verify_locations(certs / "ca.pem")
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(certs / "ca.pem"))
    client_ctx.load_cert_chain(certs / "client.pem", certs / "client.key")

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    lsock.settimeout(10)
    result = {}

    def serve():
        try:
            conn, _ = lsock.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                result["peer"] = tls.getpeercert()
                tls.sendall(tls.recv(100).upper())
        except Exception as e:  # reported by the assertion below
            result["error"] = repr(e)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with socket.create_connection(lsock.getsockname(), timeout=10) as raw:
        with client_ctx.wrap_socket(raw, server_hostname=server_name) as tls:
            tls.sendall(b"ping")
            assert tls.recv(100) == b"PING"
    t.join(10)
    lsock.close()
    assert "error" not in result, result
    subject = dict(x[0] for x in result["peer"]["subject"])
    assert subject["commonName"] == "ferrymq-test-client"


def test_untrusted_ca_is_rejected(certs, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["bash", str(GEN), str(other)], check=True, capture_output=True, timeout=120)
    r = subprocess.run(["openssl", "verify", "-CAfile", str(other / "ca.pem"), str(certs / "server.pem")],
                       capture_output=True)
    assert r.returncode != 0
