#!/usr/bin/env bash
# Regenerates driver/symbol-order.txt: the functions the node daemon runs, in the order the
# release link should place them (driver/build.rs hands the file to the linker).
#
# Why: the daemon's resident memory is mostly its own text. The kernel maps 64 KiB around each
# page of code touched, and the code a daemon runs at start and per prepare is spread through
# 12 MB of text, so almost all of it became resident. Placed together, it is a few MB.
#
# How: the bench's single-node run (start, slices, prepares sequential and in flight, a wipe,
# the monitor, quiet seconds) with the daemon under valgrind's callgrind, which names every
# function that ran; run twice, with the daemon's defaults and with the pod watch on
# (`podWatch: true`), whose code otherwise lies outside the ordered text (2 MiB more
# file-backed RSS with the watch on and 1,000 claims prepared). What ran with the defaults
# comes first, then what only the watch added, each part listed by name: all of a part is
# resident anyway, names keep a module's functions together, and a new profile's diff shows
# only what ran or stopped running.
# A function the file does not name (new code, another compiler) is placed after the
# named ones, so a stale file costs memory, never correctness. Rerun after a dependency or
# compiler update; `scripts/symbol-order.sh --check` says how much of the file the current
# build still matches.
#
#   scripts/symbol-order.sh            profile and rewrite driver/symbol-order.txt (~15 min)
#   scripts/symbol-order.sh --check    share of the file's names found in the release build
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# One collation for sort and comm, and a file that sorts the same on every machine.
export LC_ALL=C

order=driver/symbol-order.txt
binary=target/release/vgpu-dra

# Every name the release binary defines in its text. The release profile keeps the symbol
# table (the image build strips it), which is what makes this readable.
text_symbols() {
	nm --defined-only "$binary" | awk '$2 ~ /^[tTwW]$/ { print $3 }' | sort -u
}

# The daemon alone, as the image builds it: built beside other packages, dependencies can get
# other features and so other symbol names.
build_daemon() {
	cargo build --release --locked -p vgpu-dra >&2
}

if [[ "${1:-}" == "--check" ]]; then
	build_daemon
	[[ -s "$order" ]] || { echo "$order is missing or empty" >&2; exit 1; }
	total=$(wc -l <"$order")
	found=$(comm -12 <(sort -u "$order") <(text_symbols) | wc -l)
	echo "$found of $total names in $order are in $binary"
	exit 0
fi

command -v valgrind >/dev/null || { echo "valgrind is missing: it names the functions that ran" >&2; exit 1; }

# Profiled without the order (for the bench's own build too), so that a stale file cannot
# shape what is measured; the names are the same either way.
export VGPU_DRA_SYMBOL_ORDER=off
build_daemon
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$binary" "$work/vgpu-dra"
binary="$work/vgpu-dra"

# Dumps every 20M basic blocks: the bench ends the daemon with SIGKILL, which callgrind cannot
# dump at, so a profile is the union of the dumps before it. Callgrind names a function once
# per file (`fn=(id) name`, later `fn=(id)`), callees the same way (`cfn=`).
# profile NAME [BENCH FLAGS]: the names of the functions that ran, sorted, in $work/NAME.ran.
profile() {
	local name=$1
	shift
	mkdir -p "$work/$name"
	local wrapper="valgrind --tool=callgrind --demangle=no --dump-instr=no --dump-every-bb=20000000 \
--callgrind-out-file=$work/$name/cg.%p"
	scripts/bench.sh --nodes 0 --webhook-pods 0 --wipes 1 --steady-seconds 5 --claims 200 \
		--sizes 1,10,200 --in-flight 16 --monitor-claims 200 --monitor-ticks 3 \
		--wipe-timeout-seconds 600 --vgpu-dra "$binary" "--driver-wrapper=$wrapper" \
		"$@" --out "$work/$name/bench.json" >&2
	ls "$work/$name"/cg.* >/dev/null 2>&1 || { echo "callgrind wrote no profile ($name)" >&2; exit 1; }
	sed -n -E 's/^c?fn=\([0-9]+\) (.*)$/\1/p' "$work/$name"/cg.* | sort -u >"$work/$name.ran"
}
profile defaults
profile watch --driver-args=--pod-watch=true

# Only the daemon's own functions: libc's are not ours to place. What runs with the defaults
# first, then what only the pod watch adds: placed among the others, the watch's functions
# spread the defaults' hot text over more pages (about 1 MiB more file-backed RSS with the watch
# off, 1,000 claims prepared).
text_symbols >"$work/ours"
comm -12 "$work/ours" "$work/defaults.ran" >"$order.tmp"
comm -12 "$work/ours" "$work/watch.ran" | comm -23 - "$work/defaults.ran" >>"$order.tmp"
mv "$order.tmp" "$order"
echo "$(wc -l <"$order") functions written to $order" >&2
