"""Who a remote value may come from: a per-domain secret key, or nobody checked.

A shared tier is written by every client of its server.  With a key, a
value is *sealed*: a keyed MAC over its record header and its payload rides
behind the header, and a value whose MAC does not verify is a miss (and is
deleted).  Names derive from the key as well, so a client without it can
neither forge a value nor find one::

    value (keyed)   = record header (112) | seal (32) | payload
    seal            = b"KVTM" | nonce (12) | tag (16)
    tag             = AES-256-GCM(mac key, nonce, plaintext=header, aad=payload).tag
    mac key, name salt, domain tag = BLAKE2b(domain, key=BLAKE2b(secret))  (distinct persons)

The tag is GMAC (NIST SP 800-38D) over the payload and the header: one AES
pass over 112 bytes plus GHASH over the payload, measured at ~19 GB/s on
one core (keyed BLAKE2b: 0.8, keyed BLAKE3: 6, HMAC-SHA256: 1.7).  GCM
needs a nonce that never repeats under one key: each ``Sealer`` draws a
random 64-bit prefix and counts the low 32 bits, drawing a new prefix when
the count wraps (two writers collide only if they draw the same 64-bit
prefix).  Verification recomputes the tag from the header received and
compares in constant time; a forger without the key cannot make a tag
verify for a header or payload it changed.

Without a key (``Unsealed``) values carry no seal and are checked with the
header's unkeyed xxh3: the tier trusts every client of its server, and says
so once when it starts (tier.py).

Key material: ``StoreConfig.remote_key`` (str or bytes), else the file
``StoreConfig.remote_key_file``, else ``KVTIER_REMOTE_KEY`` /
``KVTIER_REMOTE_KEY_FILE`` (read once, in :func:`load_key`).  Any length of
at least 16 bytes; it is hashed, never stored, logged or shown in a repr.

Threading: a ``Sealer`` is thread-safe (its counter is guarded by a lock;
the AES object is stateless per call).
"""
from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import secrets
import threading
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import StoreError

SEAL_MAGIC = b"KVTM"
SEAL_BYTES = 32
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

    __slots__ = ("salt", "tag", "mac_key", "keyed")

    def __init__(self, secret: bytes | None, domain: str) -> None:
        d = domain.encode()
        self.keyed = secret is not None
        if secret is None:
            self.salt = hashlib.blake2b(d, digest_size=32, person=b"kvtier.salt").digest()
            self.tag = hashlib.blake2b(d, digest_size=8, person=b"kvtier.domain").digest()
            self.mac_key = None
            return
        root = hashlib.blake2b(secret, digest_size=32, person=b"kvtier.root").digest()
        self.salt = hashlib.blake2b(d, key=root, digest_size=32, person=b"kvtier.salt").digest()
        self.tag = hashlib.blake2b(d, key=root, digest_size=8, person=b"kvtier.domain").digest()
        self.mac_key = hashlib.blake2b(d, key=root, digest_size=32, person=b"kvtier.mac").digest()

    def __repr__(self) -> str:
        return f"DomainKeys(keyed={self.keyed})"

    def sealer(self) -> "Sealer | Unsealed":
        return Sealer(self.mac_key) if self.keyed else Unsealed()


class Unsealed:
    """No key: values carry no seal; ``open`` accepts what the xxh3 accepts."""

    seal_bytes = 0
    keyed = False

    def seal(self, header: bytes, payload) -> bytes:
        return b""

    def open(self, header, seal, payload) -> bool:
        return True


class Sealer:
    """Seals and opens values with one MAC key (see the module docstring)."""

    seal_bytes = SEAL_BYTES
    keyed = True

    def __init__(self, mac_key: bytes) -> None:
        self._aead = AESGCM(mac_key)
        self._lock = threading.Lock()
        self._new_prefix()

    def __repr__(self) -> str:
        return "Sealer()"

    def _new_prefix(self) -> None:
        self._prefix = secrets.token_bytes(8)
        self._count = itertools.count()

    def _nonce(self) -> bytes:
        with self._lock:
            n = next(self._count)
            if n >= 1 << 32:
                self._new_prefix()
                n = next(self._count)
            return self._prefix + n.to_bytes(4, "little")

    def _tag(self, nonce: bytes, header, payload) -> bytes:
        return self._aead.encrypt(nonce, bytes(header), payload)[-16:]

    def seal(self, header: bytes, payload) -> bytes:
        """The 32-byte seal of ``header`` + ``payload`` (a fresh nonce)."""
        nonce = self._nonce()
        return SEAL_MAGIC + nonce + self._tag(nonce, header, payload)

    def open(self, header, seal, payload) -> bool:
        """True iff ``seal`` is this key's seal of exactly ``header`` + ``payload``."""
        s = bytes(seal)
        if len(s) != SEAL_BYTES or s[:4] != SEAL_MAGIC:
            return False
        return hmac.compare_digest(self._tag(s[4:16], header, payload), s[16:])
