#!/usr/bin/env bash
# The whole test suite on a fresh machine: builds (or reuses from the cache outside the repo) the
# pinned Kubernetes components the integration tests run against, then every Rust test.
#
#   scripts/test.sh            all tests
#   scripts/test.sh -p cdi-spec  extra arguments go to `cargo test`
#   scripts/test.sh -- --test-threads=1  and those after `--` to the test binaries
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The test bed's Go builds pin their own toolchain (see integration/k8s/build.sh).
export GOTOOLCHAIN=go1.27.3

start=$SECONDS
components="$(integration/k8s/build.sh)"
echo "test bed components ready in $((SECONDS - start)) s"
# Hand the paths to the Rust test support, which otherwise runs build.sh itself.
while IFS='=' read -r name path; do
	var="VGPU_DRA_BIN_$(echo "$name" | tr 'a-z-' 'A-Z_')"
	export "$var=$path"
done <<<"$components"

# Integration tests each bring up a control plane: two at once is what 2 cores bear, unless the
# caller chose a number (after `--`, or in RUST_TEST_THREADS); a second --test-threads after the
# caller's would silently replace it.
cargo_args=()
test_args=()
after_dashes=false
threads_chosen=false
for arg in "$@"; do
	if $after_dashes; then
		test_args+=("$arg")
		if [[ $arg == --test-threads* ]]; then threads_chosen=true; fi
	elif [[ $arg == -- ]]; then
		after_dashes=true
	else
		cargo_args+=("$arg")
	fi
done
if ! $threads_chosen && [[ -z ${RUST_TEST_THREADS:-} ]]; then
	test_args+=(--test-threads=2)
fi
rm -f target/test-bed-timings.log
status=0
# `${a[@]+"${a[@]}"}`: an empty array is no argument, also under `set -u` in bash before 4.4.
cargo test --workspace --locked ${cargo_args[@]+"${cargo_args[@]}"} -- ${test_args[@]+"${test_args[@]}"} || status=$?
if [[ -f target/test-bed-timings.log ]]; then
	cat target/test-bed-timings.log
fi
exit "$status"
