#!/bin/bash
# The CUDA paths of `torchdoctor run`, on a real GPU: each script under the default
# probes, its report.json and memory snapshot kept for the tests' recorded data.
# Usage (on the GPU machine, from the repo root): bash bench/gpu/run_paths.sh OUT_DIR
out=$1; mkdir -p "$out"
for s in healthy oom leak sync dataloader_bound; do
  start=$(date +%s.%N)
  timeout 300 torchdoctor run bench/gpu/scripts/$s.py --out "$out/$s" --format json --fail-on never \
      > "$out/$s.report.json" 2> "$out/$s.stderr"
  echo "$s rc=$? $(echo "$(date +%s.%N) - $start" | bc) s"
  python3 - "$out/$s.report.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("  unreadable:", e); sys.exit()
for s in r.get("symptoms", []):
    print("  ", s.get("severity"), s.get("id"), (s.get("title") or "")[:160])
print("  stopped:", r.get("run", {}).get("stopped"), "steps:", r.get("run", {}).get("steps"))
PY
done
