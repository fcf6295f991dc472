#!/usr/bin/env bash
# Writes a one-layer OCI image as an OCI layout in a tar archive, which `ctr images import` reads:
# no registry, no Docker.
#
#   oci-image.sh ROOTFS NAME OUT.tar [ENTRYPOINT...]
#
# ROOTFS is the directory that becomes the image's only layer; NAME the full image reference
# (`registry.k8s.io/pause:3.10`), recorded in the index as containerd's image-name annotation and
# the OCI ref name. The archive is reproducible: sorted, owned by root, every time stamp zero.
set -euo pipefail

[[ $# -ge 3 ]] || { echo "usage: $0 ROOTFS NAME OUT.tar [ENTRYPOINT...]" >&2; exit 2; }
rootfs="$1" name="$2" out="$3"
shift 3

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/blobs/sha256"

# A blob is named by its digest; echoes `sha256:<hex> <size>`.
put_blob() {
	local file="$1" hex size
	hex="$(sha256sum "$file" | cut -d' ' -f1)"
	size="$(stat -c %s "$file")"
	mv "$file" "$work/blobs/sha256/$hex"
	echo "sha256:$hex $size"
}

json_array() {
	local first=1 item
	printf '['
	for item in "$@"; do
		((first)) || printf ','
		first=0
		printf '"%s"' "${item//\"/\\\"}"
	done
	printf ']'
}

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$work/layer.tar" .
read -r layer_digest layer_size < <(put_blob "$work/layer.tar")

entrypoint=""
if [[ $# -gt 0 ]]; then entrypoint=",\"Entrypoint\":$(json_array "$@")"; fi
printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]%s},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
	"$entrypoint" "$layer_digest" >"$work/config.json"
read -r config_digest config_size < <(put_blob "$work/config.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
	"$config_digest" "$config_size" "$layer_digest" "$layer_size" >"$work/manifest.json"
read -r manifest_digest manifest_size < <(put_blob "$work/manifest.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
	"$manifest_digest" "$manifest_size" "$name" "${name##*:}" >"$work/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work" -cf "$out" oci-layout index.json blobs
