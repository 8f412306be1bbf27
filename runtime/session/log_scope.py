"""Per-session and per-run log severity (onnxruntime's ``SessionOptions.log_severity_level`` and
``RunOptions.log_severity_level``: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal).

onnxruntime gives each session its own logger. onnxhal logs through the ``onnxhal`` logger tree,
which the application configures. A session's severity applies only to records logged while that
session is being created or run, in that thread (a ``ContextVar``): a filter on the ``onnxhal``
loggers drops the records below it. The level is not set on the ``onnxhal`` logger itself,
because then one session created with severity 4 would silence every other session's warnings for
the rest of the process.

Severities 0 and 1 ask for records below WARNING. A filter never sees those unless the logger's
level lets them through, so the ``onnxhal`` logger is lowered while such a scope is open. Records
logged outside it meanwhile are still held to the level the application had set; when the last
such scope closes, the logger gets that level back, so a verbose session leaves no mark on how the
application's own logging settings apply afterwards.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from onnxhal.hal.errors import InvalidArgument

LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL}
DEFAULT_SEVERITY = 2

_current: ContextVar[int | None] = ContextVar("onnxhal_log_level", default=None)
#: The ``onnxhal`` logger's level before a verbose session lowered it: the bar for other records.
_baseline: int | None = None
#: The ``onnxhal`` logger's own level (maybe NOTSET) to restore, and how many lowering scopes are open.
_saved_level: int = logging.NOTSET
_lowered = 0
_lock = threading.Lock()


class _ScopeFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        level = _current.get()
        if level is None:
            level = _baseline
        return level is None or record.levelno >= level


_FILTER = _ScopeFilter()


def _install() -> None:
    """The filter on ``onnxhal`` and on every ``onnxhal.*`` logger created so far (a logger's
    filters do not apply to its children's records)."""
    loggers = [logging.getLogger("onnxhal")] + [
        lg for name, lg in list(logging.Logger.manager.loggerDict.items())
        if name.startswith("onnxhal.") and isinstance(lg, logging.Logger)]
    for lg in loggers:
        if _FILTER not in lg.filters:
            lg.addFilter(_FILTER)


@contextmanager
def log_scope(severity: int) -> Iterator[None]:
    """Records logged inside the block are kept only at ``severity`` or above."""
    global _baseline, _saved_level, _lowered
    if severity == DEFAULT_SEVERITY:
        yield
        return
    level = LEVELS[severity]
    _install()
    root = logging.getLogger("onnxhal")
    with _lock:
        effective = root.getEffectiveLevel()
        lowering = _lowered > 0 or level < effective  # this scope holds the lowering open too
        if lowering:
            if _lowered == 0:
                _baseline, _saved_level = effective, root.level
            if level < effective:
                root.setLevel(level)
            _lowered += 1
    token = _current.set(level)
    try:
        yield
    finally:
        _current.reset(token)
        if lowering:
            with _lock:
                _lowered -= 1
                if _lowered == 0 and _baseline is not None:
                    root.setLevel(_saved_level)
                    _baseline = None


def set_process_level(severity: int) -> None:
    """onnxruntime's ``set_default_logger_severity``: the ``onnxhal`` logger's own level."""
    global _baseline, _saved_level
    with _lock:
        if _lowered:  # a verbose scope is open: the level it restores on closing is this one
            _baseline, _saved_level = LEVELS[severity], LEVELS[severity]
        else:
            _baseline = None
            logging.getLogger("onnxhal").setLevel(LEVELS[severity])


class _StderrWhenUnconfigured(logging.Handler):
    """onnxhal's records on stderr while the application has configured no logging, as onnxruntime
    prints its own: Python's last-resort handler shows only WARNING and above, so without this a
    verbose severity (``set_default_logger_severity(0)``, ``log_severity_level=0``) printed nothing.
    Silent once any handler sits on the root logger or on the ``onnxhal`` tree (the application's
    configuration, pytest's capture, ``set_default_logger_callback``), so nothing prints twice."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s [%(levelname).1s:%(name)s] %(message)s"))

    def handle(self, record: logging.LogRecord) -> bool:
        if logging.getLogger().handlers:
            return False
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(h is not self for h in logger.handlers):
                return False
            logger = logger.parent if logger.propagate else None
        return super().handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        import sys

        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # a closed stderr must not break a run
            self.handleError(record)


STDERR_FALLBACK = _StderrWhenUnconfigured()
if not any(isinstance(h, _StderrWhenUnconfigured) for h in logging.getLogger("onnxhal").handlers):
    logging.getLogger("onnxhal").addHandler(STDERR_FALLBACK)


def check_log_severity(level: int, what: str = "log_severity_level") -> None:
    """ORT's severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal (see runtime/session/log_scope.py)."""
    if isinstance(level, bool) or level not in LEVELS:
        raise InvalidArgument(f"{what} {level!r} is out of range: use 0 (verbose), 1 (info), "
                              "2 (warning), 3 (error) or 4 (fatal)")


def set_default_logger_severity(level: int) -> None:
    """onnxruntime's process-wide log severity (0 verbose ... 4 fatal), set on the ``onnxhal``
    logger; sessions' ``log_severity_level`` still applies on top."""
    if isinstance(level, bool) or level not in LEVELS:
        raise InvalidArgument(f"set_default_logger_severity({level!r}): use 0 (verbose), 1 (info), 2 (warning), "
                              "3 (error) or 4 (fatal)")
    set_process_level(level)
