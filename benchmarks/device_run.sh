#!/usr/bin/env bash
# One run of the GPU figures on a lent H100/H200 with no network (docs/gpu.md, "The device run"):
#   bash benchmarks/device_run.sh            # from the repository root, with .whl/ carried beside it
# Installs what the machine lacks from the wheels carried in .whl/ (gitignored; fetched on a networked machine with
# `pip download --no-deps -d .whl torchao==0.18.0 transformers==5.24.0 sentence-transformers==6.2.0
# tokenizers==0.23.3 safetensors==0.8.0 huggingface_hub==2.4.0 faiss-cpu==1.15.1 psutil==7.2.2`, about 40 MB),
# then runs every side of benchmarks.gpu_index once (padded, packed, packed+compiled, fp8, sentence-transformers at
# its defaults and at its best) and writes the cuda section of docs/gpu.md; the JSON goes to $OUT when set.
#   DEVICE_RUN=train bash benchmarks/device_run.sh   # a second call: the paper recipe's dry run, its stage table
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
need=()
for pair in transformers:transformers sentence_transformers:sentence-transformers tokenizers:tokenizers \
    safetensors:safetensors huggingface_hub:huggingface_hub faiss:faiss-cpu psutil:psutil torchao:torchao; do
  module=${pair%%:*}; wheel=${pair##*:}
  "$PY" -c "import $module" 2>/dev/null || need+=("$wheel")
done
if ((${#need[@]})); then
  echo "installing from .whl/: ${need[*]}"
  "$PY" -m pip install -q --no-index --find-links .whl --no-deps "${need[@]}"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))"
out=${OUT:-/tmp}
device=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")
if [[ "${DEVICE_RUN:-index}" == train ]]; then
  # The paper recipe's dry run (random towers of the paper's shapes, 10 steps a stage, about 2.5 minutes on an
  # H200): run as a second device call, `DEVICE_RUN=train bash benchmarks/device_run.sh`, since one call is at
  # most 10 minutes. Its run.json names the forward pass each stage's document side ran (packed on CUDA).
  cmd="care-retriever train --recipe paper --out /tmp/p --preset base --dry-run-steps 10"
  timeout "${DEVICE_RUN_SECONDS:-470}" "$PY" -m care_retriever.cli.main train --recipe paper --out /tmp/p \
    --preset base --dry-run-steps 10 "$@"
  cp /tmp/p/run.json "$out/run.json"; "$PY" -m benchmarks.training_walltime /tmp/p/run.json --device "$device (1 GPU)" --command "$cmd"
  cp docs/gpu.md "$out/gpu.md"
  exit 0
fi
# one round a side: the eight sides of two corpora fit the device's minutes (the compile warm-ups included)
timeout "${DEVICE_RUN_SECONDS:-470}" "$PY" -m benchmarks.gpu_index --sides all --rounds 1 --json \
  "$@" | tee "$out/gpu_index.json"
cp docs/gpu.md "$out/gpu.md"
