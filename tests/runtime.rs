//! The ABI 1.1 process settings through the exported functions: the host thread count (and
//! that host work obeys it), the log callback, the progress callback. They are process-wide,
//! so the tests of this binary take turns (`SERIAL`).

use std::collections::HashSet;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;
use std::thread::ThreadId;

use moeplug::capi::types::*;
use moeplug::capi::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(moeplug_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn ok(s: moeplug_status) {
    assert_eq!(s, moeplug_status::MoeplugOk, "{}", last_error());
}

fn invalid(s: moeplug_status, message: &str) {
    assert_eq!(s, moeplug_status::MoeplugInvalidArgument);
    assert_eq!(last_error(), message);
}

/// Threads that ran pieces of a 4 MiB `parallel_chunks` pass.
fn threads_used() -> HashSet<ThreadId> {
    let seen = Mutex::new(HashSet::new());
    let mut out = vec![0u8; 4 << 20];
    moeplug::prep::parallel::parallel_chunks(&mut out, 4096, |_, chunk| {
        chunk.fill(1);
        seen.lock().unwrap().insert(std::thread::current().id());
    });
    assert!(out.iter().all(|&b| b == 1));
    seen.into_inner().unwrap()
}

#[test]
fn num_threads_is_one_setting_that_host_work_obeys() {
    let _s = serial();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    ok(moeplug_set_num_threads(0));
    assert_eq!(moeplug_num_threads() as usize, cores);
    ok(moeplug_set_num_threads(3));
    assert_eq!(moeplug_num_threads(), 3);
    assert_eq!(threads_used().len(), 3);
    ok(moeplug_set_num_threads(1));
    let one = threads_used();
    assert_eq!(
        one.into_iter().collect::<Vec<_>>(),
        [std::thread::current().id()],
        "one thread: the caller's"
    );
    invalid(
        moeplug_set_num_threads(4097),
        "moeplug_set_num_threads: num_threads: expected 0 (every core) to 4096, got 4097",
    );
    assert_eq!(moeplug_num_threads(), 1, "a refused call changed the count");
    ok(moeplug_set_num_threads(4096));
    assert_eq!(moeplug_num_threads(), 4096);
    ok(moeplug_set_num_threads(0));
}

static LOG: Mutex<Vec<(i32, String, usize)>> = Mutex::new(Vec::new());

unsafe extern "C" fn record_log(level: i32, message: *const c_char, user: *mut c_void) {
    let text = CStr::from_ptr(message).to_string_lossy().into_owned();
    LOG.lock().unwrap().push((level, text, user as usize));
}

/// Tries to replace the callback from inside it and logs what that returned.
unsafe extern "C" fn reentrant_log(_level: i32, _message: *const c_char, user: *mut c_void) {
    let s = moeplug_set_log_callback(None, std::ptr::null_mut());
    let text = CStr::from_ptr(moeplug_last_error())
        .to_string_lossy()
        .into_owned();
    LOG.lock().unwrap().push((s as i32, text, user as usize));
}

#[test]
fn log_callback_gets_failed_calls_and_settings_until_cleared() {
    let _s = serial();
    LOG.lock().unwrap().clear();
    let user = 0x1234usize as *mut c_void;
    invalid(
        moeplug_set_log_callback(None, user),
        &format!("moeplug_set_log_callback: user: expected NULL when callback is NULL (clearing), got {user:p}"),
    );
    ok(moeplug_set_log_callback(Some(record_log), user));
    let s = unsafe { moeplug_shuffle_weight(std::ptr::null(), std::ptr::null_mut()) };
    assert_eq!(s, moeplug_status::MoeplugInvalidArgument);
    let failed = last_error();
    ok(moeplug_set_num_threads(2));
    ok(moeplug_set_num_threads(0));
    ok(moeplug_set_log_callback(None, std::ptr::null_mut()));
    unsafe { moeplug_shuffle_weight(std::ptr::null(), std::ptr::null_mut()) };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let got = std::mem::take(&mut *LOG.lock().unwrap());
    assert_eq!(
        got,
        [
            (4, format!("MOEPLUG_INVALID_ARGUMENT: {failed}"), 0x1234),
            (3, "host worker threads: 2 (set)".to_string(), 0x1234),
            (
                3,
                format!("host worker threads: {cores} (every core)"),
                0x1234
            ),
        ]
    );

    // From inside the callback the setter refuses (it would wait on itself).
    ok(moeplug_set_log_callback(Some(reentrant_log), user));
    ok(moeplug_set_num_threads(0));
    ok(moeplug_set_log_callback(None, std::ptr::null_mut()));
    let got = std::mem::take(&mut *LOG.lock().unwrap());
    assert_eq!(
        got,
        [(
            moeplug_status::MoeplugInvalidArgument as i32,
            "moeplug_set_log_callback: cannot replace the log callback from inside a moeplug callback"
                .to_string(),
            0x1234
        )]
    );
}

static PROGRESS: Mutex<Vec<(String, u64, u64, ThreadId)>> = Mutex::new(Vec::new());

unsafe extern "C" fn record_progress(op: *const c_char, done: u64, total: u64, _user: *mut c_void) {
    let op = CStr::from_ptr(op).to_string_lossy().into_owned();
    PROGRESS
        .lock()
        .unwrap()
        .push((op, done, total, std::thread::current().id()));
}

/// moeplug_quantize_mx (MXFP4) of `rows` x 1024 fp32 on the host: (q, scales).
fn quantize(rows: usize) -> (Vec<u8>, Vec<u8>) {
    let k = 1024usize;
    let src: Vec<f32> = (0..rows * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
        .collect();
    let mut q = vec![0u8; rows * k / 2];
    let mut sc = vec![0u8; rows * k / 32];
    let (r, kk) = (rows as i64, k as i64);
    // The descriptors point at their shapes: keep them alive for the call.
    let shapes = [[r, kk], [r, kk / 2], [r, kk / 32]];
    let st = moeplug_tensor::host(src.as_ptr() as *mut c_void, &shapes[0], 2, 32);
    let qt = moeplug_tensor::host(q.as_mut_ptr() as *mut c_void, &shapes[1], 1, 8);
    let ct = moeplug_tensor::host(sc.as_mut_ptr() as *mut c_void, &shapes[2], 1, 8);
    let args = moeplug_quantize_mx_args {
        struct_size: std::mem::size_of::<moeplug_quantize_mx_args>() as u32,
        src: &st,
        dst_q: &qt,
        dst_scale: &ct,
        format: moeplug_weight_format::Mxfp4 as i32,
        round_mode: 0,
        shuffle_scale: 0,
        out_fragment: std::ptr::null_mut(),
    };
    ok(unsafe { moeplug_quantize_mx(&args, std::ptr::null_mut()) });
    (q, sc)
}

#[test]
fn progress_of_a_host_quantization_on_the_calling_thread() {
    let _s = serial();
    PROGRESS.lock().unwrap().clear();
    let rows = 2048; // 64 Ki MX blocks: split over the workers
    ok(moeplug_set_num_threads(1));
    let serial_result = quantize(rows);
    assert!(
        PROGRESS.lock().unwrap().is_empty(),
        "reported without a callback"
    );

    ok(moeplug_set_num_threads(4));
    ok(moeplug_set_progress_callback(
        Some(record_progress),
        std::ptr::null_mut(),
    ));
    let parallel_result = quantize(rows);
    ok(moeplug_set_progress_callback(None, std::ptr::null_mut()));
    ok(moeplug_set_num_threads(0));
    assert!(
        parallel_result == serial_result,
        "the thread count changed the bytes"
    );

    let got = std::mem::take(&mut *PROGRESS.lock().unwrap());
    let total = (rows * 1024 / 2 + rows * 1024 / 32) as u64;
    let me = std::thread::current().id();
    assert!(got.len() >= 3, "no intermediate report: {got:?}");
    assert_eq!((got[0].1, got.last().unwrap().1), (0, total), "{got:?}");
    for (i, (op, done, t, thread)) in got.iter().enumerate() {
        assert_eq!(
            (op.as_str(), *t, *thread),
            ("moeplug_quantize_mx", total, me)
        );
        assert!(i == 0 || *done > got[i - 1].1, "not increasing: {got:?}");
    }
}

#[test]
fn progress_callback_validates_user() {
    let _s = serial();
    let user = 8usize as *mut c_void;
    invalid(
        moeplug_set_progress_callback(None, user),
        &format!("moeplug_set_progress_callback: user: expected NULL when callback is NULL (clearing), got {user:p}"),
    );
}

#[test]
fn a_long_host_call_logs_its_time_without_a_progress_callback() {
    let _s = serial();
    LOG.lock().unwrap().clear();
    ok(moeplug_set_log_callback(
        Some(record_log),
        std::ptr::null_mut(),
    ));
    quantize(64);
    ok(moeplug_set_log_callback(None, std::ptr::null_mut()));
    let got = std::mem::take(&mut *LOG.lock().unwrap());
    let total = 64 * 1024 / 2 + 64 * 1024 / 32;
    assert_eq!(got.len(), 1, "{got:?}");
    let (level, text, _) = &got[0];
    assert_eq!(*level, 4);
    let rest = text
        .strip_prefix(&format!("moeplug_quantize_mx: {total} bytes in "))
        .and_then(|r| r.strip_suffix(" ms"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(rest.parse::<f64>().is_ok(), "{text}");
}
