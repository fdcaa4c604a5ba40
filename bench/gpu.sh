#!/usr/bin/env bash
# Every GPU measurement of issue 34 in one call (written for one H100/H200, under 8 minutes), one table at the end.
#
#   bash bench/gpu.sh                     # from the repository root; results under $RESULTS (default bench-out/)
#   SKIP_INTERPRETER=1 bash bench/gpu.sh  # skip step 0 (already run on a CPU just before)
#
# 0. The kernels in Triton's CPU interpreter against their references (tests/kernels), before any GPU time.
# 1. megaeval installed from this working tree, without dependencies (a GPU machine may have no registry);
#    `python -m megaeval.kernels.aot` checks that every kernel builds for the GPU first.
# 2. bench/kernels.py: each fast op against its reference at 7B shapes (time, error, memory).
# 3. bench/gpu_end_to_end.py: `score` of the 7B-shaped model, 32 layers to 256K and 4 layers to 2M tokens, MFU,
#    and where the time goes.
# 4. bench/gpu_decode.py: a decode step of the 7B-shaped model at batch 1, eager and as CUDA graphs (unfused and
#    fused), against the time to read its weights; a float32 check of both graphs against the eager forward.
# 5. bench/gpu_sequence_parallel.py: the Transformers' sequence-parallel attention on one rank against SDPA.
# 6. `megaeval ppl-sweep --device cuda` on the embedded model: the report's MFU fields, end to end.
# A step that fails is reported and the next one runs; each has its own time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${RESULTS:-bench-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=()

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.log, remember how it ended
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    status+=("$name: exit $rc after $((SECONDS - t0))s")
}

if [ "${SKIP_INTERPRETER:-0}" != 1 ]; then
    step interpreter 600 env TRITON_INTERPRET=1 "$PY" -m pytest -q -p no:cacheprovider tests/kernels
fi
step install 90 "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
step aot 90 "$PY" -m megaeval.kernels.aot --arch 90
step kernels 120 "$PY" bench/kernels.py --out "$OUT/kernels.json"
step end_to_end 200 "$PY" bench/gpu_end_to_end.py --out "$OUT/end_to_end.json"
step decode 100 "$PY" bench/gpu_decode.py --out "$OUT/decode.json"
step sequence_parallel 60 "$PY" bench/gpu_sequence_parallel.py --out "$OUT/sequence_parallel.json"
stream_dir=$(mktemp -d)
step prep_books 60 "$PY" -m megaeval prep-books data_prep/corpora/austen/persuasion.txt --out "$stream_dir/stream" \
    --no-progress
step sweep 90 "$PY" -m megaeval ppl-sweep --stream "$stream_dir/stream" --lengths 1K,4K,16K --device cuda \
    --dtype bfloat16 --no-progress --out "$OUT/sweep.json"
"$PY" -c "import json; r = json.load(open('$OUT/sweep.json'))['results']; print(json.dumps([{k: v for k, v in x.items() \
if k in ('context_length', 'ppl', 'tokens_per_second', 'model_flops_per_token', 'achieved_tflops', 'mfu')} \
for x in r['lengths']]), r['peak_tflops'], r['peak_tflops_source'])" | tee "$OUT/sweep_mfu.txt"

echo
echo "=== summary"
printf '%s\n' "${status[@]}"
for name in kernels end_to_end decode sequence_parallel; do
    echo
    grep -v '^JSON:' "$OUT/$name.log" | tail -n 40  # each bench prints its table last
done
