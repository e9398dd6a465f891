"""Logging set-up: levels per module, text and JSON lines, tags."""

from __future__ import annotations

import io
import json
import logging

import pytest

from qrouter.log import setup_logging, tag


def test_text_and_module_levels() -> None:
    out = io.StringIO()
    setup_logging("warning", "text", {"core": "debug"}, stream=out)
    logging.getLogger("qrouter.core").debug("%s attached", tag(conn=3, link=7))
    logging.getLogger("qrouter.mesh").info("hidden")
    logging.getLogger("qrouter.mesh").warning("shown")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("DEBUG   qrouter.core: [C3][L7] attached")
    assert lines[1].endswith("WARNING qrouter.mesh: shown")


def test_json_lines() -> None:
    out = io.StringIO()
    setup_logging("info", "json", stream=out)
    log = logging.getLogger("qrouter.server")
    log.info("listening on %s:%d", "127.0.0.1", 5672)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    # one object per line: the traceback's newlines are escaped inside the JSON string
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["level"] == "info" and first["logger"] == "qrouter.server"
    assert first["msg"] == "listening on 127.0.0.1:5672"
    assert first["ts"].endswith("Z") and "T" in first["ts"]
    assert second["level"] == "error" and "RuntimeError: boom" in second["exc"]


def test_setup_again_replaces_handler_and_module_levels() -> None:
    first, second = io.StringIO(), io.StringIO()
    setup_logging("info", "text", {"qrouter.mesh": "error"}, stream=first)
    setup_logging("info", "json", stream=second)
    logging.getLogger("qrouter.mesh").info("x")
    assert first.getvalue() == ""
    assert json.loads(second.getvalue())["msg"] == "x"


def test_bad_values() -> None:
    with pytest.raises(ValueError):
        setup_logging("loud")
    with pytest.raises(ValueError):
        setup_logging("info", "xml")


def test_tag() -> None:
    assert tag(3, 7, 42) == "[C3][L7][D42]"
    assert tag(conn=3) == "[C3]"
    assert tag(link=0, delivery=1) == "[L0][D1]"
    assert tag() == ""
