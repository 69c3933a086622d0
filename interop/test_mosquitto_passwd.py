"""A password file made by Debian's own ``mosquitto_passwd`` (as a team moving off
Mosquitto has one) is used by FerryMQ as it is: ``auth.mosquitto_password_file``
turns MQTT password checks on; paho clients with the file's users get in (3.1.1 and 5),
a wrong password and a client without a user name are refused with Mosquitto's codes, and
a user added to the file later is there after a restart.  FerryMQ only (the reference
broker reads the file itself)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from brokers import Broker
from mqttclient import V5, V311, Client, unique_id

# .ci/run installs Debian's mosquitto and sets INTEROP_REQUIRE_MOSQUITTO_PASSWD=1: then a
# missing tool fails the test instead of skipping it.
MISSING = shutil.which("mosquitto_passwd") is None and os.environ.get("INTEROP_REQUIRE_MOSQUITTO_PASSWD") != "1"
pytestmark = [
    pytest.mark.ferrymq_only,
    pytest.mark.skipif(MISSING, reason="mosquitto_passwd not installed (Debian mosquitto)"),
]


def passwd(*args: str) -> None:
    subprocess.run(["mosquitto_passwd", *args], check=True, capture_output=True, timeout=30)


def client(b: Broker, version: int, user: str | None, password: str | None) -> Client:
    c = Client(b.host, b.port, unique_id("pw"), version=version)
    if user is not None:
        c.c.username_pw_set(user, password)
    return c


def test_a_mosquitto_passwd_file_is_used_as_it_is(tmp_path, monkeypatch):
    pwfile = tmp_path / "passwd"
    passwd("-c", "-b", str(pwfile), "sensor-7", "s3nsor pw")
    passwd("-b", str(pwfile), "dashboard", "dash-pw")
    assert pwfile.read_text().count("$7$") == 2, "mosquitto_passwd writes PBKDF2-SHA512 hashes"
    monkeypatch.setenv("FERRYMQ_AUTH__MOSQUITTO_PASSWORD_FILE", str(pwfile))
    b = Broker("ferrymq", tmp_path / "broker")
    b.start()
    opened = []
    try:
        for version in (V311, V5):
            sub = client(b, version, "dashboard", "dash-pw")
            opened.append(sub)
            sub.connect()
            sub.subscribe("plant/#", qos=1)
            pub = client(b, version, "sensor-7", "s3nsor pw")
            opened.append(pub)
            pub.connect()
            pub.publish("plant/7/temp", b"19.0", qos=1)
            assert sub.get().payload == b"19.0"

            wrong = client(b, version, "sensor-7", "guess")
            opened.append(wrong)
            code = wrong.connect(expect_success=False).reason_code
            # (paho 2 reports a 3.1.1 return code as the 5.0 reason code it maps to)
            assert code in ((4, 0x86) if version == V311 else (0x86,)), f"bad user name or password, got {code}"
            anon = client(b, version, None, None)
            opened.append(anon)
            code = anon.connect(expect_success=False).reason_code
            assert code in ((5, 0x87) if version == V311 else (0x87,)), f"not authorized, got {code}"
        # The file is read at start: a user added with mosquitto_passwd is there after a restart.
        passwd("-b", str(pwfile), "sensor-8", "eight")
        b.restart()
        late = client(b, V311, "sensor-8", "eight")
        opened.append(late)
        late.connect()
    finally:
        for c in opened:
            try:
                c.close()
            except Exception:
                pass
        b.stop()
