#!/usr/bin/env bash
# Real NVML discovery on a machine with an NVIDIA GPU, read-only (nothing here changes a GPU's
# settings). Compares what vgpu-dra publishes with nvidia-smi's view and exits non-zero on a
# mismatch. Needs a built driver: VGPU_DRA_BIN, or target/release/vgpu-dra.
#
#   scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin="${VGPU_DRA_BIN:-target/release/vgpu-dra}"
out="${OUT:-$(mktemp -d)}"

nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id --format=csv,noheader | tee "$out/nvidia-smi.csv"
"$bin" inventory --node-name gpu-check -o json | tee "$out/slices.json" >/dev/null

python3 - "$out/nvidia-smi.csv" "$out/slices.json" <<'PY'
import csv, json, sys
smi = list(csv.reader(open(sys.argv[1]), skipinitialspace=True))
devices = [d for s in json.load(open(sys.argv[2]))["items"] for d in s["spec"]["devices"]]
driver = json.load(open(sys.argv[2]))["items"][0]["spec"]["driver"]
by_uuid = {d["attributes"]["uuid"]["string"]: d for d in devices}
bad = 0
for index, uuid, name, mem, bus in smi:
    d = by_uuid.get(uuid)
    if d is None:
        print(f"MISSING card {index} {uuid} (MIG mode publishes instances instead)"); bad += 1; continue
    got = d["capacity"]["memory"]["value"]
    print(f"card {index}: {d['name']} {d['attributes']['productName']['string']} memory {got} "
          f"(nvidia-smi {mem}) bus {d['attributes']['pcieBusID']['string']} (nvidia-smi {bus.lower()})")
    if d["attributes"]["productName"]["string"] != name[:64]:
        print("  MISMATCH product name"); bad += 1
print(f"{len(devices)} devices published by {driver} for {len(smi)} cards")
sys.exit(1 if bad or not devices else 0)
PY
