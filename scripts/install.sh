#!/usr/bin/env bash
# Install libmoeplug into a prefix, laid out as C/C++ build systems expect:
#   PREFIX/lib/libmoeplug.so.1.0.0           the library (file name: ABI 1.0, patch 0)
#   PREFIX/lib/libmoeplug.so.1 -> .so.1.0.0  the soname, what programs load at run time
#   PREFIX/lib/libmoeplug.so   -> .so.1      what `-lmoeplug` links
#   PREFIX/include/moeplug.h
#   PREFIX/lib/pkgconfig/moeplug.pc          pkg-config --cflags --libs moeplug
#   PREFIX/lib/cmake/moeplug/moeplugConfig.cmake (+ ConfigVersion)   find_package(moeplug)
#
# usage: scripts/install.sh --prefix PREFIX [--library PATH]
#   --library PATH  install this already-built libmoeplug.so instead of running
#                   `cargo build --release` (the tests use it: cargo holds its build lock)
set -euo pipefail

usage() { sed -n '2,/^set -e/{/^#/s/^# \{0,1\}//p}' "$0"; }

prefix="" library=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a value}"; shift 2 ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --library) library="${2:?--library needs a value}"; shift 2 ;;
    --library=*) library="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "install.sh: --prefix is required" >&2; usage >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
header="$root/include/moeplug.h"
if [ -z "$library" ]; then
  (cd "$root" && cargo build --release --lib)
  target_dir="$(cd "$root" && cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
  library="$target_dir/release/libmoeplug.so"
fi
[ -f "$library" ] || { echo "install.sh: $library does not exist" >&2; exit 1; }

# One source for each number: the header the library was built with.
macro() { sed -n "s/^#define $1 \(.*\)$/\1/p" "$header"; }
version="$(macro MOEPLUG_VERSION | tr -d '"')"
abi="$(macro MOEPLUG_ABI_VERSION | tr -d 'u')"
abi_major=$((abi >> 16)) abi_minor=$((abi & 0xFFFF))
real="libmoeplug.so.$abi_major.$abi_minor.0"
soname="libmoeplug.so.$abi_major"

mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"
lib="$prefix/lib" inc="$prefix/include"
mkdir -p "$lib/pkgconfig" "$lib/cmake/moeplug" "$inc"
install -m 0755 "$library" "$lib/$real"
ln -sfn "$real" "$lib/$soname"
ln -sfn "$soname" "$lib/libmoeplug.so"
install -m 0644 "$header" "$inc/moeplug.h"

cat > "$lib/pkgconfig/moeplug.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include
abi_version=$abi_major.$abi_minor

Name: moeplug
Description: Mixture-of-Experts weight preparation and fused MoE (C ABI $abi_major.$abi_minor, soname $soname)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -lmoeplug
PC

# Relocatable: paths are found from this file's own location.
cat > "$lib/cmake/moeplug/moeplugConfig.cmake" <<CMAKE
# moeplug $version, C ABI $abi_major.$abi_minor.
#   moeplug::moeplug  link to libmoeplug ($soname) with its include directory
#   moeplug::headers  only the include directory (programs that dlopen $soname)
get_filename_component(_moeplug_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(moeplug_VERSION "$version")
set(moeplug_ABI_VERSION "$abi_major.$abi_minor")
set(moeplug_INCLUDE_DIRS "\${_moeplug_prefix}/include")
set(moeplug_LIBRARIES moeplug::moeplug)
if(NOT TARGET moeplug::moeplug)
  add_library(moeplug::moeplug SHARED IMPORTED)
  set_target_properties(moeplug::moeplug PROPERTIES
    IMPORTED_LOCATION "\${_moeplug_prefix}/lib/$real"
    IMPORTED_SONAME "$soname"
    INTERFACE_INCLUDE_DIRECTORIES "\${_moeplug_prefix}/include")
endif()
if(NOT TARGET moeplug::headers)
  add_library(moeplug::headers INTERFACE IMPORTED)
  set_target_properties(moeplug::headers PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "\${_moeplug_prefix}/include")
endif()
unset(_moeplug_prefix)
CMAKE

# Same-major compatibility: find_package(moeplug 0.1) accepts 0.1.x and later 0.x.
cat > "$lib/cmake/moeplug/moeplugConfigVersion.cmake" <<CMAKE
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
elseif(NOT PACKAGE_FIND_VERSION_MAJOR STREQUAL "${version%%.*}")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
if(NOT CMAKE_SIZEOF_VOID_P STREQUAL "8")
  set(PACKAGE_VERSION "\${PACKAGE_VERSION} (64-bit)")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
endif()
CMAKE

# The build tree gets the soname link too (build.rs makes it; this covers older builds).
[ -e "$(dirname "$library")/$soname" ] || ln -sfn "$(basename "$library")" "$(dirname "$library")/$soname" 2>/dev/null || true

echo "installed moeplug $version (ABI $abi_major.$abi_minor) into $prefix"
echo "  $lib/$real, $soname, libmoeplug.so"
echo "  $inc/moeplug.h"
echo "  $lib/pkgconfig/moeplug.pc, $lib/cmake/moeplug/moeplugConfig.cmake"
