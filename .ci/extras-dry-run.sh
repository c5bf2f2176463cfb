#!/usr/bin/env bash
# Resolve every extra in pyproject.toml against the torch it is documented with (README: "Installing for a GPU"),
# with `pip install --dry-run --ignore-installed`: nothing is installed. pip reads the wheels' metadata files
# (PEP 658), so even vLLM's tree resolves without downloading wheels; no --no-deps is needed. An extra that is
# not in TORCH_FOR below fails the check, so a new extra must say which torch it goes with.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A TORCH_FOR=(
  [triton]=2.13.0 [plot]=2.13.0 [test]=2.13.0  # the CPU line (CI, the README's commands)
  [cuda-sm90]=2.14.1 [cuda-sm100]=2.14.1        # sgl-flash-mla 1.0.0 asks for torch>=2.14.1
  [cuda-vllm]=2.11.0                            # vLLM 0.24 pins torch==2.11.0
  [rocm]=2.13.0                                 # any torch: the ROCm image keeps its own; PyPI has no ROCm torch
)

mapfile -t extras < <(python3 - <<'PY'
try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]))
PY
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pids=()
for extra in "${extras[@]}"; do
  torch=${TORCH_FOR[$extra]:-}
  if [[ -z $torch ]]; then
    echo "extras-dry-run: extra '$extra' has no torch version in .ci/extras-dry-run.sh TORCH_FOR; add it there and to the README" >&2
    exit 1
  fi
  ( python3 -m pip install --dry-run --ignore-installed --quiet --disable-pip-version-check \
      --report "$tmp/$extra.json" ".[$extra]" "torch==$torch" >"$tmp/$extra.log" 2>&1 ) &
  pids+=("$!")
done
failed=0
for i in "${!extras[@]}"; do
  extra=${extras[$i]}
  if wait "${pids[$i]}"; then
    echo "extras-dry-run: .[$extra] resolves with torch==${TORCH_FOR[$extra]} ($(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["install"]))' "$tmp/$extra.json") packages)"
  else
    echo "extras-dry-run: .[$extra] does NOT resolve with torch==${TORCH_FOR[$extra]}:" >&2
    grep -v '^WARNING: Location' "$tmp/$extra.log" | tail -n 20 >&2
    failed=1
  fi
done
exit "$failed"
