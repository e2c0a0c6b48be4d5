#!/usr/bin/env bash
# One run of the GPU figures on a lent H100/H200 with no network (benchmarks/results/gpu.md, "The device run"):
#   bash benchmarks/device_run.sh            # from the repository root, with .whl/ and .devdata/ carried beside it
# Installs the wheels carried in .whl/ (gitignored) into /tmp/site, ahead of the machine's own packages, so that the
# tested versions run whatever the machine has (its torch stays: torch 2.11 cu130 there). The wheels, fetched on a
# networked machine for the device's Python 3.12:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     torchao==0.18.0 transformers==5.24.0 sentence-transformers==6.2.0 tokenizers==0.23.3 safetensors==0.8.0 \
#     faiss-cpu==1.15.1 regex==2026.11.19 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19     # about 41 MB
# The shared data travels as .devdata/ (a gitignored copy of ../shared/data's tasks/ and train/, made for the call
# and deleted after it; CARE_SHARED_DATA points there). A lease is 15 minutes of device time, the machine's start
# included: one full call and one short one. The calls, most decisive first (each side prints its line as it ends
# and the doc's section is written per corpus, so a call stopped by its time limit keeps what it finished; logs,
# JSON, the profiles' traces and benchmarks/results/gpu.md go to $OUT):
#   bash benchmarks/device_run.sh                   # benchmarks.cuda_checks (what the CPU suite cannot run: packed =
#                                                   # padded on the varlen kernel, its backward, compile without graph
#                                                   # breaks; under a minute), then the sides of gpu_index on the im-qa
#                                                   # answers, fp8 and compiled first, each profiled after its timed run
#   DEVICE_RUN=train bash benchmarks/device_run.sh  # the paper recipe's dry run (packed Stage II on CUDA), its table
#   DEVICE_RUN=titles bash benchmarks/device_run.sh # the sides on 8,192 kuake-qtr titles
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# the device in words; on a machine without CUDA the script rehearses the calls in this environment (tiny tower,
# CPU checks, no wheels: they are the device's Python's) so that what would stop them is found before a lease is spent:
#   OUT=/tmp/r bash benchmarks/device_run.sh --limit 64 --no-write
device=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU')")
if [[ $device != CPU ]] && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
site=$([[ $device == CPU ]] || echo /tmp/site:)
export PYTHONPATH=$site$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[[ -d .devdata ]] && export CARE_SHARED_DATA=${CARE_SHARED_DATA:-$PWD/.devdata}
# not installed there: the wheel maps training/ and integrations/ to care_retriever.training / .integrations
# (pyproject's package-dir); on the device's copy of the tree, links do the same
for sub in training integrations; do
  "$PY" -c "import care_retriever.$sub" 2>/dev/null || ln -sfn "../$sub" "care_retriever/$sub"
done
checks_device=$([[ $device == CPU ]] && echo cpu || echo cuda)
"$PY" -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_capability(0))"
echo "device: $device"
out=${OUT:-/tmp}
mkdir -p "$out"  # a rehearsal's OUT may not exist yet; the device's does
# by what they decide: the index path, then FP8 and compiling (the levers left), then sentence-transformers'
# defaults (the targets' baseline), the index path with the model's own RMSNorm code (what the fused norms of
# "index" gain), sentence-transformers at our batch and at its best, then the padded path ("index" is packed on CUDA).
# Four compiled sides would take most of a call (about 75 s of cold compiling each): the padded path compiled, the
# fallback for towers that cannot pack, is left to `--sides all`, so that one call measures the rest in 8 minutes.
sides="index,index fp8,index packed+compiled,encode_document defaults,index own norms,encode_document"
sides+=",encode_document best,index padded"
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
      --sides "$sides" --rounds 1 --profile 1024 --profile-traces "$out/traces" --json "$@" \
      2> >(tee "$out/gpu_index.log" >&2) | tee "$out/gpu_index.json" \
      || echo "[device_run] gpu_index ended with exit $? (124: its time limit)"
    ;;
  *)
    vocab=${CARE_SHARED_DATA:-/work/shared/data}/tasks/kuake-qtr-retrieval/corpus.jsonl
    timeout 100 "$PY" -m benchmarks.cuda_checks --device "$checks_device" --vocab "$vocab" \
      --json "$out/cuda_checks.json" 2>&1 | tee "$out/cuda_checks.log" \
      || echo "[device_run] cuda_checks ended with exit $? (124: its time limit)"
    # what is left of the call's 580 s after the wheels and the checks
    timeout "${DEVICE_RUN_SECONDS:-450}" "$PY" -m benchmarks.gpu_index --only "im-qa answers" \
      --sides "$sides" --rounds 1 --profile 512 --profile-traces "$out/traces" --json "$@" \
      2> >(tee "$out/gpu_index.log" >&2) | tee "$out/gpu_index.json" \
      || echo "[device_run] gpu_index ended with exit $? (124: its time limit)"
    ;;
esac
cp benchmarks/results/gpu.md "$out/gpu.md"
