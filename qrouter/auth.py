"""SASL PLAIN credentials: password hashes, the PLAIN response, the users file.

Users file: one ``user:hash`` per line, where hash is what `hash_password` returns
(``pbkdf2-sha256$<iterations>$<b64 salt>$<b64 hash>``) or a SCRAM-SHA-256 record
(``scram-sha-256$...``, qrouter/scram.py, what ``qrouter-tool passwd`` writes; it serves PLAIN
and SCRAM); blank lines and lines starting with
``#`` are ignored. ``qrouter-tool passwd`` writes it. Plaintext passwords are never kept, not
even in a cache: each login costs one PBKDF2 run (~50 ms at the default 200,000 iterations),
which is also what makes a stolen users file expensive to attack.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import tempfile
from collections import Counter

from qrouter import scram
from qrouter.config import ConfigError

_SCHEME = "pbkdf2-sha256"
_SALT_BYTES = 16
DEFAULT_ITERATIONS = scram.DEFAULT_ITERATIONS
_MAX_ITERATIONS = 10_000_000  # refuse absurd counts from a damaged file (login would hang)


def hash_password(password: str, *, iterations: int = DEFAULT_ITERATIONS) -> str:
    """A salted PBKDF2-HMAC-SHA256 hash: ``pbkdf2-sha256$<iter>$<b64 salt>$<b64 hash>``."""
    if not 1 <= iterations <= _MAX_ITERATIONS:
        raise ValueError(f"iterations must be between 1 and {_MAX_ITERATIONS}")
    salt = os.urandom(_SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return "$".join(
        (
            _SCHEME,
            str(iterations),
            base64.b64encode(salt).decode(),
            base64.b64encode(digest).decode(),
        )
    )


def _parse_hash(stored: str) -> tuple[int, bytes, bytes]:
    """(iterations, salt, digest) of a stored hash; ValueError if it is not one."""
    if stored.startswith(scram.SCHEME + "$"):  # digest: the StoredKey
        keys = scram.parse_record(stored)
        return keys.iterations, keys.salt, keys.stored_key
    parts = stored.split("$")
    if len(parts) != 4 or parts[0] != _SCHEME:
        raise ValueError(f"not a {_SCHEME} hash")
    if not parts[1].isdigit() or not 1 <= int(parts[1]) <= _MAX_ITERATIONS:
        raise ValueError("bad iteration count")
    try:
        salt = base64.b64decode(parts[2], validate=True)
        digest = base64.b64decode(parts[3], validate=True)
    except binascii.Error:
        raise ValueError("bad base64 in salt or hash") from None
    if not salt or len(digest) != hashlib.sha256().digest_size:
        raise ValueError("bad salt or hash length")
    return int(parts[1]), salt, digest


def _iterations(stored: str) -> int:
    try:
        return _parse_hash(stored)[0]
    except ValueError:
        return DEFAULT_ITERATIONS


def check_password(password: str, stored: str) -> bool:
    """Whether `password` matches `stored` (constant-time compare); False if `stored` is bad."""
    if isinstance(stored, str) and stored.startswith(scram.SCHEME + "$"):
        return scram.check_plain(password, stored)
    try:
        iterations, salt, digest = _parse_hash(stored)
        candidate = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    except (ValueError, UnicodeError, TypeError, AttributeError):
        return False
    return hmac.compare_digest(candidate, digest)


def parse_plain(response: bytes) -> tuple[str, str, str]:
    """Split a SASL PLAIN initial response (RFC 4616): ``authzid NUL authcid NUL passwd``.

    Returns (authzid, authcid, password); authzid may be empty. Raises ValueError when the
    response does not have exactly three fields, authcid or password is empty, or a field is
    not UTF-8.
    """
    if not isinstance(response, bytes | bytearray | memoryview):
        raise ValueError("PLAIN response must be bytes")
    fields = bytes(response).split(b"\0")
    if len(fields) != 3:
        raise ValueError("PLAIN response must be authzid NUL authcid NUL password")
    try:
        authzid, authcid, password = (f.decode("utf-8") for f in fields)
    except UnicodeDecodeError:
        raise ValueError("PLAIN response is not UTF-8") from None
    if not authcid:
        raise ValueError("PLAIN response has an empty authentication identity")
    if not password:
        raise ValueError("PLAIN response has an empty password")
    return authzid, authcid, password


def _check_user(user: str) -> None:
    if not user or ":" in user or user != user.strip() or not user.isprintable():
        raise ValueError(f"bad user name {user!r} (empty, ':', spaces at the ends or control)")


@functools.lru_cache(maxsize=4)
def _dummy_hash(iterations: int = DEFAULT_ITERATIONS) -> str:
    # A hash of a random password: verify() runs PBKDF2 for unknown users too, with the count
    # the users file's records have (UserDB.typical_iterations), so the time a failed login
    # takes does not tell whether the user exists.
    return hash_password(os.urandom(16).hex(), iterations=iterations)


class UserDB:
    """User name -> password hash, loaded from and saved to a users file.

    `save` rewrites the file it was loaded from keeping comments and order; new users are
    appended.
    """

    def __init__(self, users: dict[str, str] | None = None) -> None:
        self._hashes: dict[str, str] = {}
        # The file as read: comment/blank lines verbatim, user lines as the user name.
        self._lines: list[tuple[str, str]] = []  # ("text", line) | ("user", name)
        self._from_file = False
        self._typical: int | None = None  # typical_iterations(), computed once per change
        for user, stored in (users or {}).items():
            self.set_hash(user, stored)

    @classmethod
    def load(cls, path: str) -> UserDB:
        """Read a users file; ConfigError naming the file and line for any bad line."""
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror or exc}", file=path) from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"not UTF-8 ({exc.reason})", file=path) from None
        db = cls()
        db._from_file = True
        first_line: dict[str, int] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                db._lines.append(("text", raw))
                continue
            where = f"line {number}"
            user, sep, stored = line.partition(":")
            if not sep:
                raise ConfigError("expected user:hash", key=where, file=path)
            try:
                _check_user(user)
                _parse_hash(stored)
            except ValueError as exc:
                raise ConfigError(str(exc), key=where, file=path) from None
            if user in first_line:
                raise ConfigError(
                    f"user {user!r} again (first on line {first_line[user]})", key=where, file=path
                )
            first_line[user] = number
            db._hashes[user] = stored
            db._lines.append(("user", user))
        return db

    def __contains__(self, user: object) -> bool:
        return user in self._hashes

    def __len__(self) -> int:
        return len(self._hashes)

    def users(self) -> list[str]:
        return list(self._hashes)

    def verify(self, user: str, password: str) -> bool:
        """Whether the password is right for the user. Never raises; False for any oddity."""
        try:
            stored = self._hashes.get(user)
            if stored is None:
                check_password(str(password), _dummy_hash(self.typical_iterations()))
                return False
            return check_password(password, stored)
        except Exception:  # a login check must fail closed, never take the connection down
            return False

    def set(self, user: str, password: str, *, iterations: int = DEFAULT_ITERATIONS) -> None:
        """Add the user or change their password. ValueError on a bad name or empty password."""
        if not password:
            raise ValueError("empty password")
        self.set_hash(user, scram.make_record(password, iterations=iterations))

    def typical_iterations(self) -> int:
        """The iteration count an unknown user is given (SCRAM's server-first-message, the
        PLAIN check's dummy hash): the most common one of the file's records, so that a count
        set with ``qrouter-tool passwd --iterations`` does not tell who exists."""
        if self._typical is None:
            counts = Counter(_iterations(stored) for stored in self._hashes.values())
            self._typical = counts.most_common(1)[0][0] if counts else DEFAULT_ITERATIONS
        return self._typical

    def scram_keys(self, user: str) -> scram.ScramKeys | None:
        """The user's SCRAM-SHA-256 keys (derived for an old pbkdf2-sha256 line, whose hash is
        SCRAM's SaltedPassword); None for an unknown user."""
        stored = self._hashes.get(user)
        if stored is None:
            return None
        try:
            if stored.startswith(scram.SCHEME + "$"):
                return scram.parse_record(stored)
            iterations, salt, digest = _parse_hash(stored)
            return scram.keys_from_salted(digest, salt, iterations)
        except ValueError:
            return None

    def set_hash(self, user: str, stored: str) -> None:
        """Add or update a user with an already-hashed password. ValueError if malformed."""
        _check_user(user)
        _parse_hash(stored)
        if user not in self._hashes:
            self._lines.append(("user", user))
        self._hashes[user] = stored
        self._typical = None

    def remove(self, user: str) -> bool:
        if self._hashes.pop(user, None) is None:
            return False
        self._lines = [entry for entry in self._lines if entry != ("user", user)]
        self._typical = None
        return True

    def save(self, path: str) -> None:
        """Write the file atomically (temp file + rename), readable by its owner only."""
        out = []
        if not self._from_file:
            out.append("# qrouter users: user:hash per line; edit with `qrouter-tool passwd`")
        for kind, value in self._lines:
            out.append(f"{value}:{self._hashes[value]}" if kind == "user" else value)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".users-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write("\n".join(out) + "\n")
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
