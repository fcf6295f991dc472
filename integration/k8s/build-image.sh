#!/usr/bin/env bash
# Writes images for a node of the test bed without a registry or a container engine, as OCI
# layouts in tar archives that `ctr images import` loads (node/oci-image.sh writes them).
#
#   build-image.sh BINARY NAME OUT.tar
#       The driver's image, laid out as the repository's Dockerfile lays it out on
#       gcr.io/distroless/cc-debian12:nonroot: BINARY at /usr/bin/vgpu-dra, the C libraries it
#       loads, distroless's /etc/passwd and /etc/group, /tmp and /home/nonroot; the Dockerfile's
#       ENTRYPOINT, CMD, USER and ENV. integration/tests/image.rs checks that the two agree.
#
#   build-image.sh --hami-core LIBVGPU_SO BUSYBOX NAME OUT.tar
#       A HAMi-core install image, as the chart's hamiCore.installImage: busybox (the init
#       container's sh, cp and mv) plus LIBVGPU_SO at /k8s-vgpu/lib/nvidia/libvgpu.so, the
#       chart's default hamiCore.installFrom. BUSYBOX is a root file system (a directory) or a
#       one-layer OCI archive such as build-node.sh's vgpu-dra.test/busybox:1.
#
# The binary's debug information is stripped (a test build's line tables take ~25 MB); its
# symbols stay, so that a panic's backtrace names functions. The C libraries are the build
# machine's, at the paths `ldd` prints: the image runs on a machine with the same C library (a
# test node), not necessarily elsewhere. Archives are reproducible for the same inputs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Modes in the layer do not depend on the caller's umask.
umask 022

die() {
	echo "build-image.sh: $*" >&2
	exit 1
}

usage() {
	echo "usage: $0 BINARY NAME OUT.tar" >&2
	echo "       $0 --hami-core LIBVGPU_SO BUSYBOX NAME OUT.tar" >&2
	exit 2
}

# Copies file $1 to $root$2, following symbolic links, creating the directories on the way.
put() {
	mkdir -p "$root$(dirname "$2")"
	cp -L "$1" "$root$2"
}

# The driver's root file system, after distroless/cc-debian12:nonroot with the Dockerfile's COPY.
driver_root() {
	local binary="$1" lib
	[[ -f "$binary" ]] || die "driver binary $binary does not exist"
	command -v objcopy >/dev/null || die "objcopy (binutils) is missing: it strips the binary"
	mkdir -p "$root/usr/bin"
	objcopy --strip-debug "$binary" "$root/usr/bin/vgpu-dra"
	chmod 755 "$root/usr/bin/vgpu-dra"
	# The libraries and the dynamic loader under the names the binary asks for (libc.so.6,
	# /lib64/ld-linux-x86-64.so.2), each a copy of the file the name resolves to.
	local libs
	libs="$(ldd "$binary" | grep -o '/[^ ]*')" || die "ldd $binary names no library (a static binary?)"
	for lib in $libs; do put "$lib" "$lib"; done
	mkdir -p "$root/etc" "$root/tmp" "$root/home/nonroot"
	chmod 1777 "$root/tmp"
	chmod 700 "$root/home/nonroot"
	cat >"$root/etc/passwd" <<-'EOF'
		root:x:0:0:root:/root:/sbin/nologin
		nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
		nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
	EOF
	cat >"$root/etc/group" <<-'EOF'
		root:x:0:
		nobody:x:65534:
		tty:x:5:
		staff:x:50:
		nonroot:x:65532:
	EOF
}

# Unpacks BUSYBOX (a directory or a one-layer OCI archive) into $root.
busybox_root() {
	local busybox="$1" manifest layers
	if [[ -d "$busybox" ]]; then
		cp -a "$busybox/." "$root/"
	elif [[ -f "$busybox" ]]; then
		# The first manifest the index names, and the layers (after the config) that it names.
		manifest="$(tar -xOf "$busybox" index.json | grep -o 'sha256:[0-9a-f]*' | head -n1)" ||
			die "$busybox is not an OCI archive: no manifest in its index.json"
		layers="$(tar -xOf "$busybox" "blobs/sha256/${manifest#sha256:}" | grep -o 'sha256:[0-9a-f]*' | tail -n +2)"
		[[ $(wc -w <<<"$layers") -eq 1 ]] || die "$busybox: expected an image of one layer, found: $layers"
		tar -xOf "$busybox" "blobs/sha256/${layers#sha256:}" | tar -x -C "$root" --no-same-owner
	else
		die "busybox root file system or archive $busybox does not exist"
	fi
	for tool in sh cp mv; do
		[[ -e "$root/bin/$tool" || -L "$root/bin/$tool" ]] || die "$busybox has no /bin/$tool, which the install container runs"
	done
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/root"
mkdir -p "$root"

if [[ ${1:-} == --hami-core ]]; then
	[[ $# -eq 5 ]] || usage
	so="$2" busybox="$3" name="$4" out="$5"
	[[ -f "$so" ]] || die "HAMi-core library $so does not exist"
	busybox_root "$busybox"
	put "$so" /k8s-vgpu/lib/nvidia/libvgpu.so
	chmod 755 "$root/k8s-vgpu/lib/nvidia/libvgpu.so"
	# As Docker's busybox image: a shell unless the pod says otherwise (the chart does).
	"$HERE/node/oci-image.sh" --cmd sh "$root" "$name" "$out"
	exit
fi

[[ $# -eq 3 && ${1:-} != --* ]] || usage
binary="$1" name="$2" out="$3"
driver_root "$binary"
# ENV, USER, ENTRYPOINT and CMD as in the Dockerfile; PATH comes from distroless, as there.
"$HERE/node/oci-image.sh" --cmd kubelet-plugin --user 0:0 --env MALLOC_ARENA_MAX=1 \
	--env GLIBC_TUNABLES=glibc.malloc.tcache_count=0 \
	--chown 65532:65532 home/nonroot "$root" "$name" "$out" /usr/bin/vgpu-dra
