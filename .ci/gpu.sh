#!/usr/bin/env bash
# The GPU check, by hand on a machine with a CUDA torch and Triton (never run by .ci/run: CI has no
# GPU). Three parts, each bounded by its own wall-clock limit so that one slow part leaves the others
# their time:
#   1. the suite on the registry's kernels: --normcert-device cuda --normcert-tier all (the served
#      family's modes include the CUDA-graph capture there);
#   2. the FP4 Triton kernels (impls/triton_fp4.py) certified as a user would, on the GPU;
#   3. the CUDA-graph mode's meta-tests.
# A part stopped by its limit is interrupted (SIGINT to it and its process group: the xdist workers
# stop too), so pytest still prints what finished and the certificate says "interrupted".
#
# What it leaves in $OUT (default gpu-out/) is two files, whatever the run wrote: summary.txt (the
# machine, each part's exit status, pytest's last line, the verdict and the FAILED lines) and
# gpu-run.tgz (every log, certificate and replay file, under gpu-run/). A machine that returns only
# a few files from its output folder (8 on the device machines normcert is checked on) then returns
# all of it. Both are rewritten after each part, so a run cut short still leaves the parts it ended.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUN=$(mktemp -d)/gpu-run
mkdir -p "$RUN"
trap 'rm -rf "$(dirname "$RUN")"' EXIT
export PYTHONUNBUFFERED=1
SUITE_S=${SUITE_S:-300} FP4_S=${FP4_S:-150} WORKERS=${WORKERS:-14}
MAX_TGZ=$((15 * 1024 * 1024))  # under the 16 MiB a returned file may hold

pack() {  # the tarball of $RUN and the summary, both in $OUT; without the replay files if too large
    tar czf "$OUT/gpu-run.tgz" -C "$(dirname "$RUN")" gpu-run
    if [ "$(stat -c %s "$OUT/gpu-run.tgz")" -gt "$MAX_TGZ" ]; then
        tar czf "$OUT/gpu-run.tgz" -C "$(dirname "$RUN")" --exclude='gpu-run/failures*' gpu-run
        echo "gpu-run.tgz: over $MAX_TGZ bytes with the replay files; packed without them" >>"$RUN/summary.txt"
    fi
    cp "$RUN/summary.txt" "$OUT/summary.txt"
}

part() {  # NAME LOG RC: the part's exit status, pytest's last line, the verdict and the FAILED lines
    {
        echo "== $1: exit status $3"
        grep -E '( in [0-9.]+s( \([0-9:]+\))?( =+)?$|^normcert verdict: |^normcert: not certified: )' "$2" \
            | cut -c1-400
        grep -E '^FAILED ' "$2" | cut -c1-300
    } >>"$RUN/summary.txt"
    pack
}

python3 -m pip install -q --no-deps --no-build-isolation -e . >"$RUN/install.log" 2>&1 \
    || python3 -m pip install -q --no-deps -e . >>"$RUN/install.log" 2>&1 || { cat "$RUN/install.log"; exit 2; }
python3 - <<'EOF' >"$RUN/summary.txt" 2>&1
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), "cuda", torch.version.cuda)
EOF
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$RUN/summary.txt" 2>&1
echo "limits: suite ${SUITE_S}s on $WORKERS workers, FP4 certify ${FP4_S}s" >>"$RUN/summary.txt"
pack

echo "== 1. suite, --normcert-device cuda --normcert-tier all (limit ${SUITE_S}s)"
timeout -s INT -k 20 "$SUITE_S" python3 -m pytest --pyargs normcert.properties.suite -n "$WORKERS" -q -rfE \
    --normcert-device cuda --normcert-tier all --normcert-certificate "$RUN/suite.json" \
    --normcert-failures-dir "$RUN/failures" -p no:cacheprovider >"$RUN/suite.log" 2>&1
part suite "$RUN/suite.log" $?

echo "== 2. FP4 Triton kernels, normcert certify --device cuda (limit ${FP4_S}s)"
timeout -s INT -k 20 "$FP4_S" normcert certify --device cuda -n 3 \
    rms_norm_fp4_quant=normcert.impls.triton_fp4:rms_norm_fp4_quant \
    add_rms_norm_fp4_quant=normcert.impls.triton_fp4:add_rms_norm_fp4_quant \
    silu_and_mul_fp4_quant=normcert.impls.triton_fp4:silu_and_mul_fp4_quant \
    --certificate "$RUN/fp4.json" --failures-dir "$RUN/failures-fp4" >"$RUN/fp4.log" 2>&1
part fp4 "$RUN/fp4.log" $?

echo "== 3. CUDA-graph meta-tests"
timeout -s INT -k 10 60 python3 -m pytest properties/tests/meta/test_graphed.py -q --normcert-device cuda \
    -p no:cacheprovider >"$RUN/graphed.log" 2>&1
part graphed "$RUN/graphed.log" $?
cat "$OUT/summary.txt"
