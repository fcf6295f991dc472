#!/usr/bin/env bash
# Dynamic MIG on real hardware: one create/destroy round trip through NVML (`vgpu-dra mig-check`)
# on a MIG-capable GPU that is ALREADY in MIG mode. Run by hand, as root (NVML creates and lists
# MIG instances for privileged users only).
#
# This script NEVER changes MIG mode, and leaves the card's instances as it found them: it creates
# one instance of the profile (default 19, the smallest `1g`) at the first free placement,
# checks NVML's answers, and destroys it. A card not in MIG mode is refused. To put a card in MIG
# mode is the operator's decision (`nvidia-smi -i <index> -mig 1`; a GPU reset on A100).
#
#   scripts/mig-hardware-check.sh [GPU-UUID [GI-PROFILE-ID]]
#
# Builds the driver (cargo build --release -p vgpu-dra) unless VGPU_DRA_BIN names a binary.
# Prints PASS or FAIL; the exit status is non-zero on FAIL. If the check is killed between the
# create and the destroy, `nvidia-smi mig -lgi` shows the instance left over and
# `nvidia-smi mig -i <index> -dci -ci <ci> -gi <gi>` then `-dgi -gi <gi>` removes it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

card="${1:-}"
profile="${2:-19}"

if [[ -n "${VGPU_DRA_BIN:-}" ]]; then
  bin="$VGPU_DRA_BIN"
else
  cargo build --release -p vgpu-dra
  bin=target/release/vgpu-dra
fi

nvidia-smi -L
if [[ -z "$card" ]]; then
  # The first card whose current MIG mode is Enabled; nothing is switched.
  card="$(nvidia-smi --query-gpu=uuid,mig.mode.current --format=csv,noheader |
    awk -F', *' '$2 == "Enabled" { print $1; exit }')"
  if [[ -z "$card" ]]; then
    echo "FAIL: no GPU is in MIG mode (this check never switches MIG mode; see the top of $0)"
    exit 1
  fi
fi
echo "card $card, GPU-instance profile $profile"
nvidia-smi mig -lgi || true

if "$bin" mig-check --card "$card" --profile "$profile"; then
  nvidia-smi mig -lgi || true
  echo PASS
else
  status=$?
  nvidia-smi mig -lgi || true
  echo "FAIL (vgpu-dra mig-check exited $status)"
  exit 1
fi
