//! The error type of the safe core. Every failure carries the C status it maps to and a
//! message that names the argument and the expected vs given value.

use std::fmt;

/// Status codes of the C ABI (API.md §1). The values are fixed forever.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Ok = 0,
    InvalidArgument = 1,
    Unsupported = 2,
    LayoutMismatch = 3,
    BackendUnavailable = 4,
    DeviceError = 5,
    CompileError = 6,
    OutOfMemory = 7,
    BufferTooSmall = 8,
    Internal = 9,
}

impl Status {
    pub const ALL: [Status; 10] = [
        Status::Ok,
        Status::InvalidArgument,
        Status::Unsupported,
        Status::LayoutMismatch,
        Status::BackendUnavailable,
        Status::DeviceError,
        Status::CompileError,
        Status::OutOfMemory,
        Status::BufferTooSmall,
        Status::Internal,
    ];

    pub fn from_code(code: i32) -> Option<Status> {
        Status::ALL.iter().copied().find(|s| *s as i32 == code)
    }

    /// The C spelling, e.g. "MOEPLUG_INVALID_ARGUMENT".
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "MOEPLUG_OK",
            Status::InvalidArgument => "MOEPLUG_INVALID_ARGUMENT",
            Status::Unsupported => "MOEPLUG_UNSUPPORTED",
            Status::LayoutMismatch => "MOEPLUG_LAYOUT_MISMATCH",
            Status::BackendUnavailable => "MOEPLUG_BACKEND_UNAVAILABLE",
            Status::DeviceError => "MOEPLUG_DEVICE_ERROR",
            Status::CompileError => "MOEPLUG_COMPILE_ERROR",
            Status::OutOfMemory => "MOEPLUG_OUT_OF_MEMORY",
            Status::BufferTooSmall => "MOEPLUG_BUFFER_TOO_SMALL",
            Status::Internal => "MOEPLUG_INTERNAL",
        }
    }
}

/// A failed call: the status for C and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidArgument, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::new(Status::Unsupported, message)
    }
    pub fn mismatch(message: impl Into<String>) -> Error {
        Error::new(Status::LayoutMismatch, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Error {
        Error::new(Status::BackendUnavailable, message)
    }
    pub fn device(message: impl Into<String>) -> Error {
        Error::new(Status::DeviceError, message)
    }
    pub fn out_of_memory(message: impl Into<String>) -> Error {
        Error::new(Status::OutOfMemory, message)
    }
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(Status::Internal, message)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// `return Err(Error::invalid(format!(..)))` in one line.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($fmt:tt)+) => {
        return Err($crate::error::Error::$kind(format!($($fmt)+)))
    };
}
