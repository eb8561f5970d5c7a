#!/usr/bin/env bash
# Times the whole `proxops validate` process over the generated 10,000-resource repository
# (crates/core/benches/validate_10k.rs writes it), issue 20's figure 4: start, read 9,063
# files, parse, validate, level, print the summary, exit. Prints each run, the min and the
# median, and the load average before and after.
#
#   benches/validate_process.sh [RUNS]     # default 21 runs, bench profile
#
# Builds with `cargo bench --no-run` (the `bench` profile, which inherits `release`), so run it
# from the workspace root; CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-21}"
target="${CARGO_TARGET_DIR:-target}"
repo="$(mktemp -d)"
trap 'rm -rf "$repo"' EXIT

cargo bench --no-run -p proxops-core --bench validate_10k >/dev/null 2>&1
gen="$(ls -t "$target"/release/deps/validate_10k-* | grep -v '\.d$' | head -n 1)"
PROXOPS_BENCH_WRITE_REPO="$repo" "$gen"
cargo build --profile bench --bin proxops >/dev/null 2>&1
bin="$target/release/proxops"

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" validate "$repo" >/dev/null # warm the page cache
times=()
for _ in $(seq "$runs"); do
  start=$(date +%s%N)
  "$bin" validate "$repo" >/dev/null
  end=$(date +%s%N)
  times+=($(((end - start) / 1000)))
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
ms() { awk -v us="$1" 'BEGIN { printf "%.1f ms", us / 1000 }'; }
echo "proxops validate, 10,000 resources, whole process: min $(ms "${sorted[0]}"), median $(ms "${sorted[$((runs / 2))]}"), max $(ms "${sorted[$((runs - 1))]}") over $runs runs"
