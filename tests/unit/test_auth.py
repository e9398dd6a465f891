"""SASL PLAIN credentials: hashes, the PLAIN response, the users file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from qrouter.auth import UserDB, check_password, hash_password, parse_plain
from qrouter.config import ConfigError

FAST = 1000  # PBKDF2 iterations for tests that do not check the default


def test_hash_format_and_verify() -> None:
    stored = hash_password("s3cret")
    scheme, iterations, salt, digest = stored.split("$")
    assert (scheme, iterations) == ("pbkdf2-sha256", "200000")
    assert salt and digest
    assert check_password("s3cret", stored)
    assert not check_password("s3cret ", stored)
    assert hash_password("s3cret", iterations=FAST) != hash_password("s3cret", iterations=FAST)


def test_hash_unicode_and_iterations() -> None:
    stored = hash_password("pässwörd✓", iterations=FAST)
    assert stored.split("$")[1] == str(FAST)
    assert check_password("pässwörd✓", stored)
    with pytest.raises(ValueError):
        hash_password("x", iterations=0)


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "plain",
        "md5$1000$c2FsdA==$aGFzaA==",
        "pbkdf2-sha256$x$c2FsdA==$aGFzaA==",
        "pbkdf2-sha256$0$c2FsdA==$aGFzaA==",
        "pbkdf2-sha256$1000$!!$aGFzaA==",
        "pbkdf2-sha256$1000$c2FsdA==$aGFzaA==",  # digest too short
        "pbkdf2-sha256$99999999999$c2FsdA==$" + "A" * 44,
    ],
)
def test_check_password_is_false_for_bad_hashes(stored: str) -> None:
    assert check_password("x", stored) is False


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (b"\0alice\0pw", ("", "alice", "pw")),
        (b"admin\0alice\0p w", ("admin", "alice", "p w")),
        ("\0jos\u00e9\0pw".encode(), ("", "jos\u00e9", "pw")),
        (bytearray(b"\0a\0b"), ("", "a", "b")),
    ],
)
def test_parse_plain(response: bytes, expected: tuple[str, str, str]) -> None:
    assert parse_plain(response) == expected


@pytest.mark.parametrize(
    "response", [b"", b"alice", b"\0alice", b"\0\0pw", b"\0alice\0", b"a\0b\0c\0d", b"\0\xff\0pw"]
)
def test_parse_plain_malformed(response: bytes) -> None:
    with pytest.raises(ValueError):
        parse_plain(response)


def test_parse_plain_refuses_str() -> None:
    with pytest.raises(ValueError):
        parse_plain("\0a\0b")  # type: ignore[arg-type]


def test_userdb_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text(
        "# operators\n\nalice:" + hash_password("a-pw", iterations=FAST) + "\n"
        "  # indented comment\n"
        "bob:" + hash_password("b-pw", iterations=FAST) + "\n"
    )
    db = UserDB.load(str(path))
    assert db.users() == ["alice", "bob"] and len(db) == 2 and "alice" in db
    assert db.verify("alice", "a-pw") and db.verify("bob", "b-pw")
    assert not db.verify("alice", "b-pw")
    assert not db.verify("carol", "a-pw")
    db.set("bob", "new", iterations=FAST)
    db.set("carol", "c-pw", iterations=FAST)
    db.save(str(path))
    lines = path.read_text().splitlines()
    assert lines[:3] == ["# operators", "", lines[2]] and lines[2].startswith("alice:")
    assert lines[3] == "  # indented comment"
    assert lines[4].startswith("bob:") and lines[5].startswith("carol:")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = UserDB.load(str(path))
    assert again.verify("bob", "new") and not again.verify("bob", "b-pw")
    assert again.verify("carol", "c-pw")
    assert again.remove("carol") and not again.remove("carol")
    assert [p.name for p in tmp_path.iterdir()] == ["users"]  # no temp file left


def test_new_userdb_save(tmp_path: Path) -> None:
    db = UserDB()
    db.set("alice", "pw", iterations=FAST)
    db.save(str(tmp_path / "users"))
    text = (tmp_path / "users").read_text()
    assert text.startswith("# qrouter users")
    assert UserDB.load(str(tmp_path / "users")).verify("alice", "pw")


def test_verify_never_raises() -> None:
    db = UserDB({"alice": hash_password("pw", iterations=FAST)})
    assert db.verify("alice", "pw")
    assert db.verify("alice", None) is False  # type: ignore[arg-type]
    assert db.verify(None, "pw") is False  # type: ignore[arg-type]
    assert db.verify("alice", "\udcff") is False  # lone surrogate: not encodable as UTF-8
    assert db.verify(["x"], "pw") is False  # type: ignore[arg-type]


def test_set_refuses_bad_names_and_empty_passwords() -> None:
    db = UserDB()
    for name in ("", "a:b", " alice", "al\nice"):
        with pytest.raises(ValueError):
            db.set(name, "pw", iterations=FAST)
    with pytest.raises(ValueError):
        db.set("alice", "")
    with pytest.raises(ValueError):
        db.set_hash("alice", "not-a-hash")


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("alice", 1, "expected user:hash"),
        ("# c\nalice:nothash", 2, "not a pbkdf2-sha256 hash"),
        (":{h}", 1, "bad user name"),
        ("alice:{h}\n\nalice:{h}", 3, "user 'alice' again (first on line 1)"),
    ],
)
def test_load_errors_name_file_and_line(tmp_path: Path, text: str, line: int, what: str) -> None:
    path = tmp_path / "users"
    path.write_text(text.format(h=hash_password("x", iterations=FAST)))
    with pytest.raises(ConfigError) as info:
        UserDB.load(str(path))
    assert str(info.value).startswith(f"{path}: line {line}: {what}")


def test_load_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        UserDB.load(str(tmp_path / "none"))
    assert str(info.value) == f"{tmp_path / 'none'}: cannot read: No such file or directory"
