#!/usr/bin/env bash
# One prepared session on a lent GPU machine (no network; its own torch and transformers):
# every device point of the open issues in one run, each step time-bounded, results under $OUT.
#   1. throughput sweep on CUDA (V x k, batch sized to the device), and --compile at V = 32 and
#      V = 32,000 (compiled driver + compiled_step)                               issue 16
#   2. the CLI on CUDA: selftest, the reference audit with default and device-sized calls (16),
#      e2e on the toy models, greedy on tiny-llama                                issue 15
#      the vLLM and SGLang adapters' quick audits on CUDA (the real vLLM / sgl-kernel when the
#      machine has them, else the pure-torch stand-ins), cost on tiny-llama     issues 15, 17
#   3. the default test suite under the machine's torch/transformers          issue 18
# Run from the repository root:  OUT=/some/dir bash benchmarks/gpu_session.sh
set -u
OUT=${OUT:-/tmp/exactcheck-gpu}
mkdir -p "$OUT/reports"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
step() { echo "== $(date +%T) $*"; }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, transformers, scipy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'scipy', scipy.__version__, torch.cuda.get_device_name())"
  nproc
} > "$OUT/env.txt" 2>&1

step "throughput sweep (cuda)" > "$OUT/throughput-cuda.txt"
timeout "${SWEEP_S:-150}" python3 benchmarks/throughput.py --sweep --device cuda --repeats 3 \
    --json "$OUT/throughput-cuda.json" >> "$OUT/throughput-cuda.txt" 2>&1
echo "rc=$?" >> "$OUT/throughput-cuda.txt"
# compiled driver + compiled_step (Triton): the launch-bound V = 32 cell, and one real vocabulary
for vocab in 32 32000; do
  step "throughput --compile V=$vocab (cuda)" >> "$OUT/throughput-cuda.txt"
  timeout "${COMPILE_S:-120}" python3 benchmarks/throughput.py --compile --device cuda --repeats 3 --vocab $vocab \
      $([ $vocab = 32000 ] && echo --batch 20000) --json "$OUT/throughput-cuda-compiled-$vocab.json" >> "$OUT/throughput-cuda.txt" 2>&1
  echo "rc=$?" >> "$OUT/throughput-cuda.txt"
done

{
  step "selftest --level quick --device cuda"
  time timeout 100 python3 -m exactcheck selftest --level quick --device cuda --quiet --report "$OUT/reports/selftest"
  echo "rc=$?"
  for size in default auto; do  # issue 16: calls sized to the device fill it in fewer launches
    step "audit reference --level standard --device cuda, call size $size"
    time timeout 90 python3 -m exactcheck audit exactcheck.step.reference:reference_verifier --level standard \
        --device cuda --quiet $([ $size = auto ] && echo --call-elements auto) --report "$OUT/reports/audit-$size"
    echo "rc=$?"
  done
  step "e2e reference-loop --device cuda"
  time timeout 60 python3 -m exactcheck e2e reference-loop --device cuda --level quick --quiet --world hf_v4_l3_k2 --report "$OUT/reports/e2e"
  echo "rc=$?"
  step "greedy transformers-assisted --model tiny-llama --device cuda"
  time timeout 60 python3 -m exactcheck greedy transformers-assisted --model tiny-llama --device cuda --prompts 4 --new-tokens 16 --quiet
  echo "rc=$?"
  step "engine adapters' quick audits on cuda"
  time timeout 120 python3 - <<'PY'
import importlib.util, sys
sys.path.insert(0, "property_tests")
from exactcheck.adapters.vllm import audit_rejection_sampler
from exactcheck.adapters.sglang import audit_chain_verifier
from standins import sglang_kernel, vllm_rejection_sampler
real_vllm = importlib.util.find_spec("vllm") is not None
real_sgl = importlib.util.find_spec("sgl_kernel") is not None
for name, run in (("vllm" + (" (installed)" if real_vllm else " (stand-in)"),
                   lambda: audit_rejection_sampler(None if real_vllm else vllm_rejection_sampler, device="cuda", progress=False)),
                  ("sglang" + (" (installed)" if real_sgl else " (stand-in)"),
                   lambda: audit_chain_verifier(None if real_sgl else sglang_kernel.tree_speculative_sampling_target_only,
                                                device="cuda", progress=False))):
    result = run()
    print(name, "passed" if result.passed else "FAILED", f"{result.duration_s:.1f} s",
          [(v.check, v.outcome.value, v.reachability.describe() if v.reachability else "") for v in result.failed])
PY
  echo "rc=$?"
  step "cost transformers-assisted --model tiny-llama --device cuda"
  time timeout 120 python3 -m exactcheck cost transformers-assisted --model tiny-llama --device cuda --prompts 8 --quiet --report "$OUT/reports/cost"
  echo "rc=$?"
} > "$OUT/cli-cuda.txt" 2>&1

{
  step "default test suite (-n 12) under $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
  if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"; fi
  # the pytest11 entry point (the example project's own pytest run needs it); no network, no isolation
  python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . || echo "editable install failed"
  timeout "${TESTS_S:-280}" python3 -m pytest property_tests -q -p no:cacheprovider -n 12 --durations=5
  echo "rc=$?"
} > "$OUT/tests.txt" 2>&1
tar -czf "$OUT/reports.tar.gz" -C "$OUT" reports && rm -rf "$OUT/reports"
tail -n 3 "$OUT"/*.txt
