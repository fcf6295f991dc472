#!/usr/bin/env bash
# The whole test suite on a fresh machine: builds (or reuses from the cache outside the repo) the
# pinned Kubernetes components the integration tests run against, then every Rust test.
#
#   scripts/test.sh            all tests on Kubernetes v1.36.3, then the tests that touch the
#                              scheduler, the kubelet and the DRA API again on v1.37.2
#   scripts/test.sh -p cdi-spec  extra arguments go to `cargo test` (one release only, unless they
#                              select nothing: --no-fail-fast, --release, --offline...)
#   scripts/test.sh -- --test-threads=1  and those after `--` to the test binaries
#   SECOND_K8S_VERSION= scripts/test.sh  all tests, one release only
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
# The whole workspace, unless the caller named packages: `--workspace` would override `-p`.
scope=(--workspace)
for arg in ${cargo_args[@]+"${cargo_args[@]}"}; do
	case $arg in -p | --package | -p* | --package=*) scope=() ;; esac
done
rm -f target/test-bed-timings.log
status=0
start=$SECONDS
# `${a[@]+"${a[@]}"}`: an empty array is no argument, also under `set -u` in bash before 4.4.
cargo test ${scope[@]+"${scope[@]}"} --locked ${cargo_args[@]+"${cargo_args[@]}"} -- ${test_args[@]+"${test_args[@]}"} || status=$?
if [[ -f target/test-bed-timings.log ]]; then
	cat target/test-bed-timings.log
fi
echo "tests on Kubernetes ${K8S_VERSION:-v1.36.3}: $((SECONDS - start)) s (status $status)"

# The whole suite runs on one release; the tests of what changes between releases (the
# scheduler's allocator and rounding, the kubelet's plugin manager, a real node and the chart
# installed on it, the DRA API, admission, Kueue's DRA path) run again on the next one. Not for a run the caller narrowed.
SECOND_K8S_VERSION="${SECOND_K8S_VERSION-v1.37.2}"
narrowed=false
for arg in ${cargo_args[@]+"${cargo_args[@]}"}; do
	case $arg in
	--no-fail-fast | --locked | --offline | --release | -q | --quiet | -v | --verbose) ;;
	*) narrowed=true ;;
	esac
done
if ! $narrowed && [[ -n $SECOND_K8S_VERSION && -z ${K8S_VERSION:-} ]]; then
	start=$SECONDS
	second="$(K8S_VERSION="$SECOND_K8S_VERSION" integration/k8s/build.sh)"
	echo "test bed components for Kubernetes $SECOND_K8S_VERSION ready in $((SECONDS - start)) s"
	second_status=0
	start=$SECONDS
	(
		while IFS='=' read -r name path; do
			export "VGPU_DRA_BIN_$(echo "$name" | tr 'a-z-' 'A-Z_')=$path"
		done <<<"$second"
		export K8S_VERSION="$SECOND_K8S_VERSION"
		tests=()
		for t in rounding dynamic_mig kubelet_plugin kubelet_sim real_node helm_install preflight admin_access device_taints chart webhook webhook_fit webhook_examples kueue; do
			tests+=(--test "$t")
		done
		# --workspace, not -p: the same feature resolution as the first pass, so its build is
		# reused rather than a second copy of every dependency written to disk.
		cargo test --workspace --locked ${cargo_args[@]+"${cargo_args[@]}"} "${tests[@]}" -- ${test_args[@]+"${test_args[@]}"}
	) || second_status=$?
	echo "tests on Kubernetes $SECOND_K8S_VERSION: $((SECONDS - start)) s (status $second_status)"
	if [[ $status -eq 0 ]]; then status=$second_status; fi
fi
exit "$status"
