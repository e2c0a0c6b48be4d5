#!/usr/bin/env bash
# One run of the GPU figures on a lent H100/H200 with no network (docs/gpu.md, "The device run"):
#   bash benchmarks/device_run.sh            # from the repository root, with .whl/ and .devdata/ carried beside it
# Installs the wheels carried in .whl/ (gitignored) into /tmp/site, ahead of the machine's own packages, so that the
# tested versions run whatever the machine has (its torch stays: torch 2.11 cu130 there). The wheels, fetched on a
# networked machine for the device's Python 3.12:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     torchao==0.18.0 transformers==5.24.0 sentence-transformers==6.2.0 tokenizers==0.23.3 safetensors==0.8.0 \
#     faiss-cpu==1.15.1 regex==2026.11.19 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19     # about 41 MB
# The shared data travels as .devdata/ (a gitignored copy of ../shared/data's tasks/ and train/, made for the call
# and deleted after it; CARE_SHARED_DATA points there). Three calls, each under the device's 10-minute limit, in the
# order of what they decide (each side prints its line as it ends and the doc's section is written per corpus, so a
# call stopped by its time limit keeps what it finished; logs, JSON and docs/gpu.md go to $OUT):
#   bash benchmarks/device_run.sh                   # benchmarks.cuda_checks (what the CPU suite cannot run: packed =
#                                                   # padded on the varlen kernel, its backward, compile without graph
#                                                   # breaks), then every side of gpu_index on the im-qa answers
#   DEVICE_RUN=titles bash benchmarks/device_run.sh # every side on 8,192 kuake-qtr titles
#   DEVICE_RUN=train bash benchmarks/device_run.sh  # the paper recipe's dry run, its stage table
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[[ -d .devdata ]] && export CARE_SHARED_DATA=${CARE_SHARED_DATA:-$PWD/.devdata}
# not installed there: the wheel maps training/ and integrations/ to care_retriever.training / .integrations
# (pyproject's package-dir); on the device's copy of the tree, links do the same
for sub in training integrations; do
  "$PY" -c "import care_retriever.$sub" 2>/dev/null || ln -sfn "../$sub" "care_retriever/$sub"
done
"$PY" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))"
out=${OUT:-/tmp}
device=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")
sides="encode_document defaults,index,encode_document,index packed+compiled,index fp8,index packed,index padded"
sides+=",index padded+compiled,encode_document best"
case "${DEVICE_RUN:-index}" in
  train)
    # random towers of the paper's shapes, 10 steps a stage (134 s on an H200); its run.json names the forward
    # pass each stage's document side ran (packed on CUDA)
    cmd="care-retriever train --recipe paper --out /tmp/p --preset base --dry-run-steps 10"
    timeout "${DEVICE_RUN_SECONDS:-470}" "$PY" -m care_retriever.cli.main train --recipe paper --out /tmp/p \
      --preset base --dry-run-steps 10 --data-dir "${CARE_SHARED_DATA:-../shared/data}" "$@" 2>&1 \
      | tee "$out/train.log"
    cp /tmp/p/run.json "$out/run.json"
    "$PY" -m benchmarks.training_walltime /tmp/p/run.json --device "$device (1 GPU)" --command "$cmd"
    ;;
  titles)
    timeout "${DEVICE_RUN_SECONDS:-520}" "$PY" -m benchmarks.gpu_index --only "kuake-qtr titles" --limit 8192 \
      --sides "$sides" --rounds 1 --json "$@" 2> >(tee "$out/gpu_index.log" >&2) | tee "$out/gpu_index.json" || true
    ;;
  *)
    vocab=${CARE_SHARED_DATA:-/work/shared/data}/tasks/kuake-qtr-retrieval/corpus.jsonl
    timeout 150 "$PY" -m benchmarks.cuda_checks --vocab "$vocab" --json "$out/cuda_checks.json" 2>&1 \
      | tee "$out/cuda_checks.log" || true
    timeout "${DEVICE_RUN_SECONDS:-380}" "$PY" -m benchmarks.gpu_index --only "im-qa answers" \
      --sides "$sides" --rounds 1 --json "$@" 2> >(tee "$out/gpu_index.log" >&2) | tee "$out/gpu_index.json" || true
    ;;
esac
cp docs/gpu.md "$out/gpu.md"
