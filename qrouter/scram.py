"""SASL SCRAM-SHA-256 (RFC 7677; the message flow of RFC 5802): users-file records, the
server side (listeners) and the client side (connectors).

A users-file record for SCRAM is ``scram-sha-256$<iterations>$<b64 salt>$<b64 StoredKey>$<b64
ServerKey>``. It serves PLAIN too: SCRAM's SaltedPassword is PBKDF2-HMAC-SHA256(password,
salt, iterations), so a PLAIN password is checked by computing SaltedPassword -> ClientKey ->
StoredKey and comparing. The record holds no password equivalent: StoredKey and ServerKey
let a thief check guesses (at PBKDF2's cost each) and impersonate the *server*, not log in.

An old ``pbkdf2-sha256$...`` record (qrouter/auth.py) holds SaltedPassword itself (the same
PBKDF2 with a 32-byte output), so SCRAM keys are derived from it; `qrouter-tool passwd`
rewrites a user's line in the new form.

Not done: SASLprep of names and passwords (RFC 5802 5.1) -- both are used as UTF-8 as given,
which is the same for ASCII; channel binding (SCRAM-SHA-256-PLUS) is not offered, and a client
that asks for it (gs2 flag ``p``) is refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
SCHEME = "scram-sha-256"
MIN_ITERATIONS = 4096  # RFC 7677 section 4: at least 4096
DEFAULT_ITERATIONS = 200_000  # qrouter-tool passwd's default (one PBKDF2 run: ~50 ms)
# Cyrus SASL's SCRAM client (python-qpid-proton or proton-C built with Cyrus) refuses to compute
# more iterations than this ("iteration-count is too big"): write its users with --iterations
CYRUS_MAX_ITERATIONS = 65_536
MAX_ITERATIONS = 10_000_000  # as qrouter/auth.py: a damaged file or hostile server cannot hang us
MAX_MESSAGE = 2048  # bytes of any SCRAM message we accept (names and nonces are short)
_NONCE_BYTES = 18
_PROCESS_SECRET = os.urandom(32)  # fake salts for unknown users (not revealing who exists)


class ScramError(Exception):
    """A malformed or failed SCRAM exchange; the message says which step, never a secret."""


@dataclass(frozen=True)
class ScramKeys:
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramError(f"bad base64 in {what}") from None


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802 Hi(): PBKDF2-HMAC-SHA256 with a 32-byte output."""
    return hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)


def keys_from_salted(salted: bytes, salt: bytes, iterations: int) -> ScramKeys:
    client_key = _hmac(salted, b"Client Key")
    return ScramKeys(
        iterations, salt, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key")
    )


def make_record(password: str, *, iterations: int = DEFAULT_ITERATIONS) -> str:
    """A new users-file record for `password` (fresh 16-byte salt)."""
    if not password:
        raise ValueError("empty password")
    if not 1 <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be between 1 and {MAX_ITERATIONS}")
    salt = os.urandom(16)
    keys = keys_from_salted(salted_password(password, salt, iterations), salt, iterations)
    return "$".join(
        (SCHEME, str(iterations), _b64(salt), _b64(keys.stored_key), _b64(keys.server_key))
    )


def parse_record(stored: str) -> ScramKeys:
    """The keys of a ``scram-sha-256$`` record; ValueError if it is not a good one."""
    parts = stored.split("$")
    if len(parts) != 5 or parts[0] != SCHEME:
        raise ValueError(f"not a {SCHEME} record")
    if not parts[1].isdigit() or not 1 <= int(parts[1]) <= MAX_ITERATIONS:
        raise ValueError("bad iteration count")
    try:
        salt, stored_key, server_key = (base64.b64decode(p, validate=True) for p in parts[2:])
    except binascii.Error:
        raise ValueError("bad base64 in salt or keys") from None
    if not salt or len(stored_key) != 32 or len(server_key) != 32:
        raise ValueError("bad salt or key length")
    return ScramKeys(int(parts[1]), salt, stored_key, server_key)


def check_plain(password: str, stored: str) -> bool:
    """PLAIN against a SCRAM record: recompute StoredKey, compare in constant time."""
    try:
        keys = parse_record(stored)
        salted = salted_password(password, keys.salt, keys.iterations)
    except (ValueError, UnicodeError, TypeError, AttributeError):
        return False
    return hmac.compare_digest(keys_from_salted(salted, keys.salt, keys.iterations).stored_key,
                               keys.stored_key)  # fmt: skip


def _saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unsaslname(text: str) -> str:
    # RFC 5802 5.1: "=" appears only as =2C or =3D
    out = text.replace("=2C", ",").replace("=3D", "\0")
    if "=" in out:
        raise ScramError("bad user name encoding")
    return out.replace("\0", "=")


def _attributes(message: str, what: str) -> list[tuple[str, str]]:
    pairs = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise ScramError(f"malformed {what}")
        pairs.append((part[0], part[2:]))
    return pairs


def _text(data: bytes | None, what: str) -> str:
    if data is None or len(data) > MAX_MESSAGE:
        raise ScramError(f"{what} missing or longer than {MAX_MESSAGE} bytes")
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError(f"{what} is not UTF-8") from None


class ScramServer:
    """One server-side exchange: `first` answers the client-first-message with a
    server-first-message (the challenge), `final` checks the client-final-message and returns
    (user, server-final-message). Any problem raises ScramError. Costs two HMACs and a hash:
    the PBKDF2 work is the client's."""

    def __init__(self, lookup: Callable[[str], ScramKeys | None], default_iterations: int) -> None:
        self._lookup = lookup
        self._default_iterations = default_iterations
        self._step = 0
        self._user = ""
        self._keys: ScramKeys | None = None
        self._known = False
        self._gs2 = ""
        self._nonce = ""
        self._auth_prefix = ""

    def first(self, data: bytes | None) -> bytes:
        if self._step != 0:
            raise ScramError("client-first-message out of sequence")
        self._step = 1
        message = _text(data, "client-first-message")
        # gs2-header: cbind-flag "," [authzid] ","
        flag, sep1, rest = message.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep1 or not sep2:
            raise ScramError("malformed client-first-message")
        if flag.startswith("p="):
            raise ScramError("channel binding is not offered (no SCRAM-SHA-256-PLUS)")
        if flag not in ("n", "y"):
            raise ScramError("bad gs2 channel-binding flag")
        if authzid and not authzid.startswith("a="):
            raise ScramError("malformed authzid")
        attrs = _attributes(bare, "client-first-message")
        if attrs and attrs[0][0] == "m":
            raise ScramError("mandatory extension not supported")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise ScramError("client-first-message needs n= and r=")
        user = _unsaslname(attrs[0][1])
        if authzid and _unsaslname(authzid[2:]) != user:
            raise ScramError("authorization identity differs from the user")
        client_nonce = attrs[1][1]
        if not user or not client_nonce.isprintable():
            raise ScramError("empty user name or bad nonce")
        self._user = user
        self._gs2 = f"{flag},{authzid},"
        keys = self._lookup(user)
        self._known = keys is not None
        if keys is None:
            # same shape of answer for a user who does not exist; the proof will not match
            salt = _hmac(_PROCESS_SECRET, user.encode("utf-8"))[:16]
            keys = ScramKeys(self._default_iterations, salt, os.urandom(32), os.urandom(32))
        self._keys = keys
        self._nonce = client_nonce + secrets.token_urlsafe(_NONCE_BYTES)
        server_first = f"r={self._nonce},s={_b64(keys.salt)},i={keys.iterations}"
        self._auth_prefix = f"{bare},{server_first},"
        return server_first.encode("ascii")

    @property
    def user(self) -> str:
        return self._user

    def final(self, data: bytes | None) -> tuple[str, bytes]:
        if self._step != 1 or self._keys is None:
            raise ScramError("client-final-message out of sequence")
        self._step = 2
        message = _text(data, "client-final-message")
        without_proof, sep, proof_attr = message.rpartition(",")
        if not sep or not proof_attr.startswith("p="):
            raise ScramError("client-final-message needs p= last")
        attrs = _attributes(without_proof, "client-final-message")
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise ScramError("client-final-message needs c= and r=")
        if _unb64(attrs[0][1], "c=") != self._gs2.encode("utf-8"):
            raise ScramError("channel binding data does not match the gs2 header")
        if not hmac.compare_digest(attrs[1][1].encode(), self._nonce.encode()):
            raise ScramError("nonce does not match")
        proof = _unb64(proof_attr[2:], "p=")
        auth_message = (self._auth_prefix + without_proof).encode("utf-8")
        signature = _hmac(self._keys.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("bad proof length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self._keys.stored_key):
            raise ScramError("invalid proof")
        if not self._known:  # cannot happen with random keys, but never admit an unknown user
            raise ScramError("invalid proof")
        server_signature = _hmac(self._keys.server_key, auth_message)
        return self._user, f"v={_b64(server_signature)}".encode("ascii")


class ScramClient:
    """The client side for a connector: `initial()` is the sasl-init's initial-response, and
    the instance is the engine's `step(kind, data)` callback (Connection.start): a challenge
    (server-first-message) gets the client-final-message; the outcome's additional-data (or
    a second challenge, as some servers send it) must carry the server's signature."""

    def __init__(self, user: str, password: str) -> None:
        if not user or not password:
            raise ValueError("SCRAM needs a user name and a password")
        self._password = password
        self._nonce = secrets.token_urlsafe(_NONCE_BYTES)
        self._bare = f"n={_saslname(user)},r={self._nonce}"
        self._server_signature: bytes | None = None
        self.verified = False

    def initial(self) -> bytes:
        return ("n,," + self._bare).encode("utf-8")

    def __call__(self, kind: str, data: bytes | None) -> bytes | bool:
        if kind == "challenge" and self._server_signature is None:
            return self._final(data)
        if kind == "challenge":
            self._verify(data)
            return b""  # 5.3.3.4: an empty response to the server-final sent as a challenge
        if not self.verified:
            self._verify(data)
        return self.verified

    def _final(self, data: bytes | None) -> bytes:
        server_first = _text(data, "server-first-message")
        attrs = dict(_attributes(server_first, "server-first-message"))
        nonce, salt_text, count = attrs.get("r"), attrs.get("s"), attrs.get("i")
        if nonce is None or salt_text is None or count is None:
            raise ScramError("server-first-message needs r=, s= and i=")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise ScramError("the server's nonce does not extend ours")
        if not count.isdigit() or not MIN_ITERATIONS <= int(count) <= MAX_ITERATIONS:
            raise ScramError(f"iteration count {count} outside {MIN_ITERATIONS}-{MAX_ITERATIONS}")
        salt = _unb64(salt_text, "s=")
        salted = salted_password(self._password, salt, int(count))
        keys = keys_from_salted(salted, salt, int(count))
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        auth_message = f"{self._bare},{server_first},{without_proof}".encode()
        client_key = _hmac(salted, b"Client Key")
        signature = _hmac(keys.stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(keys.server_key, auth_message)
        return f"{without_proof},p={_b64(proof)}".encode("ascii")

    def _verify(self, data: bytes | None) -> None:
        if self._server_signature is None:
            raise ScramError("outcome before the server-first-message")
        attrs = dict(_attributes(_text(data, "server-final-message"), "server-final-message"))
        if "e" in attrs:
            raise ScramError(f"server error {attrs['e']!r}")
        got = _unb64(attrs.get("v", ""), "v=")
        if not hmac.compare_digest(got, self._server_signature):
            raise ScramError("the server's signature is wrong")
        self.verified = True
