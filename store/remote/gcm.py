"""AES-256-GCM for remote values: a tag over a header and a payload, or the value encrypted.

Three operations under one 32-byte key, each with a 12-byte nonce the caller
never repeats under that key::

    tag(nonce, header, payload)        -> 16-byte tag; aad = payload, plaintext = header
                                          (the header's ciphertext is dropped: a GMAC)
    encrypt(nonce, aad, srcs, dsts)    -> 16-byte tag; the buffers srcs, as one stream,
                                          encrypted into dsts (same lengths)
    decrypt(nonce, aad, bufs, tag)     -> bool; bufs decrypted in place, True iff the
                                          tag holds (else they hold garbage: discard them)

All three run in ``cryptography`` (OpenSSL): ``tag`` in one ``AESGCM`` call,
``encrypt`` / ``decrypt`` through the streaming ``Cipher`` interface, whose
``update_into`` writes each buffer's output straight into its destination,
so neither joins a payload.  ``decrypt`` works in place where the library
allows it (``cryptography`` 43 to 50); from 51 on ``update_into`` refuses
overlapping buffers, and each buffer is decrypted in 256 KiB slices through
a per-thread bounce buffer, then copied back (one memcpy of the payload, in
cache: +20 % on a decrypt, ``python -m kvtier.bench.gcm_bench``; the tier's
put/get cost with it is in docs/reliability.md).  Which of the two runs is found
once, at import, by trying an in-place decrypt of one block.

These calls hold the GIL while they run (~50 us for a 1 MiB tag, ~100 us to
encrypt 1 MiB, one core here).  libcrypto through ``ctypes`` (which drops
the GIL) was measured too and used more CPU: the system's OpenSSL 3.0 GHASH
is ~3x slower than the OpenSSL that ``cryptography`` bundles.

Raises ``ValueError`` for a key that is not 32 bytes, a nonce not 12, or
buffers of unequal lengths.  Threading: thread-safe (``AESGCM`` is
stateless per call; a ``Cipher`` context is made per call).
"""
from __future__ import annotations

import hmac
import threading

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
BOUNCE_BYTES = 256 << 10


def _bytes(buf) -> memoryview:
    mv = memoryview(buf)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def in_place_allowed() -> bool:
    """Whether this ``cryptography`` decrypts a GCM buffer into itself (it
    refuses overlapping buffers from 51 on, with ``ValueError``)."""
    d = Cipher(algorithms.AES(bytes(32)), modes.GCM(bytes(12), bytes(TAG_BYTES))).decryptor()
    buf = bytearray(16)
    try:
        d.update_into(buf, buf)
    except ValueError:
        return False
    return True


class _InPlace:
    """Decrypts each buffer into itself (no copy)."""

    def __call__(self, d, mv: memoryview) -> None:
        d.update_into(mv, mv)


class _Bounced:
    """Decrypts each buffer slice by slice into a per-thread bounce buffer and
    copies the slice back (for a ``cryptography`` that refuses in place)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _bounce(self) -> memoryview:
        mv = getattr(self._local, "buf", None)
        if mv is None:
            mv = self._local.buf = memoryview(bytearray(BOUNCE_BYTES))
        return mv

    def __call__(self, d, mv: memoryview) -> None:
        out = self._bounce()
        for off in range(0, mv.nbytes, BOUNCE_BYTES):
            part = mv[off:off + BOUNCE_BYTES]
            n = d.update_into(part, out)
            part[:n] = out[:n]


def decrypt_step(in_place: bool | None = None) -> "_InPlace | _Bounced":
    """How ``Gcm.decrypt`` turns each buffer into plaintext: in place where the
    library allows it (``in_place=None``: ask it), else through a bounce buffer."""
    return _InPlace() if (in_place_allowed() if in_place is None else in_place) else _Bounced()


_STEP = decrypt_step()


class Gcm:
    """AES-256-GCM under one key (see the module docstring)."""

    def __init__(self, key: bytes, step: "_InPlace | _Bounced | None" = None) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"AES-256-GCM keys are {KEY_BYTES} bytes, got {len(key)}")
        self._aead = AESGCM(bytes(key))
        self._alg = algorithms.AES(bytes(key))
        self._step = _STEP if step is None else step

    def __repr__(self) -> str:
        return "Gcm()"

    @staticmethod
    def _nonce(nonce: bytes) -> bytes:
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"nonces here are {NONCE_BYTES} bytes, got {len(nonce)}")
        return bytes(nonce)

    def tag(self, nonce: bytes, header, payload) -> bytes:
        return self._aead.encrypt(self._nonce(nonce), bytes(header), payload)[-TAG_BYTES:]

    def encrypt(self, nonce: bytes, aad, srcs, dsts) -> bytes:
        ins, outs = [_bytes(s) for s in srcs], [_bytes(d) for d in dsts]
        if len(ins) != len(outs) or any(i.nbytes != o.nbytes for i, o in zip(ins, outs)):
            raise ValueError("encrypt: every output buffer must be as long as its input")
        e = Cipher(self._alg, modes.GCM(self._nonce(nonce))).encryptor()
        if aad:
            e.authenticate_additional_data(bytes(aad))
        for i, o in zip(ins, outs):
            e.update_into(i, o)
        e.finalize()
        return e.tag

    def decrypt(self, nonce: bytes, aad, bufs, tag: bytes) -> bool:
        if len(tag) != TAG_BYTES:
            return False
        d = Cipher(self._alg, modes.GCM(self._nonce(nonce), bytes(tag))).decryptor()
        if aad:
            d.authenticate_additional_data(bytes(aad))
        for b in bufs:
            self._step(d, _bytes(b))
        try:
            d.finalize()
        except InvalidTag:
            return False
        return True


def gcm(key: bytes) -> Gcm:
    """The AES-256-GCM of ``key``.  Raises ``ValueError`` (not 32 bytes)."""
    return Gcm(key)


def tags_equal(a: bytes, b: bytes) -> bool:
    """Constant-time comparison of two tags."""
    return hmac.compare_digest(a, b)
