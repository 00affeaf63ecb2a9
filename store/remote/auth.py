"""Who a remote value may come from: a per-domain secret key, or nobody checked.

A shared tier is written by every client of its server.  With a key, a
value is *sealed*: an AES-256-GCM tag over its record header and its
payload rides behind the header, and a value whose tag does not verify is a
miss (and is deleted).  Names derive from the key as well, so a client
without it can neither forge a value nor find one.  Two forms, told apart
by the seal's magic; a keyed reader opens both, and its setting chooses
only the form it writes::

    authenticated (Sealer)    = header (112) | b"KVTM" nonce (12) tag (16) | payload
        tag = GMAC: AES-256-GCM(mac key, nonce, aad=payload, plaintext=header).tag
    encrypted (Encrypter)     = E(header) (112) | b"KVTE" nonce (12) tag (16) | E(payload)
        E, tag = AES-256-GCM(enc key, nonce, aad=b"KVTE", plaintext=header + payload)

    mac key, enc key, name salt, domain tag = BLAKE2b(domain, key=BLAKE2b(secret))
                                              (distinct persons: independent keys)

The GMAC is one AES pass over 112 bytes plus GHASH over the payload, ~20
GB/s on one core here (keyed BLAKE2b: 0.8, keyed BLAKE3: 6, HMAC-SHA256:
1.7); a keyed value's header carries no payload xxh3 (0): the tag covers
the payload.  The encrypted form hides the payload and the header (the
block key) from a client without the key; only the length, the magic,
nonce and tag are in clear.  Its cost, measured: docs/reliability.md.

GCM needs a nonce that never repeats under one key: each sealer draws a
random 64-bit prefix and counts the low 32 bits, drawing a new prefix when
the count wraps (two writers collide only if they draw the same 64-bit
prefix).  Verification recomputes the tag and compares in constant time
(decryption checks it in OpenSSL); a forger without the key cannot make a
tag verify for a header or payload it changed.

Without a key (``Unsealed``) values carry no seal and are checked with the
header's unkeyed xxh3: the tier trusts every client of its server, and says
so once when it starts (tier.py).

Key material: ``StoreConfig.remote_key`` (str or bytes), else the file
``StoreConfig.remote_key_file``, else ``KVTIER_REMOTE_KEY`` /
``KVTIER_REMOTE_KEY_FILE`` (read once, in :func:`load_key`).  Any length of
at least 16 bytes; it is hashed, never stored, logged or shown in a repr.
Encryption: ``StoreConfig.remote_encrypt``, else ``KVTIER_REMOTE_ENCRYPT``
(:func:`load_encrypt`); it needs a key.

The sealer interface (``Unsealed``, ``Sealer``, ``Encrypter``):
``payload_sum(payload, known)`` -- the xxh3 the header carries;
``seal(header, payload, body)`` -- the bytes sent before the body (the
body is the payload itself, or, for ``Encrypter``, a staging buffer it
fills with the ciphertext: ``stages`` is True); ``open(check, key, head,
body)`` -- the whole verification of a value read into ``head`` and
``body`` (an encrypted one is decrypted in place; False leaves garbage
the caller must discard); ``hashes_beside`` -- whether a helper thread may
seal one part while the socket thread sends the previous one (the hash
drops the GIL), or each value is sealed on the sending thread right
before it is sent (``Sealer``: measured, a GIL-holding helper stalls
the sender).

Threading: sealers are thread-safe (the nonce counter is guarded by a
lock; the AES contexts are per call or per thread, gcm.py).
"""
from __future__ import annotations

import hashlib
import itertools
import os
import secrets
import threading
from pathlib import Path

from .. import record
from ..errors import StoreError
from .gcm import TAG_BYTES, gcm, tags_equal

MAC_MAGIC = b"KVTM"
ENC_MAGIC = b"KVTE"
SEAL_BYTES = 4 + 12 + TAG_BYTES
RECORD = record.HEADER_BYTES
MIN_KEY_BYTES = 16


class BadRemoteKey(StoreError, ValueError):
    """The remote key is too short or its file cannot be read (never shows the key)."""


def load_key(key: str | bytes | None = None, key_file: str | os.PathLike | None = None,
             env: dict | None = None) -> bytes | None:
    """The secret's bytes from the first source set: ``key``, ``key_file``,
    ``KVTIER_REMOTE_KEY``, ``KVTIER_REMOTE_KEY_FILE``; None when none is.
    A key file's trailing newline is not part of the key.

    Raises:
        BadRemoteKey: shorter than 16 bytes, or an unreadable key file.
    """
    env = os.environ if env is None else env
    if key is None and key_file is None:
        key = env.get("KVTIER_REMOTE_KEY") or None
        key_file = env.get("KVTIER_REMOTE_KEY_FILE") or None
    if key is None and key_file is not None:
        try:
            key = Path(key_file).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise BadRemoteKey(f"remote key file {os.fspath(key_file)!r} cannot be read: "
                               f"{exc.strerror or type(exc).__name__}") from None
    if key is None:
        return None
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if len(raw) < MIN_KEY_BYTES:
        raise BadRemoteKey(f"the remote key must be at least {MIN_KEY_BYTES} bytes, got {len(raw)}")
    return raw


class DomainKeys:
    """The name salt, header tag and MAC key of one (secret, domain) pair.
    Without a secret the salt and tag depend on the domain only (as before keys)."""

    __slots__ = ("salt", "tag", "mac_key", "enc_key", "keyed")

    def __init__(self, secret: bytes | None, domain: str) -> None:
        d = domain.encode()
        self.keyed = secret is not None
        if secret is None:
            self.salt = hashlib.blake2b(d, digest_size=32, person=b"kvtier.salt").digest()
            self.tag = hashlib.blake2b(d, digest_size=8, person=b"kvtier.domain").digest()
            self.mac_key = self.enc_key = None
            return
        root = hashlib.blake2b(secret, digest_size=32, person=b"kvtier.root").digest()
        self.salt = hashlib.blake2b(d, key=root, digest_size=32, person=b"kvtier.salt").digest()
        self.tag = hashlib.blake2b(d, key=root, digest_size=8, person=b"kvtier.domain").digest()
        self.mac_key = hashlib.blake2b(d, key=root, digest_size=32, person=b"kvtier.mac").digest()
        self.enc_key = hashlib.blake2b(d, key=root, digest_size=32, person=b"kvtier.enc").digest()

    def __repr__(self) -> str:
        return f"DomainKeys(keyed={self.keyed})"

    def sealer(self, encrypt: bool = False) -> "Unsealed | Sealer | Encrypter":
        """The sealer of these keys: ``Encrypter`` with ``encrypt``, ``Sealer`` with a key,
        else ``Unsealed``.  Raises ``BadRemoteKey`` for ``encrypt`` without a key."""
        if encrypt and not self.keyed:
            raise BadRemoteKey("remote encryption needs a key (StoreConfig.remote_key / remote_key_file, "
                               "KVTIER_REMOTE_KEY / KVTIER_REMOTE_KEY_FILE)")
        if not self.keyed:
            return Unsealed()
        return Encrypter(self) if encrypt else Sealer(self)


class Unsealed:
    """No key: values carry no seal; ``open`` checks the header and the payload's xxh3."""

    seal_bytes = 0
    keyed = False
    stages = False
    hashes_beside = True       # xxh3 drops the GIL: a helper thread hashes beside the socket

    def __repr__(self) -> str:
        return "Unsealed()"

    def payload_sum(self, payload, known: int | None) -> int:
        return record.payload_checksum(payload) if known is None else known

    def seal(self, header: bytes, payload, body) -> bytes:
        return header

    def open(self, check, key: bytes, head, body) -> bool:
        want = check.payload_sum(key, head)
        return want is not None and record.payload_checksum(body) == want


class _Nonces:
    """96-bit nonces that never repeat within one process: a random 64-bit
    prefix and a 32-bit counter (a new prefix when it wraps)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._new_prefix()

    def _new_prefix(self) -> None:
        self._prefix = secrets.token_bytes(8)
        self._count = itertools.count()

    def next(self) -> bytes:
        with self._lock:
            n = next(self._count)
            if n >= 1 << 32:
                self._new_prefix()
                n = next(self._count)
            return self._prefix + n.to_bytes(4, "little")


class Sealer:
    """Writes authenticated values (``KVTM``); opens both forms (see the module docstring)."""

    seal_bytes = SEAL_BYTES
    keyed = True
    stages = False
    hashes_beside = False      # AES-GCM holds the GIL: seal between sends, not on a helper thread

    def __init__(self, keys: DomainKeys) -> None:
        self._mac = gcm(keys.mac_key)
        self._enc = gcm(keys.enc_key)
        self._nonces = _Nonces()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def payload_sum(self, payload, known: int | None) -> int:
        return 0                                 # the tag covers the payload

    def seal(self, header: bytes, payload, body) -> bytes:
        """``header`` + its 32-byte seal over ``header`` and ``payload`` (a fresh nonce)."""
        nonce = self._nonces.next()
        return header + MAC_MAGIC + nonce + self._mac.tag(nonce, header, payload)

    def open(self, check, key: bytes, head, body) -> bool:
        """True iff ``head`` + ``body`` is a value of ``key`` sealed (or encrypted) with
        this domain's key; an encrypted one is left decrypted in place."""
        s = bytes(head[RECORD:RECORD + SEAL_BYTES])
        if len(s) != SEAL_BYTES:
            return False
        nonce, tag = s[4:16], s[16:]
        if s[:4] == MAC_MAGIC:
            return (check.payload_sum(key, head) is not None
                    and tags_equal(self._mac.tag(nonce, head[:RECORD], body), tag))
        if s[:4] == ENC_MAGIC:
            return (self._enc.decrypt(nonce, ENC_MAGIC, [head[:RECORD], body], tag)
                    and check.payload_sum(key, head) is not None)
        return False


class Encrypter(Sealer):
    """Writes encrypted values (``KVTE``): ``seal`` fills ``body`` (a staging
    buffer, not the caller's payload) with the payload's ciphertext."""

    stages = True

    def seal(self, header: bytes, payload, body) -> bytes:
        nonce = self._nonces.next()
        out = bytearray(len(header))
        tag = self._enc.encrypt(nonce, ENC_MAGIC, [header, payload], [out, body])
        return bytes(out) + ENC_MAGIC + nonce + tag


def load_encrypt(flag: bool | None = None, env: dict | None = None) -> bool:
    """Whether the tier writes encrypted values: ``flag`` when not None, else
    ``KVTIER_REMOTE_ENCRYPT`` (1/true/yes/on, 0/false/no/off or empty).

    Raises:
        ValueError: any other value of the variable.
    """
    if flag is not None:
        return bool(flag)
    env = os.environ if env is None else env
    v = env.get("KVTIER_REMOTE_ENCRYPT", "").strip().lower()
    if v in ("", "0", "false", "no", "off"):
        return False
    if v in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"KVTIER_REMOTE_ENCRYPT={v!r} must be 1 or 0")
