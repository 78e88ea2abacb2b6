#!/usr/bin/env bash
# The benchmark figures of docs/benchmarks.md, in the order they were taken. Run on a quiet machine:
# each figure is a ratio or a median measured within one process.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
T=${THREADS:-2}
# Foundation + quantized execution: prefill/decode, ceiling, verify cost curve.
for m in smollm2-135m-instruct qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct; do
  for q in none auto; do
    python scripts/bench_runtime.py --model $m --quant $q --threads $T --reps 2 --decode-tokens 64 --json-out out/runtime.jsonl
  done
done
# Peak resident memory of a whole generate run (4-bit path).
/usr/bin/time -f "peak_rss_kb %M" specdecode generate -t $T --chat "Write a Python function that checks whether a number is prime." \
  --max-tokens 64 --temperature 0 2> out/peak_rss.txt >/dev/null || true
# Speculative decoding: Spec-Bench categories, greedy, 128 tokens, same process, same prompts.
CATS="--category coding --category writing --category translation --category summarization --category qa --category math_reasoning --category rag"
specdecode bench -t $T --spec-types draft,ngram-simple,ngram --model-draft qwen2.5-coder-0.5b-instruct \
  $CATS --limit 2 --max-tokens 128 --json-out out/bench_greedy.json --plot docs/bench_greedy.png | tee out/bench_greedy.txt
specdecode bench -t $T --spec-types draft,ngram --model-draft qwen2.5-coder-0.5b-instruct \
  $CATS --limit 1 --max-tokens 128 --temperature 0.7 --json-out out/bench_t07.json | tee out/bench_t07.txt
