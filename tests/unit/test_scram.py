"""SCRAM-SHA-256 (qrouter/scram.py): our client and server against each other and against a
third-party implementation (scramp), the users-file records, and the refused cases."""

from __future__ import annotations

import pytest
import scramp

from qrouter import scram
from qrouter.auth import UserDB, check_password, hash_password

FAST = 4096  # RFC 7677's minimum; keeps the tests quick


def _server(db: UserDB) -> scram.ScramServer:
    return scram.ScramServer(db.scram_keys, FAST)


def _db(**users: str) -> UserDB:
    db = UserDB()
    for user, password in users.items():
        db.set(user, password, iterations=FAST)
    return db


def _exchange(client: scram.ScramClient, server: scram.ScramServer) -> bool:
    first = server.first(client.initial())
    final = client("challenge", first)
    assert isinstance(final, bytes)
    _user, server_final = server.final(final)
    return bool(client("outcome", server_final))


def test_our_client_and_server_agree() -> None:
    server = _server(_db(alice="s3cret"))
    assert _exchange(scram.ScramClient("alice", "s3cret"), server)
    assert server.user == "alice"


def test_wrong_password_and_unknown_user_are_refused_alike() -> None:
    db = _db(alice="s3cret")
    for user, password in (("alice", "wrong"), ("mallory", "s3cret")):
        server = _server(db)
        client = scram.ScramClient(user, password)
        final = client("challenge", server.first(client.initial()))
        with pytest.raises(scram.ScramError, match="invalid proof"):
            server.final(final)


def test_unknown_user_gets_a_stable_salt() -> None:
    # the same salt each time: a prober cannot tell unknown users by a changing salt
    db = _db(alice="s3cret")
    a = _server(db).first(b"n,,n=nobody,r=abc").split(b",")[1]
    b = _server(db).first(b"n,,n=nobody,r=xyz").split(b",")[1]
    assert a == b


def test_a_server_with_the_wrong_keys_is_not_believed() -> None:
    client = scram.ScramClient("alice", "s3cret")
    real = _server(_db(alice="s3cret"))
    final = client("challenge", real.first(client.initial()))
    assert isinstance(final, bytes)
    with pytest.raises(scram.ScramError, match="signature"):
        client("outcome", b"v=" + b"A" * 44)
    with pytest.raises(scram.ScramError, match="server error"):
        client("outcome", b"e=invalid-proof")


def test_scramp_client_against_our_server() -> None:
    db = _db(bob="hunter2")
    server = _server(db)
    client = scramp.ScramClient(["SCRAM-SHA-256"], "bob", "hunter2")
    server_first = server.first(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    user, server_final = server.final(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # raises if our signature were wrong
    assert user == "bob"


def test_scramp_client_with_a_wrong_password_is_refused() -> None:
    server = _server(_db(bob="hunter2"))
    client = scramp.ScramClient(["SCRAM-SHA-256"], "bob", "nope")
    client.set_server_first(server.first(client.get_client_first().encode()).decode())
    with pytest.raises(scram.ScramError):
        server.final(client.get_client_final().encode())


def test_our_client_against_a_scramp_server() -> None:
    mechanism = scramp.ScramMechanism("SCRAM-SHA-256")
    info = mechanism.make_auth_info("pw-Ω", iteration_count=FAST)
    server = mechanism.make_server(lambda _user: info)
    client = scram.ScramClient("carol", "pw-Ω")
    server.set_client_first(client.initial().decode())
    final = client("challenge", server.get_server_first().encode())
    assert isinstance(final, bytes)
    server.set_client_final(final.decode())
    assert client("outcome", server.get_server_final().encode()) is True


def test_scramp_keys_match_our_record() -> None:
    # the same password, salt and count give the same StoredKey/ServerKey in both
    record = scram.make_record("abc", iterations=FAST)
    keys = scram.parse_record(record)
    salt, stored_key, server_key, count = scramp.ScramMechanism("SCRAM-SHA-256").make_auth_info(
        "abc", iteration_count=FAST, salt=keys.salt
    )
    assert (salt, stored_key, server_key, count) == (
        keys.salt,
        keys.stored_key,
        keys.server_key,
        FAST,
    )


def test_one_record_serves_plain_and_scram() -> None:
    record = scram.make_record("s3cret", iterations=FAST)
    assert check_password("s3cret", record)
    assert not check_password("s3creT", record)
    db = UserDB({"alice": record})
    assert db.verify("alice", "s3cret")
    assert _exchange(scram.ScramClient("alice", "s3cret"), _server(db))


def test_old_pbkdf2_lines_still_serve_plain_and_scram(tmp_path: object) -> None:
    db = UserDB({"old": hash_password("legacy", iterations=FAST)})
    assert db.verify("old", "legacy")
    assert _exchange(scram.ScramClient("old", "legacy"), _server(db))


def test_passwd_writes_scram_records(tmp_path: pytest.TempPathFactory) -> None:
    db = _db(dave="pw")
    path = str(tmp_path) + "/users"  # type: ignore[operator]
    db.save(path)
    line = open(path).read().splitlines()[-1]
    assert line.startswith("dave:scram-sha-256$4096$")
    assert UserDB.load(path).verify("dave", "pw")


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"x" * (scram.MAX_MESSAGE + 1),
        b"\xff\xfe",
        b"p=tls-unique,,n=alice,r=abc",  # channel binding asked for
        b"n,,r=abc",  # no user
        b"n,,n=alice",  # no nonce
        b"n,,m=ext,n=alice,r=abc",  # mandatory extension
        b"n,a=bob,n=alice,r=abc",  # authzid differs
        b"n,,n=al=ice,r=abc",  # bad saslname escape
        b"q,,n=alice,r=abc",
    ],
)
def test_malformed_client_first_is_refused(message: bytes) -> None:
    with pytest.raises(scram.ScramError):
        _server(_db(alice="s3cret")).first(message)


def test_replayed_or_tampered_final_is_refused() -> None:
    db = _db(alice="s3cret")
    server = _server(db)
    client = scram.ScramClient("alice", "s3cret")
    final = client("challenge", server.first(client.initial()))
    assert isinstance(final, bytes)
    tampered = final.replace(b"r=", b"r=X", 1)
    with pytest.raises(scram.ScramError, match="nonce"):
        server.final(tampered)
    with pytest.raises(scram.ScramError, match="out of sequence"):
        server.final(final)  # one exchange, one final


def test_client_refuses_a_hostile_iteration_count() -> None:
    client = scram.ScramClient("alice", "pw")
    nonce = client.initial().decode().split("r=")[1]
    with pytest.raises(scram.ScramError, match="iteration count"):
        client("challenge", f"r={nonce}srv,s=c2FsdA==,i=999999999".encode())
    with pytest.raises(scram.ScramError, match="nonce"):
        client("challenge", b"r=other,s=c2FsdA==,i=4096")


def _told_iterations(db: UserDB, user: str) -> int:
    """The i= the router's SCRAM (qrouter/sasl.py) tells `user` in its server-first-message."""
    from qrouter.config import ListenerConfig
    from qrouter.sasl import ServerMechanisms

    first = ServerMechanisms(ListenerConfig(), db).start(
        None, scram.MECHANISM, scram.ScramClient(user, "pw").initial()
    )
    assert isinstance(first, bytes)
    return int(dict(a.split("=", 1) for a in first.decode().split(","))["i"])


def test_an_unknown_user_is_told_the_count_the_users_have() -> None:
    """The iteration count must not tell who exists: users written with passwd --iterations
    65536 (for Cyrus SASL clients) and a name that is not in the file get the same count."""
    db = _db(alice="a", bob="b")
    db.set("carol", "c", iterations=FAST + 1)
    assert db.typical_iterations() == FAST
    assert _told_iterations(db, "alice") == _told_iterations(db, "nobody") == FAST
    assert UserDB().typical_iterations() == scram.DEFAULT_ITERATIONS


def test_plain_for_an_unknown_user_costs_the_users_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """PLAIN's check of an unknown user runs PBKDF2 with the count of the file's records, so
    the time a refusal takes does not tell who exists."""
    import hashlib

    counts: list[int] = []
    real = hashlib.pbkdf2_hmac

    def spy(name: str, password: bytes, salt: bytes, iterations: int) -> bytes:
        counts.append(iterations)
        return real(name, password, salt, iterations)

    db = _db(alice="a")
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", spy)
    assert not db.verify("alice", "wrong") and not db.verify("nobody", "wrong")
    assert counts and set(counts) == {FAST}
