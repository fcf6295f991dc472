#!/usr/bin/env bash
# Benchmarks on the test bed: prepare/unprepare latency, memory, slice recovery, start-up, API
# requests at steady state, and a many-node scale run. Prints a table; the JSON figures go to
# target/bench/results.json. See BENCHMARKS.md.
#
#   scripts/bench.sh                 vgpu-dra (release build), default sizes
#   scripts/bench.sh --nodes 0       skip the scale run
#   scripts/bench.sh --help          every option, including how to measure another driver
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The test bed's Go builds pin their own toolchain (see integration/k8s/build.sh).
export GOTOOLCHAIN=go1.27.3

components="$(integration/k8s/build.sh)"
while IFS='=' read -r name path; do
	var="VGPU_DRA_BIN_$(echo "$name" | tr 'a-z-' 'A-Z_')"
	export "$var=$path"
done <<<"$components"

cargo build --release --locked -p vgpu-dra -p vgpu-dra-bench
exec target/release/vgpu-dra-bench "$@"
