#!/usr/bin/env bash
# One GPU session's checks, in priority order, each stage under its own time limit so a slow stage
# cannot starve the next: CUDA tests, generate, train, metrics. Results land in $OUT (or ./gpu_out).
#   bash benchmarks/gpu/run_device.sh [stage ...]      # stages: tests generate train metrics
# Wheels for packages the machine lacks travel in .whl/ (docs/gpu.md, "Running the GPU checks").
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
if [ -d .whl ] && ! python3 -c "import diffusers" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
stages=${*:-tests generate train metrics}
for s in $stages; do
  t0=$(date +%s)
  case $s in
    tests) timeout 150 python3 -m pytest tests/gpu/test_cuda.py -m cuda -q -s -p no:cacheprovider 2>&1 | tail -25 ;;
    generate) timeout 200 python3 benchmarks/gpu/bench_generate.py --images 48 --batch 16 --repeats 2 \
                --variants channels_last --invariance --json "$OUT/generate.json" 2>&1 | grep -v "float32" | tail -40 ;;
    train) timeout 200 python3 benchmarks/gpu/bench_train.py --setup 2 --setup 5 --batches 1 \
             --json "$OUT/train.json" 2>&1 | grep -v "^epoch\|Loading\|float32" | tail -20 ;;
    metrics) timeout 120 python3 benchmarks/gpu/bench_metrics.py --images 500 --json "$OUT/metrics.json" 2>&1 \
               | grep -v "Warning\|warn" | tail -8 ;;
    quick) timeout 70 python3 benchmarks/gpu/bench_generate.py --images 32 --batch 16 --repeats 1 \
             --json "$OUT/generate_quick.json" 2>&1 | grep -v "float32" | tail -30
           timeout 45 python3 -m pytest tests/gpu/test_cuda.py -m cuda -k train_resume -q -s -p no:cacheprovider 2>&1 | tail -4
           timeout 40 python3 benchmarks/gpu/bench_metrics.py --images 300 --metrics fid \
             --json "$OUT/metrics_quick.json" 2>&1 | grep -v "Warning\|warn" | tail -3 ;;
    compile) timeout 300 python3 benchmarks/gpu/bench_generate.py --images 48 --batch 16 --repeats 1 \
               --variants compile --json "$OUT/generate_compile.json" 2>&1 | grep -v "float32" | tail -12 ;;
  esac
  echo "== stage $s: $(( $(date +%s) - t0 )) s"
done
