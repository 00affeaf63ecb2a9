"""Credentials are a state, never silent, never echoed: passwords, ACL users and TLS on loopback.

Real redis-servers with ``requirepass`` (a password holding ``/ ? @ % :``),
an ACL user without the commands the tier needs, and ``rediss://`` with a
self-signed certificate the test makes.
"""
from __future__ import annotations

import datetime
import logging
from urllib.parse import quote

import numpy as np
import pytest

from kvtier.store import StoreConfig
from kvtier.store.remote import BadRemoteURL, RemoteTier, parse_remote_url, remote_gauges
from kvtier_testutil import key, random_block
from remote_servers import HOST, RedisServer, free_port, redis_binary

pytestmark = pytest.mark.faults

BB = 64 << 10
PASSWORD = "p/a?s@s%w:rd"                 # every character that breaks naive URL handling
WRONG = "w/r?o@n%g:pw"


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory):
    if redis_binary() is None:
        pytest.skip("redis-server not found")
    srv = RedisServer(tmp_path_factory.mktemp("locked"), extra=("--requirepass", PASSWORD)).start()
    c = srv.client()
    c.connection_pool.connection_kwargs["password"] = PASSWORD
    # an ACL user that may PING but not touch kvtier:* keys, and one that may
    c.execute_command("ACL", "SETUSER", "reader", "on", ">" + PASSWORD, "~other:*", "+ping", "+exists",
                      "+get", "+set", "+client", "+hello", "+select")
    c.execute_command("ACL", "SETUSER", "kv", "on", ">" + PASSWORD, "~kvtier:*", "+@all")
    yield srv
    srv.stop()


def secrets_absent(*texts: str) -> None:
    for t in texts:
        for s in (PASSWORD, WRONG, quote(PASSWORD, safe=""), quote(WRONG, safe="")):
            assert s not in t, t


def tier_for(url):
    return RemoteTier.from_url(url, BB, secret=b"a key for the auth tests, 32 by")


def wait_state(t, state, timeout=10.0):
    import time
    deadline = time.monotonic() + timeout
    while t.stats().state != state and time.monotonic() < deadline:
        time.sleep(0.05)
    return t.stats()


@pytest.mark.parametrize("cred", ["", f":{quote(WRONG, safe='')}@", f":{WRONG}@", f"reader:{WRONG}@"],
                         ids=["missing", "wrong-encoded", "wrong-raw", "wrong-user-password"])
def test_rejected_password_is_auth_failed_with_one_warning(locked_redis, caplog, cred):
    url = f"redis://{cred}{HOST}:{locked_redis.port}"
    with caplog.at_level(logging.DEBUG, logger="kvtier"):
        t = tier_for(url)
        try:
            st = wait_state(t, "auth_failed")
            out = np.full(BB, 1, np.uint8)
            assert t.fetch([key(1)], [memoryview(out)]) == [False]           # a miss, no raise
            assert t.publish([key(1)], [memoryview(random_block(1, BB))]) == 0
            import time
            time.sleep(0.6)                       # the probe retries meanwhile; no second WARNING
        finally:
            t.close()
    assert st.state == "auth_failed" and st.auth_failures >= 1, st
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "credentials" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    g = remote_gauges(st.as_dict())
    assert g["remote_auth_failed"] == 1.0 and g["remote_up"] == 0.0
    secrets_absent(repr(st), str(st.as_dict()), repr(g), *[r.getMessage() for r in caplog.records],
                   repr(parse_remote_url(url)), parse_remote_url(url).redacted())


def test_acl_user_without_the_commands_is_auth_failed(locked_redis):
    t = tier_for(f"redis://reader:{quote(PASSWORD, safe='')}@{HOST}:{locked_redis.port}")
    try:
        st = wait_state(t, "auth_failed")
        assert st.state == "auth_failed", st
        secrets_absent(repr(st))
    finally:
        t.close()


@pytest.mark.parametrize("encode", [True, False], ids=["percent-encoded", "raw"])
def test_right_password_and_acl_user_work(locked_redis, encode):
    pw = quote(PASSWORD, safe="") if encode else PASSWORD
    for user in ("", "kv"):
        t = tier_for(f"redis://{user}:{pw}@{HOST}:{locked_redis.port}")
        try:
            assert t.wait_ready(10), t.stats()
            assert t.publish([key(2)], [memoryview(random_block(2, BB))]) == 1
            out = np.zeros(BB, np.uint8)
            assert t.fetch([key(2)], [memoryview(out)]) == [True]
            assert (out == random_block(2, BB)).all()
        finally:
            t.close()


def test_password_from_the_environment(locked_redis):
    s = parse_remote_url(f"redis://{HOST}:{locked_redis.port}", env={"KVTIER_REMOTE_PASSWORD": PASSWORD})
    assert s.password == PASSWORD
    secrets_absent(repr(s), s.redacted())


@pytest.mark.parametrize("bad", ["redis://u:{pw}@host:notaport", "redis://u:{pw}@h:1/notadb",
                                 "redis://u:{pw}@h:1?timeout=x", "redis://u:{pw}@h:1?deadline=0",
                                 "redis://u:{pw}@h:1?batch_mb=x", "nope://u:{pw}@h:1"])
def test_url_errors_never_echo_the_password(bad):
    for pw in (PASSWORD, quote(PASSWORD, safe="")):
        with pytest.raises(BadRemoteURL) as ei:
            parse_remote_url(bad.format(pw=pw), env={})
        secrets_absent(str(ei.value))
    with pytest.raises(ValueError) as ei:
        StoreConfig(root="/nonexistent-kvtier", remote_url=bad.format(pw=PASSWORD))
    secrets_absent(str(ei.value))


# ---------------------------------------------------------------- TLS
def _self_signed(tmp):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress
    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(k, hashes.SHA256()))
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return tmp / "cert.pem", tmp / "key.pem"


def test_rediss_with_a_self_signed_certificate(tmp_path):
    if redis_binary() is None:
        pytest.skip("redis-server not found")
    cert, keyf = _self_signed(tmp_path)
    port = free_port()
    srv = RedisServer(tmp_path / "tls", port=free_port(), extra=(
        "--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(keyf),
        "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no", "--requirepass", PASSWORD)).start()
    try:
        ok = tier_for(f"rediss://:{quote(PASSWORD, safe='')}@{HOST}:{port}?tls_ca={cert}")
        untrusted = tier_for(f"rediss://:{quote(PASSWORD, safe='')}@{HOST}:{port}")   # CA not given
        try:
            assert ok.wait_ready(10), ok.stats()
            assert ok.publish([key(3)], [memoryview(random_block(3, BB))]) == 1
            out = np.zeros(BB, np.uint8)
            assert ok.fetch([key(3)], [memoryview(out)]) == [True] and (out == random_block(3, BB)).all()
            assert not untrusted.wait_ready(1.5)       # an unverifiable certificate is never trusted
            assert untrusted.stats().state != "up"
            secrets_absent(repr(ok.stats()), repr(untrusted.stats()))
        finally:
            ok.close()
            untrusted.close()
    finally:
        srv.stop()
