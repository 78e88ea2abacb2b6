#!/usr/bin/env bash
# The benchmark figures of docs/benchmarks.md (rounds 3 and 4), in the order they were taken. Run on a quiet
# machine (no other CPU load: with two threads any other runnable process stalls torch's thread pool);
# each figure is a ratio or a median measured within one process. Raw results land in out/.
# Until round 9 `specdecode bench` ran only the first user turn of each prompt; since round 10 it runs
# MT-bench's two turns as conversations by default, so the `specdecode bench` commands of rounds 1-9
# reproduce their figures with `--turns 1` added.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
T=${THREADS:-2}
CATS="--category coding --category writing --category translation --category summarization --category qa --category math_reasoning --category rag"
# Runtime: prefill/decode, bandwidth ceiling, verify cost curve v(t)/v(1).
for mq in "qwen2.5-coder-1.5b-instruct auto" "qwen2.5-coder-0.5b-instruct auto" "qwen2.5-coder-0.5b-instruct int8" \
          "smollm2-135m-instruct auto"; do
  set -- $mq
  python scripts/bench_runtime.py --model $1 --quant $2 --threads $T --reps 2 --decode-tokens 64 --json-out out/runtime_r3.jsonl
done
# The native kernels alone, streamed from DRAM.
python scripts/bench_kernels.py --threads $T
# Peak resident memory of a whole generate run (4-bit path, default 4096-token context).
/usr/bin/time -f "peak_rss_kb %M" specdecode generate -t $T --chat "Write a Python function that reverses a linked list." \
  --max-tokens 64 --temperature 0 2> out/peak_rss.txt >/dev/null
# Quantized vs float32 agreement.
for m in smollm2-135m-instruct qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct; do
  python scripts/quant_agreement.py --model $m --quant auto --tokens 256 --threads $T | tail -1 >> out/agreement.jsonl
done
python scripts/quant_agreement.py --model qwen2.5-coder-0.5b-instruct --quant int8 --tokens 256 --threads $T | tail -1 >> out/agreement.jsonl
# Speculative decoding core: 1.5B int4 target, 0.5B draft, greedy and temperature 0.7.
specdecode bench -t $T --spec-types draft,ngram-simple,ngram --model-draft qwen2.5-coder-0.5b-instruct \
  $CATS --limit 3 --max-tokens 128 --json-out out/r6_bench_greedy.json --plot docs/bench_greedy.png
specdecode bench -t $T --spec-types draft,ngram --model-draft qwen2.5-coder-0.5b-instruct \
  $CATS --limit 3 --max-tokens 128 --temperature 0.7 --json-out out/r6_bench_t07.json
# After the controller changes (batch draft length, asked-but-undrafted positions count as misses).
specdecode bench -t $T --spec-types draft --model-draft qwen2.5-coder-0.5b-instruct $CATS --limit 3 \
  --max-tokens 128 --json-out out/r8_bench_draft.json
specdecode bench -t $T --spec-types ngram-simple,ngram --category summarization --category rag --category coding \
  --category math_reasoning --limit 3 --max-tokens 128 --json-out out/r7_bench_ngram.json
specdecode bench -t $T --spec-types ngram-simple,ngram --category writing --category translation --category qa \
  --limit 3 --max-tokens 128 --json-out out/r8_bench_ngram_rest.json
specdecode bench -t $T --spec-types draft,ngram --model-draft qwen2.5-coder-0.5b-instruct $CATS --limit 3 \
  --max-tokens 128 --temperature 0.7 --json-out out/r8_bench_t07.json
# Draft heads: SmolLM2 (bundled EAGLE-3 head, MTP head attached to the GGUF) and the Qwen 0.5B head.
specdecode attach-mtp --model smollm2-135m-instruct --head heads/smollm2-mtp --out out/smollm2-135m-instruct-mtp.gguf
specdecode bench -t $T --model out/smollm2-135m-instruct-mtp.gguf --spec-head heads/smollm2-135m-instruct-eagle3 \
  --spec-types "eagle3,draft-mtp,ngram,eagle3(4,1,5),eagle3(3,2,6),eagle3(3,4,8)" \
  $CATS --limit 2 --max-tokens 128 --json-out out/r6_bench_smollm_heads.json
specdecode bench -t $T --model qwen2.5-coder-0.5b-instruct --spec-head out/heads/qwen2.5-coder-0.5b-instruct-eagle3 \
  --spec-types "eagle3,eagle3(4,1,5),eagle3(3,2,6),ngram" $CATS --limit 2 --max-tokens 128 \
  --json-out out/r6_bench_qwen05_eagle3.json
# Server: bench-serve, plain vs n-gram, concurrency 1-8.
specdecode bench-serve -t $T --spec-types none,ngram $CATS --limit 2 --requests 16 --max-tokens 96 \
  --json-out out/r8_bench_serve.json --plot docs/bench_serve.png
python scripts/bench_prefix_cache.py --threads $T | tee out/prefix_cache.json
python scripts/bench_tables.py out/r6_bench_*.json

# Round 4: runtime after the vectorized activation quantization (verify curve interleaved).
for mq in "qwen2.5-coder-1.5b-instruct auto" "qwen2.5-coder-0.5b-instruct auto" "qwen2.5-coder-0.5b-instruct int8" \
          "smollm2-135m-instruct auto" "qwen2.5-coder-1.5b-instruct auto"; do
  set -- $mq
  python scripts/bench_runtime.py --model $1 --quant $2 --threads $T --reps 2 --decode-tokens 64 --json-out out/runtime_r4.jsonl
done
python scripts/bench_kernels.py --threads $T | tee out/kernels_r4.txt
/usr/bin/time -f "peak_rss_kb %M" specdecode generate -t $T --chat "Write a Python function that reverses a linked list." \
  --max-tokens 64 --temperature 0 2> out/peak_rss_r4.txt >/dev/null
# Round 4: the Qwen 0.5B EAGLE-3 head retrained with general-domain self-distillation (the recipe now in
# scripts/build_heads.sh, trained into out/heads/qwen05-eagle3-v2), against the round-3 head (still in
# out/heads/qwen2.5-coder-0.5b-instruct-eagle3 on the machine that measured it) on the same prompts;
# then the core proposers on the 1.5B again.
specdecode bench -t $T --model qwen2.5-coder-0.5b-instruct --spec-head out/heads/qwen05-eagle3-v2 \
  --spec-types "eagle3,eagle3(4,1,5),eagle3(3,2,6),eagle3(3,4,8),ngram" $CATS --limit 2 --max-tokens 128 \
  --json-out out/r9_bench_qwen05_eagle3_v2.json
specdecode bench -t $T --model qwen2.5-coder-0.5b-instruct --spec-head out/heads/qwen2.5-coder-0.5b-instruct-eagle3 \
  --spec-types "eagle3,eagle3(3,2,6)" $CATS --limit 2 --max-tokens 128 --json-out out/r9_bench_qwen05_eagle3_v1.json
specdecode bench -t $T --spec-types draft,ngram-simple,ngram --model-draft qwen2.5-coder-0.5b-instruct \
  $CATS --limit 3 --max-tokens 128 --json-out out/r9_bench_greedy.json
# After the controller's depth fix for trees.
specdecode bench -t $T --model qwen2.5-coder-0.5b-instruct --spec-head out/heads/qwen05-eagle3-v2 \
  --spec-types "eagle3,eagle3(3,2,6),eagle3(3,4,8)" $CATS --limit 2 --max-tokens 128 --json-out out/r9_bench_qwen05_trees_depth.json
specdecode bench -t $T --model out/smollm2-135m-instruct-mtp.gguf --spec-head heads/smollm2-135m-instruct-eagle3 \
  --spec-types "eagle3,draft-mtp,eagle3(3,2,6),eagle3(3,4,8)" $CATS --limit 2 --max-tokens 128 \
  --json-out out/r9_bench_smollm_heads.json

# Round 7: the fused decoder layer, software prefetch, per-drafter caps, the server's thread pools.
LLAMA_BIN=${LLAMA_BIN:-$(../shared/peers/build-llama-cpp)}
python scripts/bench_vs_llamacpp.py --llama-bin "$LLAMA_BIN" --theirs plain,draft4,ngram-simple,ngram-mod --rounds 2 \
  --json-out out/r7_vs_llamacpp_avx512.json
# The AVX2 body against llama.cpp built for AVX2 (cmake -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF ...,
# see docs/benchmarks.md), on the same AVX512 machine.
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin "${LLAMA_AVX2_BIN:?}" \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r7_vs_llamacpp_avx2.json
for i in 1 2 3; do
  python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64 --json-out out/runtime_r7.jsonl
done
python scripts/bench_step_ratio.py --threads $T --rounds 5 | tee out/r7_step_ratio.jsonl
specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
  --json-out out/r7_bench_serve_scaling.json
specdecode bench -t $T --spec-types auto --limit 5 --max-tokens 128 --json-out out/r7_greedy.json
specdecode bench -t $T --spec-types auto --limit 5 --max-tokens 128 --temperature 0.7 --json-out out/r7_t07.json

# Round 8: the bundled EAGLE-3 head of the 1.5B; the draft model's LM head trimmed to its draft vocabulary.
specdecode bench -t $T --spec-types "eagle3,draft(model_draft=qwen2.5-coder-0.5b-instruct),auto" --limit 2 \
  --max-tokens 128 --json-out out/r8_heads_greedy.json
for v in full auto full auto; do
  python scripts/bench_step_ratio.py --threads $T --rounds 3 --draft-vocab $v | tee -a out/r8_step_ratio.jsonl
done
python scripts/eagle_interop_llamacpp.py --llama-bin "$LLAMA_BIN" --json-out out/r8_interop.json  # Qwen2: llama-server aborts
python scripts/eagle_interop_llamacpp.py --llama-bin "$LLAMA_BIN" --model smollm2-135m-instruct --max-tokens 32
# Round 9: each request's acceptance prior from its drafter's engine-wide record; EAGLE fed at prefill;
# the bundled EAGLE-3 head of the 0.5B.
specdecode bench -t $T --spec-types "auto,eagle3" --limit 5 --max-tokens 128 --json-out out/r9_greedy.json
root=$PWD
git worktree add -f /tmp/old_ctrl ce9cc76 2>/dev/null || true
for r in 1 2; do  # the previous controller (a worktree at ce9cc76) and this one, alternated
  (cd /tmp/old_ctrl && PYTHONPATH=/tmp/old_ctrl python3 -m specdecode.cli bench -t $T --spec-types auto \
    --prompts "$root/../shared/datasets/spec_bench/question.jsonl" --category qa --limit 10 --max-tokens 128 \
    --json-out "$root/out/r9_qa_before_$r.json")
  specdecode bench -t $T --spec-types auto --category qa --limit 10 --max-tokens 128 --json-out out/r9_qa_after_$r.json
done
specdecode bench -t $T -m qwen2.5-coder-0.5b-instruct --spec-types "eagle3,auto" --limit 2 --max-tokens 128 \
  --json-out out/r9_05b_head.json
specdecode bench -t $T --spec-types auto --limit 3 --max-tokens 128 --temperature 0.7 --json-out out/r9_t07.json
for m in qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct; do  # each head in and out of its training distribution
  python scripts/head_acceptance.py --model $m --n 12 | tee -a out/r9_head_acc.jsonl
done
# Round 10: the AVX2 int4 kernel's int16 partial sums; Spec-Bench with MT-bench's second turns; llama.cpp
# side by side on both bodies (peer trees: /tmp/llama.cpp-peer from ../shared/peers/build-llama-cpp, and
# /tmp/llama.cpp-avx2 built from that tree with the AVX2-only flags of round 7).
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin \
  --theirs plain,ngram-simple,ngram-mod --rounds 2 --json-out out/r10_vs_llamacpp_avx512.json
git show 59032e4:specdecode/kernels/quant_gemm.c > /tmp/quant_gemm_before.c  # the kernel before this round
for r in 1 2; do
  python scripts/ab_kernels.py /tmp/quant_gemm_before.c specdecode/kernels/quant_gemm.c --flags=-mno-avx512f --threads 1 --int4-only
  python scripts/ab_kernels.py /tmp/quant_gemm_before.c /tmp/quant_gemm_before.c --flags=-mno-avx512f --threads 1 --int4-only
done
python scripts/ab_kernels.py /tmp/quant_gemm_before.c specdecode/kernels/quant_gemm.c --flags=-mno-avx512f --stream
git worktree add -f /tmp/old_k 59032e4 2>/dev/null || true
for r in 1 2; do
  (cd /tmp/old_k && PYTHONPATH=/tmp/old_k SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto \
    --threads $T --reps 3 --decode-tokens 64 --json-out "$OLDPWD/out/r10_runtime_avx2_before.jsonl")
  SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64 \
    --json-out out/r10_runtime_avx2_after.jsonl
done
python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64 --json-out out/r10_runtime_avx512.jsonl
specdecode bench -t $T --spec-types "auto,eagle3" --limit 5 --max-tokens 128 --json-out out/r10_greedy.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r10_vs_llamacpp_avx2.json
specdecode bench -t $T --spec-types auto --limit 3 --max-tokens 128 --temperature 0.7 --json-out out/r10_t07.json
# Round 11: the controller's re-probe backoff and a cost model sharing the machine's speed across shapes, each
# A/B-tested in one process against the code before it (first turns, 65 prompts; the backoff's ran on 32a649d);
# llama.cpp side by side on the AVX2 body again (once on 728deaf, once on 240a223) and on AVX512.
python scripts/ab_controller.py --old BACKOFF_MAX=0 --spec-types auto,eagle3 --limit 5 --turns 1 --max-tokens 128 \
  --threads $T --json-out out/r11_ab_backoff.json
git worktree add -f /tmp/r11_costs 728deaf 2>/dev/null || true  # the shared-speed cost model, since dropped
(cd /tmp/r11_costs && PYTHONPATH=/tmp/r11_costs python scripts/ab_controller.py --old-costs --spec-types auto,eagle3 \
  --limit 5 --turns 1 --max-tokens 128 --threads $T --json-out "$OLDPWD/out/r11_ab_costs.json")
for out in r11_vs_llamacpp_avx2 r11_vs_llamacpp_avx2_head; do  # (a) on 728deaf, (b) on 240a223
  SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
    --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/$out.json
done
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin \
  --theirs plain,ngram-simple,ngram-mod --rounds 2 --json-out out/r11_vs_llamacpp_avx512.json
# Round 12: the drafter state kept across prefix-cache hits (against a cold twin), the LM head in int4 (A/B against
# int8 in one process, with a null A/B), llama.cpp side by side on both instruction sets.
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_kept_state.py --spec-types eagle3,auto --limit 1 \
  --threads $T --json-out out/r12_kept_avx2.json
python scripts/bench_kept_state.py --spec-types eagle3,auto --limit 1 --threads $T --json-out out/r12_kept_avx512.json
python scripts/ab_lm_head.py agree --tokens 1024
for flags in -mno-avx512f ""; do
  SPECDECODE_NATIVE_FLAGS=$flags python scripts/ab_lm_head.py speed --threads $T
  SPECDECODE_NATIVE_FLAGS=$flags python scripts/ab_lm_head.py speed --threads $T --same
done
python scripts/quant_agreement.py --model qwen2.5-coder-1.5b-instruct --quant auto --tokens 256 --threads $T
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r12_vs_llamacpp_avx2.json
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r12_vs_llamacpp_avx512.json

# Round 13: llama.cpp side by side with paired ratios (four rounds, odd ones in reverse order) on both
# instruction sets; Spec-Bench refreshed (auto against none, two turns); the runtime curve and the server's
# scaling with concurrency on both bodies.
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 4 --json-out out/r13_vs_llamacpp_avx2.json
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 4 --json-out out/r13_vs_llamacpp_avx512.json
specdecode bench -t $T --spec-types auto --limit 5 --max-tokens 128 --json-out out/r13_greedy.json
python scripts/spec_bench_categories.py out/r13_greedy.json
for flags in -mno-avx512f ""; do
  SPECDECODE_NATIVE_FLAGS=$flags python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64
done
for flags in "" -mno-avx512f; do
  SPECDECODE_NATIVE_FLAGS=$flags specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
    --max-tokens 96 --max-num-seqs 8
done
specdecode bench-serve -t $T --spec-types none --concurrency 1 --category writing --category qa --limit 3 --max-tokens 96
specdecode bench -t $T --spec-types none --category writing --category qa --limit 3 --max-tokens 96
# Round 14: the error our int4 requantization adds to the file's Q4_K / Q6_K values (deterministic).
python scripts/q4k_requant_error.py
# Round 15: Q4_K tensors loaded as stored and the native int4 format in Q4_K's layout (4.625 bits).
# Agreement with float32 at three commits (each a worktree: git worktree add /tmp/wt_X <commit>).
for wt in /tmp/wt_orig /tmp/wt_step1 .; do  # 424fa61, 36b9f1a, this tree
  for m in qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct; do
    (cd $wt && PYTHONPATH=$PWD python scripts/quant_agreement.py --model $m --quant auto --tokens 2000 --threads $T)
  done
done
git show 36b9f1a:specdecode/kernels/quant_gemm.c > /tmp/quant_gemm_5bit.c
for flags in "" --flags=-mno-avx512f; do
  python scripts/ab_int4_format.py /tmp/quant_gemm_5bit.c specdecode/kernels/quant_gemm.c $flags
done
python scripts/bench_kernels.py --threads $T
# llama.cpp's -DGGML_NATIVE=ON build crashed in libggml-cpu on this Intel host (AMX enabled by -march=native):
# the AVX512 peer is built with GGML_NATIVE=OFF, AVX512 + VNNI + BF16 + VBMI on, AMX off (/tmp/llama.cpp-512).
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 3 --json-out out/r15_vs_llamacpp_avx2.json
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-512/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 3 --json-out out/r15_vs_llamacpp_avx512.json
for wt in /tmp/wt_orig . /tmp/wt_orig .; do
  (cd $wt && PYTHONPATH=$PWD python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64)
done
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64
# Round 16: one core's vpdpbusd peak; AMX variants of the int4 kernel (sources not kept) against the committed one.
gcc -O2 -march=native scripts/dpbusd_peak.c -o /tmp/dpbusd_peak && /tmp/dpbusd_peak
git show HEAD:specdecode/kernels/quant_gemm.c > /tmp/quant_gemm_committed.c
python scripts/ab_kernels.py /tmp/quant_gemm_committed.c /tmp/quant_gemm_amx.c --threads 1 --int4-only --rows 1,2,3,5,9
python scripts/ab_kernels.py /tmp/quant_gemm_committed.c /tmp/quant_gemm_amx.c --threads 2 --int4-only --stream --rows 1,2,3,5,8
for i in 1 2; do  # alternated; a third AVX512 run after them
  python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64 --json-out out/r16_runtime_avx512.json
  SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64 \
    --json-out out/r16_runtime_avx2.json
done
specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
  --json-out out/r16_serve_avx512.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
  --max-tokens 96 --max-num-seqs 8 --json-out out/r16_serve_avx2.json
for i in 1 2; do
  specdecode bench-serve -t $T --spec-types auto,none --concurrency 8 --requests 16 --max-tokens 96 --max-num-seqs 8 --json-out out/r16_c8_$i.json
done
specdecode bench-serve -t $T --spec-types auto --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 --json-out out/r16_auto_c18.json
for i in 1 2; do
  specdecode bench-serve -t $T --spec-types none --concurrency 1 --category writing --category qa --limit 3 --max-tokens 96
  specdecode bench -t $T --spec-types none --category writing --category qa --limit 3 --max-tokens 96
done
specdecode serve -t $T --spec-type none --port 8811 & sleep 30
specdecode bench-serve --url http://127.0.0.1:8811 --concurrency 1 --category writing --category qa --limit 3 --max-tokens 96
kill %1
specdecode bench -t $T --spec-types none --category writing --category qa --limit 3 --max-tokens 96
# Round 16: the AVX2 body with AVX-VNNI (-mno-avx512f on this host) against the plain AVX2 body (Zen 3's).
git show 589ea9a:specdecode/kernels/quant_gemm.c > /tmp/quant_gemm_plain_avx2.c
python scripts/ab_kernels.py /tmp/quant_gemm_plain_avx2.c specdecode/kernels/quant_gemm.c --flags=-mno-avx512f --threads $T --int4-only --stream --rows 1,2,3,5,8
for i in 1 2; do
  for f in "-mno-avx512f" "-mno-avx512f -mno-avxvnni"; do
    SPECDECODE_NATIVE_FLAGS="$f" python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64
  done
done
for f in "-mno-avx512f" "-mno-avx512f -mno-avxvnni"; do
  SPECDECODE_NATIVE_FLAGS="$f" specdecode bench-serve -t $T --spec-types none --concurrency 1,8 --requests 16 --max-tokens 96 \
    --max-num-seqs 8 --json-out "out/r16_serve_$(echo $f | tr -d ' -').json"
done
for f in "-mno-avx512f" "-mno-avx512f -mno-avxvnni"; do
  SPECDECODE_NATIVE_FLAGS="$f" specdecode bench -t $T --spec-types none,auto --limit 1 --max-tokens 96 \
    --json-out "out/r16_bench_$(echo $f | tr -d ' -').json"
done
# Round 17: the server's per-token latency at concurrency 1, paired (ABBA) with LLM.stream's on the same prompts.
python scripts/bench_itl.py -t $T --pairs 20 --limit 5 --category writing --category qa --max-tokens 96 \
  --json-out out/r17_itl20.json
python scripts/bench_itl.py -t $T --pairs 8 --category writing --category qa --max-tokens 96
# Round 17: where the c = 8 time goes; the int4 kernel's AMX passes (12+ rows) against the VNNI body.
specdecode bench-serve -t $T --spec-types none --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
  --json-out out/r17_serve.json
git show 2f78a03~1:specdecode/kernels/quant_gemm.c > /tmp/quant_gemm_committed.c  # before AMX
python scripts/ab_kernels.py /tmp/quant_gemm_committed.c specdecode/kernels/quant_gemm.c --threads 1 --int4-only --rows 16,32,80
python scripts/ab_kernels.py /tmp/quant_gemm_committed.c specdecode/kernels/quant_gemm.c --threads 2 --int4-only --stream --rows 12,16,80
for i in 1 2; do
  for f in "" "-DSPECDECODE_NO_AMX"; do
    SPECDECODE_NATIVE_FLAGS="$f" python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 16 --prompt-tokens 256
  done
done
for f in "" "-DSPECDECODE_NO_AMX" "-DSPECDECODE_NO_AMX" ""; do
  SPECDECODE_NATIVE_FLAGS="$f" specdecode bench-serve -t $T --spec-types none --concurrency 1,8 --requests 16 --max-tokens 96 \
    --max-num-seqs 8
done
# Round 18: the AMX pass decomposed: timing-only variants of quant_gemm.c, each with one part removed.
q=specdecode/kernels/quant_gemm.c
sed 's/^#define AMX_EPI(g, d) .*/#define AMX_EPI(g, d) do { acc[0] = _mm512_add_ps(acc[0], _mm512_castsi512_ps(_mm512_load_si512((const void*)(d)))); } while (0)/' $q > /tmp/qg_noepi.c
sed -e 's/^#define AMX_EPI(g, d) .*/#define AMX_EPI(g, d) do { } while (0)/' -e 's/_tile_stored(\([012]\), dots\[[012]\], 64);/;/' $q > /tmp/qg_nostore.c
sed -e 's/_tile_stored(\([012]\), dots\[[012]\], 64);/;/' \
    -e 's/__attribute__((aligned(64))) int32_t dots\[3\]\[AMX_ROWS \* TILE\];/__attribute__((aligned(64))) int32_t dots[3][AMX_ROWS * TILE] = {{0}};/' $q > /tmp/qg_epionly.c
sed 's/^        amx_unpack(w, K, t, amx);/        (void)0;/' $q > /tmp/qg_nounpack.c
for v in noepi nostore epionly nounpack; do
  python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_$v.c --threads 1 --int4-only --rows 16,80 --no-check
done
# /tmp/qg_dbl.c (double-buffered operand tiles; its source was not kept):
# python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_dbl.c --threads 1 --int4-only --rows 12,16,32,80
python scripts/bench_kernels.py --threads $T --rows 1,8,16,32,80
# Round 18: what auto's per-step choice leaves on the table; the coding probe of Spec-Bench's first category runs.
specdecode bench -t $T --spec-types auto,eagle3,suffix,ngram --category coding --limit 5 --max-tokens 128 \
  --json-out out/r18_coding_probe.json
python scripts/chain_choice_probe.py --category coding --limit 10 --category writing --limit 3
# Round 19 (Zen 3, AVX2 only): merged drafts in auto against auto without merging (alternated, off first),
# llama.cpp side by side (its default GGML_NATIVE=ON build: AVX2 here).
n=0
for m in off auto auto off; do
  n=$((n+1))
  specdecode bench -t $T --spec-types auto --spec-merge $m --category coding --limit 5 --max-tokens 128 \
    --json-out out/r19_coding_${m}_$n.json
done
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin --ours none,auto \
  --theirs plain,ngram-mod --rounds 3 --json-out out/r19_vs_llamacpp_zen3.json
# Round 20 (Intel Xeon, family 6 model 207, AVX512-VNNI + AVX-VNNI, no AMX exposed): the runtime curve on the
# AVX512 body and on the plain AVX2 body (as a Zen 3 runs it); merged drafts in auto against auto without
# merging on coding (runs 1, 2, 5, 6, 7 in that order: off, auto, auto, off, auto; runs 3 and 4 ran beside
# other load and were discarded); llama.cpp side by side on both bodies (its GGML_NATIVE build for AVX512, an AVX2 build
# with AVX-VNNI for the AVX2 body); the server's scaling; Spec-Bench at T = 0.7.
python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64 --json-out out/r20_runtime.jsonl
SPECDECODE_NATIVE_FLAGS="-mno-avx512f -mno-avxvnni" python scripts/bench_runtime.py --quant auto --threads $T --reps 3 \
  --decode-tokens 64 --json-out out/r20_runtime.jsonl
for run in "off 1" "auto 2" "auto 5" "off 6" "auto 7"; do
  set -- $run
  specdecode bench -t $T --spec-types auto --spec-merge $1 --category coding --limit 5 --max-tokens 128 \
    --json-out out/r20_coding_$1_$2.json
done
(cd /tmp/llama.cpp-avx2 && cmake -B build -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=OFF -DGGML_AVX_VNNI=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release &&
  cmake --build build -j2 --target llama-server)  # /tmp/llama.cpp-avx2: a copy of build-llama-cpp's source tree
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r20_vs_llamacpp_avx2.json
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin --ours none,auto \
  --theirs plain,ngram-mod --rounds 2 --json-out out/r20_vs_llamacpp.json
specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
  --json-out out/r20_serve.json
specdecode bench -t $T --spec-types auto --limit 5 --max-tokens 128 --temperature 0.7 --json-out out/r20_t07.json
python scripts/spec_bench_categories.py out/r20_t07.json
gcc -O2 -march=native scripts/dpbusd_peak.c -o /tmp/dpbusd_peak && for i in 1 2 3; do /tmp/dpbusd_peak; done
python scripts/bench_kernels.py --threads $T --rows 1,5,9
# the epilogue's weight: group_row's three float lines replaced by one add of the raw dots (qg_noepi_vnni.c) or by one
# integer multiply-add by the sub-scales (qg_intepi_vnni.c); timing only (wrong outputs)
python - <<'PY'
s = open("specdecode/kernels/quant_gemm.c").read()
old = """    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(*sx));
    *acc = _mm512_fmadd_ps(f, sv, *acc);
    *acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(*xsum), *acc);"""
open("/tmp/qg_noepi_vnni.c", "w").write(s.replace(old, """    (void)sx; (void)xsum; (void)sv; (void)mv;
    *acc = _mm512_add_ps(*acc, _mm512_castsi512_ps(dot));"""))
open("/tmp/qg_intepi_vnni.c", "w").write(s.replace(old, """    (void)sx; (void)xsum; (void)mv;
    *acc = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(*acc), _mm512_mullo_epi32(dot, _mm512_castps_si512(sv))));"""))
PY
for v in noepi_vnni intepi_vnni; do
  python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_$v.c --threads $T --stream --int4-only --rows 1,5,9 --no-check
done

# Round 21 (the same Intel host as round 20, no AMX exposed): the kernels' group-major activations against the file
# before them (bit-identical outputs are checked first), variants tried on top (timing-only where marked), the runtime
# curve on both bodies, llama.cpp side by side (AVX512), the draft/target step ratio, the server's scaling.
git show 00bbefd:specdecode/kernels/quant_gemm.c > /tmp/qg_before.c
python scripts/ab_kernels.py /tmp/qg_before.c specdecode/kernels/quant_gemm.c --threads 1 --int4-only --rows 1,5,9
python scripts/ab_kernels.py /tmp/qg_before.c specdecode/kernels/quant_gemm.c --threads 1 --rows 1,2,3,5,9,10,16
python scripts/ab_kernels.py /tmp/qg_before.c specdecode/kernels/quant_gemm.c --stream --rows 1,5,9
python scripts/ab_kernels.py /tmp/qg_before.c specdecode/kernels/quant_gemm.c --threads 1 --flags=-mno-avx512f --rows 1,2,3,5,8,9
python scripts/ab_kernels.py /tmp/qg_before.c specdecode/kernels/quant_gemm.c --threads 1 --flags="-mno-avx512f -mno-avxvnni" \
  --rows 1,3,5,8,9
git show b4ab762:specdecode/kernels/quant_gemm.c > /tmp/qg_b4.c  # the variants below are of this file
F=/tmp/qg_b4.c
for d in 4096 16384; do sed "s/#define PF_DIST 8192/#define PF_DIST $d/" $F > /tmp/qg_pf$d.c; done
sed "s/_MM_HINT_T0/_MM_HINT_T1/g" $F > /tmp/qg_t1.c; sed "s/_MM_HINT_T0/_MM_HINT_NTA/g" $F > /tmp/qg_nta.c
sed 's/#pragma omp for schedule(static)/#pragma omp for schedule(static, 1)/' $F > /tmp/qg_s1.c
python -c "import re; open('/tmp/qg_nopf.c', 'w').write(re.sub(r'_mm_prefetch\([^;]*;', ';', open('$F').read()))"
for v in pf16384 pf4096 t1 nta nopf; do python scripts/ab_kernels.py $F /tmp/qg_$v.c --stream --rows 1,5,9; done
python scripts/ab_kernels.py $F /tmp/qg_s1.c --stream --int4-only --rows 1,5,9
python scripts/ab_kernels.py $F $F --stream --threads 1 --int4-only --rows 1,3,5,9
python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64 --json-out out/r21_runtime.jsonl
SPECDECODE_NATIVE_FLAGS="-mno-avx512f -mno-avxvnni" python scripts/bench_runtime.py --quant auto --threads $T --reps 3 \
  --decode-tokens 64 --json-out out/r21_runtime.jsonl
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin --ours none,auto \
  --theirs plain,ngram-mod --rounds 2 --json-out out/r21_vs_llamacpp.json
python scripts/bench_step_ratio.py --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --threads $T --rounds 5
python scripts/bench_step_ratio.py --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --threads $T --rounds 5 \
  --draft-vocab full
for run in a b; do  # runs 3 and 4 of the round's table (runs 1 and 2 ran on b4ab762 and 94a153a)
  specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
    --json-out out/r21_serve_$run.json
done
# per-sequence draft lengths against the shared one (the chooser exists only at 331504f; dropped after it)
# git checkout 331504f && python scripts/ab_ragged_draft_lengths.py 4
specdecode bench -t $T --spec-types auto --limit 2 --max-tokens 128 --json-out out/r21_greedy.json
python scripts/spec_bench_categories.py out/r21_greedy.json
# two prefetch levels (T2 16 KB ahead, then T0 4 KB ahead) against b4ab762's single 8 KB level, on every body
for flags in "" -mno-avx512f "-mno-avx512f -mno-avxvnni"; do
  python scripts/ab_kernels.py /tmp/qg_b4.c specdecode/kernels/quant_gemm.c --stream --rows 1,5,9 --flags="$flags"
done
(rm -rf /tmp/llama.cpp-avx2 && cp -r /tmp/llama.cpp-peer/src /tmp/llama.cpp-avx2 && rm -rf /tmp/llama.cpp-avx2/build &&
  cd /tmp/llama.cpp-avx2 && cmake -B build -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=OFF -DGGML_AVX_VNNI=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release &&
  cmake --build build -j2 --target llama-server)
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r21_vs_llamacpp_avx2.json

# Round 22 (the same Intel host as rounds 20-21): the attention kernel's tasks of several tokens (bits checked first),
# the GEMM's activation quantization on both threads, all layers in one native call, the prompt store; the runtime
# curve on both bodies, the server's scaling with the store off and on, llama.cpp side by side on both bodies.
git show 6178a08:specdecode/kernels/attention.c > /tmp/attn_before.c
git show 706f901:specdecode/kernels/attention.c > /tmp/attn_706f901.c
python scripts/bench_attention.py /tmp/attn_before.c specdecode/kernels/attention.c --reps 21
for i in 1 2; do  # the whole step, the session's first attention.c and 706f901's in turns (quant_gemm.c at 6178a08)
  for f in /tmp/attn_before.c /tmp/attn_706f901.c; do
    cp $f specdecode/kernels/attention.c
    python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64 --json-out out/r22_rt_$i.jsonl
  done
done
git checkout specdecode/kernels/attention.c
git show 706f901:specdecode/kernels/quant_gemm.c > /tmp/qg_before.c
for flags in "" -mno-avx512f; do
  python scripts/ab_kernels.py /tmp/qg_before.c specdecode/kernels/quant_gemm.c --stream --rows 1,5,9 --flags="$flags"
done
python scripts/ab_kernels.py /tmp/qg_before.c specdecode/kernels/quant_gemm.c --rows 1,5,9
python scripts/ab_kernels.py /tmp/qg_before.c specdecode/kernels/quant_gemm.c --rows 1,5,9 --flags=-mno-avx512f
for i in 1 2; do  # all layers in one call (a20b479) against one call per layer (06782ac), in turns
  git checkout -q a20b479 && python scripts/bench_verify_curve.py --rounds 21
  git checkout -q 06782ac && python scripts/bench_verify_curve.py --rounds 21
done
git checkout -q main
python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64 --json-out out/r22_runtime_avx512.json
SPECDECODE_NATIVE_FLAGS="-mno-avx512f -mno-avxvnni" python scripts/bench_runtime.py --quant auto --threads $T --reps 3 \
  --decode-tokens 64 --json-out out/r22_runtime_avx2.json
specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
  --cache-ram 0 --json-out out/r22_serve_ram0.json
specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
  --json-out out/r22_serve_store.json
python scripts/bench_prompt_store.py --chats 8 --slots 2 --cache-ram 0,2048 --rounds 2
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin --ours none,auto \
  --theirs plain,ngram-mod --rounds 2 --json-out out/r22_vs_llamacpp.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r22_vs_llamacpp_avx2.json
specdecode bench -t $T --spec-types auto --limit 2 --max-tokens 128 --json-out out/r22_greedy.json
python scripts/spec_bench_categories.py out/r22_greedy.json
specdecode bench -t $T --spec-types auto --limit 5 --max-tokens 128 --json-out out/r22_specbench5.json
python scripts/spec_bench_categories.py out/r22_specbench5.json
# timing-only: layer.c with a clock around each part (and a 60 us pause after attention), not committed
# Round 23 (the same Intel host as rounds 20-22): the GEMM's row blocks for prompt chunks (bits checked first), the
# whole prefill before / after from two worktrees in turns, llama.cpp's prompt processing, the server with every
# level cold, auto in a full batch of 8, a static standard-library n-gram table replayed over round 22's outputs.
git show 170cd2e:specdecode/kernels/quant_gemm.c > /tmp/qg_head.c
python scripts/ab_kernels.py /tmp/qg_head.c specdecode/kernels/quant_gemm.c --stream --int4-only --rows 9,64,200,512
python scripts/ab_kernels.py /tmp/qg_head.c specdecode/kernels/quant_gemm.c --stream --int4-only --rows 200,512 \
  --flags=-mno-avx512f
for b in 131072 262144 524288 1048576 2097152; do  # block budgets, as -DROW_BLOCK_BYTES variants
  sed "s|#define ROW_BLOCK_BYTES (256 << 10)|#define ROW_BLOCK_BYTES $b|" specdecode/kernels/quant_gemm.c > /tmp/qg_$b.c
done
python scripts/ab_kernels.py /tmp/qg_1048576.c /tmp/qg_2097152.c --stream --int4-only --rows 512
python scripts/ab_kernels.py /tmp/qg_1048576.c /tmp/qg_524288.c --stream --int4-only --rows 512
python scripts/ab_kernels.py /tmp/qg_524288.c /tmp/qg_262144.c --stream --int4-only --rows 512,100
python scripts/ab_kernels.py /tmp/qg_262144.c /tmp/qg_131072.c --stream --int4-only --rows 512
git worktree add /tmp/wt_before 170cd2e && cp scripts/bench_prefill.py /tmp/wt_before/scripts/
for i in 1 2 3; do python /tmp/wt_before/scripts/bench_prefill.py; python scripts/bench_prefill.py; done
/tmp/llama.cpp-peer/src/build/bin/llama-bench -m ~/.cache/specdecode/models/qwen2.5-coder-1.5b-instruct.gguf -t $T \
  -p 128,512 -n 32 -r 2
python scripts/bench_kernels.py --threads $T --rows 1,10,100,512
gcc -O2 -march=native scripts/dpbusd_peak.c -o /tmp/dpbusd_peak
taskset -c 0 /tmp/dpbusd_peak & taskset -c 1 /tmp/dpbusd_peak & wait  # both cores at once: not SMT siblings
specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
  --json-out out/r23_serve_cold2.json
specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
  --cache-ram 0 --json-out out/r23_serve_ram0.json
python scripts/bench_batch_drafters.py --spec-types none,auto,ngram-mod,suffix,eagle3 --rounds 2
python scripts/sim_static_ngram.py out/r22_specbench5.json
# two fixes tried and dropped, each against 9e33267 in turns: the packed batch priced by its rows with the head's
# prompt feeding deferred in chains (a working tree, not committed), then the pricing alone (ebbde52, reverted)
git worktree add /tmp/wt_b 9e33267 && git worktree add /tmp/wt_p ebbde52
for i in 1 2; do
  python /tmp/wt_b/scripts/bench_batch_drafters.py --spec-types none,auto
  python scripts/bench_batch_drafters.py --spec-types none,auto  # with the deferral on top of ebbde52
done
for i in 1 2; do
  for wt in /tmp/wt_b /tmp/wt_p; do
    python $wt/scripts/bench_batch_drafters.py --spec-types none,auto --prompts scripts/data/repeated_tasks.jsonl \
      --max-tokens 128
  done
done
python /tmp/wt_p/scripts/bench_batch_drafters.py --spec-types none,auto --rounds 2
python scripts/bench_batch_drafters.py --spec-types none,auto --rounds 2 --warm-requests 16
# the deferral again on warm engines (a working tree on top of 025fb2b, not committed), in turns with 025fb2b
git worktree add /tmp/wt_c 025fb2b && cp scripts/bench_batch_drafters.py /tmp/wt_c/scripts/
for i in 1 2; do
  python /tmp/wt_c/scripts/bench_batch_drafters.py --spec-types none,auto --warm-requests 16
  python scripts/bench_batch_drafters.py --spec-types none,auto --warm-requests 16
done
for i in 1 2; do  # the pending-features buffer and the bisection (b401983) against 025fb2b, in turns
  python /tmp/wt_c/scripts/bench_batch_drafters.py --spec-types auto --warm-requests 16
  python scripts/bench_batch_drafters.py --spec-types auto --warm-requests 16
done
python scripts/bench_batch_drafters.py --spec-types none,auto --rounds 2 --warm-requests 16

# ---------------------------------------------------------------------------------------------------
# Round 24 (Intel Xeon fam 6 model 207, 2 cores): the EAGLE head's prefix-cache gap from the prefill
# (prefill_start), the speculation gate per batch size. "Before" is b634b88 in a second worktree.
git worktree add /tmp/wt_base b634b88
P=$PWD/../shared/datasets/spec_bench/question.jsonl
for i in 1 2; do  # run once after prefill_start alone, once after the gate too
  for wt in /tmp/wt_base $PWD; do
    (cd $wt && python scripts/bench_batch_drafters.py --spec-types none,auto --prompts $P)
  done
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --turns 1 --prompts $P)
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
    --max-tokens 96 --max-num-seqs 8 --prompts $P)
done
# the head's held-out prior, and (measured, reverted) a pool for draftless drafters: each in turns with 84429a2
(cd /tmp/wt_base && git checkout 84429a2)
for i in 1 2; do
  for wt in /tmp/wt_base $PWD; do
    (cd $wt && python scripts/bench_batch_drafters.py --spec-types none,auto --prompts $P)
  done
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --turns 1 --prompts $P)
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
    --max-tokens 96 --max-num-seqs 8 --prompts $P)
done
# the server in three rounds, configurations in turns (bench-serve --rounds, new)
specdecode bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
  --rounds 3

# ---------------------------------------------------------------------------------------------------
# Round 25 (Intel Xeon fam 6 model 207, 2 cores): a suffix draft's evidence class, drafts found and not
# verified scored against the emitted tokens, a head's catch-up fed alone and priced. "Before" is 86d0cc3
# (round 24's last commit) in a second worktree.
git worktree add /tmp/wt_base 86d0cc3
P=$PWD/../shared/datasets/spec_bench/question.jsonl
# the cost of verify rows in a full batch; suffix's acceptance by evidence (on the code before: the script copied
# into the worktree); the per-step logs were throwaway wrappers of Engine.step / ModelRunner.forward
python scripts/bench_batch_rows.py --batch 8
cp scripts/suffix_evidence_probe.py /tmp/wt_base/scripts/ && (cd /tmp/wt_base && python scripts/suffix_evidence_probe.py --requests 48 --prompts $P)
python scripts/suffix_evidence_probe.py --requests 48 --prompts $P
for i in 1 2; do
  for wt in /tmp/wt_base $PWD; do
    (cd $wt && python scripts/bench_batch_drafters.py --spec-types none,auto --prompts $P)
  done
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --turns 1 --prompts $P)
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench -t $T --spec-types none,auto --category extraction --category translation \
    --limit 5 --max-tokens 128 --turns 1 --prompts $P)
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
    --max-tokens 96 --max-num-seqs 8 --rounds 3 --prompts $P)
done

# ---------------------------------------------------------------------------------------------------
# Round 26 (Intel Xeon fam 6 model 207, 2 cores): a verify's logits of the real rows only and a native argmax.
# "Before" is cf03acb (round 25's last commit) in a second worktree; its row costs by a copy of
# bench_batch_rows.py timing forward() with padded logits and torch.argmax (the script before this round
# timed the forward alone).
git worktree add /tmp/wt_base cf03acb
P=$PWD/../shared/datasets/spec_bench/question.jsonl
python scripts/bench_batch_rows.py --batch 8 --reps 5
for i in 1 2; do
  for wt in /tmp/wt_base $PWD; do
    (cd $wt && python scripts/bench_batch_drafters.py --spec-types none,auto --prompts $P)
  done
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
    --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P)
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --turns 1 --prompts $P)
done
# top-k / top-p without a sort: sampled Spec-Bench with llama.cpp's default filters (cf03acb ran with this round's
# specdecode/args.py and specdecode/bench/cli.py copied into its worktree: the flags only)
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --turns 1 \
    --temperature 0.8 --top-k 40 --top-p 0.95 --prompts $P)
done
# the verify curve, three runs; prefetch distances tried for multi-row verifies
for i in 1 2 3; do python scripts/bench_verify_curve.py --rounds 21; done
for f in "" -DPF_FAR=32768 -DPF_FAR=8192 -DPF_NEAR=2048 -DPF_NEAR=8192 ""; do
  SPECDECODE_NATIVE_FLAGS="$f" python scripts/bench_verify_curve.py --rounds 15
done
# Round 27 (Intel Xeon fam 6 model 207, 2 cores): auto's fixed work in a full batch; a native sampler.
# "Before" is bcfb1b2 (round 26's last commit) in a second worktree.
git worktree add /tmp/wt_base bcfb1b2
P=$PWD/../shared/datasets/spec_bench/question.jsonl
for i in 1 2; do
  for wt in /tmp/wt_base $PWD; do
    (cd $wt && python scripts/bench_batch_drafters.py --spec-types none,auto --prompts $P)
  done
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --turns 1 --prompts $P)
done
# the server, greedy (three invocations of each code over the session), then T = 0.7
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
    --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P)
done
for wt in /tmp/wt_base $PWD; do
  (cd $wt && python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
    --max-tokens 96 --max-num-seqs 8 --rounds 2 --temperature 0.7 --seed 0 --prompts $P)
done
# Round 28 (Intel Xeon fam 6 model 207, 2 cores): auto's idle planning in a full batch; --max-prefill-tokens.
# "Before" is 5e8ce3d (round 27's last commit) in a second worktree.
git worktree add /tmp/wt_base 5e8ce3d
P=$PWD/../shared/datasets/spec_bench/question.jsonl
for i in 1 2; do
  for wt in /tmp/wt_base $PWD; do
    (cd $wt && python scripts/bench_batch_drafters.py --spec-types none,auto --prompts $P)
  done
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --turns 1 --prompts $P)
done
for wt in $PWD /tmp/wt_base; do
  (cd $wt && python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
    --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P)
done
# a prompt's prefill beside decoding requests (run at 66819ae, then at 9721b1a, then at 44193e4 twice: 32 0, 0 32;
# then 32 0 with bench-serve's longest-wait column)
for n in 32 0; do
  specdecode bench-serve -t $T --spec-types none,auto --concurrency 8 --requests 16 --max-tokens 96 --max-num-seqs 8 \
    --rounds 2 --max-prefill-tokens $n --prompts $P
done
for n in 0 32; do  # a longer run: 48 requests
  specdecode bench-serve -t $T --spec-types none,auto --concurrency 8 --requests 48 --max-tokens 96 --max-num-seqs 8 \
    --rounds 2 --max-prefill-tokens $n --prompts $P
done
# the server at the session's end, defaults (44193e4 against 5e8ce3d)
for wt in /tmp/wt_base $PWD; do
  (cd $wt && python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
    --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P)
done
# the verify curve; the kernels alone; vpdpbusd beside the epilogue's kinds of operation
for i in 1 2 3; do python scripts/bench_verify_curve.py --rounds 21; done
PYTHONPATH=. python scripts/bench_kernels.py --threads 2 --rows 1,10,64
gcc -O2 -march=native scripts/dpbusd_peak.c -o /tmp/dpbusd_peak && /tmp/dpbusd_peak && /tmp/dpbusd_peak
git worktree remove --force /tmp/wt_base
# Round 29 (AMD EPYC family 25 model 17, Zen 4: AVX512-VNNI, no AVX-VNNI): every point of the CPU-step issue; the
# int4 epilogue's parts; what one activation scale per block of B inputs costs. Code: 146951c in a worktree.
git worktree add /tmp/wt_bench 146951c
P=$PWD/../shared/datasets/spec_bench/question.jsonl
# llama.cpp: the sdist fetched without building its build dependencies from source, then build-llama-cpp's steps
pip download -q --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d /tmp/sd
# (unpack vendor/llama.cpp to /tmp/llama.cpp-peer/src; cmake -DGGML_NATIVE=ON ...; a copy at /tmp/llama.cpp-avx2 with)
(cd /tmp/llama.cpp-avx2 && cmake -B build -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release &&
  cmake --build build -j2 --target llama-server)
cd /tmp/wt_bench
gcc -O2 -march=native scripts/dpbusd_peak.c -o /tmp/dpbusd_peak && /tmp/dpbusd_peak && /tmp/dpbusd_peak
taskset -c 0 /tmp/dpbusd_peak & taskset -c 1 /tmp/dpbusd_peak; wait  # two physical cores or one shared?
PYTHONPATH=. python scripts/bench_kernels.py --threads 2 --rows 1,5,9
python - <<'PY'  # timing-only variants of group_row (wrong outputs) and of the prefetch distances
s = open("specdecode/kernels/quant_gemm.c").read()
f = """    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(*sx));"""
old = f + """
    *acc = _mm512_fmadd_ps(f, sv, *acc);
    *acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(*xsum), *acc);"""
out = {
    "noepi": s.replace(old, """    (void)sx; (void)xsum; (void)sv; (void)mv;
    *acc = _mm512_add_ps(*acc, _mm512_castsi512_ps(dot));"""),
    "dpwssd1": s.replace(old, """    (void)sx; (void)xsum; (void)mv;
    *acc = _mm512_castsi512_ps(_mm512_dpwssd_epi32(_mm512_castps_si512(*acc), dot, _mm512_castps_si512(sv)));"""),
    "magic": s.replace(f, """    const __m512 f = _mm512_fmadd_ps(_mm512_castsi512_ps(dot), _mm512_set1_ps(*sx), _mm512_set1_ps(*xsum));"""),
    "nomins": s.replace("    *acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(*xsum), *acc);\n}", "    (void)mv; (void)xsum;\n}"),
}
for level, value in (("FAR", 32768), ("FAR", 8192), ("NEAR", 2048), ("NEAR", 8192)):
    out[f"pf_{level}_{value}"] = "\n".join(f"#define PF_{level} {value}" if l.startswith(f"#define PF_{level} ") else l
                                         for l in s.split("\n"))
for k, v in out.items():
    open(f"/tmp/qg_{k}.c", "w").write(v)
PY
for v in noepi dpwssd1 magic nomins; do
  python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_$v.c --threads 2 --stream --int4-only --rows 1,5,9 --no-check
done
for v in FAR_32768 FAR_8192 NEAR_2048 NEAR_8192; do
  python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_pf_$v.c --threads 2 --stream --rows 1,5
done
for i in 1 2; do python scripts/bench_verify_curve.py --rounds 21; done
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_verify_curve.py --rounds 21
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin --ours none,auto \
  --theirs plain,ngram-mod --rounds 2 --json-out out/r29_vs_llamacpp.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r29_vs_llamacpp_avx2.json
python scripts/bench_runtime.py --quant auto --threads $T --reps 3 --decode-tokens 64 --json-out out/r29_runtime_avx512.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --threads $T --reps 3 \
  --decode-tokens 64 --json-out out/r29_runtime_avx2.json
python scripts/bench_step_ratio.py --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --threads $T --rounds 5
python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
  --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r29_serve.json
python scripts/bench_itl.py -t $T --pairs 8 --category writing --category qa --max-tokens 96 --prompts $P
python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --prompts $P --json-out out/r29_greedy.json
python scripts/spec_bench_categories.py out/r29_greedy.json
cd - && git worktree remove --force /tmp/wt_bench
# the new scripts, from the checkout (scripts/ added after 146951c)
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --categories roleplay,rag,math,qa --reps 3  # at e6b6174 (the same order every turn)
python scripts/act_scale_blocks.py --tokens 512 --blocks 32,64,128,256
# one row's dots in two chains (tile_rows' inner loop with a second accumulator for the high nibbles when RB == 1,
# added after the chunk loop: /tmp/qg_2chain.c, same bits), and a null A/B
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_2chain.c --threads 2 --stream --rows 1,2
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_2chain.c --threads 2 --stream --rows 1
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c specdecode/kernels/quant_gemm.c --threads 2 --stream --rows 1
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_2chain.c --threads 1 --rows 1
# what a parallel region costs: one int4 GEMM call per shape, cache-hot, on 1 and on 2 threads
for t in 1 2; do python - $t <<'PY'
import statistics, sys, time, torch
from specdecode.kernels import int4_scale_buffers, native_kernels
from specdecode.layers.quant.formats import super_groups
torch.set_num_threads(int(sys.argv[1]))
nk = native_kernels()
for n, k in ((16, 256), (256, 1536), (1536, 1536)):
    g = k // 32
    sub, sup = int4_scale_buffers(n, g, g // super_groups(g))
    sub.random_(0, 256); sup.random_(0, 0x3000)
    w, x = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8), torch.randn(1, k)
    for _ in range(50): nk.int4_gemm(x, w, sub, sup, n, 32)
    ts = []
    for _ in range(15):
        t0 = time.perf_counter()
        for _ in range(200): nk.int4_gemm(x, w, sub, sup, n, 32)
        ts.append((time.perf_counter() - t0) / 200)
    print(sys.argv[1], "threads", n, k, f"{statistics.median(ts) * 1e6:.1f} us/call")
PY
done
# bench_interleaved with the order flipped every turn; auto's costs at batch 1 on the AVX2 body
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --categories roleplay,rag,math,qa --reps 3
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_batch_drafters.py --spec-types none,auto --slots 1 --requests 4 \
  --max-tokens 128 --prompts $P
# the head's calibrated and measured cost per proposal, both bodies (roleplay and writing, 128 tokens each)
for flags in -mno-avx512f ""; do SPECDECODE_NATIVE_FLAGS="$flags" python - <<'PY'
from specdecode import LLM, SamplingParams
from specdecode.bench.prompts import DEFAULT_PROMPTS, load_prompts
llm = LLM("qwen2.5-coder-1.5b-instruct", spec_type="auto", threads=2, max_num_seqs=1)
ps = {p.category: p for p in load_prompts(DEFAULT_PROMPTS, limit=1)}
llm.generate([1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
head = [m for m in llm.engine.proposer.members if not m.draftless][0]
print("head draft_cost(1)", head.draft_cost(1), "verify(1,1)", llm.engine.costs.verify_cost(1, 1),
      "verify(1,2)", llm.engine.costs.verify_cost(1, 2))
for cat in ("roleplay", "writing"):
    ids = llm.encode_chat([{"role": "user", "content": ps[cat].text}])
    o = llm.generate(ids, SamplingParams(temperature=0, max_tokens=128, ignore_eos=True))[0]
    print(cat, o.stats["spec"]["by_drafter"].get("eagle3"))
PY
done

# Round 30 (AMD EPYC family 25 model 17, Zen 4: AVX512-VNNI, no AVX-VNNI): a plain step's parts and the Python's
# cold caches; accept on host lists; the EAGLE head in int4; the runtime curve; what this host allows.
# "Before" is 65a6489 (round 29's last commit) in a worktree, with this round's new scripts copied into it; the
# rest ran at 2372f89, the int4 head's runs with that change on top (its commit).
P=$PWD/../shared/datasets/spec_bench/question.jsonl
git worktree add /tmp/wt_base 65a6489
cp scripts/bench_step_parts.py scripts/bench_interleaved.py /tmp/wt_base/scripts/
gcc -O2 -march=native scripts/dpbusd_peak.c -o /tmp/dpbusd_peak && /tmp/dpbusd_peak
taskset -c 0 /tmp/dpbusd_peak & taskset -c 1 /tmp/dpbusd_peak; wait
for i in 1 2; do  # at 21c9f95 (greedy_paths; the head still int8) against 65a6489, in turns
  python scripts/bench_step_parts.py --reps 3; python /tmp/wt_base/scripts/bench_step_parts.py --reps 3
done
python scripts/ab_accept_greedy.py
# the weights prefetched non-temporally: quant_gemm.c with its prefetch hints as macros (PF_FAR_HINT, PF_NEAR_HINT,
# defaulting to _MM_HINT_T2 / _MM_HINT_T0) in a worktree /tmp/wt_nta; each variant twice, in turns
for i in 1 2; do for f in "" "-DPF_FAR_HINT=_MM_HINT_NTA" "-DPF_FAR_HINT=_MM_HINT_NTA -DPF_NEAR_HINT=_MM_HINT_NTA"; do
  SPECDECODE_NATIVE_FLAGS="$f" python /tmp/wt_nta/scripts/bench_step_parts.py --reps 3
done; done
python scripts/bench_batch_drafters.py --spec-types none,auto --rounds 2 --prompts $P
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 1 --max-tokens 128 --prompts $P --json-out out/r30_greedy.json
python scripts/spec_bench_categories.py out/r30_greedy.json
for f in "" -mno-avx512f; do for i in 1 2; do
  SPECDECODE_NATIVE_FLAGS="$f" python scripts/bench_runtime.py --quant auto --threads 2 --reps 3 --decode-tokens 64
done; done
# the head in int4: in one process, and before / after in turns (--draft-fixed --draft-max 3, the coding prompt)
python scripts/ab_head_format.py --categories coding,writing,roleplay --limit 2 --prompts $P
for i in 1 2 3 4 5; do for tree in /tmp/wt_base $PWD; do python - "$tree" <<'PY'
import statistics, sys, time
sys.path.insert(0, sys.argv[1])
from specdecode import LLM, SamplingParams
from specdecode.bench.prompts import DEFAULT_PROMPTS, load_prompts
p = load_prompts(DEFAULT_PROMPTS, ["coding"], limit=1)[0]
llm = LLM("qwen2.5-coder-1.5b-instruct", spec_type="eagle3", threads=2, max_num_seqs=1, draft_fixed=True, draft_max=3)
prop, ts = llm.engine.proposer, []
f = prop.propose
def g(*a, **k):
    t0 = time.perf_counter(); r = f(*a, **k); ts.append(time.perf_counter() - t0); return r
prop.propose = g
s = llm.engine.add_request(llm.encode_chat([{"role": "user", "content": p.text}]),
                           SamplingParams(temperature=0, max_tokens=128, ignore_eos=True))
while not s.finished: llm.engine.step()
print(sys.argv[1], f"proposal {statistics.median(ts[2:]) * 1e3:.2f} ms, tau {s.stats.mean_acceptance_length:.2f}")
PY
done; done
for tree in $PWD /tmp/wt_base; do python $tree/scripts/bench_interleaved.py --categories coding,roleplay,writing --reps 2 --prompts $P; done
# (after the int4 head) Spec-Bench, the coding category and the AVX2 body's roleplay, now and before in turns
for tree in $PWD /tmp/wt_base; do (cd $tree && python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 2 \
  --max-tokens 128 --prompts $P --json-out out/r30_sb2_$(basename $tree).json); done
for order in "$PWD /tmp/wt_base" "/tmp/wt_base $PWD"; do for tree in $order; do (cd $tree && python -m specdecode.cli bench \
  -t 2 --spec-types none,auto --category coding --limit 5 --max-tokens 128 --prompts $P); done; done
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --categories roleplay,qa --reps 3 --prompts $P
for tree in $PWD /tmp/wt_base $PWD; do (cd $tree && python -m specdecode.cli bench-serve -t 2 --spec-types none,auto \
  --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P); done
git worktree remove --force /tmp/wt_base

# ---- Round 31 (thirty-fourth session, Zen 4 host): a decode step's lean one-token path; the draft's pick ----
# "before" is 37d933d (round 30's last commit) in a second worktree; 992cd39 (the lean path, before the
# draft's sub-vocabulary pick) in a third.
git worktree add -f /tmp/wt_base 37d933d && git worktree add -f /tmp/wt_mid 992cd39
python scripts/ab_one_token.py
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/ab_one_token.py
git show 992cd39:scripts/bench_step_ratio.py > /tmp/wt_base/scripts/bench_step_ratio_new.py  # steps in turns
for i in 1 2; do (cd /tmp/wt_base && python scripts/bench_step_ratio_new.py --rounds 5); python scripts/bench_step_ratio.py --rounds 5; done
for i in 1 2; do (cd /tmp/wt_mid && python scripts/bench_step_ratio.py --rounds 5); python scripts/bench_step_ratio.py --rounds 5; done
python scripts/bench_step_ratio.py --rounds 7 --whole-row
python scripts/bench_step_ratio.py --rounds 3 --whole-row  # at f5a7531
# the runtime curve, before and now in turns (the first "before" with its own script's torch argmax)
for i in 1 2; do (cd /tmp/wt_base && python scripts/bench_runtime.py --quant auto --reps 3); python scripts/bench_runtime.py --quant auto --reps 3
  cp scripts/bench_runtime.py /tmp/wt_base/scripts/; done
(cd /tmp/wt_base && SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --reps 3)
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --reps 3
# llama.cpp side by side (peers built as in round 29)
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin --ours none,auto \
  --theirs plain,ngram-mod --rounds 2 --json-out out/r31_vs_llamacpp.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r31_vs_llamacpp_avx2.json
# the same prompts' sequential ratios without llama-servers: ours only, the first 3 prompts, two rounds
for tree in $PWD /tmp/wt_base; do python - "$tree" <<'PY'
import sys
sys.path[:0] = [sys.argv[1] + "/scripts", sys.argv[1]]
import bench_vs_llamacpp as b
from specdecode import LLM
from specdecode.store import resolve_model
model = str(resolve_model("qwen2.5-coder-1.5b-instruct"))
items = b.prompts(LLM(model, spec_type="none", max_num_seqs=1, max_model_len=64))[:3]
base = LLM(model, spec_type="none", threads=2, max_num_seqs=1)
b.run(lambda: b.ours(model, None, ["none", "auto"], 2, base), lambda: {}, items, 128, 2)
PY
done
python scripts/bench_interleaved.py --categories writing,roleplay,coding --reps 2 --prompts $P  # at d626fc0 and at ac8c780
python scripts/bench_itl.py -t $T --pairs 8 --category writing --category qa --max-tokens 96 --prompts $P
python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --prompts $P --json-out out/r31_sb2.json
python scripts/spec_bench_categories.py out/r31_sb2.json
git worktree remove --force /tmp/wt_base && git worktree remove --force /tmp/wt_mid

# ---- Round 32 (thirty-fifth session, Zen 4 host): captures inside the one native call; suffix's class priors ----
# "before" is bb6d751 (round 31's last commit) in a second worktree, with this round's bench_interleaved.py
git worktree add -f /tmp/wt_base bb6d751 && cp scripts/bench_interleaved.py /tmp/wt_base/scripts/
for i in 1 2; do for tree in /tmp/wt_base $PWD; do (cd $tree && PYTHONPATH=$tree python scripts/bench_interleaved.py \
  --spec-types none,auto:gate-closed --categories writing,roleplay --reps 3 --prompts $P); done; done
python scripts/suffix_class_priors.py --prompts 160 --max-tokens 128  # the table in speculative/suffix.py
python scripts/bench_interleaved.py --spec-types none,auto,auto:optimistic \
  --categories roleplay,writing,qa,translation,math_reasoning,coding --reps 2 --prompts $P
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --spec-types none,auto,auto:optimistic \
  --categories writing,roleplay --reps 4 --prompts $P
python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --prompts $P --json-out out/r32_sb2.json
python -m specdecode.cli bench -t $T --spec-types none,auto --limit 5 --max-tokens 128 --prompts $P --json-out out/r32_sb5.json
python -m specdecode.cli bench -t $T --spec-types none,auto --limit 2 --max-tokens 128 --temperature 0.7 --seed 0 \
  --prompts $P --json-out out/r32_sb2_t07.json
for f in out/r32_sb2.json out/r32_sb5.json out/r32_sb2_t07.json; do python scripts/spec_bench_categories.py $f; done
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin --ours none,auto \
  --theirs plain,ngram-mod --rounds 2 --json-out out/r32_vs_llamacpp.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r32_vs_llamacpp_avx2.json
python scripts/bench_itl.py -t $T --pairs 8 --category writing --category qa --max-tokens 96 --prompts $P
for i in 1 2; do python scripts/bench_step_ratio.py --rounds 7; done
# a fresh engine's calibration, end to end (before and after b547220)
for i in 1 2; do for st in none auto; do /usr/bin/time -f "$st wall %e s" specdecode generate --chat \
  "Write a Python function that checks whether a number is prime." --max-tokens 64 --temperature 0 --spec-type $st; done; done
# the verify curve, split into layers and LM head, before and now in turns
cp scripts/bench_verify_curve.py /tmp/wt_base/scripts/
for i in 1 2; do for tree in /tmp/wt_base $PWD; do (cd $tree && PYTHONPATH=$tree python scripts/bench_verify_curve.py \
  --rounds 11 --split); done; done
# two int32 accumulators per row in the AVX512 pass (a local edit of quant_gemm.c, not committed)
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_2acc.c --stream --int4-only --rows 1,5,9
git worktree remove --force /tmp/wt_base

# ---- Round 33: `specdecode generate` end to end (converted weights and the cost curve kept on disk) ----
git worktree add -f /tmp/wt_base 4704552
python scripts/bench_startup.py --configs none,auto,none@/tmp/wt_base,auto@/tmp/wt_base --rounds 3
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_startup.py \
  --configs none,auto,none@/tmp/wt_base,auto@/tmp/wt_base --rounds 2
python scripts/bench_startup.py --configs none,auto --rounds 2 --cold
# after 35c401f (the saved curve checked by the first verify forwards instead of a v(1) measurement)
python scripts/bench_startup.py --configs none,auto,none@/tmp/wt_base,auto@/tmp/wt_base --rounds 3
python scripts/bench_startup.py --configs none,auto --rounds 3 --prompt "Write a short story about a lighthouse keeper."
# the engine's construction alone, before and now in turns
for i in 1 2 3; do for tree in /tmp/wt_base $PWD; do (cd /tmp && PYTHONPATH=$tree python -c "
import time; from specdecode import LLM; t = time.perf_counter()
LLM('qwen2.5-coder-1.5b-instruct', spec_type='none'); print('$tree', time.perf_counter() - t)"); done; done
for tree in /tmp/wt_base $PWD; do (cd /tmp && PYTHONPATH=$tree /usr/bin/time -f "$tree peak_rss_kb %M" \
  python -m specdecode.cli generate --chat "Write a Python function that reverses a linked list." --max-tokens 64 \
  --temperature 0 > /dev/null); done
git worktree remove --force /tmp/wt_base
# where a verify's extra rows go: the forwards, the layers and the decoder's int4 GEMMs alone, in the same rounds
for i in 1 2; do python scripts/bench_verify_curve.py --rounds 11 --split --gemms; done
python scripts/bench_attention.py --reps 15
# key blocks of 16 instead of 32 (a local copy of attention.c, not committed), in turns
git show 4f7178d:specdecode/kernels/attention.c > /tmp/attn_before.c
sed 's/^#define KB 32 /#define KB 16 /' /tmp/attn_before.c > /tmp/attn_kb16.c
python scripts/bench_attention.py /tmp/attn_before.c /tmp/attn_kb16.c --reps 21
# the next block prefetched in decode and verify calls over >= 512 keys (eb97b8d), before and after
for ctx in 256 1000 2000; do python scripts/bench_attention.py /tmp/attn_before.c specdecode/kernels/attention.c \
  --reps 15 --context $ctx; done
python scripts/bench_attention.py specdecode/kernels/attention.c /tmp/attn_before.c --reps 15 --context 1000
python scripts/bench_attention.py /tmp/attn_before.c /tmp/attn_before.c --reps 15 --context 1000

# ---- Round 34: attention's scratch on cache lines; SwiGLU on both threads; weights in 2 MiB pages ----
git show 64722b0:specdecode/kernels/attention.c > /tmp/attn_before.c
for ctx in 256 1000; do python scripts/bench_attention.py /tmp/attn_before.c specdecode/kernels/attention.c \
  --reps 21 --context $ctx; done
sed 's/\["gcc", \*_FLAGS,/["gcc", *_FLAGS, "-mno-avx512f",/' scripts/bench_attention.py > scripts/_ba_avx2.py
for ctx in 256 1000; do python scripts/_ba_avx2.py /tmp/attn_before.c specdecode/kernels/attention.c \
  --reps 15 --context $ctx; done; rm scripts/_ba_avx2.py
# SwiGLU alone, one thread against the team (same bits)
python -c "
import time, torch; from specdecode.kernels import native_kernels; nk = native_kernels()
for R in (1, 5, 9):
    gu = torch.randn(R, 2 * 8960); ts = {1: [], 2: []}
    for rep in range(400):
        for th in (1, 2):
            torch.set_num_threads(th); t0 = time.perf_counter(); nk.silu_mul(gu); ts[th].append(time.perf_counter() - t0)
    print(R, {k: sorted(v)[200] * 1e6 for k, v in ts.items()})"
# whole forwards, both builds in one process; the same sources twice for the noise floor
python scripts/ab_native.py --rev 64722b0 --tokens 1,5,9 --rounds 41
python scripts/ab_native.py --rev 64722b0 --tokens 1,5,9 --rounds 31 --context 1000
python scripts/ab_native.py --rev HEAD --tokens 1,5,9 --rounds 31
# 4 KiB against 2 MiB pages
python scripts/ab_hugepages.py --stream --rounds 30
for i in 1 2; do python scripts/ab_hugepages.py --rounds 41; done
python scripts/ab_hugepages.py --mapped --rounds 61; python scripts/ab_hugepages.py --mapped --rounds 61 --b-first
# a fresh huge page's first touch on this VM: 900 MB, again at once, again after 5 s
python -c "
import mmap, time, torch
for pause in (0, 0, 5, 0, 5):
    time.sleep(pause); m = mmap.mmap(-1, 900 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE); t = torch.frombuffer(m, dtype=torch.uint8)
    t0 = time.perf_counter(); t.zero_(); print(pause, time.perf_counter() - t0); del t; m.close()"
# the engine's construction, arena (default) and ordinary tensors, in turns
for i in 1 2; do for mode in auto off; do SPECDECODE_HUGEPAGES=$mode python -c "
import time; from specdecode import LLM; t = time.perf_counter()
LLM('qwen2.5-coder-1.5b-instruct', spec_type='none'); print('$mode', time.perf_counter() - t)"; done; done
# how much of the mapped entry is mapped as huge pages (after a generate; drop_caches first for a cold read)
sync; echo 1 > /proc/sys/vm/drop_caches
python -c "
import re; from specdecode import LLM, SamplingParams
llm = LLM('qwen2.5-coder-1.5b-instruct', spec_type='none'); llm.generate(['hi'], SamplingParams(max_tokens=4))
parts = re.split(r'\n(?=[0-9a-f]+-[0-9a-f]+ )', open('/proc/self/smaps').read())
print(sum(int(l.split()[1]) for p in parts if 'weights/' in p.split('\n')[0]
          for l in p.split('\n') if l.startswith('FilePmdMapped')) // 1024, 'MB')"
# 256 MB written in 2 MiB and in 1 MB blocks, then mapped: how much in huge pages
for chunk in 2097152 1000000; do python -c "
import mmap, os, re; p = os.path.expanduser('~/.cache/specdecode/fw_test.bin'); buf = os.urandom($chunk)
with open(p, 'wb') as f:
    for _ in range((256 << 20) // $chunk): f.write(buf)
m = mmap.mmap(os.open(p, os.O_RDONLY), 0, access=mmap.ACCESS_COPY); m.madvise(mmap.MADV_HUGEPAGE)
sum(m[o] for o in range(0, len(m), 4096))
print($chunk, [l for q in re.split(r'\n(?=[0-9a-f]+-[0-9a-f]+ )', open('/proc/self/smaps').read())
               if 'fw_test' in q.split('\n')[0] for l in q.split('\n') if 'FilePmdMapped' in l]); os.unlink(p)"; done
git worktree add -f /tmp/wt_base 64722b0
python scripts/bench_startup.py --configs none,auto,none@/tmp/wt_base,auto@/tmp/wt_base --rounds 3
git worktree remove --force /tmp/wt_base
for i in 1 2 3; do python scripts/bench_verify_curve.py --rounds 11 --split --gemms; done
for i in 1 2; do SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_verify_curve.py --rounds 11 --split --gemms; done
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin --ours none,auto \
  --theirs plain,ngram-mod --rounds 2 --json-out out/r34_vs_llamacpp.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r34_vs_llamacpp_avx2.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --spec-types none,auto \
  --categories rag,stem,math --reps 2
P=$PWD/../shared/datasets/spec_bench/question.jsonl
python -m specdecode.cli bench -t $T --spec-types none,auto --limit 5 --max-tokens 128 --prompts $P --json-out out/r34_sb5.json
python scripts/spec_bench_categories.py out/r34_sb5.json

# ---- Round 35 (thirty-eighth session, Zen 4 host): the host's two bandwidth states; auto in a full batch ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r35_serve.json
python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 4 --prompts $P --json-out out/r35_serve_c8.json
python scripts/bench_batch_drafters.py --spec-types none,auto --rounds 3
python scripts/bench_interleaved.py --spec-types none,auto,auto:gate-closed --batch 8 --reps 3
python scripts/bench_interleaved.py --spec-types none,auto,auto:gate-closed --batch 8 --requests 16 --reps 3 --max-tokens 96
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --spec-types none,auto,auto:gate-closed \
  --batch 8 --requests 16 --reps 2 --max-tokens 96
python scripts/bench_states.py --seconds 60
python scripts/bench_states.py --seconds 45 --gemms
python scripts/bench_verify_curve.py --rounds 11 --split --gemms
for i in 1 2; do python scripts/bench_runtime.py --quant auto --reps 3
  SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --reps 3; done
# the cache-hot and streamed kernel A/Bs (variants: local edits of quant_gemm.c; the high-nibble one multiplies
# b & 0xF0 into a second accumulator for passes of 1-2 rows and adds it back shifted right by 4 per group)
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_base.c --int4-only --rows 1,2
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_hinib.c --int4-only --rows 1,2,3 --passes 15
for i in 1 2 3; do python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_hinib.c --stream --huge-pages --int4-only \
  --rows 1 --passes 30; done
for v in "FAR 32768" "FAR 65536" "NEAR 8192"; do set -- $v; (echo "#define PF_$1 $2"; cat /tmp/qg_base.c) > /tmp/qg_pf.c
  python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_pf.c --stream --huge-pages --int4-only --rows 1 --passes 40; done
# the output projection requested during attention (a local edit of attention.c / layer.c, dropped)
python scripts/ab_native.py --rev 418082e --tokens 1,5 --rounds 31
python scripts/ab_native.py --rev 418082e --tokens 1 --rounds 41 --context 1000
# coding with the head
python -m specdecode.cli bench -t $T --spec-types none,auto,eagle3 --category coding --limit 5 --max-tokens 128 --prompts $P
python -m specdecode.cli bench -t $T --spec-types none,eagle3 --draft-fixed --category coding --limit 5 --max-tokens 128 --prompts $P
for opts in "--eagle-topk 2 --num-draft-tokens 6" "--eagle-topk 4 --num-draft-tokens 8 --num-steps 4"; do
  python -m specdecode.cli bench -t $T --spec-types none,auto $opts --category coding --limit 5 --max-tokens 128 --prompts $P; done
# the watch: one-token forwards for 90 s, medians per 3 s, with the process's huge-page mappings
python - <<'PY'
import re, statistics, time, torch
from specdecode.config import EngineConfig
from specdecode.engine.engine import Engine
torch.set_num_threads(2)
eng = Engine(EngineConfig(model="qwen2.5-coder-1.5b-instruct", quant="auto", threads=2, max_model_len=1024))
prompt = torch.randint(0, 100000, (256,), generator=torch.Generator().manual_seed(0)).tolist()
slot = eng.kv.allocate(); eng.runner.forward([slot], [prompt], last_only=True)
start = time.time()
while time.time() - start < 90:
    ts, t1 = [], time.time()
    while time.time() - t1 < 3:
        eng.kv.set_length(slot, 256); t0 = time.perf_counter()
        eng.runner.forward([slot], [prompt[:1]], last_only=True); ts.append(time.perf_counter() - t0)
    pmd = re.search(r"FilePmdMapped:\s+(\d+)", open("/proc/self/smaps_rollup").read()).group(1)
    print(f"{time.time() - start:5.1f} s median {statistics.median(ts) * 1e3:.1f} ms, FilePmdMapped {int(pmd) // 1024} MB")
PY
# matrices cold (after three other layers' gate/up streamed) and again right after (resident in L3)
python - <<'PY'
import statistics, time, torch
from specdecode.config import EngineConfig
from specdecode.engine.engine import Engine
from specdecode.kernels import native_kernels
torch.set_num_threads(2)
eng = Engine(EngineConfig(model="qwen2.5-coder-1.5b-instruct", quant="auto", threads=2, max_model_len=1024))
nk, L = native_kernels(), eng.model.layers
slot = eng.kv.allocate(); eng.runner.forward([slot], [[1, 2, 3]], last_only=True)
g = lambda m, x: nk.int4_gemm(x, m.qweight, m.qparams, m.qsuper, m.out_features, m.group_size)
for name in ("o_proj", "down_proj", "gate_up_proj"):
    cold, warm = [], []
    for rep in range(20):
        m = getattr(L[rep % 28].self_attn if name == "o_proj" else L[rep % 28].mlp, name); x = torch.randn(1, m.in_features)
        for j in range(3): g(L[(rep + 5 + j) % 28].mlp.gate_up_proj, torch.randn(1, 1536))
        t0 = time.perf_counter(); g(m, x); cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); g(m, x); warm.append(time.perf_counter() - t0)
    print(name, f"cold {statistics.median(cold) * 1e6:.0f} us, warm {statistics.median(warm) * 1e6:.0f} us")
PY
python scripts/bench_step_ratio.py --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --threads $T --rounds 5
python scripts/bench_itl.py -t $T --pairs 8 --category writing --category qa --max-tokens 96 --prompts $P
python scripts/bench_states.py --seconds 30 --threads 1
gcc -O3 -march=native -fopenmp -std=c11 -ffp-contract=off -S -o /tmp/qg.s specdecode/kernels/quant_gemm.c  # the one-row loop

# ---- Round 36 (thirty-ninth session, Zen 4 host): the gate's idle windows; bench-serve's client apart ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
# before / after the gate's idle rule, alternating worktrees (before: git worktree add -f /tmp/wt_base 1b65f14;
# after: 0cbe697 for the batch runs, e8c0515 for the one-sequence run)
for i in 1 2; do for r in /tmp/wt_base .; do
  (cd $r && python scripts/bench_interleaved.py --spec-types none,auto --batch 8 --requests 16 --max-tokens 96 --reps 2 --prompts $P)
  (cd $r && python scripts/bench_interleaved.py --spec-types none,auto --batch 8 --reps 2 --prompts $P); done; done
for r in /tmp/wt_base .; do (cd $r && python scripts/bench_interleaved.py --spec-types none,auto --reps 2 --prompts $P); done
python scripts/bench_interleaved.py --spec-types none,auto,auto:gate-closed --batch 8 --reps 3   # gated steps per rep
# each step's gate state, planning and time outside the forward (the script runs in the worktree it sits in)
for r in /tmp/wt_base .; do (cp scripts/bench_gate_steps.py $r/scripts/ 2>/dev/null; cd $r && \
  python scripts/bench_gate_steps.py --spec-type auto --batch 8 --reps 3); done
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --spec-types none,auto,auto:gate-closed --batch 8 --reps 2
# the EAGLE chain path against the tree path for eagle-topk 1, in one process
python scripts/bench_interleaved.py --spec-types none,eagle3,eagle3:eagle-tree --categories coding,writing,qa,math --reps 3 --max-tokens 96
# the server: in-process client (bench-serve at 8827970: git worktree add -f /tmp/wt_inproc 8827970), in both orders;
# the client in a child process (now); each engine served from its own process
(cd /tmp/wt_inproc && python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 \
  --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r36_serve.json)
(cd /tmp/wt_inproc && python -m specdecode.cli bench-serve -t $T --spec-types auto,none --concurrency 8 --requests 16 \
  --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r36_serve_rev.json)
python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r36_serve_child.json
for s in none auto; do python -m specdecode.cli serve --spec-type $s --max-num-seqs 8 -t $T --port 8123 & SP=$!
  until curl -s localhost:8123/health >/dev/null; do sleep 1; done
  python -m specdecode.cli bench-serve --url http://localhost:8123 --label $s --concurrency 8 --requests 16 --max-tokens 96 --prompts $P
  kill $SP; wait $SP; done
python -m specdecode.cli bench -t $T --spec-types none,auto --limit 5 --max-tokens 128 --prompts $P --json-out out/r36_sb5.json

# ---- Round 37 (fortieth session, Emerald Rapids host with AMX exposed): the AMX pass's next-tile prefetch ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
# peers: the source tree of build-llama-cpp (fetched with `pip download --no-deps --no-binary llama-cpp-python
# llama-cpp-python==0.3.36`), built twice with GGML_NATIVE=OFF and AMX off (its native build crashed on round
# 15's AMX host): /tmp/llama.cpp-512 with -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
# -DGGML_AVX512_VBMI=ON -DGGML_AVX_VNNI=ON, /tmp/llama.cpp-avx2 with -DGGML_AVX512=OFF -DGGML_AVX_VNNI=ON
# (both with -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON; targets llama-server llama-bench)
# AMX against VNNI for multi-row passes (variants of the committed file: AMX_MIN_ROWS 5 with amx_rows' cases
# from 5, and 99 = AMX off), before the prefetch (/tmp/qg_base.c = 726fbca's) and after it (/tmp/qg_pf_*.c)
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_amx5.c --threads 1 --int4-only --rows 5,8,9,10,12
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_amx5.c --threads 2 --int4-only --stream --huge-pages --rows 1,8,9 --passes 12
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_noamx.c --threads 2 --int4-only --stream --huge-pages --rows 12,16,24 --passes 10
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_noamx.c --threads 1 --int4-only --rows 12,16,24,32,64
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_noamx.c --threads 2 --int4-only --stream --huge-pages --rows 16,20,32 --passes 8
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_pf_amx.c --threads 2 --int4-only --stream --huge-pages --rows 12,16,32 --passes 8
python scripts/ab_kernels.py /tmp/qg_pf_noamx.c /tmp/qg_pf_amx5.c --threads 2 --int4-only --stream --huge-pages --rows 8,9,12,16,24 --passes 8
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_pf_amx.c --threads 2 --int4-only --stream --huge-pages --rows 16,24,64 --passes 8
python scripts/ab_native.py --rev 726fbca --tokens 1,16,32 --rounds 21
# the issues' points on this host
python scripts/bench_runtime.py --quant auto --reps 3
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --reps 3
for i in 1 2 3 4; do python scripts/bench_verify_curve.py --rounds 11 --split --gemms; done
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-512/build/bin --ours none,auto --theirs plain,ngram-mod \
  --rounds 2 --json-out out/r37_vs_llamacpp.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 2 --json-out out/r37_vs_llamacpp_avx2.json
python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r37_serve.json
python scripts/bench_interleaved.py --spec-types none,auto,auto:gate-closed --batch 8 --reps 3 --prompts $P
python scripts/bench_step_ratio.py --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --threads $T --rounds 5
python -m specdecode.cli bench -t $T --spec-types none,auto --limit 5 --max-tokens 128 --prompts $P --json-out out/r37_sb5.json
python scripts/spec_bench_categories.py out/r37_sb5.json
python -m specdecode.cli bench-serve -t $T --spec-types auto,none --concurrency 8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r37_serve_rev.json
python scripts/bench_itl.py -t $T --pairs 8 --category writing --category qa --max-tokens 96 --prompts $P
# the next tile's codes requested into L1 instead of L2 (/tmp/qg_t0.c: 860f182's file with _MM_HINT_T0 there)
python scripts/ab_kernels.py /tmp/qg_head.c /tmp/qg_t0.c --threads 2 --int4-only --stream --huge-pages --rows 16,32 --passes 8
for i in 1 2; do python -m specdecode.cli bench-serve -t $T --spec-types none --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r37_serve_none$i.json; done
python -m specdecode.cli bench -t $T --spec-types none,auto --limit 5 --max-tokens 128 --temperature 0.7 --seed 0 \
  --prompts $P --json-out out/r37_sb5_t07.json
python scripts/spec_bench_categories.py out/r37_sb5_t07.json

# ---- Round 38 (Emerald Rapids with AMX, 2026-12-06): prefix sharing from running requests, c8 / c1 ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
# the sharing A/B in one process (variant no-share: the engine before aba1a24)
python scripts/bench_interleaved.py --spec-types none,none:no-share --batch 8 --requests 16 --reps 3 --max-tokens 96 --prompts $P
python scripts/bench_interleaved.py --spec-types none,auto,auto:no-share --batch 8 --requests 16 --reps 3 --max-tokens 96 --prompts $P
# the server's c8 / c1, ad7b295 (a worktree at /tmp/wt_base) and aba1a24 alternated, then single invocations
for i in 1 2; do for w in /tmp/wt_base $PWD; do (cd $w && PYTHONPATH=$w python -m specdecode.cli bench-serve -t $T \
  --spec-types none --concurrency 1,8 --requests 16 --max-tokens 96 --max-num-seqs 8 --rounds 1 --prompts $P \
  --json-out /work/main/out/r38_share_$(basename $w)_$i.json); done; done
for i in 1 2 3 4; do python -m specdecode.cli bench-serve -t $T --spec-types none --concurrency 1,8 --requests 16 \
  --max-tokens 96 --max-num-seqs 8 --rounds 1 --prompts $P --json-out out/r38_serve_share$i.json; done
python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r38_serve.json          # aba1a24
python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r38_serve_final.json    # a34049c
python scripts/bench_levels.py --spec-type none --reps 3     # 592813c (one engine for both levels)
python scripts/bench_levels.py --spec-type none --reps 2
python scripts/bench_levels.py --spec-type auto --reps 2
python scripts/bench_levels.py --spec-type none --reps 1 --steps
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c specdecode/kernels/quant_gemm.c --threads 2 --int4-only \
  --stream --huge-pages --rows 1,8,16,64,128 --passes 4
# the AMX pass's variants (files under /tmp/amx, each the committed quant_gemm.c with one edit): noepi (the epilogue
# on row 0 only), notile2 (AMX_ISSUE empty, no tile stores, dots zeroed), nostore, sink (tile stores into a second
# buffer), nozero / noA / noB / nodp (one tile instruction removed), deep (six dot tiles, tmm6/tmm7 for A/B),
# batched (three groups' stores and issues, then three epilogues); zeroonly / zerorot / zeroonce: notile2 plus one
# tilezero per group / per group over tiles 0-3 / once per tile pass
for v in noepi notile2 nostore sink nozero noA noB nodp deep batched; do
  python scripts/ab_kernels.py /tmp/amx/base.c /tmp/amx/$v.c --threads 1 --int4-only --rows 16,64 --no-check; done
for v in zeroonly zerorot zeroonce; do
  python scripts/ab_kernels.py /tmp/amx/notile2.c /tmp/amx/$v.c --threads 1 --int4-only --rows 16,64 --no-check; done
python scripts/ab_kernels.py /tmp/amx/base.c /tmp/amx/base.c --flags=-DSPECDECODE_NO_AMX --threads 1 --int4-only --rows 8,16,64
/tmp/llama.cpp-512/build/bin/llama-bench -m ~/.cache/specdecode/models/qwen2.5-coder-1.5b-instruct.gguf -t 2 -p 64,512 -n 0 -r 2
python scripts/bench_prefill.py --lengths 64,512 --rounds 2
python -m specdecode.cli bench-serve -t $T --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r38_serve_final2.json   # db01b24

# ---- Round 39 (Emerald Rapids with AMX, 2026-12-06): draft model / MTP sharing, c8 / c1, AMX without tilezero ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
python scripts/bench_interleaved.py --spec-types draft,draft:no-draft-share --model-draft qwen2.5-coder-0.5b-instruct \
  --batch 8 --requests 16 --max-tokens 96 --reps 3 --prompts $P          # twice
# the draft model's prompt tokens with and without sharing: a spy on DraftModelProposer.runner.forward over
# LLM(..., spec_type="draft", max_num_seqs=8).generate(the 16 chat-templated prompts, max_tokens=96), the
# no-share side with proposer.share = Proposer.share (what variant no-draft-share does)
python scripts/bench_levels.py --spec-type none --reps 2
python scripts/bench_levels.py --spec-type none --reps 1 --steps
# the running-sum variant of amx_tile_rows (/tmp/qg_cum.c: no tilezero per group, epilogue on now - was)
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_cum.c --rows 16,32,64 --threads 1
python scripts/bench_batch_drafters.py --spec-types none,auto --rounds 2 --prompts $P
# scales per tile (/tmp/qg_scales.c: group_scales once per tile into the AMX unpack buffer)
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_scales.c --rows 12,16,32,64 --threads 1 --int4-only
# PyTorch's bf16 GEMM (oneDNN) on the 1.5B's shapes, 16 / 64 / 256 rows, two threads: F.linear(x.bfloat16(), w.bfloat16())
# the probe with and without the second prefetch level: stream_read_pf(p, n, 2, far) over 1 and 4 GiB, four rounds
for i in 1 2; do python scripts/bench_runtime.py --quant auto --reps 3 --json-out out/r39_runtime_512_$i.json
  SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --reps 3 --json-out out/r39_runtime_avx2_$i.json; done
python scripts/bench_verify_curve.py --rounds 11
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r39_serve.json
# server / engine at c = 8: LLM(max_num_seqs=8).generate(the 16 chat prompts, max_tokens=96) against
# bench_engines([("none", fresh engine)], prompts, [8], 16, {"max_tokens": 96, "temperature": 0}), back to back;
# a background process busy 10 / 20 / 15 % of each 10 ms beside the engine alone and ab_native.py; dynamic tile chunks:
python scripts/ab_native.py --rev HEAD --tokens 1,8 --rounds 21        # with the schedule(dynamic) quant_gemm.c
python scripts/ab_native.py --rev HEAD --tokens 1,5,8,16,64 --rounds 21
for i in 1 2; do python scripts/ab_native.py --rev HEAD --tokens 1,8,16 --rounds 31; done

# ---- Round 40 (Emerald Rapids with AMX, 2026-12-07): which bound holds per row count; eight kernel variants dropped ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r40_serve_1.json
python scripts/bench_batch_drafters.py --spec-types none,auto --rounds 2 --prompts $P
python scripts/bench_levels.py --spec-type none --reps 2
python scripts/bench_runtime.py --quant auto --reps 3                   # once alone, first
for i in 1 2 3; do python scripts/bench_runtime.py --quant auto --reps 3 --json-out out/r40_runtime_512_$i.json
  SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --reps 3 --json-out out/r40_runtime_avx2_$i.json; done
python scripts/bench_verify_curve.py --rounds 11                        # five invocations over the session
python scripts/bench_verify_curve.py --rounds 15 --split --gemms
python scripts/bench_step_parts.py --reps 3
for i in 1 2; do python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c specdecode/kernels/quant_gemm.c --stream \
  --huge-pages --rows 1 --passes 8 --no-check; python scripts/bench_step_parts.py --reps 3; done
gcc -O2 -march=native scripts/dpbusd_peak.c -o /tmp/dpbusd_peak && /tmp/dpbusd_peak && /tmp/dpbusd_peak
python scripts/bench_gemm_bound.py --rows 1,5,9 --rounds 4
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_gemm_bound.py --rows 1,3,5 --rounds 4
python scripts/bench_prefill.py --lengths 16,24,32,48,64,96,128,200,256,400 --rounds 3
# variants of quant_gemm.c (each the committed file with one edit, same bits unless --no-check is given):
# gfni (the high nibbles by one gf2p8affine), dot2 (one row: the low and high nibbles' dots in two chains),
# pipe (one row: the next group's scales computed a group ahead), far32 / far64 (PF_FAR 32 / 64 KiB),
# amx5 / amx8 (AMX_MIN_ROWS 5 / 8), rb (AMX passes in row blocks of 1 MiB of activations)
for v in gfni dot2 pipe far32 far64; do
  python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_$v.c --stream --huge-pages --rows 1,5,9 --passes 8; done
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_gfni.c --rows 1,5,9 --int4-only --threads 1   # twice
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_amx5.c --rows 5,8,9,10 --int4-only --threads 1
# timing only, from amx8: noepi (the epilogue replaced by adding the stored dots' first row), nostore (no tile stores)
for v in noepi nostore; do python scripts/ab_kernels.py /tmp/qg_amx8.c /tmp/qg_amx8_$v.c --rows 8 --int4-only --threads 1 --no-check; done
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_rb.c --stream --huge-pages --int4-only --rows 64,128,256,512 --passes 4
# what the one-row pass spends on its scales (timing only): nosub (no sub- or super-scale read, constants instead),
# subinline (the same scale arithmetic on bytes of the group's codes, already in L1: no extra bytes)
for i in 1 2 3; do python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_nosub.c --stream --huge-pages \
  --rows 1 --passes 10 --no-check --int4-only
  python scripts/ab_kernels.py /tmp/qg_nosub.c /tmp/qg_subinline.c --stream --huge-pages --rows 1 --passes 10 --no-check --int4-only; done
# the AVX2 body: hoist (super-scales converted once per super-block), three (passes of at most 3 rows, both halves)
for i in 1 2 3; do python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_hoist.c --flags=-mno-avx512f \
  --stream --huge-pages --rows 1,3,5 --passes 8; done
for i in 1 2; do python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_three.c --flags=-mno-avx512f \
  --rows 4,5,6,8,9 --int4-only --threads 1; done
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-512/build/bin --ours none,auto --theirs plain,ngram-mod \
  --rounds 2 --json-out out/r40_vs_llamacpp.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 1 --json-out out/r40_vs_llamacpp_avx2.json
# the engine's thread count under CPU quotas (root: it makes a cgroup of its own)
python scripts/bench_cpu_quota.py --quotas 1.0,1.5 --threads default,1,2 --rounds 2
python scripts/bench_cpu_quota.py --quotas 1.2,2.0 --threads default,1,2 --rounds 2
# a burst's prompts in one forward: runner.forward(8 slots, the 8 prompts' tokens after the shared 29) against a forward
# per prompt, six interleaved rounds, both waves of bench-serve's 16 chat prompts
# the server's threads at c = 8: specdecode serve --spec-type none --max-num-seqs 8 --port 8123 (warmed by one level), then
# py-spy record -p <its pid> -o /tmp/spy.txt -f raw -r 200 -d 40 --threads while this runs:
python -m specdecode.cli bench-serve --url http://127.0.0.1:8123 --concurrency 8 --requests 16 --max-tokens 96 --prompts $P

# ---- Round 41 (Emerald Rapids with AMX, 2026-12-07): a GEMM's threads share its tiles; the issues' points again ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
# where a 64-token prefill loop's threads spend (a probe: Engine + runner.forward of one 64-token prompt, 60 times)
#   perf record -o /tmp/perf.data -p <its pid> -- sleep 12 ; perf report -i /tmp/perf.data --no-children -s pid,sym --stdio
# the kernels before tile sharing (a382bca) against after (1e922a9), whole forwards and whole steps, in turns
python scripts/ab_native.py --rev a382bca --tokens 1,8,39,64 --rounds 31
python scripts/ab_native.py --rev a382bca --tokens 1,8,39,64 --rounds 21
python scripts/ab_native.py --rev HEAD --tokens 1,8,39,64 --rounds 21      # at 1e922a9: the noise floor
python scripts/bench_interleaved.py --spec-types none,none:native-rev --native-rev a382bca --batch 8 --requests 16 \
  --max-tokens 96 --reps 3
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --spec-types none,none:native-rev \
  --native-rev a382bca --batch 8 --requests 16 --max-tokens 96 --reps 3
python scripts/bench_interleaved.py --spec-types none,none:native-rev --native-rev a382bca --reps 2 --max-tokens 96
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --spec-types none,none:native-rev \
  --native-rev a382bca --categories writing,qa,coding --reps 2 --max-tokens 96
# beside a process taking 15 % of one core: python -c "busy 7.5 ms, sleep 42.5 ms, forever" &
python scripts/bench_interleaved.py --spec-types none,none:native-rev --native-rev a382bca --batch 8 --requests 16 \
  --max-tokens 96 --reps 3
# the issues' points
python scripts/bench_levels.py --spec-type none --reps 2
python scripts/bench_levels.py --spec-type none --reps 1 --steps
for i in 1 2 3; do python scripts/bench_verify_curve.py --rounds 11; done
python scripts/bench_runtime.py --quant auto --reps 3                   # once alone, first
for i in 1 2; do python scripts/bench_runtime.py --quant auto --reps 3 --json-out out/r41_runtime_512_$i.json
  SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --reps 3 --json-out out/r41_runtime_avx2_$i.json; done
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r41_serve_1.json
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r41_serve_2.json
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 5 --max-tokens 128 --prompts $P --json-out out/r41_sb5.json
python scripts/spec_bench_categories.py out/r41_sb5.json
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 5 --max-tokens 128 --temperature 0.7 --seed 0 \
  --prompts $P --json-out out/r41_sb5_t07.json
python scripts/spec_bench_categories.py out/r41_sb5_t07.json
# auto at c = 8 in the server: the other order; the gate held closed from 2 sequences (timing only: a python -c wrapper
# setting specdecode.speculative.gate.SpeculationGate.open = lambda self, batch: batch < 2 before cli.main; likewise
# sys.setswitchinterval(0.0005)); the engine alone
python -m specdecode.cli bench-serve -t 2 --spec-types auto,none --concurrency 8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 3 --prompts $P --json-out out/r41_serve_rev.json
python scripts/bench_batch_drafters.py --spec-types none,auto --rounds 2 --prompts $P
# after 739b480 (a step carrying prompt chunks drafts nothing)
python -m specdecode.cli bench-serve -t 2 --spec-types auto,none --concurrency 8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 3 --prompts $P --json-out out/r41_serve_rev_nomerge.json
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 3 --prompts $P --json-out out/r41_serve_nomerge.json
python scripts/bench_interleaved.py --spec-types none,auto,auto:merged-drafts --batch 8 --requests 16 --max-tokens 96 \
  --reps 3 --prompts $P
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r41_serve_3.json
# tried: the attention prefetch from 32 keys (attention.c's PF_MIN_KEYS as a -D flag, a batch of 8 one-token rows over
# 200 keys, two libraries in turns in one process); the AVX2 body on this machine (/tmp/qg_avx2on512.c: quant_gemm.c
# under #undef __AVX512F__)
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_avx2on512.c --stream --huge-pages --rows 1,2,3 \
  --passes 8 --int4-only
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/qg_avx2on512.c --stream --huge-pages --rows 1,2,3,5,9 \
  --passes 10 --int4-only
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c specdecode/kernels/quant_gemm.c --stream --huge-pages \
  --rows 1,2,3 --passes 10 --int4-only
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-512/build/bin --ours none,auto --theirs plain,ngram-mod \
  --rounds 1 --json-out out/r41_vs_llamacpp.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 1 --json-out out/r41_vs_llamacpp_avx2.json

# ---- Round 42 (Emerald Rapids with AMX, 2026-12-07): the int4 passes prefetch their scale streams; the issues' points ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
# where `auto` spends in a full batch beside `none`: in turns, with the gate held closed, without the head; per step
python scripts/bench_interleaved.py --spec-types none,auto,auto:gate-closed --batch 8 --requests 16 --max-tokens 96 --reps 3
python scripts/bench_interleaved.py --spec-types none,auto,suffix+ngram-mod --batch 8 --requests 16 --max-tokens 96 --reps 3
python scripts/bench_gate_steps.py --spec-type auto --batch 8 --reps 2
python scripts/bench_gate_steps.py --spec-type auto --batch 8 --requests 24 --max-tokens 96 --reps 2
# (a cProfile of 63 steps of 8 sequences, `none` against `auto` with the gate held closed, and a timer around each chain
# member's commit / plan / observe: probes, not kept)
# the plain step's parts; the sub-scale prefetch (edbf2c4) and the super-scale prefetch (d2de7cb) against the
# file before each, streamed; the same file twice (the noise floor)
python scripts/bench_step_parts.py --reps 3
git show fa3785a:specdecode/kernels/quant_gemm.c > /tmp/qg_before.c
git show edbf2c4:specdecode/kernels/quant_gemm.c > /tmp/qg_sub.c
git show d2de7cb:specdecode/kernels/quant_gemm.c > /tmp/qg_sup.c
python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_sub.c --stream --huge-pages --rows 1,5 --passes 10 --int4-only
for i in 1 2; do
  python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_before.c --stream --huge-pages --rows 1 --passes 10 --int4-only
  python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_sub.c --stream --huge-pages --rows 1 --passes 10 --int4-only; done
python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_sub.c --flags=-mno-avx512f --stream --huge-pages --rows 1,5 \
  --passes 10 --int4-only    # twice
python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_sub.c --stream --huge-pages --rows 1,2,3,5,9 --passes 8 --int4-only
# the sub-scale prefetch's distance and hint: /tmp/qg_sub.c against itself with the line's PF_SUB as PF_FAR / 4 (T0),
# PF_FAR / 8 (T2) and PF_NEAR / 8 + 1024 (T0), each --rows 1 --passes 10 as above
python scripts/ab_kernels.py /tmp/qg_sub.c /tmp/qg_sup.c --stream --huge-pages --rows 1,3 --passes 10 \
  --int4-only
python scripts/ab_kernels.py /tmp/qg_sub.c /tmp/qg_sup.c --flags=-mno-avx512f --stream --huge-pages \
  --rows 1,3 --passes 10 --int4-only
# whole decode steps on the kernels before (one request at a time, decode only)
python scripts/bench_interleaved.py --spec-types none,none:native-rev --native-rev fa3785a --categories coding,writing,qa \
  --reps 3
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --spec-types none,none:native-rev \
  --native-rev fa3785a --categories coding,writing,qa --reps 2
python scripts/bench_interleaved.py --spec-types none,none:native-rev --native-rev bd3746c --categories coding,writing,qa \
  --reps 3
# the issues' points
for i in 1 2 3; do python scripts/bench_runtime.py --quant auto --reps 3 --json-out out/r42_runtime_512_$i.json
  SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_runtime.py --quant auto --reps 3 --json-out out/r42_runtime_avx2_$i.json; done
for i in 1 2; do python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 1,8 --requests 16 \
  --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r42_serve_$i.json; done
# c = 8 alone, each configuration's server in a process of its own, the client from another (both ways):
#   specdecode serve -t 2 --spec-type none|auto --max-num-seqs 8 --port 8124 &
python -m specdecode.cli bench-serve --url http://127.0.0.1:8124 --concurrency 8 --requests 16 --max-tokens 96 --prompts $P
for c in auto none auto,none; do python -m specdecode.cli bench-serve -t 2 --spec-types $c --concurrency 8 --requests 16 \
  --max-tokens 96 --max-num-seqs 8 --rounds 1 --prompts $P; done
for c in none,auto auto,none; do python -m specdecode.cli bench-serve -t 2 --spec-types $c --concurrency 8 --requests 16 \
  --max-tokens 96 --max-num-seqs 8 --rounds 4 --prompts $P --json-out out/r42_serve_c8_$c.json; done
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-512/build/bin --ours none,auto --theirs plain,ngram-mod \
  --rounds 1 --json-out out/r42_vs_llamacpp.json
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-avx2/build/bin \
  --ours none,auto --theirs plain,ngram-mod --rounds 1 --json-out out/r42_vs_llamacpp_avx2.json
# tried: the first 16 KiB of each thread's range (and its sub-scales) requested into L2 before the activations'
# quantization, at every GEMM's start (/tmp/qg_warm.c: /tmp/qg_sup.c with a warm() before each quantize_rows)
python scripts/ab_kernels.py /tmp/qg_sup.c /tmp/qg_warm.c --stream --huge-pages --rows 1,8 --passes 10
python scripts/bench_levels.py --spec-type none --reps 2
for i in 1 2 3; do python scripts/bench_verify_curve.py --rounds 11; done
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 5 --max-tokens 128 --prompts $P --json-out out/r42_sb5.json
python scripts/spec_bench_categories.py out/r42_sb5.json
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 5 --max-tokens 128 --temperature 0.7 --seed 0 \
  --prompts $P --json-out out/r42_sb5_t07.json
python scripts/spec_bench_categories.py out/r42_sb5_t07.json
python scripts/bench_itl.py -t 2 --pairs 8 --category writing --category qa --max-tokens 96 --prompts $P
# tried: AMX passes from 5 rows (/tmp/qg_amx8.c: /tmp/qg_sup.c with AMX_MIN_ROWS 5 and amx_rows' cases 5-11)
python scripts/ab_kernels.py /tmp/qg_sup.c /tmp/qg_amx8.c --stream --huge-pages --rows 5,8,9 --passes 8 --int4-only
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/bench_interleaved.py --spec-types none,none:native-rev \
  --native-rev bd3746c --categories coding,writing,qa --reps 2
python scripts/bench_verify_curve.py --rounds 7 --split --gemms
# perf of runner.forward over 1 / 5 new tokens after 256 cached, in a loop (row_exact, packed logits, as a verify):
#   perf record -F 2000 -p <its pid> -- sleep 8 ; perf report --no-children -s sym --stdio
# exp16 (45a2353) against the build before: the kernels alone, then whole c = 8 steps
python scripts/ab_layer_kernels.py --rev 5e25845
python scripts/bench_interleaved.py --spec-types none,none:native-rev --native-rev 5e25845 --batch 8 --requests 16 \
  --max-tokens 96 --reps 3

# ---- Round 43 (Emerald Rapids with AMX, 2026-12-07): attention over query pairs in 512-bit registers; decode after
# a long context beside llama.cpp; the server let go of no engine ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
# the multi-row GEMM's float epilogue, timing only (wrong outputs): the per-group sx product removed, then also the
# minimum's FMA (sed variants of a /tmp copy, as /tmp/qg_nosx.c, /tmp/qg_nosxmin.c)
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_nosx.c --no-check --int4-only --rows 1,5,9
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_nosxmin.c --no-check --int4-only --rows 1,5,9
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_nosx.c --no-check --int4-only --rows 5,8,9 --stream --huge-pages
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_nosxmin.c --no-check --int4-only --rows 1,3,5,9 --stream --huge-pages
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_base.c --int4-only --rows 1,2,3,4,5,6 --stream --huge-pages --passes 6
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_base.c --int4-only --rows 1,2,3,4,5,6,8 --threads 1
for v in NEAR_2048 NEAR_8192 nonear FAR_32768 FAR_65536; do python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_$v.c \
  --int4-only --rows 1,4,5,8 --stream --huge-pages --passes 6; done
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_dp2.c --no-check --int4-only --rows 1,4,5 --stream --huge-pages --passes 8
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_magic.c --int4-only --rows 16,80,256 --threads 1
python scripts/ab_kernels.py /tmp/qg_base.c /tmp/qg_magic.c --int4-only --rows 1,5,9 --threads 1
# attention in 512-bit pairs (a9eb45e) against the build before it
python scripts/bench_verify_curve.py --rounds 9 --split --gemms
python scripts/bench_verify_curve.py --rounds 7 --split --context 2048
python scripts/ab_layer_kernels.py --rev b1663ff --rounds 11
for c in 256 1000 2048; do python scripts/ab_native.py --rev b1663ff --context $c --tokens 1,5,9 --rounds 15; done
python scripts/ab_native.py --rev b1663ff --context 1024 --tokens 64,256 --rounds 7
python scripts/bench_interleaved.py --spec-types none,none:native-rev --native-rev b1663ff --batch 8 --requests 16 \
  --max-tokens 96 --reps 3
# tried, not kept (throwaway commits on a worktree: PF_MIN_KEYS 0; the block prefetch's hint T2; the next block's
# rows requested along the pair kernels' work instead of in one burst, against a9eb45e)
python scripts/bench_interleaved.py --spec-types none,none:native-rev --native-rev 2eef8c7 --batch 8 --requests 16 \
  --max-tokens 96 --reps 3
python scripts/ab_native.py --rev 3bd22fe --context 4096 --tokens 1,5 --rounds 11
python scripts/ab_native.py --rev a9eb45e --context 4096 --tokens 1,5 --rounds 11
python scripts/ab_native.py --rev a9eb45e --context 1024 --tokens 1,5 --rounds 11
# decode after a long context, llama.cpp beside us
python scripts/bench_depth.py --llama-bin /tmp/llama.cpp-512/build/bin --depths 0,1024,2048,4096 --rounds 2
# the issues' points
python scripts/bench_gate_steps.py --spec-type auto --batch 8 --reps 2 --max-tokens 96
for i in 1 2; do python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 1,8 --requests 16 \
  --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r43_serve_$i.json; done
for c in auto,none none,auto; do python -m specdecode.cli bench-serve -t 2 --spec-types $c --concurrency 8 --requests 16 \
  --max-tokens 96 --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r43_serve_c8_$c.json; done
python scripts/bench_levels.py --reps 2
for i in 1 2; do python scripts/bench_verify_curve.py --rounds 11; done
python scripts/bench_verify_curve.py --rounds 7 --context 2048
python scripts/bench_levels.py --spec-type auto --reps 1
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 8,1 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r43_serve_81.json
python scripts/bench_levels.py --reps 1 --steps
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/ab_layer_kernels.py --rev b1663ff --rounds 9
# SwiGLU's one division (2a2eb6b), measured before committing it against HEAD (then d4c306d)
python scripts/ab_layer_kernels.py --rev d4c306d --rounds 9
SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/ab_layer_kernels.py --rev d4c306d --rounds 7
# ---- Round 44 (Emerald Rapids with AMX, 2026-12-07): the AMX pass's tile instructions beside its epilogue; attention's
# part in a verify; the large head's build started. Every timing below with the head build stopped (kill -STOP). ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
python scripts/bench_prefill.py --lengths 16,64,200,512 --rounds 3
gcc -O2 -march=native scripts/amx_overlap.c -o /tmp/amx_overlap && /tmp/amx_overlap && /tmp/amx_overlap
# AMX variants of a /tmp copy of quant_gemm.c (then one file): inputs in two pairs of tiles unrolled by 6 (qg_dbl), the
# same unrolled form with one pair (qg_single), three activation / code tiles (qg_A3 / qg_B3), groups issued three
# ahead (qg_ahead3), timing only without the epilogue / the tile instructions (qg_noepi / qg_notile), AMX from 8 rows
# (qg_amx8), the VNNI body (qg_noamx: #define SPECDECODE_NO_AMX)
git show 8f09213:specdecode/kernels/quant_gemm.c > /tmp/qg_before.c
python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_before.c --int4-only --rows 16,64,256
for v in dbl single A3 B3 ahead3; do python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_$v.c --int4-only --rows 16,64,256; done
for v in noepi notile; do python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_$v.c --int4-only --rows 16,64,256 --no-check; done
python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_amx8.c --int4-only --rows 8,9,10
python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_amx8.c --int4-only --rows 8,10 --stream --passes 4
python scripts/ab_kernels.py /tmp/qg_before.c /tmp/qg_noamx.c --int4-only --rows 10,16,64,256
# attention: verify sizes after 256 / 4096 tokens; prefetch variants of a /tmp copy of attention.c (no prefetch:
# PF_MIN_KEYS 1e9; T2 four blocks ahead beside the burst; T2 four ahead alone; the burst two blocks ahead)
python scripts/bench_attention.py
python scripts/bench_attention.py --context 4096 --reps 21
python scripts/bench_attention.py /tmp/attn_base.c /tmp/attn_nopf.c /tmp/attn_far.c --context 4096 --reps 15
python scripts/bench_attention.py /tmp/attn_base.c /tmp/attn_faronly.c /tmp/attn_two.c --context 4096 --reps 15
# the large head (issue 16's recipe), in a copy of the tree, in the background
mkdir -p /work/hb && git archive 8f09213 | tar -x -C /work/hb
(cd /work/hb && PYTHONPATH=/work/hb THREADS=2 scripts/build_head_large.sh out/heads-large > /work/hb/build.log 2>&1 &)
# the issues' points (the head build stopped)
python scripts/bench_verify_curve.py --split --gemms --rounds 15
for i in 1 2; do python scripts/bench_verify_curve.py --rounds 11; done
python scripts/bench_levels.py --reps 2
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r44_serve_1.json
# the order of the configurations (the main-thread pool variant: release_threads() after the factory, a throwaway
# patch of bench/serve.py)
python -m specdecode.cli bench-serve -t 2 --spec-types auto,none --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 1 --prompts $P --json-out out/r44_serve_rev.json
# after 17d305b (ABBA rounds)
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r44_serve_abba.json
python -m specdecode.cli bench-serve -t 2 --spec-types none,suffix,auto --concurrency 8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r44_serve_c8_3.json
# auto's drafting at batch 8 in the engine alone, run to run (throwaway scripts: LLM.generate of the first 16 Spec-Bench
# prompts on 8 slots, 96 tokens, in a fresh process or after other levels; the gate's judgments logged by a
# monkeypatch of SpeculationGate.observe)

# ---- Round 45 (AMD EPYC family 25 model 1, Zen 3: AVX2 without VNNI, 2026-12-07): the issues' points on an AVX2-only
# host; bench's configurations in ABBA order. llama.cpp: the sdist fetched by URL (pip download was compiling cmake
# from source), then build-llama-cpp's cmake steps in /tmp/llama.cpp-peer/src. ----
P=$PWD/../shared/datasets/spec_bench/question.jsonl
python scripts/bench_verify_curve.py --rounds 7
python scripts/ab_kernels.py specdecode/kernels/quant_gemm.c /tmp/kv3/quant_gemm.c --int4-only --rows 1,2,4,5,8,9 \
  --stream --passes 6  # /tmp/kv3: the kernels folder, tile_passes taking 4-9 rows in passes of 3 (2 where 4 are left)
gcc -O2 -march=native scripts/maddubs_peak.c -o /tmp/maddubs_peak && /tmp/maddubs_peak && /tmp/maddubs_peak
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 5 --max-tokens 128 --prompts $P --json-out out/r45_sb5.json
python scripts/spec_bench_categories.py out/r45_sb5.json
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 5 --max-tokens 128 --temperature 0.7 --seed 0 \
  --prompts $P --json-out out/r45_sb5_t07.json
python scripts/spec_bench_categories.py out/r45_sb5_t07.json
# after 6a33396 (bench's order ABBA)
python -m specdecode.cli bench -t 2 --spec-types none,auto --category qa --limit 40 --max-tokens 128 --prompts $P \
  --json-out out/r45_qa40.json
python scripts/bench_vs_llamacpp.py --llama-bin /tmp/llama.cpp-peer/src/build/bin --ours none,auto --theirs plain,ngram-mod \
  --rounds 1 --json-out out/r45_vs_llamacpp.json
python -m specdecode.cli bench-serve -t 2 --spec-types none,ngram-mod,suffix,auto --prompts scripts/data/repeated_tasks.jsonl \
  --concurrency 1,4 --requests 12 --max-tokens 128 --json-out out/r45_serve_repeated.json
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --concurrency 1,8 --requests 16 --max-tokens 96 \
  --max-num-seqs 8 --rounds 2 --prompts $P --json-out out/r45_serve_abba.json
# throwaway probes (one process, engines of each configuration over one shared target): c = 8 runs of the first 16
# Spec-Bench prompts on 8 slots among c = 1 runs of 4, the gate's windows logged (a monkeypatch of
# SpeculationGate.observe); the repeated tasks' first step per request, its forward rows counted (a wrapper of
# ModelRunner.forward), none and auto; auto against auto with the EAGLE head starting after a prefix-cache hit, on the
# first 16 Spec-Bench prompts and on the repeated tasks; auto with the head's window re-prefilled (the committed rule)
# against owed to its first feed (90aa727's rule, patched onto one engine's proposer), the repeated tasks at c = 1 (one
# at a time, 8 slots) and c = 4 (all 12 queued on 4 slots), two repetitions in turns; none against auto on the first 16
# Spec-Bench prompts one at a time on 8 slots, in turns.
# the owed window (90aa727, reverted in ce5dbf7, restored in df85362): two more repetitions of the same probe at c = 1
# (the gate's lost windows counted) and two at c = 4
python -m specdecode.cli bench-serve -t 2 --spec-types none,auto --prompts scripts/data/repeated_tasks.jsonl \
  --concurrency 1,4 --requests 12 --max-tokens 128 --rounds 2 --json-out out/r45_serve_repeated_after.json
# ---- Round 46 (AMD EPYC family 25 model 1, Zen 3: AVX2 without VNNI, 2026-12-07): a drafter's state in the host
# prompt store; bench-serve --turns. The large head's build ran in the background (nice 19, a worktree of f049b3c
# at /work/hb): stopped (SIGSTOP on build_head_large.sh and its train-head) for every measurement. ----
(cd /work/hb && PYTHONPATH=/work/hb nice -n 19 scripts/build_head_large.sh /work/hb-out)  # resumable
# throwaway probe (one process, engines over one shared target, in turns, 2 repetitions): the first 8 two-turn
# Spec-Bench prompts' first turns, then their second turns (answers from a `none` engine in the history), one at a
# time on 2 slots; `none`, `auto` with EagleProposer.stash patched to None, `auto` as committed; turn 2's tok/s.
# the server, `auto` against `auto` with the stash switched off (a wrapper patching EagleProposer.stash to None
# where spec.ngram_size_n == 4, a setting only ngram-simple reads, then calling specdecode.cli.main):
python3 /tmp/p/ab_serve.py bench-serve --spec-types "none,auto,auto(ngram_size_n=4)" --category mt_bench \
  --limit 2 --turns all --concurrency 1,4 --max-tokens 128 --rounds 2 --json-out out/r46_serve_turns_ab.json
# throwaway probe: the 16 first turns of that workload queued at once on 4 slots (spills, no store hits), none /
# auto / auto with the stash patched to None, engines over one shared target, in turns, 2 repetitions
# the cross-request drafters on the same workload, one round each (the first before the A/B above)
specdecode bench-serve --spec-types none,suffix,ngram-mod,auto --category mt_bench --limit 2 --turns all \
  --concurrency 1,4 --max-tokens 128 --json-out out/r46_serve_turns.json
specdecode bench-serve --spec-types none,suffix,ngram-mod --category mt_bench --limit 2 --turns all \
  --concurrency 1,4 --max-tokens 128 --json-out out/r46_serve_turns_drafters_run1.json
specdecode bench-serve --spec-types none,suffix,ngram-mod --category mt_bench --limit 2 --turns all \
  --concurrency 1,4 --max-tokens 128 --json-out out/r46_serve_turns_drafters.json
# ---- Round 47 (AMD EPYC family 25 model 1, Zen 3: AVX2 without VNNI, 2026-12-07): self-distilled answers'
# features recorded while generated; extract_shard as the engine runs the target; a confidence prune tried and
# dropped. The large head's build ran in the background (nice 19, the worktree at /work/hb moved to 9ada938, then
# 5cdbdc6): stopped for every measurement. ----
(cd /work/hb && PYTHONPATH=/work/hb nice -n 19 scripts/build_head_large.sh /work/hb-out)  # resumable
python3 scripts/bench_distill_features.py --prompts 16 --max-tokens 96 --reps 2
python3 scripts/head_confidence.py --limit 2 --max-tokens 128
specdecode bench --spec-types none,auto --category coding --category writing --limit 2 --max-tokens 128
# throwaway probes (engines over one shared target, prompt by prompt in rotating order, decode tok/s after the first
# token): `auto` with the confidence prune (a patch not committed) against `auto` without it and `none`, 2 prompts
# of each of 13 categories, one pass; the same with eagle3 alone on 8 categories; where a step's time goes
# (speculative_step wrapped: propose / verify / the rest, by verify rows).
# throwaway probe: load_checkpoint of the 1.5B int4 without and with the weight cache, in turns (build stopped)
# ---- Round 48 (AMD EPYC family 25 model 1, Zen 3: AVX2 without VNNI, 2026-12-07): an EAGLE-3 head's step as one
# native call; where a verify row's cost goes; Spec-Bench again. The large head's build ran in the background (nice
# 19, the worktree at /work/hb at d57b559): stopped for every measurement. ----
(cd /work/hb && PYTHONPATH=/work/hb nice -n 19 scripts/build_head_large.sh /work/hb-out)  # resumable
python3 scripts/bench_head_step.py --per-category 4   # twice
# throwaway probes: one head step in a tight loop, fused against modules (1 and 2 rows); forwards of 1 / 2 / 3 rows
# at 32 / 300 / 1200 cached tokens in turns, and `perf record` over 400 forwards of 1 and of 2 rows at 1200;
# specdecode_attention alone for 1 / 2 / 3 queries; `none` over 96 tokens at 8 / 12 / 16 / 32 rows
python3 scripts/bench_gemm_bound.py --rows 1,2,3,4 --rounds 5
P=$PWD/../shared/datasets/spec_bench/question.jsonl
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 5 --max-tokens 128 --prompts $P --json-out out/r48_sb5.json
python scripts/spec_bench_categories.py out/r48_sb5.json
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 5 --max-tokens 128 --temperature 0.7 --seed 0 \
  --prompts $P --json-out out/r48_sb5_t07.json
python scripts/spec_bench_categories.py out/r48_sb5_t07.json
# decode beside other load (OMP_WAIT_POLICY unset / ACTIVE / PASSIVE): alone (build stopped), beside the build's
# train-head (build running), beside two `nice -n 19 sh -c 'yes > /dev/null'` (build stopped); GOMP_SPINCOUNT=3000 / 30000 alone and beside the build
OMP_WAIT_POLICY=PASSIVE specdecode generate --chat "Write a binary search in Python" --spec-type none \
  --temperature 0 --max-tokens 64

# ---- Round 49 (AMD EPYC family 25 model 1, Zen 3: AVX2 without VNNI, 2026-12-08): one sequence's short verify on
# the lean fused path (LlamaModel.few_tokens); Spec-Bench again. The large head's build ran in the background
# (nice 19, the worktree at /work/hb at d57b559): stopped for every measurement. ----
(cd /work/hb && PYTHONPATH=/work/hb nice -n 19 scripts/build_head_large.sh /work/hb-out)  # resumable
for r in 2 1 3; do python scripts/ab_one_token.py --models qwen2.5-coder-1.5b-instruct --rows $r --rounds 6; done
python scripts/bench_interleaved.py --spec-types none,auto,auto:batched-verify --reps 3  # its last 16 lines kept
python scripts/bench_interleaved.py --spec-types auto,auto:batched-verify --reps 3  # void past rep 0 (auto first)
python scripts/bench_interleaved.py --spec-types none,auto,auto:batched-verify --reps 2
P=$PWD/../shared/datasets/spec_bench/question.jsonl
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 5 --max-tokens 128 --prompts $P --json-out out/r49_sb5.json
python scripts/spec_bench_categories.py out/r49_sb5.json
python -m specdecode.cli bench -t 2 --spec-types none,auto --limit 5 --max-tokens 128 --temperature 0.7 --seed 0 \
  --prompts $P --json-out out/r49_sb5_t07.json
python scripts/spec_bench_categories.py out/r49_sb5_t07.json
# throwaway probes: an `auto` step's parts per category against `none` (translation, qa; 20 prompts each, in turns
# by prompt: verify, the step's other work, the gap between steps, for steps that drafted nothing); forwards of 1-3
# rows at 100 cached tokens split into the layers' call, the LM head and the rest
