#!/usr/bin/env bash
# normcert as users get it (.ci/run runs this after the quick tier): in a fresh venv, from a folder
# beside the clone, the README's install lines exactly as written (torch pinned first, then the sdist
# and wheel built from the clone, the wheel installed: not editable, not the clone), the metadata
# checked (twine check), and then, from a folder of the user's own (its own pytest.ini), the
# README's certify command with --report, a replay of a planted wrong kernel's failure, and
# `normcert schema`: every file a run needs must be in the wheel.  properties/tests/test_install.py
# keeps the README's install lines, its mykern.py and its GitHub Actions snippet in step with this.
set -euo pipefail
clone="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
. "$work/venv/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_QUIET=1   # pip's cache (~/.cache/pip) is reused between runs
ln -s "$clone" "$work/normcert"  # the README's lines run in the folder that holds a clone named normcert
rm -rf "$clone/dist"
cd "$work"
# --- the README's install lines, as written (test_install.py) ---
pip install torch==2.13.0
pip install build && python -m build normcert
pip install normcert/dist/normcert-*.whl
# ---
pip install twine && twine check --strict normcert/dist/*
python - <<'EOF'  # installed as a user gets it: from the venv, not the clone
import sys, normcert
assert normcert.__file__.startswith(sys.prefix), f"normcert imported from {normcert.__file__}, not the venv"
EOF

mkdir user && cd user
printf '[pytest]\naddopts = -k nothing\n' > pytest.ini  # the user's own configuration: certify ignores it
python - "$clone/README.md" > mykern.py <<'EOF'  # the README's mykern.py, as printed there
import re, sys
print(re.search(r"```python\n# mykern\.py\n(.*?)```", open(sys.argv[1]).read(), re.S).group(1), end="")
EOF
expect() {  # expect STATUS COMMAND...: run it, fail unless it exits STATUS
    local want=$1; shift
    local got=0
    "$@" > out.txt 2>&1 || got=$?
    if [ "$got" != "$want" ]; then cat out.txt; echo "wheel.sh: '$*' exited $got, expected $want" >&2; exit 1; fi
}
has() {  # has FILE TEXT: fail, saying so, unless FILE holds TEXT
    grep -qF -- "$2" "$1" || { cat "$1"; echo "wheel.sh: $1 does not say '$2'" >&2; exit 1; }
}
expect 0 normcert certify rms_norm=mykern:rms_norm --certificate cert.json --report report.html
has out.txt "normcert verdict: certified"
python -c "import json; c = json.load(open('cert.json')); assert c['verdict'] == 'certified', c['verdict']"
has report.html "<html"
# a planted wrong kernel (eps outside the square root): rejected, its failure replayed, then the fix
sed 's/torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)/1 \/ (xf.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps)/' \
    mykern.py > wrong.py
if cmp -s mykern.py wrong.py; then echo "wheel.sh: the planted bug was not planted" >&2; exit 1; fi
expect 1 normcert certify rms_norm=wrong:rms_norm --property accuracy --dtype float32 --failures-dir wrong
has out.txt "accuracy fails for rms_norm:wrong:rms_norm"
replay=$(ls wrong/*accuracy-float32*.npz | head -1)
expect 1 normcert replay "$replay" --impl rms_norm=wrong:rms_norm  # a kernel outside the registry is named
has out.txt "accuracy still fails for rms_norm:wrong:rms_norm"
expect 0 normcert replay "$replay" --impl rms_norm=mykern:rms_norm  # the same case through the fix
normcert schema | python -c "import json, sys; assert json.load(sys.stdin)['title']"
echo "wheel.sh: the wheel certifies, reports, replays and prints the schema from $PWD"
