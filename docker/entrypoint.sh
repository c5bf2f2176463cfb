#!/usr/bin/env bash
# Entry point of the dsv4hal images (installed as /usr/local/bin/dsv4hal-entrypoint).
#
#   no arguments:  print `dsv4hal info`, then run the conformance matrix for this image's platform and write
#                  $DSV4HAL_OUT/conformance.json and $DSV4HAL_OUT/conformance.md (DSV4HAL_OUT defaults to /out).
#                  The exit status is the conformance run's: 0 no cell failed, 1 a cell failed, 2 the platform
#                  could not be used (see its message).
#   arguments:     `exec dsv4hal "$@"`, e.g. `docker run IMAGE info --json` or `docker run IMAGE explain compress`.
#
# DSV4HAL_PLATFORM (set per image by ENV: cuda_sm90, cuda_sm100 or rocm) is the platform the conformance run
# forces; dsv4hal itself reads the same variable, so `info` reports on that platform too.
set -euo pipefail

if [[ $# -gt 0 ]]; then
  exec dsv4hal "$@"
fi

platform="${DSV4HAL_PLATFORM:?DSV4HAL_PLATFORM is not set (each image sets it; pass -e DSV4HAL_PLATFORM=...)}"
out="${DSV4HAL_OUT:-/out}"

# Triton and DeepGEMM cache compiled kernels under $HOME; under `docker run --user UID` that has no home of
# its own, use a private writable one instead.
if [[ -z ${HOME:-} || ! -w ${HOME:-/nonexistent} ]]; then
  HOME="$(mktemp -d -t dsv4hal-home.XXXXXX)"
  export HOME
fi

if ! mkdir -p "$out" 2>/dev/null || [[ ! -w $out ]]; then
  echo "dsv4hal-entrypoint: cannot write to $out as uid $(id -u): create the mounted folder first and make it" \
    "writable for this uid (or run with --user \"\$(id -u):\$(id -g)\"), or set DSV4HAL_OUT" >&2
  exit 2
fi

echo "== dsv4hal info (DSV4HAL_PLATFORM=$platform)"
# Informational: a platform that cannot be used is reported again, with its reasons, by the conformance run.
dsv4hal info || echo "dsv4hal-entrypoint: dsv4hal info exited with status $?" >&2

echo "== dsv4hal conformance --platform $platform -> $out/conformance.json, $out/conformance.md"
exec dsv4hal conformance --platform "$platform" --json "$out/conformance.json" --markdown "$out/conformance.md"
