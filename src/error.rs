//! The error type of the safe core. Every failure carries the C status it maps to and a
//! message that names the argument and the expected vs given value.

use std::ffi::CStr;
use std::fmt;

use crate::vocab::moeplug_status;

macro_rules! statuses {
    ($($variant:ident = $cv:ident => $name:literal),+ $(,)?) => {
        /// Status codes of the C ABI (docs/abi.md), valued as `vocab::moeplug_status`.
        #[repr(i32)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Status { $($variant = moeplug_status::$cv as i32),+ }

        impl Status {
            pub const ALL: &'static [Status] = &[$(Status::$variant),+];

            /// The C spelling, e.g. "MOEPLUG_INVALID_ARGUMENT", NUL-terminated for C.
            pub fn c_name(self) -> &'static CStr {
                match self { $(Status::$variant => $name),+ }
            }
            /// The C value.
            pub fn to_c(self) -> moeplug_status {
                match self { $(Status::$variant => moeplug_status::$cv),+ }
            }
            /// A status added to `vocab` without a variant here does not compile.
            #[allow(dead_code)]
            fn of_c(s: moeplug_status) -> Status {
                match s { $(moeplug_status::$cv => Status::$variant),+ }
            }
        }
    };
}

statuses!(
    Ok = MoeplugOk => c"MOEPLUG_OK",
    InvalidArgument = MoeplugInvalidArgument => c"MOEPLUG_INVALID_ARGUMENT",
    Unsupported = MoeplugUnsupported => c"MOEPLUG_UNSUPPORTED",
    LayoutMismatch = MoeplugLayoutMismatch => c"MOEPLUG_LAYOUT_MISMATCH",
    BackendUnavailable = MoeplugBackendUnavailable => c"MOEPLUG_BACKEND_UNAVAILABLE",
    DeviceError = MoeplugDeviceError => c"MOEPLUG_DEVICE_ERROR",
    CompileError = MoeplugCompileError => c"MOEPLUG_COMPILE_ERROR",
    OutOfMemory = MoeplugOutOfMemory => c"MOEPLUG_OUT_OF_MEMORY",
    BufferTooSmall = MoeplugBufferTooSmall => c"MOEPLUG_BUFFER_TOO_SMALL",
    Internal = MoeplugInternal => c"MOEPLUG_INTERNAL",
);

impl Status {
    pub fn from_code(code: i32) -> Option<Status> {
        Status::ALL.iter().copied().find(|s| *s as i32 == code)
    }

    /// The C spelling, e.g. "MOEPLUG_INVALID_ARGUMENT".
    pub fn name(self) -> &'static str {
        self.c_name().to_str().unwrap_or("UNKNOWN")
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
