#!/usr/bin/env bash
# Builds the real Kubernetes components the integration tests run against, from the Go module proxy,
# and caches them outside the repository keyed by version, so a second run builds nothing.
#
#   integration/k8s/build.sh            build (or reuse) everything, print `NAME=PATH` lines
#   K8S_VERSION=v1.37.2 integration/k8s/build.sh   the same for another Kubernetes release
#
# Output (stdout, one per line, nothing else): kube-apiserver=... kube-scheduler=... and so on,
# which the Rust test support reads. Progress goes to stderr.
set -euo pipefail

# The one approved way to get a Go newer than the machine's (Kubernetes 1.37 needs it).
export GOTOOLCHAIN=go1.27.3
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
# Kueue for the quota docs: its CRDs and a decoder of its manager Configuration.
KUEUE_VERSION="${KUEUE_VERSION:-v0.18.1}"
# Kueue's next release, whose manager counts DRA consumable capacity against quotas.
KUEUE_V019_VERSION="${KUEUE_V019_VERSION:-v0.19.2}"
# Volcano: its scheduler, controllers and admission webhook, and its CRDs.
VOLCANO_VERSION="${VOLCANO_VERSION:-v1.15.1}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Upstream sources the module proxy refuses, kept unchanged beside the repository with their
# checksums (the workspace's shared/third_party): used only where the proxy fails.
VOLCANO_APIS_TARBALLS="${VOLCANO_APIS_TARBALLS:-$HERE/../../../shared/third_party/volcano-apis}"
if [[ -d "$VOLCANO_APIS_TARBALLS" ]]; then VOLCANO_APIS_TARBALLS="$(cd "$VOLCANO_APIS_TARBALLS" && pwd)"; fi

log() { echo "k8s-build: $*" >&2; }
# shellcheck source=common.sh
. "$HERE/common.sh"

k8s_bin="$CACHE/kubernetes-$K8S_VERSION"
etcd_bin="$CACHE/etcd-$ETCD_VERSION"
helm_bin="$CACHE/helm-$HELM_VERSION"
kueue_hash="$( (cd "$HERE/kueue" && cat go.mod.in main.go) | sha256sum | cut -c1-16)"
kueue_bin="$CACHE/kueue-$KUEUE_VERSION-$kueue_hash"
volcano_hash="$(sha256sum <"$HERE/volcano/go.mod.in" | cut -c1-16)"
volcano_bin="$CACHE/volcano-$VOLCANO_VERSION-$volcano_hash"
kueue_manager_hash="$( (cd "$HERE/kueue-manager" && cat go.mod.in *.go) | sha256sum | cut -c1-16)"
kueue_manager_bin="$CACHE/kueue-manager-$KUEUE_VERSION-$kueue_manager_hash"
kueue_manager_v019_bin="$CACHE/kueue-manager-$KUEUE_V019_VERSION-$kueue_manager_hash"
# Our own Go tools change with the repository: key them by their source as well as the release.
tools_hash="$( (cd "$HERE" && cat go.mod.in cmd/*/*.go release/*/*.go) | sha256sum | cut -c1-16)"
tools_bin="$CACHE/tools-$K8S_VERSION-$tools_hash"

# Writes the module that pins one Kubernetes release: replace directives for every staging module
# are read from that release's own go.mod, never typed by hand.
prepare_k8s_module() {
	local dir="$1" staging gomod go_line
	staging="$(staging_version "$K8S_VERSION")"
	log "resolving k8s.io/kubernetes@$K8S_VERSION"
	gomod="$(cd "$CACHE" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
	[[ -f "$gomod" ]] || { log "no go.mod downloaded for k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
	go_line="$(grep -m1 '^go ' "$gomod")"
	mkdir -p "$dir"
	{
		sed -e "s/@GO_LINE@/$go_line/" -e "s/@K8S_VERSION@/$K8S_VERSION/" "$HERE/go.mod.in"
		echo
		echo "replace ("
		# Staging modules are required at v0.0.0 and replaced by ./staging paths upstream.
		awk '/^replace/ {exit} $1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u |
			while read -r mod; do echo "	$mod => $mod $staging"; done
		echo ")"
	} >"$dir/go.mod"
	rm -rf "$dir/cmd"
	cp -r "$HERE/cmd" "$dir/cmd"
	# The kubelet's plugin interfaces change between releases: take the newest adapter that is
	# not newer than the release being built.
	local minor="${K8S_VERSION#v1.}" adapter=""
	minor="${minor%%.*}"
	for rel in "$HERE"/release/v1.*; do
		local m="${rel##*/v1.}"
		if ((m <= minor)) && { [[ -z "$adapter" ]] || ((m > ${adapter##*/v1.})); }; then adapter="$rel"; fi
	done
	[[ -n "$adapter" ]] || { log "no kubelet-sim adapter for Kubernetes $K8S_VERSION"; exit 1; }
	cp "$adapter/adapter.go" "$dir/cmd/kubelet-sim/adapter.go"
	(cd "$dir" && go mod tidy >&2)
}

build_kubernetes() {
	local names=(kube-apiserver kube-scheduler kube-controller-manager kubectl)
	if ! have_all "$k8s_bin" "${names[@]}" || ! have_all "$tools_bin" kubelet-sim cdi-check; then
		local src="$CACHE/src/kubernetes-$K8S_VERSION"
		prepare_k8s_module "$src"
		local minor="${K8S_VERSION#v1.}"
		minor="${minor%%.*}"
		local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
-X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
		if ! have_all "$k8s_bin" "${names[@]}"; then
			log "building Kubernetes $K8S_VERSION (first time only; takes a while on 2 cores)"
			rm -rf "$k8s_bin.tmp" && mkdir -p "$k8s_bin.tmp"
			(cd "$src" && go build -trimpath -ldflags "$ldflags" -o "$k8s_bin.tmp/" \
				k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
				k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl >&2)
			rm -rf "$k8s_bin" && mv "$k8s_bin.tmp" "$k8s_bin"
		fi
		log "building kubelet-sim and cdi-check against Kubernetes $K8S_VERSION"
		# Tools built from older sources of this repository are of no further use.
		find "$CACHE" -maxdepth 1 -name "tools-$K8S_VERSION-*" ! -name "$(basename "$tools_bin")" -exec rm -rf {} +
		mkdir -p "$tools_bin.tmp"
		(cd "$src" && go build -trimpath -o "$tools_bin.tmp/" ./cmd/kubelet-sim ./cmd/cdi-check >&2)
		rm -rf "$tools_bin" && mv "$tools_bin.tmp" "$tools_bin"
	fi
}

build_etcd() {
	have_all "$etcd_bin" etcd && return
	log "building etcd $ETCD_VERSION"
	local src="$CACHE/src/etcd-$ETCD_VERSION"
	mkdir -p "$src"
	cat >"$src/go.mod" <<EOF
module vgpu-dra.test/etcd

go 1.24
EOF
	# etcd's server module carries etcdmain; a three-line main makes it the etcd binary.
	cat >"$src/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
	(cd "$src" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2 && go mod tidy >&2 &&
		mkdir -p "$etcd_bin.tmp" && go build -trimpath -ldflags "-s -w" -o "$etcd_bin.tmp/etcd" . >&2)
	rm -rf "$etcd_bin" && mv "$etcd_bin.tmp" "$etcd_bin"
}

build_helm() {
	have_all "$helm_bin" helm && return
	log "building helm $HELM_VERSION"
	local major="${HELM_VERSION%%.*}"
	mkdir -p "$helm_bin.tmp"
	(cd "$CACHE" && GOBIN="$helm_bin.tmp" go install -trimpath -ldflags "-s -w" \
		"helm.sh/helm/$major/cmd/helm@$HELM_VERSION" >&2)
	rm -rf "$helm_bin" && mv "$helm_bin.tmp" "$helm_bin"
}

build_kueue() {
	have_all "$kueue_bin" kueue-check && [[ -d "$kueue_bin/crds" ]] && return
	log "building kueue-check against Kueue $KUEUE_VERSION"
	find "$CACHE" -maxdepth 1 -name "kueue-$KUEUE_VERSION-*" ! -name "$(basename "$kueue_bin")" -exec rm -rf {} +
	local src="$CACHE/src/kueue-$KUEUE_VERSION" dir
	rm -rf "$src" && mkdir -p "$src"
	sed "s/@KUEUE_VERSION@/$KUEUE_VERSION/" "$HERE/kueue/go.mod.in" >"$src/go.mod"
	cp "$HERE/kueue/main.go" "$src/"
	mkdir -p "$kueue_bin.tmp/crds"
	(cd "$src" && go mod tidy >&2 && go build -trimpath -ldflags "-s -w" -o "$kueue_bin.tmp/kueue-check" . >&2)
	# The CRDs Kueue installs, from the same module release.
	dir="$(cd "$src" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
	cp "$dir"/config/components/crd/bases/*.yaml "$kueue_bin.tmp/crds/"
	rm -rf "$kueue_bin" && mv "$kueue_bin.tmp" "$kueue_bin"
}

# Kueue's controller manager (batch/v1 Job integration) at release $1 into directory $2, with the
# admission webhook registrations (webhooks.yaml) and the CRDs (crds/) of the same release beside
# it, for the tests that run Kueue itself. One source serves v0.18 and v0.19: main.go and the
# release's compat file (compat_v019.go from v0.19 on, built with its tag kueue_v019; else
# compat_v018.go). Only that one is copied: `go mod tidy` reads every file whatever its tags.
build_kueue_manager() {
	local version="$1" bin="$2"
	have_all "$bin" kueue-manager && [[ -f "$bin/webhooks.yaml" && -d "$bin/crds" ]] && return
	log "building kueue-manager against Kueue $version (first time only; takes a while on 2 cores)"
	find "$CACHE" -maxdepth 1 -name "kueue-manager-$version-*" ! -name "$(basename "$bin")" -exec rm -rf {} +
	local src="$CACHE/src/kueue-manager-$version" started=$SECONDS dir tags="" compat=compat_v018.go
	local minor="${version#v0.}"
	minor="${minor%%.*}"
	if ((minor >= 19)); then tags=kueue_v019 compat=compat_v019.go; fi
	rm -rf "$src" && mkdir -p "$src"
	sed "s/@KUEUE_VERSION@/$version/" "$HERE/kueue-manager/go.mod.in" >"$src/go.mod"
	cp "$HERE/kueue-manager/main.go" "$HERE/kueue-manager/$compat" "$src/"
	rm -rf "$bin.tmp" && mkdir -p "$bin.tmp/crds"
	(cd "$src" && go mod tidy >&2 && go build -trimpath -tags "$tags" \
		-ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version" \
		-o "$bin.tmp/kueue-manager" . >&2)
	dir="$(cd "$src" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
	cp "$dir/config/components/webhook/manifests.yaml" "$bin.tmp/webhooks.yaml"
	cp "$dir"/config/components/crd/bases/*.yaml "$bin.tmp/crds/"
	rm -rf "$bin" && mv "$bin.tmp" "$bin"
	log "kueue-manager $version built in $((SECONDS - started)) s"
}

# Volcano's own scheduler, controller manager and admission webhook server, built from its
# release's cmd packages (integration/k8s/volcano/go.mod.in), with the release's install manifest
# (volcano-development.yaml: webhook registrations, scheduler configuration) beside them; and its
# CRDs (crds/: batch, bus, scheduling, topology, flow, ...), which other tests use without Volcano.
# A dependent module does not inherit Volcano's replace directives (the k8s.io staging modules at
# v0.0.0), so they are read from the release's own go.mod. The one to a path inside Volcano's
# repository, its staging volcano.sh/apis, is not in the module. The version the release requires
# comes from the first of: VOLCANO_APIS_DIR (a copy of staging/src/volcano.sh/apis at the release's
# tag), the Go module proxy, the workspace's checked tarball of it (VOLCANO_APIS_TARBALLS). A build
# with a local copy is cached apart (suffix -local-apis for VOLCANO_APIS_DIR, -vendored-apis for
# the tarball), so that one never passes for a build from the proxy. When none is to be had,
# Volcano's binaries are left out: `volcano-unavailable=<why>` is printed instead, and only the
# tests that run Volcano fail, with that reason.
volcano_unavailable=""

# volcano.sh/apis at version $1 from the workspace's third-party copy (a tarball of Volcano's
# staging/src/volcano.sh/apis at the release tag, with SHA256SUMS; see its README), for a proxy
# that refuses the module. The tarball is checked against SHA256SUMS and unpacked into the cache,
# never into the repository; prints the unpacked directory. Fails (printing nothing) when there
# is no such tarball or its checksum does not match.
vendored_volcano_apis() {
	local version="$1" name="volcano.sh-apis-$1" sum dest
	local tarball="$VOLCANO_APIS_TARBALLS/$name.tar.gz"
	[[ -f "$tarball" && -f "$VOLCANO_APIS_TARBALLS/SHA256SUMS" ]] || return 1
	sum="$(awk -v f="$name.tar.gz" '$2 == f || $2 == "*" f {print $1; exit}' "$VOLCANO_APIS_TARBALLS/SHA256SUMS")"
	[[ -n "$sum" ]] || { log "$VOLCANO_APIS_TARBALLS/SHA256SUMS lists no $name.tar.gz"; return 1; }
	if [[ "$(sha256sum <"$tarball" | cut -d' ' -f1)" != "$sum" ]]; then
		log "$tarball does not match its SHA256SUMS entry: not used"
		return 1
	fi
	# Keyed by the checksum: a different tarball of the same version is unpacked anew.
	dest="$CACHE/src/volcano-apis-$version-${sum:0:16}"
	if ! [[ -f "$dest/go.mod" ]]; then
		rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
		tar -xzf "$tarball" -C "$dest.tmp" --strip-components=1 "$name" >&2 || { log "unpacking $tarball failed"; return 1; }
		[[ -f "$dest.tmp/go.mod" ]] || { log "$tarball has no $name/go.mod"; return 1; }
		rm -rf "$dest" && mv "$dest.tmp" "$dest"
	fi
	echo "$dest"
}

build_volcano() {
	local info gomod dir sha go_line apis_version apis_replace exe_dir="$volcano_bin"
	if ! [[ -d "$volcano_bin/crds" && -f "$volcano_bin/volcano-development.yaml" ]]; then
		find "$CACHE" -maxdepth 1 -name "volcano-$VOLCANO_VERSION-*" ! -name "$(basename "$volcano_bin")*" -exec rm -rf {} +
	fi
	info="$(cd "$CACHE" && go mod download -json "volcano.sh/volcano@$VOLCANO_VERSION")"
	gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p' <<<"$info")"
	dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p' <<<"$info")"
	sha="$(sed -n 's/^[[:space:]]*"Hash": "\(.*\)",*$/\1/p' <<<"$info")"
	[[ -f "$gomod" && -d "$dir/config/crd/volcano/bases" ]] || { log "volcano.sh/volcano@$VOLCANO_VERSION: no go.mod or CRDs"; exit 1; }
	if ! [[ -d "$volcano_bin/crds" && -f "$volcano_bin/volcano-development.yaml" ]]; then
		rm -rf "$volcano_bin.tmp" && mkdir -p "$volcano_bin.tmp/crds"
		cp "$dir"/config/crd/volcano/bases/*.yaml "$dir"/config/crd/jobflow/bases/*.yaml "$volcano_bin.tmp/crds/"
		cp "$dir/installer/volcano-development.yaml" "$volcano_bin.tmp/"
		rm -rf "$volcano_bin" && mv "$volcano_bin.tmp" "$volcano_bin"
	fi
	apis_version="$(awk '$1 == "volcano.sh/apis" && $2 ~ /^v/ {print $2; exit}' "$gomod")"
	local apis_dir="" apis_source
	if [[ -n "${VOLCANO_APIS_DIR:-}" ]]; then
		[[ -f "$VOLCANO_APIS_DIR/go.mod" ]] || { log "VOLCANO_APIS_DIR=$VOLCANO_APIS_DIR has no go.mod"; exit 1; }
		apis_dir="$(cd "$VOLCANO_APIS_DIR" && pwd)"
		apis_source="VOLCANO_APIS_DIR ($apis_dir)"
		exe_dir="$volcano_bin-local-apis"
	elif (cd "$CACHE" && go mod download "volcano.sh/apis@$apis_version" >/dev/null 2>&1); then
		apis_source="the Go module proxy (volcano.sh/apis@$apis_version)"
	elif apis_dir="$(vendored_volcano_apis "$apis_version")"; then
		apis_source="the checked tarball in $VOLCANO_APIS_TARBALLS (unpacked to $apis_dir)"
		exe_dir="$volcano_bin-vendored-apis"
	else
		volcano_unavailable="volcano.sh/volcano@$VOLCANO_VERSION needs volcano.sh/apis@$apis_version, which the Go module proxy does not serve, and $VOLCANO_APIS_TARBALLS has no volcano.sh-apis-$apis_version.tar.gz that matches its SHA256SUMS; set VOLCANO_APIS_DIR to a copy of it"
		log "$volcano_unavailable"
		return
	fi
	[[ -z "$apis_dir" ]] || apis_replace="volcano.sh/apis => $apis_dir"
	log "volcano.sh/apis for Volcano $VOLCANO_VERSION from $apis_source"
	volcano_exe="$exe_dir"
	have_all "$exe_dir" vc-scheduler vc-controller-manager vc-webhook-manager && return
	log "building Volcano $VOLCANO_VERSION with volcano.sh/apis from $apis_source (first time only; takes a while on 2 cores)"
	local src="$CACHE/src/volcano-$VOLCANO_VERSION" started=$SECONDS
	go_line="$(grep -m1 '^go ' "$gomod")"
	rm -rf "$src" && mkdir -p "$src"
	{
		sed -e "s/@GO_LINE@/$go_line/" -e "s/@VOLCANO_VERSION@/$VOLCANO_VERSION/" "$HERE/volcano/go.mod.in"
		echo
		echo "replace ("
		awk '/^replace[[:space:]]*\(/ {block = 1; next}
			block && /^\)/ {block = 0; next}
			block || /^replace[[:space:]]/ {
				sub(/^replace[[:space:]]+/, ""); sub(/\/\/.*/, ""); sub(/[[:space:]]+$/, ""); sub(/^[[:space:]]+/, "")
				if ($0 ~ /=>/ && $0 !~ /=>[[:space:]]*(\.\.?)?\//) print "\t" $0
			}' "$gomod"
		[[ -z "${apis_replace:-}" ]] || echo "	$apis_replace"
		echo ")"
	} >"$src/go.mod"
	rm -rf "$exe_dir.tmp" && mkdir -p "$exe_dir.tmp"
	(cd "$src" && go mod tidy >&2 && go build -trimpath \
		-ldflags "-s -w -X volcano.sh/volcano/pkg/version.Version=$VOLCANO_VERSION -X volcano.sh/volcano/pkg/version.GitSHA=$sha" \
		-o "$exe_dir.tmp/" volcano.sh/volcano/cmd/scheduler volcano.sh/volcano/cmd/controller-manager \
		volcano.sh/volcano/cmd/webhook-manager >&2)
	for name in scheduler controller-manager webhook-manager; do mv "$exe_dir.tmp/$name" "$exe_dir.tmp/vc-$name"; done
	cp "$volcano_bin/volcano-development.yaml" "$exe_dir.tmp/"
	rm -rf "$exe_dir" && mv "$exe_dir.tmp" "$exe_dir"
	log "Volcano $VOLCANO_VERSION built in $((SECONDS - started)) s"
}

# Two test runs started together, or a test's own call of this script beside scripts/test.sh's.
lock_cache .build.lock
start=$SECONDS
build_etcd
build_kubernetes
build_helm
build_kueue
build_kueue_manager "$KUEUE_VERSION" "$kueue_manager_bin"
build_kueue_manager "$KUEUE_V019_VERSION" "$kueue_manager_v019_bin"
build_volcano
log "components ready in $((SECONDS - start)) s (cache: $CACHE)"

for name in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
	echo "$name=$k8s_bin/$name"
done
echo "etcd=$etcd_bin/etcd"
echo "helm=$helm_bin/helm"
echo "kubelet-sim=$tools_bin/kubelet-sim"
echo "cdi-check=$tools_bin/cdi-check"
echo "kueue-check=$kueue_bin/kueue-check"
echo "kueue-crds=$kueue_bin/crds"
echo "kueue-manager=$kueue_manager_bin/kueue-manager"
echo "kueue-manager-v0-19=$kueue_manager_v019_bin/kueue-manager"
echo "volcano-crds=$volcano_bin/crds"
if [[ -n "$volcano_unavailable" ]]; then
	echo "volcano-unavailable=$volcano_unavailable"
else
	for name in vc-scheduler vc-controller-manager vc-webhook-manager; do
		echo "volcano-${name#vc-}=$volcano_exe/$name"
	done
fi

# The real node's kubelet, containerd, runc and images (build-node.sh, read by
# integration/src/node.rs), built last: its lines follow the others. When they cannot be built,
# none is printed, so that only the tests that run a real node fail: they run build-node.sh
# themselves, and fail with its messages.
node_started=$SECONDS
if node_components="$("$HERE/build-node.sh")"; then
	log "node components ready in $((SECONDS - node_started)) s"
	echo "$node_components"
else
	log "build-node.sh failed (exit $?) after $((SECONDS - node_started)) s: the tests that run a real node will fail"
fi
