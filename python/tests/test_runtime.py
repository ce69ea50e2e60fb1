"""ABI 1.1 process settings from Python: host threads, the library's log messages on the
``moeplug`` logger, progress callbacks of prepare_moe and quantize_mx."""

import logging
import os
import threading

import numpy as np
import pytest

import moeplug

E, H, INTER = 4, 512, 256


@pytest.fixture
def default_threads():
    yield
    moeplug.set_num_threads(0)


def test_num_threads_round_trip_and_refusals(default_threads):
    moeplug.set_num_threads(0)
    assert 1 <= moeplug.num_threads() <= len(os.sched_getaffinity(0))
    moeplug.set_num_threads(3)
    assert moeplug.num_threads() == 3
    with pytest.raises(moeplug.MoeplugError) as e:
        moeplug.set_num_threads(5000)
    assert e.value.name == "MOEPLUG_INVALID_ARGUMENT"
    assert e.value.message == "moeplug_set_num_threads: num_threads: expected 0 (every core) to 4096, got 5000"
    assert moeplug.num_threads() == 3
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="num_threads: expected an int >= 0"):
            moeplug.set_num_threads(bad)


def test_failed_calls_and_settings_reach_the_moeplug_logger(caplog, default_threads):
    with caplog.at_level(logging.DEBUG, logger="moeplug"):
        with pytest.raises(moeplug.MoeplugError) as e:
            moeplug.get_caps((99, 0))
        moeplug.set_num_threads(2)
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert records == [
        ("moeplug", logging.DEBUG, f"MOEPLUG_INVALID_ARGUMENT: {e.value.message}"),
        ("moeplug", logging.INFO, "host worker threads: 2 (set)"),
    ]


def _weights():
    rng = np.random.default_rng(3)
    w13 = (rng.standard_normal((E, 2 * INTER, H)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((E, H, INTER)) * 0.1).astype(np.float32)
    return w13, w2


def test_progress_of_quantize_and_prepare(default_threads):
    w13, w2 = _weights()
    moeplug.set_num_threads(1)
    want_q, want_s = moeplug.quantize_mx(w13.reshape(-1, H))
    seen = []
    moeplug.set_num_threads(4)
    moeplug.set_progress_callback(lambda op, done, total: seen.append((op, done, total, threading.get_ident())))
    try:
        q, s = moeplug.quantize_mx(w13.reshape(-1, H))
        quantize_reports = list(seen)
        q2, s2 = _q2(w2)
        seen.clear()
        p = moeplug.prepare_moe(
            q.reshape(E, 2 * INTER, H // 2), q2, weight_format="mxfp4", w13_scale=s.reshape(E, 2 * INTER, -1), w2_scale=s2
        )
    finally:
        moeplug.set_progress_callback(None)
    assert np.array_equal(np.asarray(q), np.asarray(want_q)) and np.array_equal(np.asarray(s), np.asarray(want_s))

    total_q = np.asarray(q).nbytes + np.asarray(s).nbytes
    _check_reports(quantize_reports, "moeplug_quantize_mx", total_q)
    outputs = sum(np.asarray(t).nbytes for t in (p.w13, p.w2, p.w13_scale, p.w2_scale) if t is not None)
    _check_reports(seen, "moeplug_prepare_moe", outputs)

    seen.clear()
    moeplug.quantize_mx(w13.reshape(-1, H))
    assert seen == [], "reported after the callback was cleared"


def _q2(w2):
    q, s = moeplug.quantize_mx(w2.reshape(-1, INTER))
    return q.reshape(E, H, INTER // 2), s.reshape(E, H, -1)


def _check_reports(reports, op, total):
    me = threading.get_ident()
    assert reports, f"no reports for {op}"
    assert [r[0] for r in reports] == [op] * len(reports)
    assert {r[2] for r in reports} == {total} and {r[3] for r in reports} == {me}
    done = [r[1] for r in reports]
    assert done[0] == 0 and done[-1] == total and done == sorted(set(done)), done


def test_progress_callback_errors_are_logged_not_raised(caplog):
    def boom(op, done, total):
        raise RuntimeError("boom")

    w13, _ = _weights()
    moeplug.set_progress_callback(boom)
    try:
        with caplog.at_level(logging.ERROR, logger="moeplug"):
            q, _s = moeplug.quantize_mx(w13.reshape(-1, H))
    finally:
        moeplug.set_progress_callback(None)
    assert np.asarray(q).shape == (E * 2 * INTER, H // 2)
    assert any(r.getMessage() == "progress callback raised" for r in caplog.records)
    with pytest.raises(TypeError, match="expected a callable or None"):
        moeplug.set_progress_callback(3)
