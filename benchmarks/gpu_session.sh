#!/usr/bin/env bash
# One prepared session on a lent GPU machine (no network; its own torch, triton and transformers):
# the engines' real kernels audited natively on CUDA (issue 31), each step time-bounded, results
# under $OUT (copy $OUT/reports into reports/gpu/ and the summary into the closing note).
#   1. every engine path of exactcheck.adapters.engine_paths: the full quick audit on CUDA (no time
#      budget), and the standard audit of vLLM V1 at temperature 1 and V2 standard
#   2. SGLang's CUDA tree kernel (sgl-kernel's tree_speculative_sampling_target_only) on a chain,
#      where sgl-kernel imports, and on the top-k tree worlds through the tree contract
#      (`exactcheck tree sglang-tree-target-only-cuda`: exit 2 with one line where it cannot run)
#   3. the default test suite under the machine's torch/transformers
# vLLM 0.33 and SGLang 0.5.23 must import: installed on the machine, or unpacked (pip download
# --no-deps, unzip) into $ENGINES_SITE, which is put on the path.
# Run from the repository root:  OUT=/some/dir bash benchmarks/gpu_session.sh
set -u
OUT=${OUT:-/tmp/exactcheck-gpu}
mkdir -p "$OUT/reports"
export PYTHONPATH="$PWD${ENGINES_SITE:+:$ENGINES_SITE}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
step() { echo "== $(date +%T) $*"; }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  python3 -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
  python3 -c "import sglang; print('sglang', sglang.__version__)" 2>&1 | tail -1
  python3 -c "import sgl_kernel; print('sgl_kernel', getattr(sgl_kernel, '__version__', '?'))" 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1

{
  for path in VllmV1Temperature1 VllmV1Temperature07TopK VllmV1Greedy VllmV2Standard VllmV2Block \
              SglangTritonTokenWise SglangTritonBlock; do
    step "audit $path --level quick --device cuda"
    time timeout "${QUICK_S:-60}" python3 -m exactcheck audit "exactcheck.adapters.engine_paths:$path" --level quick \
        --device cuda --quiet --report "$OUT/reports/quick"
    echo "rc=$?"
  done
  for path in VllmV1Temperature1 VllmV2Standard; do
    step "audit $path --level standard --device cuda"
    time timeout "${STANDARD_S:-120}" python3 -m exactcheck audit "exactcheck.adapters.engine_paths:$path" \
        --level standard --device cuda --quiet --report "$OUT/reports/standard"
    echo "rc=$?"
  done
  step "SGLang's CUDA tree kernel on a chain (sgl-kernel)"
  if python3 -c "import sgl_kernel" 2>/dev/null; then
    time timeout 60 python3 -m exactcheck audit exactcheck.adapters.sglang:SglangChainVerifier --level quick \
        --device cuda --quiet --report "$OUT/reports/quick"
    echo "rc=$?"
  else
    echo "sgl-kernel does not import here: not run"
  fi
  step "SGLang's CUDA tree kernel on trees (tree_speculative_sampling_target_only through the tree contract)"
  time timeout "${TREE_S:-120}" python3 -m exactcheck tree sglang-tree-target-only-cuda --level quick --quiet \
      --report "$OUT/reports/quick"
  echo "rc=$?"
} > "$OUT/engines-cuda.txt" 2>&1

{
  step "default test suite (-n 12) under $(python3 -c 'import torch; print("torch", torch.__version__)')"
  python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . || echo "editable install failed"
  timeout "${TESTS_S:-240}" python3 -m pytest property_tests -q -p no:cacheprovider -n 12 --durations=5
  echo "rc=$?"
} > "$OUT/tests.txt" 2>&1
tar -czf "$OUT/reports.tar.gz" -C "$OUT" reports && rm -rf "$OUT/reports"
grep -h "^exactcheck audit\|^== \|rc=" "$OUT"/engines-cuda.txt; tail -n 3 "$OUT"/tests.txt
