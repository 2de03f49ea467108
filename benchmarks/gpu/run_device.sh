#!/usr/bin/env bash
# One GPU session's checks, in priority order, each stage under its own time limit so a slow stage
# cannot starve the next. Results land in $OUT (or ./gpu_out); each stage prints its last lines, and its
# whole output (warnings included) is appended to $OUT/stages.log (one file for all stages: at most 8
# files come back from a device call).
#   bash benchmarks/gpu/run_device.sh [stage ...]
# stages: generate train2 metrics train5 (default), tests profile trainprofile trainbatch train3 invariance attention bigbatch
# quick compile.
# Measured stage times (H200, 2026-11-27): generate 80 s, train2 ~58 s per run at 2 epochs, metrics 84-93 s (all four
# metrics), tests ~20 s per scenario; attention ran past 200 s; train5 past 100 s (2026-11-26).
# Wheels for packages the machine lacks travel in .whl/ (docs/gpu.md, "Running the GPU checks").
set -u
stages=${*:-generate train2 metrics train5}  # TRAIN_RUNS: bench_train --runs for train2
known=" tests generate profile invariance train2 trainprofile trainbatch train3 train5 metrics attention quick bigbatch compile "
for s in $stages; do  # an unknown stage (a renamed one: train is train2) ran nothing, silently, on device time
  case "$known" in *" $s "*) ;; *) echo "error: unknown stage '$s'; choose from:$known" >&2; exit 2 ;; esac
done
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
LOG="$OUT/stages.log"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
if [ -d .whl ] && ! python3 -c "import diffusers" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
for s in $stages; do
  t0=$(date +%s)
  echo "== stage $s ($(date -u +%FT%TZ))" >> "$LOG"
  case $s in
    tests) # each CUDA scenario on its own (90 s at most, and never past TESTS_BUDGET s of the stage, default
           # 270), in priority order, one JSON line each in $OUT/cuda_checks.jsonl; CUDA_TESTS overrides the list
           budget=${TESTS_BUDGET:-270}
           for c in ${CUDA_TESTS:-train_resume train_mixed_precision train_tf32 metrics_on_cuda feature_numerics \
                     generate_precisions generate_memory_micro_batch step_syncs dist_group flow_models_bf16 \
                     flow_train_bf16 generate_sd1_tiny train_reward_on_device}; do
             left=$(( budget - ($(date +%s) - t0) ))
             if [ $left -lt 10 ]; then echo "SKIPPED $c (stage time spent)" | tee -a "$LOG"; continue; fi
             d=$(mktemp -d) c0=$(date +%s)
             if timeout $(( left < 90 ? left : 90 )) python3 tests/support/cuda_checks.py "$c" "$d" > "$d/out.txt" 2> "$d/err.txt"; then
               grep '^{' "$d/out.txt" | tail -1 | tee -a "$OUT/cuda_checks.jsonl"; echo "PASSED $c $(( $(date +%s) - c0 )) s" | tee -a "$LOG"
             else
               echo "FAILED $c (rc $?, $(( $(date +%s) - c0 )) s)" | tee -a "$LOG"; tail -6 "$d/err.txt"
               { echo "-- $c stdout"; cat "$d/out.txt"; echo "-- $c stderr"; cat "$d/err.txt"; } >> "$LOG"
             fi
             rm -rf "$d"
           done ;;
    generate) timeout 120 python3 benchmarks/gpu/bench_generate.py --images 48 --batch 16 --repeats 1 \
                --json "$OUT/generate.json" 2>&1 | tee -a "$LOG" | grep -v "float32" | tail -40 ;;
    profile) timeout 150 python3 benchmarks/gpu/bench_generate.py --images 16 --batch 16 --repeats 1 \
                --profile "$OUT/generate_profile.txt" 2>&1 | tee -a "$LOG" | grep -v "float32" | tail -5 ;;
    invariance) timeout 200 python3 benchmarks/gpu/bench_generate.py --images 48 --batch 16 --repeats 1 \
                --variants channels_last --invariance --json "$OUT/generate_invariance.json" 2>&1 | tee -a "$LOG" | grep -v "float32" | tail -40 ;;
    train2) # TRAIN_EPOCHS (default 4): the median of epochs 2.. per run (one epoch varied ~10 % per phase);
            # TRAIN2_LIMIT overrides the time limit (a compile=true run compiles the UNet first: give it its own call)
            runs=${TRAIN_RUNS:-ppo_clip}; n=$(( $(tr -cd ';' <<< "$runs" | wc -c) + 1 )); e=${TRAIN_EPOCHS:-4}
            timeout ${TRAIN2_LIMIT:-$(( (50 + 22 * e) * n ))} python3 benchmarks/gpu/bench_train.py --setup 2 --batches 1 --runs "$runs" \
              --epochs "$e" --json "$OUT/train2.json" 2>&1 | tee -a "$LOG" | grep -v "Loading\|float32\|Writing" | tail -12 ;;
    trainprofile) # TRAIN_PROFILE_RUN: the profiled run (default ppo_clip; e.g. ppo_clip:train_steps_per_forward=4)
                  # (the row is saved before the profiler's tables, which take about a minute at SD-1.5's size)
                  timeout 240 python3 benchmarks/gpu/bench_train.py --setup 2 --batches 1 --runs "${TRAIN_PROFILE_RUN:-ppo_clip}" \
              --profile "$OUT/train_profile.txt" --json "$OUT/train2_profiled.json" 2>&1 \
              | tee -a "$LOG" | grep -v "Loading\|float32\|Writing" | tail -8 ;;
    trainbatch) # larger update forwards (docs/training.md: speed settings), and a one-GPU sampling batch of 32;
                # 8 steps per forward last (64 UNet rows: may not fit an H100; bench_train keeps the other rows)
                timeout 360 python3 benchmarks/gpu/bench_train.py --setup 2 --batches 1 --epochs 3 \
              --runs "ppo_clip:train_steps_per_forward=2;ppo_clip:sample_batch_size=32,train_steps_per_forward=4;ppo_clip:train_steps_per_forward=8" \
              --json "$OUT/train2_batch.json" 2>&1 \
              | tee -a "$LOG" | grep -v "Loading\|float32\|Writing" | tail -8 ;;
    train3) # setup 3 (and 4: the same shapes, twice the images): the BERTScore reward of the real sizes
            # (Qwen2.5-VL-3B bf16 + DeBERTa-xlarge, random weights) on the training GPU: peak memory, reward_s
            # and whether scoring beside sampling (reward_overlap) hides the captioner's host-bound decoding
            if ! python3 -c "import bert_score" 2>/dev/null; then
              echo "SKIPPED train3: bert_score is not installed (bert-score==0.3.13 in .whl/: docs/gpu.md)" | tee -a "$LOG"; continue
            fi
            timeout 400 python3 benchmarks/gpu/bench_train.py --setup 3 --batches 2 --epochs 3 \
              --runs "${TRAIN3_RUNS:-ppo_clip;ppo_clip:reward_overlap=true}" \
              --json "$OUT/train3.json" 2>&1 | tee -a "$LOG" | grep -v "Loading\|float32\|Writing" | tail -8 ;;
    train5) timeout 200 python3 benchmarks/gpu/bench_train.py --setup 5 --batches 1 --runs ppo_clip \
              --json "$OUT/train5.json" 2>&1 | tee -a "$LOG" | grep -v "Loading\|float32\|Writing" | tail -8 ;;
    metrics) timeout 270 python3 benchmarks/gpu/bench_metrics.py --images 1000 --metrics "fid;fid,fd_dinov2,is,lpips" \
               --precision "${METRICS_PRECISION:-fp32}" --json "$OUT/metrics_${METRICS_PRECISION:-fp32}.json" 2>&1 | tee -a "$LOG" | grep -v "Warning\|warn" | tail -8 ;;
    attention) timeout 300 python3 benchmarks/gpu/bench_generate.py --images 48 --batch 16 --repeats 1 \
                --variants attn_math,attn_efficient,attn_cudnn,cudnn_benchmark --json "$OUT/generate_attention.json" 2>&1 \
                | tee -a "$LOG" | grep -E "^(variant |diffusers: |ours: )|Error|Traceback" | tail -12 ;;
    quick) timeout 70 python3 benchmarks/gpu/bench_generate.py --images 32 --batch 16 --repeats 1 \
             --json "$OUT/generate_quick.json" 2>&1 | tee -a "$LOG" | grep -v "float32" | tail -30
           timeout 45 python3 -m pytest tests/gpu/test_cuda.py -m cuda -k train_resume -q -s -p no:cacheprovider 2>&1 | tee -a "$LOG" | tail -4
           timeout 40 python3 benchmarks/gpu/bench_metrics.py --images 300 --metrics fid \
             --json "$OUT/metrics_quick.json" 2>&1 | tee -a "$LOG" | grep -v "Warning\|warn" | tail -3 ;;
    bigbatch) # the FLOP share at larger denoiser calls: 32 images per call, 64 rows (the micro-batch's cap)
              timeout 200 python3 benchmarks/gpu/bench_generate.py --images 64 --batch 16 --repeats 1 \
                --variants batch32 --json "$OUT/generate_bigbatch.json" 2>&1 | tee -a "$LOG" \
                | grep -E "^(variant |diffusers: |ours: )|Error|Traceback" | tail -12 ;;
    compile) timeout 300 python3 benchmarks/gpu/bench_generate.py --images 48 --batch 16 --repeats 1 \
               --variants compile --json "$OUT/generate_compile.json" 2>&1 | tee -a "$LOG" | grep -v "float32" | tail -12 ;;
  esac
  rc=${PIPESTATUS[0]}  # of the stage's last pipeline: its timeout's 124 when the stage ran past its limit
  [ "$rc" = 124 ] && echo "TIMED OUT: stage $s's last command ran past its limit" | tee -a "$LOG"
  echo "== stage $s: $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
done
