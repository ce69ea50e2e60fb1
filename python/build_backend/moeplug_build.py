"""PEP 517 backend for the moeplug Python package: builds libmoeplug with cargo and writes a
wheel holding the ctypes package with the library inside it (moeplug/libmoeplug.so).

No build-time dependencies: a wheel is a zip with three metadata files. The tag is
py3-none-<platform> because the package talks to the library through ctypes, never through
the CPython ABI. $MOEPLUG_WHEEL_LIBRARY bundles an already-built library instead of running
cargo (the test suite uses it: it runs inside `cargo test`, which holds cargo's build lock).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # python/
REPO = PACKAGE_DIR.parent
NAME = "moeplug"
LIBRARY = "libmoeplug.so"


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(path.read_text())


def _project() -> dict:
    return _toml(PACKAGE_DIR / "pyproject.toml")["project"]


def _version() -> str:
    return _toml(REPO / "Cargo.toml")["package"]["version"]


def _tag() -> str:
    platform = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return f"py3-none-{platform}"


def _metadata() -> str:
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {_version()}",
        f"Summary: {p['description']}",
        f"License: {p['license']}",
        f"Requires-Python: {p['requires-python']}",
    ]
    lines += [f"Requires-Dist: {d}" for d in p["dependencies"]]
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    return "\n".join(lines) + "\n"


def _entry_points() -> str:
    scripts = _project().get("scripts", {})
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())


def _built_library() -> Path:
    given = os.environ.get("MOEPLUG_WHEEL_LIBRARY")
    if given:
        path = Path(given)
    else:
        subprocess.run(["cargo", "build", "--release", "--lib"], cwd=REPO, check=True, stdout=sys.stderr)
        meta = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps"],
            cwd=REPO, check=True, capture_output=True, text=True,
        )
        path = Path(json.loads(meta.stdout)["target_directory"]) / "release" / LIBRARY
    if not path.is_file():
        raise FileNotFoundError(f"{path}: libmoeplug was not built")
    return path


class _Wheel:
    """A wheel being written: files plus the RECORD of their hashes."""

    def __init__(self, path: Path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, arcname: str, data: bytes, executable: bool = False) -> None:
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o755 if executable else 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append(f"{arcname},sha256={digest},{len(data)}")

    def close(self, dist_info: str) -> None:
        self.record.append(f"{dist_info}/RECORD,,")
        self.zip.writestr(f"{dist_info}/RECORD", "\n".join(self.record) + "\n")
        self.zip.close()


def _write_wheel(wheel_directory: str, payload) -> str:
    version = _version()
    name = f"{NAME}-{version}-{_tag()}.whl"
    dist_info = f"{NAME}-{version}.dist-info"
    wheel = _Wheel(Path(wheel_directory) / name)
    payload(wheel)
    wheel.add(f"{dist_info}/METADATA", _metadata().encode())
    wheel.add(f"{dist_info}/entry_points.txt", _entry_points().encode())
    for lic in ("LICENSE-MIT", "LICENSE-APACHE"):
        if (REPO / lic).exists():
            wheel.add(f"{dist_info}/licenses/{lic}", (REPO / lic).read_bytes())
    wheel_file = f"Wheel-Version: 1.0\nGenerator: moeplug_build\nRoot-Is-Purelib: false\nTag: {_tag()}\n"
    wheel.add(f"{dist_info}/WHEEL", wheel_file.encode())
    wheel.close(dist_info)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    library = _built_library()

    def payload(wheel):
        for f in sorted((PACKAGE_DIR / NAME).glob("*.py")):
            wheel.add(f"{NAME}/{f.name}", f.read_bytes())
        wheel.add(f"{NAME}/{LIBRARY}", library.read_bytes(), executable=True)

    return _write_wheel(wheel_directory, payload)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """The source folder on sys.path; the package then loads target/release/libmoeplug.so."""
    _built_library()
    return _write_wheel(wheel_directory, lambda w: w.add(f"_{NAME}_editable.pth", f"{PACKAGE_DIR}\n".encode()))
