"""Logging set-up: loggers under ``qrouter.*``, text or JSON lines on stderr.

Modules log through ``logging.getLogger("qrouter.<module>")`` (for example ``qrouter.core``,
``qrouter.server``) and prefix per-object lines with `tag`, as skupper-router does:
``[C3][L7][D42] released: no consumer``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import TextIO

ROOT = "qrouter"
LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

_TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601, ms), level, logger, msg (+ exc)."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, object] = {
            "ts": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def _level(name: str) -> int:
    if name.lower() not in LEVELS:
        raise ValueError(f"log level {name!r} is not one of {', '.join(LEVELS)}")
    return logging.getLevelNamesMapping()[name.upper()]


def _module_logger(name: str) -> str:
    return name if name == ROOT or name.startswith(ROOT + ".") else f"{ROOT}.{name}"


# Loggers whose level the last setup_logging call set, so a second call can undo them.
_configured: set[str] = set()


def setup_logging(
    level: str = "info",
    fmt: str = "text",
    modules: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> logging.Logger:
    """Send ``qrouter.*`` records at `level` and above to `stream` (default stderr).

    `fmt` is ``text`` or ``json``; `modules` maps a module (``core`` or ``qrouter.core``) to
    its own level. Calling again replaces the previous set-up. Returns the ``qrouter`` logger.
    """
    if fmt not in ("text", "json"):
        raise ValueError(f"log format {fmt!r} is not one of text, json")
    root = logging.getLogger(ROOT)
    root.setLevel(_level(level))
    for name in _configured:
        logging.getLogger(name).setLevel(logging.NOTSET)
    _configured.clear()
    for module, module_level in (modules or {}).items():
        name = _module_logger(module)
        logging.getLogger(name).setLevel(_level(module_level))
        _configured.add(name)
    for handler in [h for h in root.handlers if getattr(h, "_qrouter", False)]:
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler._qrouter = True  # type: ignore[attr-defined]
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT))
    root.addHandler(handler)
    root.propagate = False
    return root


TRACE = 5  # below DEBUG: the frame trace (qrouter/_fast/trace.pxi)
logging.addLevelName(TRACE, "TRACE")
TRACE_LOGGER = "qrouter.trace"


def enable_trace() -> None:
    """Let the frame trace's records through: ``qrouter.trace`` at TRACE, whatever the
    router's level (connections still trace only when their flag is set)."""
    logging.getLogger(TRACE_LOGGER).setLevel(TRACE)


def tag(conn: int | None = None, link: int | None = None, delivery: int | None = None) -> str:
    """``[C<conn>][L<link>][D<delivery>]``, leaving out the parts that are None."""
    parts = []
    if conn is not None:
        parts.append(f"[C{conn}]")
    if link is not None:
        parts.append(f"[L{link}]")
    if delivery is not None:
        parts.append(f"[D{delivery}]")
    return "".join(parts)
