"""minisign's key and signature formats, and Ed25519 signing and verifying in them. No I/O.

Byte layouts follow minisign 0.11/0.12 (src/minisign.h); every field is base64 on one line
after an ``untrusted comment:`` line:

* public key: ``"Ed"`` | key id (8) | Ed25519 public key (32)
* secret key: ``"Ed"`` | kdf ``"Sc"`` or ``"\\0\\0"`` (none, ``minisign -W``) | ``"B2"`` |
  salt (32) | opslimit (8, LE) | memlimit (8, LE) | key id (8) | seed + public key (64) |
  checksum (32, BLAKE2b-256 of ``"Ed"`` | key id | seed + public key; zeros from ``-W``)
* signature: ``"ED"`` (message prehashed with BLAKE2b-512, minisign's default) or ``"Ed"``
  (legacy: the raw message) | key id (8) | signature (64); then ``trusted comment: TEXT`` and
  the global signature (64) over signature | TEXT.

Only unencrypted secret keys are read and written: minisign's scrypt parameters are libsodium's
(``crypto_pwhash_scryptsalsa208sha256``), and a key the build holds has no one to type a password.
The key id shown by minisign is the 8 bytes read as a little-endian integer, in upper-case hex.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ironclawd.errors import MinisignFormatError, SignatureMismatch

ALG = b"Ed"
ALG_PREHASHED = b"ED"
KDF_NONE = b"\0\0"
KDF_SCRYPT = b"Sc"
CHK_ALG = b"B2"
COMMENT_PREFIX = "untrusted comment: "
TRUSTED_PREFIX = "trusted comment: "
SIGNATURE_COMMENT = "signature from minisign secret key"
SECRET_KEY_COMMENT = "minisign encrypted secret key"  # noqa: S105 - minisign writes it, even with -W
SIG_SUFFIX = ".minisig"
KEY_ID_BYTES = 8
# minisign's buffers: COMMENTMAXBYTES and TRUSTEDCOMMENTMAXBYTES less prefix and newline.
MAX_COMMENT = 1024 - len(COMMENT_PREFIX) - 2
MAX_TRUSTED_COMMENT = 8192 - len(TRUSTED_PREFIX) - 2
_PUBLIC_LEN = 2 + KEY_ID_BYTES + 32
_SECRET_LEN = 2 + 2 + 2 + 32 + 8 + 8 + KEY_ID_BYTES + 64 + 32
_SIG_LEN = 2 + KEY_ID_BYTES + 64


def key_id_hex(key_id: bytes) -> str:
    """The key id as minisign prints it (``%016PRIX64`` of the little-endian integer)."""
    return f"{int.from_bytes(key_id, 'little'):016X}"


@dataclass(frozen=True)
class PublicKey:
    key_id: bytes
    key: bytes

    def __post_init__(self) -> None:
        _need_len("public key id", self.key_id, KEY_ID_BYTES)
        _need_len("public key", self.key, 32)

    @property
    def id_hex(self) -> str:
        return key_id_hex(self.key_id)

    def to_base64(self) -> str:
        """The one-line form ``minisign -P`` takes."""
        return base64.b64encode(ALG + self.key_id + self.key).decode("ascii")

    def to_file(self) -> str:
        """The public key file minisign -G writes."""
        return f"{COMMENT_PREFIX}minisign public key {self.id_hex}\n{self.to_base64()}\n"


@dataclass(frozen=True)
class SecretKey:
    key_id: bytes
    seed: bytes = field(repr=False)
    public: bytes

    def __post_init__(self) -> None:
        _need_len("secret key id", self.key_id, KEY_ID_BYTES)
        _need_len("secret key seed", self.seed, 32)
        _need_len("secret key's public half", self.public, 32)
        derived = _private(self.seed).public_key().public_bytes_raw()
        if not hmac.compare_digest(derived, self.public):
            raise MinisignFormatError(
                "reading minisign secret key: the stored public half does not belong to the seed"
            )

    def public_key(self) -> PublicKey:
        return PublicKey(self.key_id, self.public)

    def to_file(self, comment: str = SECRET_KEY_COMMENT) -> str:
        """The unencrypted secret key file, byte for byte what ``minisign -G -W`` writes."""
        _check_comment("untrusted comment", comment, MAX_COMMENT)
        raw = ALG + KDF_NONE + CHK_ALG + bytes(32 + 8 + 8) + self.key_id + self.seed + self.public
        return f"{COMMENT_PREFIX}{comment}\n{base64.b64encode(raw + bytes(32)).decode()}\n"


@dataclass(frozen=True)
class Signature:
    algorithm: bytes  # ALG_PREHASHED or ALG (legacy)
    key_id: bytes
    signature: bytes
    trusted_comment: str
    global_signature: bytes
    untrusted_comment: str = SIGNATURE_COMMENT

    def __post_init__(self) -> None:
        if self.algorithm not in (ALG, ALG_PREHASHED):
            raise MinisignFormatError(
                f"reading minisign signature: algorithm {self.algorithm!r}: expected 'ED' "
                "(prehashed) or 'Ed' (legacy)"
            )
        _need_len("signature key id", self.key_id, KEY_ID_BYTES)
        _need_len("signature", self.signature, 64)
        _need_len("global signature", self.global_signature, 64)
        _check_comment("trusted comment", self.trusted_comment, MAX_TRUSTED_COMMENT)
        _check_comment("untrusted comment", self.untrusted_comment, MAX_COMMENT)

    @property
    def prehashed(self) -> bool:
        return self.algorithm == ALG_PREHASHED

    def to_file(self) -> str:
        """The ``.minisig`` file text."""
        line = base64.b64encode(self.algorithm + self.key_id + self.signature).decode()
        return (
            f"{COMMENT_PREFIX}{self.untrusted_comment}\n{line}\n"
            f"{TRUSTED_PREFIX}{self.trusted_comment}\n"
            f"{base64.b64encode(self.global_signature).decode()}\n"
        )


def generate_key(seed: bytes | None = None, key_id: bytes | None = None) -> SecretKey:
    """A new key pair; random unless ``seed`` and ``key_id`` are given (tests, known answers)."""
    seed = os.urandom(32) if seed is None else seed
    key_id = os.urandom(KEY_ID_BYTES) if key_id is None else key_id
    _need_len("secret key seed", seed, 32)
    return SecretKey(key_id, seed, _private(seed).public_key().public_bytes_raw())


def parse_public_key(text: str) -> PublicKey:
    """A public key file (comment line + base64 line) or the bare base64 line of ``-P``."""
    lines = _lines(text)
    if len(lines) == 1 and not lines[0].startswith(COMMENT_PREFIX):
        line = lines[0]
    elif len(lines) == 2 and lines[0].startswith(COMMENT_PREFIX):
        line = lines[1]
    else:
        raise MinisignFormatError(
            f"reading minisign public key: expected an '{COMMENT_PREFIX}…' line and a base64 "
            f"line (or the base64 line alone), got {len(lines)} lines"
        )
    raw = _b64("public key", line, _PUBLIC_LEN)
    if raw[:2] != ALG:
        raise MinisignFormatError(
            f"reading minisign public key: algorithm {raw[:2]!r}: expected 'Ed'"
        )
    return PublicKey(raw[2:10], raw[10:])


def parse_secret_key(text: str) -> SecretKey:
    """An unencrypted (``minisign -G -W``) secret key file."""
    lines = _lines(text)
    if len(lines) != 2 or not lines[0].startswith(COMMENT_PREFIX):
        raise MinisignFormatError(
            f"reading minisign secret key: expected an '{COMMENT_PREFIX}…' line and a base64 "
            f"line, got {len(lines)} lines"
        )
    raw = _b64("secret key", lines[1], _SECRET_LEN)
    alg, kdf, chk_alg = raw[0:2], raw[2:4], raw[4:6]
    key_id, seed, public, checksum = raw[54:62], raw[62:94], raw[94:126], raw[126:158]
    if alg != ALG or chk_alg != CHK_ALG:
        raise MinisignFormatError(
            f"reading minisign secret key: algorithms {alg!r}/{chk_alg!r}: expected 'Ed'/'B2'"
        )
    if kdf == KDF_SCRYPT:
        raise MinisignFormatError(
            "reading minisign secret key: it is password-protected (scrypt); expected an "
            "unencrypted key (minisign -G -W, or minisign -C -W to remove the password)"
        )
    if kdf != KDF_NONE:
        raise MinisignFormatError(f"reading minisign secret key: unknown kdf {kdf!r}")
    # minisign -W leaves the checksum zero; any other value must be right.
    if checksum != bytes(32) and not hmac.compare_digest(checksum, _checksum(key_id, raw[62:126])):
        raise MinisignFormatError("reading minisign secret key: checksum does not match")
    return SecretKey(key_id, seed, public)


def parse_signature(text: str) -> Signature:
    """A ``.minisig`` file: untrusted comment, signature, trusted comment, global signature."""
    lines = _lines(text)
    if len(lines) != 4:
        raise MinisignFormatError(
            f"reading minisign signature: expected 4 lines (untrusted comment, signature, "
            f"trusted comment, global signature), got {len(lines)}"
        )
    for index, prefix in ((0, COMMENT_PREFIX), (2, TRUSTED_PREFIX)):
        if not lines[index].startswith(prefix):
            raise MinisignFormatError(
                f"reading minisign signature: line {index + 1} should start with {prefix!r}"
            )
    raw = _b64("signature", lines[1], _SIG_LEN)
    return Signature(
        algorithm=raw[:2],
        key_id=raw[2:10],
        signature=raw[10:],
        trusted_comment=lines[2][len(TRUSTED_PREFIX) :],
        global_signature=_b64("global signature", lines[3], 64),
        untrusted_comment=lines[0][len(COMMENT_PREFIX) :],
    )


def sign(
    key: SecretKey,
    message: bytes,
    trusted_comment: str,
    untrusted_comment: str = SIGNATURE_COMMENT,
) -> Signature:
    """A prehashed ("ED") signature of ``message``, as ``minisign -S`` makes by default."""
    _check_comment("trusted comment", trusted_comment, MAX_TRUSTED_COMMENT)
    private = _private(key.seed)
    signature = private.sign(_prehash(message))
    return Signature(
        algorithm=ALG_PREHASHED,
        key_id=key.key_id,
        signature=signature,
        trusted_comment=trusted_comment,
        global_signature=private.sign(signature + trusted_comment.encode()),
        untrusted_comment=untrusted_comment,
    )


def verify(key: PublicKey, message: bytes, signature: Signature, allow_legacy: bool = True) -> str:
    """Check ``signature`` over ``message`` and its trusted comment; return the trusted comment.

    Raises SignatureMismatch naming what failed: the key id, the signature, or the comment's."""
    if not hmac.compare_digest(signature.key_id, key.key_id):
        raise SignatureMismatch(
            f"verifying minisign signature: made by key {key_id_hex(signature.key_id)}, "
            f"expected the trusted key {key.id_hex}"
        )
    if not signature.prehashed and not allow_legacy:
        raise SignatureMismatch(
            "verifying minisign signature: legacy (not prehashed) signature refused"
        )
    public = Ed25519PublicKey.from_public_bytes(key.key)
    signed = _prehash(message) if signature.prehashed else message
    try:
        public.verify(signature.signature, signed)
    except InvalidSignature:
        raise SignatureMismatch(
            f"verifying minisign signature: the file does not match its signature by key "
            f"{key.id_hex} (changed after signing?)"
        ) from None
    try:
        public.verify(
            signature.global_signature, signature.signature + signature.trusted_comment.encode()
        )
    except InvalidSignature:
        raise SignatureMismatch(
            "verifying minisign signature: the trusted comment does not match its signature"
        ) from None
    return signature.trusted_comment


def _private(seed: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(seed)


def _prehash(message: bytes) -> bytes:
    return hashlib.blake2b(message, digest_size=64).digest()


def _checksum(key_id: bytes, secret: bytes) -> bytes:
    return hashlib.blake2b(ALG + key_id + secret, digest_size=32).digest()


def _lines(text: str) -> list[str]:
    """Lines as minisign's fgets+trim reads them: one trailing CR dropped; blank tail ignored."""
    lines = text.split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _b64(what: str, line: str, length: int) -> bytes:
    try:
        raw = base64.b64decode(line.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MinisignFormatError(f"reading minisign {what}: not base64: {exc}") from None
    if len(raw) != length:
        raise MinisignFormatError(
            f"reading minisign {what}: {len(raw)} bytes after base64, expected {length}"
        )
    return raw


def _need_len(what: str, value: bytes, length: int) -> None:
    if len(value) != length:
        raise MinisignFormatError(f"minisign {what}: {len(value)} bytes, expected {length}")


def _check_comment(what: str, text: str, limit: int) -> None:
    """minisign's is_printable: tab, or no C0/DEL/C1 control character; and no CR/LF."""
    bad = next((c for c in text if c != "\t" and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F)), None)
    if bad is not None:
        raise MinisignFormatError(f"minisign {what}: control character {bad!r} is not allowed")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise MinisignFormatError(f"minisign {what}: lone surrogate is not valid UTF-8")
    if len(text.encode()) > limit:
        raise MinisignFormatError(f"minisign {what}: longer than {limit} bytes")
