"""5.3.3.3 sasl-challenge / 5.3.3.4 sasl-response in the engine, driven by SCRAM-SHA-256: the
round trip, the server's signature in the outcome's additional-data (5.3.3.6), and the
out-of-sequence and hostile cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from qrouter import scram
from qrouter.auth import UserDB
from qrouter.config import ListenerConfig
from tests.engine.pump import (
    SASL_CHALLENGE,
    SASL_HEADER,
    SASL_INIT,
    SASL_OUTCOME,
    SASL_RESPONSE,
    RawPeer,
    make_core,
    perf,
)

LISTENER = ListenerConfig(sasl_mechanisms=("SCRAM-SHA-256",), require_auth=True)


def _sym(s: str):  # type: ignore[no-untyped-def]
    from qrouter._fast.codec import Symbol

    return Symbol(s)


@pytest.fixture
def scram_core(tmp_path: Path):  # type: ignore[no-untyped-def]
    db = UserDB()
    db.set("alice", "secret", iterations=scram.MIN_ITERATIONS)
    db.save(str(tmp_path / "users"))
    return make_core(users_file=str(tmp_path / "users"))


def _start(core, client: scram.ScramClient) -> tuple[RawPeer, bytes]:  # type: ignore[no-untyped-def]
    raw = RawPeer(core, LISTENER, handshake=False)
    frames = raw.feed(SASL_HEADER)
    assert list(frames[0].fields["sasl_server_mechanisms"]) == ["SCRAM-SHA-256"]
    frames = raw.feed(
        perf(SASL_INIT, mechanism=_sym("SCRAM-SHA-256"), initial_response=client.initial())
    )
    assert [f.code for f in frames] == [SASL_CHALLENGE]
    return raw, frames[0].fields["challenge"]


def test_scram_round_trip_and_server_signature(scram_core) -> None:  # type: ignore[no-untyped-def]
    client = scram.ScramClient("alice", "secret")
    raw, challenge = _start(scram_core, client)
    final = client("challenge", challenge)
    assert isinstance(final, bytes)
    frames = raw.feed(perf(SASL_RESPONSE, response=final))
    assert [(f.code, f.fields["code"]) for f in frames] == [(SASL_OUTCOME, 0)]
    assert client("outcome", frames[0].fields["additional_data"]) is True
    assert raw.conn.user == "alice" and not raw.conn.closed


def test_wrong_password_gets_outcome_auth(scram_core) -> None:  # type: ignore[no-untyped-def]
    client = scram.ScramClient("alice", "guess")
    raw, challenge = _start(scram_core, client)
    frames = raw.feed(perf(SASL_RESPONSE, response=client("challenge", challenge)))
    assert [(f.code, f.fields["code"]) for f in frames] == [(SASL_OUTCOME, 1)]
    assert raw.conn.closed and raw.conn.user is None


@pytest.mark.parametrize(
    "response",
    [b"", b"c=biws,r=nonce,p=AAAA", b"\xff" * 10, b"x" * (scram.MAX_MESSAGE + 1)],
)
def test_hostile_responses_fail_closed(scram_core, response: bytes) -> None:  # type: ignore[no-untyped-def]
    raw, _challenge = _start(scram_core, scram.ScramClient("alice", "secret"))
    frames = raw.feed(perf(SASL_RESPONSE, response=response))
    assert [(f.code, f.fields["code"]) for f in frames] == [(SASL_OUTCOME, 1)]
    assert raw.conn.closed


def test_a_second_init_while_a_challenge_is_pending_is_out_of_sequence(scram_core) -> None:  # type: ignore[no-untyped-def]
    raw, _challenge = _start(scram_core, scram.ScramClient("alice", "secret"))
    frames = raw.feed(perf(SASL_INIT, mechanism=_sym("SCRAM-SHA-256"), initial_response=b"n,,"))
    assert [(f.code, f.fields["code"]) for f in frames] == [(SASL_OUTCOME, 2)]


def test_a_response_without_a_challenge_is_out_of_sequence(scram_core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(scram_core, LISTENER, handshake=False)
    raw.feed(SASL_HEADER)
    frames = raw.feed(perf(SASL_RESPONSE, response=b"c=biws"))
    assert [(f.code, f.fields["code"]) for f in frames] == [(SASL_OUTCOME, 2)]


def test_a_non_binary_response_is_a_decode_error(scram_core) -> None:  # type: ignore[no-untyped-def]
    raw, _challenge = _start(scram_core, scram.ScramClient("alice", "secret"))
    raw.feed(perf(SASL_RESPONSE, response="text, not binary"))
    assert raw.conn.closed
    assert raw.conn.error is not None and raw.conn.error[0] == "amqp:decode-error"


def test_no_anonymous_on_a_listener_off_loopback(scram_core) -> None:  # type: ignore[no-untyped-def]
    """Issue 14: a listener on 0.0.0.0 (e.g. one made through management with
    require_auth=false) offers no ANONYMOUS unless allow_anonymous, and refuses a client that
    skips SASL; on loopback both stay as they were."""
    from tests.engine.pump import AMQP_HEADER

    wide = ListenerConfig(host="0.0.0.0")
    raw = RawPeer(scram_core, wide, handshake=False)
    frames = raw.feed(SASL_HEADER)
    assert list(frames[0].fields["sasl_server_mechanisms"]) == ["PLAIN"]
    frames = raw.feed(perf(SASL_INIT, mechanism=_sym("ANONYMOUS"), initial_response=b""))
    assert [(f.code, f.fields["code"]) for f in frames] == [(SASL_OUTCOME, 1)]
    raw = RawPeer(scram_core, wide, handshake=False)
    raw.feed(AMQP_HEADER)
    assert raw.headers == [SASL_HEADER] and raw.conn.closed  # 5.3.2: SASL is required
    # without a users file nothing is offered there: the connection is refused
    nobody = RawPeer(make_core(), wide, handshake=False)
    nobody.feed(SASL_HEADER)
    assert nobody.conn.closed
    allowed = RawPeer(
        make_core(), ListenerConfig(host="0.0.0.0", allow_anonymous=True), handshake=False
    )
    frames = allowed.feed(SASL_HEADER)
    assert list(frames[0].fields["sasl_server_mechanisms"]) == ["ANONYMOUS"]
    loopback = RawPeer(make_core(), ListenerConfig(), handshake=False)
    loopback.feed(AMQP_HEADER)
    assert loopback.headers == [AMQP_HEADER] and not loopback.conn.closed
