#!/usr/bin/env bash
# Writes a one-layer OCI image as an OCI layout in a tar archive, which `ctr images import` reads:
# no registry, no Docker.
#
#   oci-image.sh [OPTION...] ROOTFS NAME OUT.tar [ENTRYPOINT...]
#
#   --cmd ARG           one element of the config's Cmd (repeat, in order)
#   --user USER         the config's User (`0:0`); none by default, that is root
#   --env KEY=VALUE     an Env entry besides PATH (repeat)
#   --chown UID:GID DIR  DIR (relative to ROOTFS) and what it holds belong to UID:GID, as a
#                       distroless home directory does; everything else belongs to root
#
# ROOTFS is the directory that becomes the image's only layer; NAME the full image reference
# (`registry.k8s.io/pause:3.10`), recorded in the index as containerd's image-name annotation and
# the OCI ref name. The archive is reproducible: sorted, owned by root (or as --chown says), every
# time stamp zero.
set -euo pipefail

usage="usage: $0 [--cmd ARG]... [--user USER] [--env KEY=VALUE]... [--chown UID:GID DIR]... ROOTFS NAME OUT.tar [ENTRYPOINT...]"
cmd=() env=() chown=() user=""
while [[ $# -gt 0 && $1 == --* ]]; do
	[[ $# -ge 2 ]] || { echo "$0: $1 needs a value" >&2; exit 2; }
	case $1 in
	--cmd) cmd+=("$2") ;;
	--user) user="$2" ;;
	--env) env+=("$2") ;;
	--chown)
		[[ $# -ge 3 ]] || { echo "$0: --chown needs UID:GID and a directory" >&2; exit 2; }
		chown+=("$2" "$3")
		shift
		;;
	*) echo "$0: unknown option $1" >&2; echo "$usage" >&2; exit 2 ;;
	esac
	shift 2
done
[[ $# -ge 3 ]] || { echo "$usage" >&2; exit 2; }
rootfs="$1" name="$2" out="$3"
shift 3
[[ -d "$rootfs" ]] || { echo "$0: root file system $rootfs is not a directory" >&2; exit 1; }

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

# Control characters are not escaped: no caller passes any.
json_string() {
	local s="${1//\\/\\\\}"
	printf '"%s"' "${s//\"/\\\"}"
}

json_array() {
	local first=1 item
	printf '['
	for item in "$@"; do
		((first)) || printf ','
		first=0
		json_string "$item"
	done
	printf ']'
}

reproducible=(--sort=name --mtime=@0 --numeric-owner)
# Owners are set in the archive, not on disk, so that no caller needs to be root: the --chown
# directories are left out of the first pass and appended with their owner.
excluded=()
for ((i = 0; i < ${#chown[@]}; i += 2)); do excluded+=(--exclude="./${chown[i + 1]#/}"); done
tar "${reproducible[@]}" --owner=0 --group=0 ${excluded[@]+"${excluded[@]}"} -C "$rootfs" -cf "$work/layer.tar" .
for ((i = 0; i < ${#chown[@]}; i += 2)); do
	owner="${chown[i]}" dir="${chown[i + 1]#/}"
	[[ -d "$rootfs/$dir" ]] || { echo "$0: --chown directory $rootfs/$dir does not exist" >&2; exit 1; }
	tar "${reproducible[@]}" --owner="${owner%%:*}" --group="${owner##*:}" -C "$rootfs" -rf "$work/layer.tar" "./$dir"
done
read -r layer_digest layer_size < <(put_blob "$work/layer.tar")

config="\"Env\":$(json_array PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ${env[@]+"${env[@]}"})"
if [[ $# -gt 0 ]]; then config+=",\"Entrypoint\":$(json_array "$@")"; fi
if [[ ${#cmd[@]} -gt 0 ]]; then config+=",\"Cmd\":$(json_array "${cmd[@]}")"; fi
if [[ -n $user ]]; then config+=",\"User\":$(json_string "$user")"; fi
printf '{"architecture":"amd64","os":"linux","config":{%s},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
	"$config" "$layer_digest" >"$work/config.json"
read -r config_digest config_size < <(put_blob "$work/config.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
	"$config_digest" "$config_size" "$layer_digest" "$layer_size" >"$work/manifest.json"
read -r manifest_digest manifest_size < <(put_blob "$work/manifest.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
	"$manifest_digest" "$manifest_size" "$name" "${name##*:}" >"$work/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work" -cf "$out" oci-layout index.json blobs
