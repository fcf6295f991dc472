#!/usr/bin/env bash
# The whole test suite on a fresh machine: builds (or reuses from the cache outside the repo) the
# pinned Kubernetes components the integration tests run against, then every Rust test.
#
#   scripts/test.sh            all tests
#   scripts/test.sh -p cdi-spec  extra arguments go to `cargo test`
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

# Integration tests each bring up a control plane: two at once is what 2 cores bear.
rm -f target/test-bed-timings.log
status=0
cargo test --workspace --locked "$@" -- --test-threads=2 || status=$?
if [[ -f target/test-bed-timings.log ]]; then
	cat target/test-bed-timings.log
fi
exit "$status"
