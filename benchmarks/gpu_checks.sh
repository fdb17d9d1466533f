#!/usr/bin/env bash
# The GPU checks in one go, for a machine with one CUDA GPU and no network:
#   1. the device-independent tests on CUDA (tests/test_device.py --device cuda),
#   2. BERT-base pre-training steps against transformers (benchmarks/pretrain_bench.py, bf16),
#   3. BERT-mini pre-trained for minutes, then fine-tuned beside its random twin (experiments/gpu_minutes.py).
# Every stage has its own time limit, so one that overruns leaves the others their time.
#
#   bash benchmarks/gpu_checks.sh OUT DATA [SECONDS]
#
# OUT receives gpu.log, cuda_tests.xml, pretrain_bench_gpu.json, benchmarks.md and gpu_minutes.json;
# DATA holds books-sop128/ (a `bertforge prepare` output) and glue/ (MRPC, SST-2). SECONDS (default 560)
# bounds the whole script.
set -u
out=${1:?OUT}; data=${2:?DATA}; total=${3:-560}
export PYTHONPATH="$PWD/src:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
left() { echo $(( total - SECONDS > 10 ? total - SECONDS : 10 )); }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
  echo "== CUDA tests ($(left) s left)"
  timeout 150 python3 -m pytest tests/test_device.py --device cuda -q -p no:cacheprovider -rfE -n 4 \
    --junitxml "$out/cuda_tests.xml"
  echo "== pre-training step against transformers ($(left) s left)"
  timeout 130 python3 benchmarks/pretrain_bench.py --presets base --seq 128,512 --batch 256,64 --steps 15 \
    --rounds 1 --device cuda && cp benchmarks/results/pretrain_bench_gpu.json docs/benchmarks.md "$out/"
  echo "== minutes of pre-training, then fine-tuning ($(left) s left)"
  timeout "$(left)" python3 -m experiments.gpu_minutes --data "$data/books-sop128" --glue "$data/glue" \
    --minutes 2 --preset mini --batch-size 256 --lr 1e-3 --tasks MRPC,SST-2 --seeds 1,2,3 \
    --work /tmp/gpu-minutes --json "$out/gpu_minutes.json"
  echo "== done after $SECONDS s"
} > "$out/gpu.log" 2>&1
