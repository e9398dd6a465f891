"""Replay the fuzz corpus and every fuzzing finding on the normal (uninstrumented) build.

Every file under ``tests/fuzz/corpus/<any target>/`` goes through every target of
tests/fuzz/targets.py (bytes seeded for one surface are still hostile input to the others),
and every file under ``tests/fuzz/regressions/<target>/`` (an input a campaign found to crash,
raise or answer ``amqp:internal-error``, since fixed) through its own target. A target
raises on anything but the documented handling of bad input (targets.py says what that is).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS, Finding, _checked, _core

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
REGRESSIONS = HERE / "regressions"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*/*") if p.is_file())


def _failures(target: str, files: list[Path]) -> list[str]:
    failures = []
    for path in files:
        try:
            TARGETS[target](path.read_bytes())
        except Exception as exc:  # noqa: BLE001 - each failure is reported with its file
            failures.append(f"{path.relative_to(HERE)}: {type(exc).__name__}: {exc}")
    return failures


def test_corpus_is_seeded_and_small() -> None:
    """Every target has seeds, from the conversations tests/fuzz/capture.py records."""
    files = _files(CORPUS)
    for target in TARGETS:
        assert any(p.parent.name == target for p in files), f"no seeds for {target}"
    for source in ("proton", "oslo", "qrouter-tool", "router-client", "mesh"):
        assert any(p.name.startswith(source) for p in files), f"no seeds from {source}"
    assert sum(p.stat().st_size for p in files) < 2 * 1024 * 1024
    assert len(files) < 2000


@pytest.mark.parametrize("target", list(TARGETS))
def test_corpus_replays(target: str) -> None:
    started = time.monotonic()
    failures = _failures(target, _files(CORPUS))
    assert not failures, "\n".join(failures)
    assert time.monotonic() - started < 60  # a slow input is a finding too (run.py: -timeout)


def _regressions() -> list[Path]:
    return _files(REGRESSIONS)


@pytest.mark.parametrize("path", _regressions(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_regression(path: Path) -> None:
    TARGETS[path.parent.name](path.read_bytes())


def test_the_engine_still_serves_after_the_corpus() -> None:
    """The core every connection input went through (as a router's does) still opens,
    attaches and moves a message, and holds no address."""
    from tests.engine.pump import assert_engine_usable

    for path in _files(CORPUS):
        TARGETS["connection"](path.read_bytes())
        TARGETS["session"](path.read_bytes())
    core = _core()
    assert core.engine.address_names() == []
    assert_engine_usable(core)


def test_a_target_that_logs_an_error_is_a_finding() -> None:
    """The replay can fail: an ERROR record from a qrouter logger while an input runs (the
    code's ``log.exception`` for what it did not expect) is reported as a finding."""

    def logs(data: bytes) -> None:
        logging.getLogger("qrouter.engine").error("internal error on %r", data)

    with pytest.raises(Finding, match="internal error"):
        _checked(logs)(b"x")


def test_an_internal_error_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler that raises turns into amqp:internal-error on the connection: a finding."""
    from qrouter.core import ConnectionHandler

    def broken(self: object, conn: object, fields: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(ConnectionHandler, "on_open", broken)
    with pytest.raises(Finding, match="internal-error"):
        TARGETS["session"](b"")


def test_deep_nesting_through_every_target() -> None:
    """Issue 13's crash (200,000 nested described types in one message, a C stack overflow
    before the codec bounded nesting), as bytes for every target: handled, not fatal."""
    depth = 200_000
    # 1.5 described type: 0x00, descriptor (smallulong 0x77, amqp-value), value; innermost null
    nested = b"\x00\x53\x77" * depth + b"\x40"
    assert len(nested) > 600_000
    for target in ("message", "management", "interrouter"):
        TARGETS[target](nested)
    # the same as a TRANSFER payload on an attached link of a session
    from qrouter._fast.codec import Described, UInt, ULong, encode

    def frame(code: int, fields: list[object], payload: bytes = b"") -> bytes:
        body = encode(Described(ULong(code), fields)) + payload
        return (8 + len(body)).to_bytes(4, "big") + b"\x02\x00\x00\x00" + body

    begin = frame(0x11, [None, UInt(0), UInt(1 << 20), UInt(1 << 20)])
    source = Described(ULong(0x28), [])
    target = Described(ULong(0x29), ["deep"])
    attach = frame(0x12, ["deep-link", UInt(0), False, None, None, source, target])
    # 1,000 levels: within the listener's max-frame-size (4096), far past the codec's bound
    transfer = frame(0x14, [UInt(0), UInt(0), b"t", UInt(0)], nested[:3000] + b"\x40")
    TARGETS["session"](begin + attach + transfer)
