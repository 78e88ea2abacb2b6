"""Frozen configuration, layered: EngineConfig (the model and the runtime) holds a SpecConfig (the
proposer). Every default is defined once, here; CLI flags and server options read them from here."""
from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"
# Drafters; --spec-type takes one, a comma-separated list of them (the controller picks per step and
# per sequence, see speculative/chain.py), auto (every drafter available for the model) or none.
DRAFTERS = ("draft", "ngram-simple", "ngram", "ngram-mod", "suffix", "eagle3", "eagle", "draft-mtp")
SPEC_TYPES = ("auto", "none") + DRAFTERS


def spec_members(spec_type: str) -> tuple[str, ...]:
    """The drafters a --spec-type names ("a,b" -> (a, b); auto and none name none themselves)."""
    return tuple(m.strip() for m in spec_type.split(",")) if spec_type not in ("auto", "none") else ()


@dataclass(frozen=True)
class SpecConfig:
    spec_type: str = "auto"
    model_draft: str | None = None  # --model-draft: name, GGUF file or HF directory
    quant_draft: str = "auto"  # --quant-draft: the draft model's linear weights (as EngineConfig.quant)
    draft_max: int = 8  # --draft-max: cap on tokens a model drafter (draft, draft-mtp) drafts per step
    draft_min: int = 0  # --draft-min: fewer useful draft tokens than this -> do not draft
    draft_p_min: float = 0.75  # --draft-p-min: stop a greedy draft when its top probability falls below
    draft_fixed: bool = False  # --draft-fixed: always draft draft_max tokens (experiments; no cost model)
    # --no-calibration-cache: measure the target's verify costs afresh in every engine instead of starting
    # from the curve an earlier engine measured for the same model file on this machine (engine/calibration_cache.py)
    calibration_cache: bool = True
    # --spec-merge: a chain verifies a model member's draft and a draftless one's as one tree: auto (when
    # the controller finds it pays), always (whenever both have one; with --draft-fixed too), off
    spec_merge: str = "auto"
    draft_vocab: str = "auto"  # --draft-vocab: the draft model's LM head rows: auto (a head's draft vocabulary) | full
    ngram_size_n: int = 3  # --spec-ngram-size-n: tokens matched by ngram-simple
    ngram_size_m: int = 48  # --spec-ngram-size-m: most tokens ngram-simple and ngram draft (llama.cpp's size-m)
    prompt_lookup_min: int = 1  # --prompt-lookup-min: smallest n-gram tried by `ngram`
    prompt_lookup_max: int = 4  # --prompt-lookup-max: largest n-gram tried by `ngram` (tried first)
    num_steps: int = 3  # --num-steps: EAGLE tree depth
    eagle_topk: int = 1  # --eagle-topk: EAGLE branching
    num_draft_tokens: int = 4  # --num-draft-tokens: EAGLE tree nodes verified, counting the root
    head: str | None = None  # --spec-head: EAGLE head directory (default: the model's bundled head)
    ngram_mod_n_match: int = 24  # --spec-ngram-mod-n-match: tokens hashed by ngram-mod (llama.cpp's default)
    ngram_mod_n_min: int = 1  # --spec-ngram-mod-n-min: shorter ngram-mod chains are dropped
    ngram_mod_n_max: int = 64  # --spec-ngram-mod-n-max: most tokens an ngram-mod chain drafts (llama.cpp's default)
    suffix_max_tree_depth: int = 24  # --suffix-decoding-max-tree-depth (vLLM's default)
    suffix_max_cached_requests: int = 10000  # --suffix-decoding-max-cached-requests: finished outputs kept
    suffix_max_spec_factor: float = 1.0  # --suffix-decoding-max-spec-factor: draft <= factor x match length
    suffix_min_token_prob: float = 0.1  # --suffix-decoding-min-token-prob: drop less likely branches

    def __post_init__(self):
        from .errors import InvalidRequestError

        members = spec_members(self.spec_type)
        if self.spec_merge not in ("auto", "always", "off"):
            raise InvalidRequestError(f"unknown --spec-merge {self.spec_merge!r} (auto, always, off)")
        if self.draft_vocab not in ("auto", "full"):
            raise InvalidRequestError(f"unknown --draft-vocab {self.draft_vocab!r} (auto, full)")
        if self.spec_type not in ("auto", "none") and (not members or any(m not in DRAFTERS for m in members)
                                                       or len(set(members)) < len(members)):
            raise InvalidRequestError(f"unknown --spec-type {self.spec_type!r} (auto, none, one of "
                                      f"{', '.join(DRAFTERS)}, or a comma-separated list of them)")
        if self.draft_max < 0 or self.draft_min < 0 or self.draft_min > max(self.draft_max, 0):
            raise InvalidRequestError("--draft-min and --draft-max must satisfy 0 <= draft-min <= draft-max")
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise InvalidRequestError("--draft-p-min must be in [0, 1]")
        if self.ngram_size_n < 1 or not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise InvalidRequestError("n-gram sizes must satisfy 1 <= prompt-lookup-min <= prompt-lookup-max")
        if "draft" in members and not self.model_draft:
            raise InvalidRequestError("--spec-type draft needs --model-draft")
        if self.ngram_mod_n_match < 1 or self.ngram_mod_n_min < 0 or self.suffix_max_tree_depth < 1:
            raise InvalidRequestError("--spec-ngram-mod-n-match and --suffix-decoding-max-tree-depth must be >= 1")
        if self.ngram_size_m < 1 or self.ngram_mod_n_max < 1:
            raise InvalidRequestError("--spec-ngram-size-m and --spec-ngram-mod-n-max must be >= 1")

    @property
    def max_draft_tokens(self) -> int:
        """The most tokens any drafter may draft in one step under these settings (each drafter has
        its own cap: --draft-max for model drafters, the n-gram and suffix caps for draftless ones;
        a long draft pays only when it is accepted, and the controller decides from measurements)."""
        return max(self.draft_max, self.num_draft_tokens, self.ngram_size_m, self.ngram_mod_n_max,
                   self.suffix_max_tree_depth)


@dataclass(frozen=True)
class EngineConfig:
    model: str = DEFAULT_MODEL  # name, GGUF file or HF directory
    dtype: str = "auto"  # activations and float weights; auto = float32 on CPU, bfloat16 on CUDA
    quant: str = "auto"  # linear-layer weights: none | int8 | int4 | auto (closest to the GGUF's own bits)
    device: str = "auto"  # auto = cuda if available, else cpu
    max_model_len: int = 4096  # per-sequence context cap (also capped by the model's own)
    # KV-cache slots (concurrent sequences); more requests wait in a queue. A slot's memory is touched
    # only once it is used (runtime/kv_cache.py), so idle slots cost address space, not RAM.
    max_num_seqs: int = 4
    kv_cache_tokens: int | None = None  # total KV budget in tokens; None = max_num_seqs * max_model_len
    enable_prefix_caching: bool = True  # a new prompt reuses the KV of a finished one sharing its prefix
    # host memory (MiB) for the KV of cached prompts whose slot was taken by another request
    # (engine/prompt_store.py; llama.cpp's --cache-ram); 0 = keep a prompt only while its slot is free
    prompt_cache_mib: int = 2048
    prefill_chunk: int = 512  # prompt tokens per forward: bounds a long prompt's stall of running decodes
    # prompt tokens prefilled in one step while at least as many requests decode as prompts wait (SGLang's
    # --max-prefill-tokens), in the decoders' verify forward: their next token waits for those rows, so
    # this bounds the inter-token latency a joining request's prefill adds (on a 2-core CPU ~4 ms a
    # token: 32 -> ~0.13 s a step, where a 70-token prompt stalled the batch ~0.3 s and a 512-token chunk
    # ~2 s). A burst of prompts that outnumbers the decoders prefills at once. 0 = no limit, a forward per chunk
    max_prefill_tokens: int = 32
    # KV-cache element type: auto = bfloat16 for a quantized model on CPU (half the memory of float32,
    # like llama.cpp's f16 cache; its linears already compute in bfloat16 there), else the model dtype.
    kv_cache_dtype: str = "auto"
    # CPU threads of the kernels and torch; None = torch's current count capped at runtime/cpus.py's useful
    # one: a thread per physical core this process may run on, performance cores only on a hybrid CPU,
    # within its cgroup's CPU quota (no cap where OMP_NUM_THREADS or MKL_NUM_THREADS is set)
    threads: int | None = None
    # --no-weight-cache: convert a quantized GGUF's weights at every load instead of reading the converted
    # copy an earlier load saved under ~/.cache/specdecode/weights (loader/weight_cache.py)
    weight_cache: bool = True
    # runtime/attention: how queries meet the KV cache; auto = cpu-native (batch-invariant) on a CPU
    # where the native kernels build, else torch-sdpa
    attention_backend: str = "auto"
    spec: SpecConfig = field(default_factory=SpecConfig)

    def __post_init__(self):
        from .errors import InvalidRequestError

        if self.max_num_seqs < 1 or self.prefill_chunk < 1 or self.max_model_len < 2:
            raise InvalidRequestError("--max-num-seqs and --prefill-chunk must be >= 1, --ctx-size >= 2")
        if self.max_prefill_tokens < 0:
            raise InvalidRequestError("--max-prefill-tokens must be >= 0 (0: no limit)")


@dataclass(frozen=True)
class ReplicaConfig:
    """``specdecode serve --replicas N``: engine replicas on Ray Serve behind one endpoint (server/replicas.py)."""
    replicas: int | None = None  # --replicas: engine replicas; None = the single-process server (no Ray)
    ray_address: str | None = None  # --ray-address: join this Ray cluster (auto, HOST:PORT); None = a local one
    replica_cpus: float = 1.0  # --replica-cpus: CPUs Ray reserves per replica (its torch threads unless --threads)
    replica_gpus: float = 0.0  # --replica-gpus: GPUs per replica (1 on a GPU node: one engine per GPU)
    # --replica-max-imbalance: a request follows its prompt's prefix to the replica that served it, unless
    # that replica has more than this many requests in flight beyond the least busy one; None = --max-num-seqs
    max_imbalance: int | None = None

    def __post_init__(self):
        from .errors import InvalidRequestError

        if self.replicas is None:
            if self.ray_address is not None:
                raise InvalidRequestError("--ray-address needs --replicas N")
            return
        if self.replicas < 1 or self.replica_cpus < 0 or self.replica_gpus < 0:
            raise InvalidRequestError("--replicas must be >= 1, --replica-cpus and --replica-gpus >= 0")
        if self.max_imbalance is not None and self.max_imbalance < 0:
            raise InvalidRequestError("--replica-max-imbalance must be >= 0")

    def imbalance(self, max_num_seqs: int) -> int:
        return max_num_seqs if self.max_imbalance is None else self.max_imbalance


@dataclass(frozen=True)
class ServerConfig:
    """``specdecode serve``'s own settings (the engine's are EngineConfig's)."""
    host: str = "127.0.0.1"  # --host: this machine only
    port: int = 8000  # --port
    shutdown_timeout: float = 30.0  # --shutdown-timeout: seconds in-flight requests get on SIGINT/SIGTERM
    # --max-queue: requests that may wait for a KV slot besides the --max-num-seqs running ones; more
    # are refused at once (429, Retry-After) rather than queued without end
    max_queue: int = 64
    queue_timeout: float = 300.0  # --queue-timeout: seconds a request may wait for a slot, then 503 (0: no limit)
    max_body_bytes: int = 8 * 2**20  # a larger request body is refused (413) before it is read whole
    # --allowed-hosts: the Host names served ('*': any). None: this machine's names when --host is a
    # loopback address and there is no --api-key (a web page cannot reach it by DNS rebinding), else any
    allowed_hosts: tuple[str, ...] | None = None

    def __post_init__(self):
        from .errors import InvalidRequestError

        if self.max_queue < 0 or self.queue_timeout < 0 or self.shutdown_timeout < 0:
            raise InvalidRequestError("--max-queue, --queue-timeout and --shutdown-timeout must be >= 0")
        if not 0 <= self.port < 65536 or self.max_body_bytes < 1:
            raise InvalidRequestError("--port must be in [0, 65535]")
        if self.allowed_hosts is not None and not all(h.strip() for h in self.allowed_hosts):
            raise InvalidRequestError("--allowed-hosts takes comma-separated host names (or '*')")
