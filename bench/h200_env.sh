# Sourced by the bench/run_h200_*.sh scripts on the device machine: the vendor bundle, this tree installed,
# $OUT (what comes back) and $R (results collected there), and `stamp` for the log.
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/h200}
R=${R:-/tmp/h200-results}
mkdir -p "$OUT" "$R"
source .kernels/install-kernels.sh .kernels/bundle /tmp/dsv4hal-site >/dev/null || echo "vendor bundle did not install"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "pip install -e . failed"
T0=$(date +%s)
stamp() { echo "--- $(( $(date +%s) - T0 ))s: $*"; }
