#!/usr/bin/env bash
# The GPU check, by hand on a machine with a CUDA torch and Triton (never run by .ci/run: CI has no
# GPU). Three parts, each bounded by its own wall-clock limit so that one slow part leaves the others
# their time; every part's log and certificate land in $OUT (default gpu-out/):
#   1. the suite on the registry's kernels: --normcert-device cuda --normcert-tier all (the served
#      family's modes include the CUDA-graph capture there);
#   2. the FP4 Triton kernels (impls/triton_fp4.py) certified as a user would, on the GPU;
#   3. the CUDA-graph mode's meta-tests.
# A part stopped by its limit is interrupted (SIGINT), so pytest still prints what finished.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SUITE_S=${SUITE_S:-300} FP4_S=${FP4_S:-150} WORKERS=${WORKERS:-14}
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || python3 -m pip install -q --no-deps -e . >>"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 2; }
python3 - <<'EOF' 2>&1 | tee "$OUT/env.txt"
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), "cuda", torch.version.cuda)
EOF
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/env.txt"

echo "== 1. suite, --normcert-device cuda --normcert-tier all (limit ${SUITE_S}s)"
timeout -s INT -k 20 "$SUITE_S" python3 -m pytest --pyargs normcert.properties.suite -n "$WORKERS" -q -rfE \
    --normcert-device cuda --normcert-tier all --normcert-certificate "$OUT/suite.json" \
    --normcert-failures-dir "$OUT/failures" -p no:cacheprovider >"$OUT/suite.log" 2>&1
echo "suite rc=$?"; tail -n 40 "$OUT/suite.log"

echo "== 2. FP4 Triton kernels, normcert certify --device cuda (limit ${FP4_S}s)"
timeout -s INT -k 20 "$FP4_S" normcert certify --device cuda -n 3 \
    rms_norm_fp4_quant=normcert.impls.triton_fp4:rms_norm_fp4_quant \
    add_rms_norm_fp4_quant=normcert.impls.triton_fp4:add_rms_norm_fp4_quant \
    silu_and_mul_fp4_quant=normcert.impls.triton_fp4:silu_and_mul_fp4_quant \
    --certificate "$OUT/fp4.json" --failures-dir "$OUT/failures" >"$OUT/fp4.log" 2>&1
echo "fp4 rc=$?"; tail -n 30 "$OUT/fp4.log"

echo "== 3. CUDA-graph meta-tests"
timeout -s INT -k 10 60 python3 -m pytest properties/tests/meta/test_graphed.py -q --normcert-device cuda \
    -p no:cacheprovider >"$OUT/graphed.log" 2>&1
echo "graphed rc=$?"; tail -n 8 "$OUT/graphed.log"
tar czf "$OUT/failures.tgz" -C "$OUT" failures 2>/dev/null; rm -rf "$OUT/failures"
