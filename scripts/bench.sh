#!/usr/bin/env bash
# Benchmarks on the test bed: prepare/unprepare latency, memory, slice recovery, start-up, API
# requests at steady state, and a many-node scale run. Prints a table; the JSON figures go to
# target/bench/results.json. See BENCHMARKS.md.
#
#   scripts/bench.sh                 vgpu-dra (release build), default sizes
#   scripts/bench.sh --nodes 0       skip the scale run
#   scripts/bench.sh --help          every option, including how to measure another driver
#
# Measuring another driver: any DRA kubelet plugin that runs outside a cluster, given by
#   --driver-name NAME           the driver name it publishes slices under
#   --driver-command 'CMD'       its command line, run by bash once per node, with placeholders
#                                {node} node name, {dir} a fresh directory standing in for the
#                                node's host paths, {kubeconfig} (a cluster-admin service
#                                account), {driver} the driver name
#   --socket PATH                its DRA socket (default {dir}/kubelet/plugins/{driver}/dra.sock)
#   --claim-requests ''          capacity per claim; '' for drivers without consumable capacity
#   --wipe-timeout-seconds 120   how long slices may take to come back after a wipe (the
#                                upstream ResourceSlice controller takes about 50 s)
#   --webhook-pods 0             the webhook runs measure vgpu-dra's webhook only
# e.g. the kubernetes-sigs example driver, built elsewhere (see BENCHMARKS.md, "Measuring
# another driver"):
#   scripts/bench.sh --nodes 0 --webhook-pods 0 --driver-name gpu.example.com \
#     --claim-requests memory=1Gi,compute=1 --driver-command '/path/dra-example-kubeletplugin \
#     --node-name={node} --kubeconfig={kubeconfig} --cdi-root={dir}/cdi \
#     --kubelet-registrar-directory-path={dir}/kubelet/plugins_registry \
#     --kubelet-plugins-directory-path={dir}/kubelet/plugins --driver-name={driver} \
#     --num-devices=16 --gpu-allow-multiple-allocations --kube-api-qps=1000 --kube-api-burst=1000'
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The test bed's Go builds pin their own toolchain (see integration/k8s/build.sh).
export GOTOOLCHAIN=go1.27.3

components="$(integration/k8s/build.sh)"
while IFS='=' read -r name path; do
	var="VGPU_DRA_BIN_$(echo "$name" | tr 'a-z-' 'A-Z_')"
	export "$var=$path"
done <<<"$components"

# Two builds, not one: built together, the two packages' dependencies would share features, and
# the daemon would differ from the image's (`-p vgpu-dra` alone), down to the symbol names that
# driver/symbol-order.txt places.
cargo build --release --locked -p vgpu-dra
cargo build --release --locked -p vgpu-dra-bench
exec target/release/vgpu-dra-bench "$@"
