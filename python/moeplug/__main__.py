"""`python -m moeplug info [--json]`: what this install is and what every device can run."""

from __future__ import annotations

import argparse
import json
import sys


def _report() -> dict:
    import moeplug

    devices = {}
    for device in ("cpu", "cuda:0", "rocm:0"):
        try:
            caps = moeplug.get_caps(device)
        except moeplug.MoeplugError as e:
            devices[device] = {"available": False, "status": e.name, "message": e.message}
            continue
        entry = {"available": True, "backend": caps.backend, "arch": caps.arch, "runtime_version": caps.runtime_version}
        for field in ("weight_formats", "act_dtypes", "gate_modes", "activations", "weight_layouts", "scale_layouts", "features"):
            entry[field] = sorted(getattr(caps, field))
        devices[device] = entry
    major, minor = moeplug.abi_version()
    return {
        "version": moeplug.version(),
        "abi_version": f"{major}.{minor}",
        "library": moeplug.library_path(),
        "package": str(__import__("pathlib").Path(moeplug.__file__).parent),
        "python": sys.version.split()[0],
        "devices": devices,
    }


def _print_text(r: dict) -> None:
    print(f"moeplug  {r['version']}")
    print(f"ABI      {r['abi_version']}")
    print(f"library  {r['library']}")
    print(f"package  {r['package']} (Python {r['python']})")
    for name, d in r["devices"].items():
        print(f"\n{name}")
        if not d["available"]:
            print(f"  unavailable: {d['status']}: {d['message']}")
            continue
        for key, value in d.items():
            if key != "available":
                text = ", ".join(value) if isinstance(value, list) else value
                print(f"  {key.replace('_', ' '):<16} {text or '-'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moeplug", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    info = commands.add_parser("info", help="version, ABI, library path and every device's capabilities")
    info.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = parser.parse_args(argv)
    try:
        report = _report()
    except OSError as e:  # the library could not be found or loaded
        print(f"moeplug: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
