"""Process-wide host settings (docs/abi.md §11, ABI 1.1): worker threads, the library's log
messages on the ``moeplug`` logger, progress of long host calls."""

from __future__ import annotations

import logging

from . import _abi

logger = logging.getLogger("moeplug")

#: moeplug_log_level → logging level.
_LEVELS = {
    _abi.LOG_LEVELS["error"]: logging.ERROR,
    _abi.LOG_LEVELS["warn"]: logging.WARNING,
    _abi.LOG_LEVELS["info"]: logging.INFO,
    _abi.LOG_LEVELS["debug"]: logging.DEBUG,
}


def _lib():
    from . import _library

    return _library()


def _need_1_1(lib, name):
    fn = getattr(lib, name, None)
    if fn is None:
        raise RuntimeError(f"{name}: the loaded library ({lib.path}) is ABI 1.0; this call needs 1.1")
    return fn


def _check(status):
    from . import _check as check

    check(status)


@_abi.LogCallback
def _on_log(level, message, _user):
    # Never raise into the library: a failing handler is logging's business, not the call's.
    try:
        py_level = _LEVELS.get(level, logging.ERROR)
        if logger.isEnabledFor(py_level):
            logger.log(py_level, message.decode(errors="replace"))
    except Exception:  # noqa: BLE001
        pass


def install_log_bridge(lib) -> None:
    """Route the library's messages to the ``moeplug`` logger (done when the library loads;
    the logger's level and handlers decide what is shown)."""
    fn = getattr(lib, "moeplug_set_log_callback", None)
    if fn is not None and fn(_on_log, None) != 0:  # the package is still loading: no _check
        raise OSError(f"moeplug_set_log_callback: {lib.moeplug_last_error().decode()}")


def set_num_threads(n: int) -> None:
    """Host worker threads for every later host call of the process (prep, quantization, the
    CPU fused_moe); 0 = every core (the default)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"num_threads: expected an int >= 0 (0 = every core), got {n!r}")
    lib = _lib()
    _check(_need_1_1(lib, "moeplug_set_num_threads")(min(n, 2**32 - 1)))


def num_threads() -> int:
    """Host worker threads calls use now."""
    lib = _lib()
    return int(_need_1_1(lib, "moeplug_num_threads")())


_progress_fn = None  # the ctypes callback the library holds; kept alive here


def set_progress_callback(callback) -> None:
    """Call ``callback(operation, done, total)`` as long host calls (``prepare_moe``,
    ``quantize_mx`` on host arrays) advance: ``done`` of ``total`` bytes written, on the
    calling thread; None stops. An exception in the callback is logged, not raised (the call
    continues)."""
    global _progress_fn
    lib = _lib()
    setter = _need_1_1(lib, "moeplug_set_progress_callback")
    if callback is None:
        _check(setter(_abi.ProgressCallback(), None))
        _progress_fn = None
        return
    if not callable(callback):
        raise TypeError(f"progress callback: expected a callable or None, got {type(callback).__name__}")

    def on_progress(operation, done, total, _user):
        try:
            callback(operation.decode(), int(done), int(total))
        except Exception:  # noqa: BLE001
            logger.exception("progress callback raised")

    fn = _abi.ProgressCallback(on_progress)
    _check(setter(fn, None))
    _progress_fn = fn
