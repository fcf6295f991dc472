#!/usr/bin/env bash
# Builds what a real node of the test bed runs besides our driver, and caches it outside the
# repository keyed by version, so a second run builds nothing:
#   - the kubelet at the test bed's Kubernetes release, from the Go module proxy;
#   - containerd 2.x (CDI on by default), its runc shim and ctr, from the Go module proxy, without
#     the snapshotters that need cgo (btrfs) or a device mapper (devmapper, zfs);
#   - runc: Debian's package (installed with apt-get when missing, as CI runs as root), or built
#     from the Go module proxy with RUNC_FROM=proxy;
#   - two OCI images, written without a registry as OCI layouts in tar archives for
#     `ctr images import`: vgpu-dra.test/pause:1 (a static sandbox process, node/pause.c) and
#     vgpu-dra.test/busybox:1 (Debian's busybox-static, plus one dynamically linked program,
#     /usr/bin/env, and the C library it loads, so that ld.so, and with it /etc/ld.so.preload,
#     runs in the container).
#
#   integration/k8s/build-node.sh      build (or reuse) everything, print `NAME=PATH` lines
#
# Output (stdout, one per line, nothing else): kubelet=... containerd=... and so on, which the Rust
# test support (integration/src/node.rs) reads. Progress goes to stderr.
set -euo pipefail

# The one approved way to get a Go newer than the machine's.
export GOTOOLCHAIN=go1.27.3
export GOFLAGS=-buildvcs=false

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
# runc from Debian (default) or from the Go module proxy at RUNC_VERSION.
RUNC_FROM="${RUNC_FROM:-debian}"
RUNC_VERSION="${RUNC_VERSION:-v1.4.4}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Builds share two cores with whatever else runs: they go last.
NICE=(nice -n 19)

log() { echo "node-build: $*" >&2; }
# shellcheck source=common.sh
. "$HERE/common.sh"

kubelet_bin="$CACHE/kubelet-$K8S_VERSION"
containerd_bin="$CACHE/containerd-$CONTAINERD_VERSION"
runc_bin="$CACHE/runc-$RUNC_VERSION-seccomp"

# The `go` line and path of the go.mod of module $1 at version $2, from the module proxy.
module_gomod() {
	(cd "$CACHE" && go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
}

# A module of ours at $1 that requires module $2 at $3 and names the commands to build as tools
# (so `go mod tidy` keeps everything they import); the remaining arguments are the commands.
write_tool_module() {
	local dir="$1" module="$2" version="$3" gomod go_line
	shift 3
	gomod="$(module_gomod "$module" "$version")"
	[[ -f "$gomod" ]] || { log "no go.mod downloaded for $module@$version"; exit 1; }
	go_line="$(grep -m1 '^go ' "$gomod")"
	rm -rf "$dir" && mkdir -p "$dir"
	{
		echo "module vgpu-dra.test/$(basename "$dir")"
		echo
		echo "$go_line"
		echo
		echo "require $module $version"
		echo
		echo "tool ("
		for tool in "$@"; do echo "	$tool"; done
		echo ")"
	} >"$dir/go.mod"
	echo "$gomod"
}

build_kubelet() {
	have_all "$kubelet_bin" kubelet && return
	local started=$SECONDS src="$CACHE/src/kubelet-$K8S_VERSION" gomod staging minor
	log "building the kubelet $K8S_VERSION (first time only; takes a while on 2 cores)"
	gomod="$(write_tool_module "$src" k8s.io/kubernetes "$K8S_VERSION" k8s.io/kubernetes/cmd/kubelet)"
	# As build.sh does: the staging modules are required at v0.0.0 and replaced by ./staging
	# paths upstream; they are replaced here by their releases, read from the release's go.mod.
	staging="$(staging_version "$K8S_VERSION")"
	{
		echo
		echo "replace ("
		awk '/^replace/ {exit} $1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u |
			while read -r mod; do echo "	$mod => $mod $staging"; done
		echo ")"
	} >>"$src/go.mod"
	minor="${K8S_VERSION#v1.}"
	minor="${minor%%.*}"
	rm -rf "$kubelet_bin.tmp" && mkdir -p "$kubelet_bin.tmp"
	(cd "$src" && go mod tidy >&2 && CGO_ENABLED=0 "${NICE[@]}" go build -trimpath \
		-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
-X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
		-o "$kubelet_bin.tmp/kubelet" k8s.io/kubernetes/cmd/kubelet >&2)
	rm -rf "$kubelet_bin" && mv "$kubelet_bin.tmp" "$kubelet_bin"
	log "kubelet $K8S_VERSION built in $((SECONDS - started)) s"
}

build_containerd() {
	have_all "$containerd_bin" containerd containerd-shim-runc-v2 ctr && return
	local started=$SECONDS src="$CACHE/src/containerd-$CONTAINERD_VERSION" mod=github.com/containerd/containerd/v2
	log "building containerd $CONTAINERD_VERSION (first time only)"
	write_tool_module "$src" "$mod" "$CONTAINERD_VERSION" \
		"$mod/cmd/containerd" "$mod/cmd/containerd-shim-runc-v2" "$mod/cmd/ctr" >/dev/null
	rm -rf "$containerd_bin.tmp" && mkdir -p "$containerd_bin.tmp"
	# Static, as containerd's own release builds: btrfs needs cgo, devmapper and zfs are of no use
	# on a test node; the overlayfs and native snapshotters stay.
	(cd "$src" && go mod tidy >&2 && CGO_ENABLED=0 "${NICE[@]}" go build -trimpath \
		-tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" \
		-ldflags "-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Revision=go-module-proxy" \
		-o "$containerd_bin.tmp/" "$mod/cmd/containerd" "$mod/cmd/containerd-shim-runc-v2" "$mod/cmd/ctr" >&2)
	rm -rf "$containerd_bin" && mv "$containerd_bin.tmp" "$containerd_bin"
	log "containerd $CONTAINERD_VERSION built in $((SECONDS - started)) s"
}

# Prints the path of runc.
find_runc() {
	if [[ "$RUNC_FROM" == proxy ]]; then
		build_runc
		echo "$runc_bin/runc"
		return
	fi
	local path
	path="$(PATH="$PATH:/usr/sbin:/sbin" command -v runc || true)"
	if [[ -z "$path" ]]; then
		[[ "$(id -u)" == 0 ]] || { log "runc is missing: install Debian's runc, or set RUNC_FROM=proxy"; exit 1; }
		log "installing Debian's runc"
		apt_get install -y --no-install-recommends runc
		path="$(PATH="$PATH:/usr/sbin:/sbin" command -v runc)"
	fi
	echo "$path"
}

# apt-get, once more after `apt-get update` when it fails (a fresh machine has no package lists).
apt_get() {
	DEBIAN_FRONTEND=noninteractive apt-get "$@" >&2 && return
	log "apt-get $* failed; updating the package lists and trying again"
	apt-get update >&2
	DEBIAN_FRONTEND=noninteractive apt-get "$@" >&2
}

# runc from the module proxy: its nsenter needs cgo (gcc), and seccomp libseccomp's headers (the
# CRI gives every pod sandbox a seccomp profile, which a runc built without seccomp refuses).
build_runc() {
	have_all "$runc_bin" runc && return
	local started=$SECONDS src="$CACHE/src/runc-$RUNC_VERSION" mod=github.com/opencontainers/runc
	log "building runc $RUNC_VERSION"
	if ! pkg-config --exists libseccomp 2>/dev/null; then
		[[ "$(id -u)" == 0 ]] || { log "runc needs libseccomp's headers: install libseccomp-dev and pkg-config"; exit 1; }
		log "installing Debian's libseccomp-dev"
		apt_get install -y --no-install-recommends libseccomp-dev pkg-config
	fi
	write_tool_module "$src" "$mod" "$RUNC_VERSION" "$mod" >/dev/null
	rm -rf "$runc_bin.tmp" && mkdir -p "$runc_bin.tmp"
	(cd "$src" && go mod tidy >&2 && CGO_ENABLED=1 "${NICE[@]}" go build -trimpath -tags seccomp \
		-ldflags "-s -w -X main.version=${RUNC_VERSION#v}" -o "$runc_bin.tmp/runc" "$mod" >&2)
	rm -rf "$runc_bin" && mv "$runc_bin.tmp" "$runc_bin"
	log "runc $RUNC_VERSION built in $((SECONDS - started)) s"
}

# The two images. Keyed by the busybox-static release, the host's C library, the host's env and
# the scripts that write them.
build_images() {
	local busybox_version libc_version key dir work deb
	busybox_version="$(apt-cache policy busybox-static 2>/dev/null | sed -n 's/^  Candidate: //p')"
	if [[ -z "$busybox_version" || "$busybox_version" == "(none)" ]]; then
		[[ "$(id -u)" == 0 ]] || { log "no package lists for busybox-static: run apt-get update"; exit 1; }
		apt-get update >&2
		busybox_version="$(apt-cache policy busybox-static | sed -n 's/^  Candidate: //p')"
	fi
	libc_version="$(dpkg-query -W -f '${Version}' libc6)"
	key="$( (echo "$busybox_version $libc_version"; cat "$HERE/node/oci-image.sh" "$HERE/node/pause.c" /usr/bin/env) |
		sha256sum | cut -c1-16)"
	dir="$CACHE/node-images-$key"
	if [[ -f "$dir/pause.tar" && -f "$dir/busybox.tar" ]]; then
		echo "$dir"
		return
	fi
	log "writing the pause and busybox images (busybox-static $busybox_version, libc6 $libc_version)"
	work="$(mktemp -d)"
	rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"

	mkdir -p "$work/pause/etc"
	gcc -static -Os -s -Wall -Werror -o "$work/pause/pause" "$HERE/node/pause.c"
	"$HERE/node/oci-image.sh" "$work/pause" vgpu-dra.test/pause:1 "$dir.tmp/pause.tar" /pause

	# Debian's busybox-static, unpacked from its package without installing it.
	(cd "$work" && apt_get download "busybox-static=$busybox_version")
	deb="$(echo "$work"/busybox-static_*.deb)"
	dpkg-deb -x "$deb" "$work/deb"
	local root="$work/busybox"
	mkdir -p "$root/bin" "$root/usr/bin" "$root/etc" "$root/tmp" "$root/root"
	chmod 1777 "$root/tmp"
	cp "$work/deb/bin/busybox" "$root/bin/busybox"
	for applet in $("$root/bin/busybox" --list); do
		[[ -e "$root/bin/$applet" ]] || ln -s busybox "$root/bin/$applet"
	done
	# One dynamically linked program and exactly the libraries it loads, at their paths.
	cp /usr/bin/env "$root/usr/bin/env"
	for lib in $(ldd /usr/bin/env | grep -o '/[^ ]*'); do
		mkdir -p "$root$(dirname "$lib")"
		cp -L "$lib" "$root$lib"
	done
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
	"$HERE/node/oci-image.sh" "$root" vgpu-dra.test/busybox:1 "$dir.tmp/busybox.tar" /bin/sh
	rm -rf "$work"
	rm -rf "$dir" && mv "$dir.tmp" "$dir"
	echo "$dir"
}

# build.sh runs this script, and so does a test that finds no VGPU_DRA_BIN_* for the node; a lock
# of its own, as build.sh holds .build.lock while it runs this.
lock_cache .build-node.lock
start=$SECONDS
runc="$(find_runc)"
images="$(build_images)"
build_containerd
build_kubelet
log "node components ready in $((SECONDS - start)) s (cache: $CACHE)"

echo "kubelet=$kubelet_bin/kubelet"
for name in containerd containerd-shim-runc-v2 ctr; do
	echo "$name=$containerd_bin/$name"
done
echo "runc=$runc"
echo "node-image-pause=$images/pause.tar"
echo "node-image-busybox=$images/busybox.tar"
