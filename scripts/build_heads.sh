#!/usr/bin/env bash
# Rebuilds the draft heads in specdecode/heads/ from scratch: corpus = Python's standard library source plus the
# target's own answers to chat prompts written from it and (Qwen) to general-domain prompts written
# from word lists (never Spec-Bench). SmolLM2's EAGLE-3 and MTP
# heads are committed; the Qwen2.5-Coder-0.5B EAGLE-3 head (66 MB) is not (.gitignore): this rebuilds it.
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
        nice -n 10 specdecode train-head --model "$name" --kind eagle3 --data stdlib --out "$out" \
            --threads "$threads" --time-limit 19 --seed 0 "$@"
    done
    mkdir -p "specdecode/heads/$name-eagle3"
    cp "$out/config.json" "$out/model.safetensors" "$out/train_report.json" "specdecode/heads/$name-eagle3/"
    echo "specdecode/heads/$name-eagle3 rebuilt"
}

build smollm2-135m-instruct --dtype bfloat16 --seq-len 512 --corpus-tokens 16000 --distill 240 \
    --distill-tokens 192 --draft-vocab 8192 --steps 400 --batch-size 4 --lr 2e-3 --eval-every 50 --save-every 25

build qwen2.5-coder-0.5b-instruct --dtype bfloat16 --seq-len 384 --corpus-tokens 24000 --distill 160 --general 400 \
    --distill-tokens 192 --draft-vocab 16384 --steps 800 --batch-size 4 --lr 2e-3 --eval-every 100 --save-every 25

mtp="$work/smollm2-mtp"
until [ -f "$mtp/mtp.safetensors" ]; do
    nice -n 10 specdecode train-head --model smollm2-135m-instruct --kind mtp --data stdlib --distill 48 --seq-len 256 \
        --ttt-steps 2 --steps 130 --lr 1.5e-3 --eval-every 40 --save-every 20 --time-limit 17 --out "$mtp" \
        --threads "$threads"
done
cp "$mtp/config.json" "$mtp/mtp.safetensors" specdecode/heads/smollm2-mtp/
echo "specdecode/heads/smollm2-mtp rebuilt"
