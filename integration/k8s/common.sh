# Sourced by build.sh and build-node.sh: what both need to build into one cache. The sourcing
# script sets HERE and defines log() (its own prefix) first.

CACHE="${VGPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vgpu-dra}"

# Staging modules (k8s.io/api, k8s.io/client-go, ...) are released as v0.<minor>.<patch>.
staging_version() {
	local v="${1#v}"
	echo "v0.${v#*.}"
}

# Whether every named executable is in the directory given first.
have_all() {
	local dir="$1"
	shift
	for name in "$@"; do [[ -x "$dir/$name" ]] || return 1; done
}

# Holds the lock file $CACHE/$1 until this script exits (one build at a time per cache and
# script: two runs at once would build into the same .tmp directories), waiting for it if taken.
lock_cache() {
	mkdir -p "$CACHE"
	exec {cache_lock_fd}>"$CACHE/$1"
	if ! flock -n "$cache_lock_fd"; then
		log "waiting for another ${0##*/} using $CACHE"
		flock "$cache_lock_fd"
	fi
}
