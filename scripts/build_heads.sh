#!/usr/bin/env bash
# Rebuilds the draft heads in specdecode/heads/ from scratch: corpus = Python's standard library source (and,
# for the Qwen heads, the source and docs of installed packages under permissive licences: --data packages)
# plus the target's own answers to chat prompts written from it and (Qwen) to general-domain prompts
# written from word lists (never Spec-Bench or HumanEval). All heads are committed.
# Each train-head call stops cleanly after --time-limit minutes and resumes where it stopped, so
# the loop below re-runs it until the head is written. Usage: scripts/build_heads.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-out/heads}"
threads="${THREADS:-1}"

build() {  # build NAME EXTRA_TRAIN_ARGS...
    local name="$1"; shift
    local out="$work/$name-eagle3"
    until [ -f "$out/model.safetensors" ]; do
        nice -n 10 specdecode train-head --model "$name" --kind eagle3 --out "$out" \
            --threads "$threads" --time-limit 19 --seed 0 "$@"
    done
    mkdir -p "specdecode/heads/$name-eagle3"
    cp "$out/config.json" "$out/model.safetensors" "$out/train_report.json" "specdecode/heads/$name-eagle3/"
    echo "specdecode/heads/$name-eagle3 rebuilt"
}

build smollm2-135m-instruct --data stdlib --dtype bfloat16 --seq-len 512 --corpus-tokens 16000 --distill 240 \
    --distill-tokens 192 --draft-vocab 8192 --steps 400 --batch-size 4 --lr 2e-3 --eval-every 50 --save-every 25

# Qwen heads: features and labels from the int4 target as it runs (--quant int4), a narrower MLP and an
# 8192-token draft vocabulary, stored as int8 rows (--store int8) to stay under 40 MB each.
# 1.5B: ~1.5 h on 2 Zen 4 cores (25 min answering 1280 prompts, ~45 min features, ~25 min training);
# the features (~6 GB) stay in WORKDIR, so a longer run (--steps) resumes on them.
build qwen2.5-coder-1.5b-instruct --quant int4 --data stdlib packages --seq-len 512 --corpus-tokens 60000 \
    --distill 640 --general 640 --distill-tokens 256 --draft-vocab 8192 --head-intermediate 2048 --steps 720 \
    --batch-size 4 --lr 2e-3 --eval-every 120 --save-every 40 --store int8

# 0.5B: the 1.5B's recipe; ~55 min on 2 Zen 4 cores (13 answering, 21 features, 20 training).
build qwen2.5-coder-0.5b-instruct --quant int4 --data stdlib packages --seq-len 512 --corpus-tokens 60000 \
    --distill 640 --general 640 --distill-tokens 256 --draft-vocab 8192 --head-intermediate 2048 --steps 720 \
    --batch-size 4 --lr 2e-3 --eval-every 120 --save-every 40 --store int8

mtp="$work/smollm2-mtp"
until [ -f "$mtp/mtp.safetensors" ]; do
    nice -n 10 specdecode train-head --model smollm2-135m-instruct --kind mtp --data stdlib --distill 48 --seq-len 256 \
        --ttt-steps 2 --steps 130 --lr 1.5e-3 --eval-every 40 --save-every 20 --time-limit 17 --out "$mtp" \
        --threads "$threads"
done
cp "$mtp/config.json" "$mtp/mtp.safetensors" specdecode/heads/smollm2-mtp/
echo "specdecode/heads/smollm2-mtp rebuilt"
