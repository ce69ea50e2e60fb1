//! Command-line parsing: every command has its `--help`; anything not understood is an
//! error that names it and shows the usage (exit status 2).

use crate::demo::Device;

pub const MAIN_USAGE: &str = "\
usage: moeplug [--version] [--help] <command> [<args>]

commands:
  info    version, ABI and the capabilities of every backend
  demo    quantize, prepare and run a gpt-oss-like MoE layer; check it against float64
  help    the usage of a command: moeplug help <command>

`moeplug <command> --help` shows a command's options.
";

pub const INFO_USAGE: &str = "\
usage: moeplug info

Prints the version, the ABI, the capabilities of every backend (cpu, cuda:0, rocm:0) or why
it is unavailable, and the state of the GPU kernel cache.

options:
  -h, --help        this help
";

pub const DEMO_USAGE: &str = "\
usage: moeplug demo [--device DEVICE]

Quantizes a bf16 gpt-oss-like MoE layer to MXFP4, prepares it (padding, re-ordering,
shuffles) and runs fused_moe through the C ABI, checked against float64.

options:
  --device DEVICE   where fused_moe runs: cpu (default), cuda:N or rocm:N. Without that GPU
                    the demo fails with MOEPLUG_BACKEND_UNAVAILABLE and the reason.
  -h, --help        this help
";

#[derive(Debug, PartialEq)]
pub enum Cli {
    /// Print this text on stdout and succeed.
    Help(&'static str),
    Version,
    Info,
    Demo(Device),
}

/// A command line that is not understood: what is wrong and the usage to show.
#[derive(Debug, PartialEq)]
pub struct UsageError {
    pub message: String,
    pub usage: &'static str,
}

fn usage_error(message: String, usage: &'static str) -> UsageError {
    UsageError { message, usage }
}

fn is_help(arg: &str) -> bool {
    arg == "-h" || arg == "--help"
}

pub fn parse(args: &[String]) -> Result<Cli, UsageError> {
    let Some((command, rest)) = args.split_first() else {
        return Err(usage_error("no command given".into(), MAIN_USAGE));
    };
    match command.as_str() {
        "-h" | "--help" => Ok(Cli::Help(MAIN_USAGE)),
        "-V" | "--version" => Ok(Cli::Version),
        "help" => match rest {
            [] => Ok(Cli::Help(MAIN_USAGE)),
            [cmd] => usage_of(cmd)
                .map(Cli::Help)
                .ok_or_else(|| usage_error(format!("no command '{cmd}'"), MAIN_USAGE)),
            [_, extra, ..] => Err(usage_error(
                format!("help: unexpected argument '{extra}'"),
                MAIN_USAGE,
            )),
        },
        "info" => match rest {
            [] => Ok(Cli::Info),
            [h] if is_help(h) => Ok(Cli::Help(INFO_USAGE)),
            [other, ..] => Err(usage_error(
                format!("info: unknown argument '{other}'"),
                INFO_USAGE,
            )),
        },
        "demo" => parse_demo(rest),
        other if other.starts_with('-') => {
            Err(usage_error(format!("unknown option '{other}'"), MAIN_USAGE))
        }
        other => Err(usage_error(
            format!("unknown command '{other}'"),
            MAIN_USAGE,
        )),
    }
}

fn usage_of(command: &str) -> Option<&'static str> {
    match command {
        "info" => Some(INFO_USAGE),
        "demo" => Some(DEMO_USAGE),
        "help" => Some(MAIN_USAGE),
        _ => None,
    }
}

fn parse_demo(args: &[String]) -> Result<Cli, UsageError> {
    let bad = |m: String| usage_error(format!("demo: {m}"), DEMO_USAGE);
    let mut device = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let value = if is_help(arg) {
            return Ok(Cli::Help(DEMO_USAGE));
        } else if arg == "--device" {
            it.next()
                .ok_or_else(|| bad("--device needs a value".into()))?
                .as_str()
        } else if let Some(v) = arg.strip_prefix("--device=") {
            v
        } else {
            return Err(bad(format!("unknown argument '{arg}'")));
        };
        if device.is_some() {
            return Err(bad("--device given twice".into()));
        }
        device = Some(Device::parse(value).map_err(bad)?);
    }
    Ok(Cli::Demo(device.unwrap_or(Device::Cpu)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Cli, UsageError> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn commands_and_their_help() {
        assert_eq!(p(&["info"]), Ok(Cli::Info));
        assert_eq!(p(&["demo"]), Ok(Cli::Demo(Device::Cpu)));
        assert_eq!(p(&["--version"]), Ok(Cli::Version));
        assert_eq!(p(&["-V"]), Ok(Cli::Version));
        assert_eq!(p(&["--help"]), Ok(Cli::Help(MAIN_USAGE)));
        assert_eq!(p(&["help"]), Ok(Cli::Help(MAIN_USAGE)));
        assert_eq!(p(&["help", "demo"]), Ok(Cli::Help(DEMO_USAGE)));
        assert_eq!(p(&["info", "-h"]), Ok(Cli::Help(INFO_USAGE)));
        // --help wins wherever it stands, and the demo does not run.
        assert_eq!(
            p(&["demo", "--device", "cuda:1", "--help"]),
            Ok(Cli::Help(DEMO_USAGE))
        );
    }

    #[test]
    fn devices() {
        let demo = |d: &str| p(&["demo", "--device", d]);
        assert_eq!(demo("cpu"), Ok(Cli::Demo(Device::Cpu)));
        assert_eq!(demo("cuda"), Ok(Cli::Demo(Device::Cuda(0))));
        assert_eq!(demo("cuda:3"), Ok(Cli::Demo(Device::Cuda(3))));
        assert_eq!(
            p(&["demo", "--device=rocm:1"]),
            Ok(Cli::Demo(Device::Rocm(1)))
        );
        let err = |args: &[&str]| p(args).unwrap_err().message;
        assert_eq!(
            err(&["demo", "--device", "cuda:x"]),
            "demo: device 'cuda:x': 'x' is not a device index"
        );
        assert_eq!(
            err(&["demo", "--device", "cuda:-1"]),
            "demo: device 'cuda:-1': '-1' is not a device index"
        );
        assert_eq!(
            err(&["demo", "--device", "tpu:0"]),
            "demo: device 'tpu:0': expected cpu, cuda:N or rocm:N"
        );
        assert_eq!(
            err(&["demo", "--device", "cpu:0"]),
            "demo: device 'cpu:0': expected cpu, cuda:N or rocm:N"
        );
        assert_eq!(err(&["demo", "--device"]), "demo: --device needs a value");
        assert_eq!(
            err(&["demo", "--device", "cpu", "--device=cpu"]),
            "demo: --device given twice"
        );
    }

    #[test]
    fn anything_else_is_an_error_with_the_right_usage() {
        let e = p(&["demo", "--fast"]).unwrap_err();
        assert_eq!(e.message, "demo: unknown argument '--fast'");
        assert_eq!(e.usage, DEMO_USAGE);
        let e = p(&["info", "--json"]).unwrap_err();
        assert_eq!(e.message, "info: unknown argument '--json'");
        assert_eq!(e.usage, INFO_USAGE);
        assert_eq!(p(&[]).unwrap_err().message, "no command given");
        assert_eq!(
            p(&["--verbose"]).unwrap_err().message,
            "unknown option '--verbose'"
        );
        assert_eq!(p(&["frob"]).unwrap_err().message, "unknown command 'frob'");
        assert_eq!(
            p(&["help", "frob"]).unwrap_err().message,
            "no command 'frob'"
        );
    }
}
