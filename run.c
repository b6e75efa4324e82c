/* run.c: inference for Llama-architecture models, about rotary position embeddings.

   One file, read top to bottom in the order of one token's trip: the model first,
   then the machinery a learner may skip.
     The model: the config and weights (plain structs); rotary position embeddings
     (RoPE and p-RoPE: the frequencies, the rotation and its tables); the forward
     pass, in the plain form that reads like the equations, top-down: forward_block
     first (prototypes above it name its steps), then the steps in the order it
     calls them; the scaling rules past the training length; moving the KV cache
     by RoPE's relative property; the sampler. Every other name waits for its
     first use: the errors before the cache shift, the file formats' numbers and
     the limits before the loading code.
     The machinery: loading and validating the checkpoint formats; sizing and
     allocating the run state; the BPE tokenizer (SentencePiece's, as in llama2.c,
     and the byte-level BPE of GPT-2, Llama 3, Qwen and SmolLM2); the programs
     built from them (generate, tokenize, perplexity, inspect, chat); "Making it
     fast" (SIMD kernels, prefill tiles, threads, memory), each piece a refinement
     of a plain function above that computes the same bits (RUN_PLAIN=1 runs
     without them); -m rope; the command line. The README's "Reading run.c" is a
     map, and docs/reading.md the full one.

   RoPE (Su et al., RoFormer, 2021) rotates each pair i of query/key dimensions by
   the angle pos * theta^(-2i/head_size), so that q_m . k_n depends on m - n only.
   p-RoPE (Barbero et al., "Round and Round We Go!", ICLR 2025) keeps only the first
   rope_angles = floor(p * head_size / 2) pairs, the highest frequencies, and leaves
   the rest unrotated. The README's chapter "How RoPE works, in this code" walks
   through the equations and names the functions here that implement them.

   Dependencies: libc and libm; OpenMP when the compiler has it. No other library.
   Compiled with -DRUN_TESTING the CLI is left out, so tests can #include "run.c". */

#define _GNU_SOURCE // sched_setaffinity and CPU_SET (Linux), to pin threads
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

// ----------------------------------------------------------------------------
// Transformer model: config and weights

// The RoPE scaling rules, numbered as the ROPE header stores them.
typedef enum {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR = 1,
    ROPE_SCALING_NTK = 2,
    ROPE_SCALING_YARN = 3,
    ROPE_SCALING_LLAMA3 = 4,
    ROPE_SCALING_LONGROPE = 5 // version 2 only: its per-pair factors are a tensor of the file
} RopeScaling;

// How the matrices and the token embedding are stored (the ROPE header's
// weight_type): float32, or a type that widens to float32 exactly. bf16 is the top
// half of a float32 (8 exponent bits, 7 fraction bits); f16 is IEEE half precision
// (5 exponent bits, 10 fraction bits). The others are GGUF's blocks, byte for byte:
// a run of 32 (or 256, the K-quants) weights along a row stored as small integers q
// and one or two f16 scales, each weight widened by the equation beside its type
// (section "Widening the weights" below; docs/format.md gives the bytes):
//   q8_0  d * q                 q int8                        32 weights in 34 bytes
//   q4_0  d * (q - 8)           q 4 bits                      32 in 18
//   q4_1  d * q + m             q 4 bits                      32 in 20
//   q5_0  d * (q - 16)          q 5 bits                      32 in 22
//   q5_1  d * q + m             q 5 bits                      32 in 24
//   q4_k  (d*sc) * q - dmin*m   q 4 bits, sc and m 6 bits     256 in 144 (8 sub-blocks of 32)
//   q5_k  (d*sc) * q - dmin*m   q 5 bits, sc and m 6 bits     256 in 176
//   q6_k  (d*sc) * (q - 32)     q 6 bits, sc int8             256 in 210 (16 sub-blocks of 16)
// Every product is exact in float32 (an f16 scale has 11 significant bits), so a
// weight is rounded at most once (q4_1, q5_1, q4_k, q5_k: the sum), exactly as
// llama.cpp's dequantize_row_* rounds it. The norms are always float32, and all
// arithmetic is float32: a file of any of these types computes what the float32
// file holding its widened weights computes, from fewer bytes. A file with a type
// table (weight_type 4, which is no type itself) gives each matrix piece its own.
typedef enum {
    WEIGHT_F32 = 0,
    WEIGHT_BF16 = 1,
    WEIGHT_F16 = 2,
    WEIGHT_Q8_0 = 3,
    WEIGHT_Q4_0 = 5,
    WEIGHT_Q4_1 = 6,
    WEIGHT_Q5_0 = 7,
    WEIGHT_Q5_1 = 8,
    WEIGHT_Q4_K = 9,
    WEIGHT_Q5_K = 10,
    WEIGHT_Q6_K = 11
} WeightType;
#define N_WEIGHT_TYPES 12
#define Q8_0_BLOCK 32       // weights in a Q8_0 block
#define Q8_0_BLOCK_BYTES 34 // its f16 scale and 32 int8 values

// Each type's block: how many weights, in how many bytes (a float type: one weight;
// 4: no type, a zero). A block type's rows are whole blocks (check_block_rows).
typedef struct {
    int weights, bytes;
} BlockShape;
static const BlockShape block_shapes[N_WEIGHT_TYPES] = {{1, 4},   {1, 2},   {1, 2},   {32, 34},  {0, 0},    {32, 18},
                                                        {32, 20}, {32, 22}, {32, 24}, {256, 144}, {256, 176}, {256, 210}};

static int is_block_type(WeightType type) { return block_shapes[type].weights > 1; }

// The bytes before element i of weights stored as `type`. A block matrix is only ever
// entered at the start of a row, a whole number of blocks (check_block_rows): i /
// weights whole blocks (a part of a block is added only to aim prefetch hints inside one).
static uint64_t weight_bytes(WeightType type, uint64_t i) {
    uint64_t weights = (uint64_t)block_shapes[type].weights, bytes = (uint64_t)block_shapes[type].bytes;
    return i / weights * bytes + i % weights * bytes / weights;
}

// The feed-forward's gate (ROPE version 2's activation field): SwiGLU, silu(gate) * up
// (Llama, Mistral, Qwen, SmolLM3, Phi), or GeGLU with the tanh GELU, gelu(gate) * up
// (Gemma's three generations).
typedef enum { ACTIVATION_SWIGLU = 0, ACTIVATION_GEGLU_TANH = 1 } Activation;

// How a mixture of experts weighs the k experts it picks for a token (header byte
// 212), from the router's logits r (one per expert):
//   p = softmax(r) over all the experts, the k largest p chosen, then
//   ROUTING_SOFTMAX_TOPK_NORM  weights p_j / sum of the chosen p (Mixtral; Qwen3-MoE
//                              with norm_topk_prob, as Qwen3-30B-A3B)
//   ROUTING_SOFTMAX_TOPK       weights p_j as they are (Qwen3-MoE without it)
//   ROUTING_GEMMA4             Gemma 4 26B-A4B: renormalized, then times a learned
//                              per-expert scale; the router reads the residual stream
//                              through a weightless RMSNorm, a learned scale and
//                              dim^-1/2, and the experts run beside the layer's
//                              feed-forward (mixture_of_experts says how)
typedef enum { ROUTING_SOFTMAX_TOPK_NORM = 1, ROUTING_SOFTMAX_TOPK = 2, ROUTING_GEMMA4 = 3 } Routing;

// Sanity limits on two header fields (the others with the file's numbers, before
// "Loading a checkpoint"): far above any real model, low enough that no product of
// them overflows 64 bits. Config's layers and the RoPE tables' pairs are sized by them.
#define MAX_DIM (1 << 16)
#define MAX_LAYERS 1024
// a type table's entries at most: the embedding, 7 matrices per layer, the classifier,
// Gemma 4's 2 + 2 per layer, 4 per layer with experts
#define MAX_PIECES (4 + 13 * MAX_LAYERS)

// The per-layer table's rotary choice: no rotation (NoPE), or one of the two settings.
#define LAYER_NOPE 0
#define LAYER_ROPE_FIRST 1
#define LAYER_ROPE_SECOND 2

// One layer's shape and wiring, filled at load (the header's values, or the per-layer
// table's) and read where each property acts. Llama's layers are all alike; Gemma 3's
// and Mistral's differ in rope and window, Gemma 4's in every field.
typedef struct {
    int rope;            // LAYER_NOPE, LAYER_ROPE_FIRST or LAYER_ROPE_SECOND
    int window;          // 0: full attention; W: the W latest keys, the current one included
    int head_size;       // width of one head (Gemma 4: 512 on full layers, 256 on sliding ones)
    int n_kv_heads;      // key/value heads (Gemma 4 31B: 4 on full layers, 16 on sliding ones)
    int hidden_dim;      // feed-forward width (Gemma 4 E2B: twice on its KV-shared layers)
    int kv_source;       // the layer whose KV cache it attends over: itself, or (Gemma 4's KV
                         // sharing) an earlier layer of its kind; then it computes no k, v
    int values_are_keys; // Gemma 4 31B's full layers: no wv, v = the key projection before k_norm and RoPE
    int experts;         // 1: a mixture of experts in place of the feed-forward (hidden_dim 0), or beside it
                         // (Gemma 4: ROUTING_GEMMA4); 0: the feed-forward alone
    // where its pieces start in the layered tensors (docs/format.md: the layers' pieces back
    // to back), in rows of dim (q, kv, v, hidden) or in floats (heads, k_heads)
    uint64_t q_before, kv_before, v_before, hidden_before, heads_before, k_heads_before;
    uint64_t sparse_before; // the layers with experts before this one (their pieces in the expert tensors)
    // its KV cache (place_kv_caches, for the context in use): the positions it holds
    // (seq_len, or a sliding layer's ring) and where it starts, in floats
    int cache_positions;
    uint64_t cache_before;
} LayerSpec;

// A RoPE setting: the frequencies' base and fraction, and the rule for positions past
// the trained length (RoPE section, "Past the training length"); a rule's parameter
// stored as 0 takes the rule's default. Config holds one per kind of rotary layer.
typedef struct {
    float theta;            // base wavelength theta of the rotary frequencies
    float fraction;         // p: the fraction of rotary pairs that rotate (p-RoPE)
    int head_size;          // the head size its frequencies are counted over (its layers'); 0: head_size_of
    RopeScaling scaling;    // none, linear, ntk, yarn, llama3, longrope
    float factor;           // the rule's factor s, >= 1 (1: none)
    int original_len;       // the trained context length the rule is relative to
    float yarn_beta_fast;   // yarn: pairs turning more often than this over it are kept (32)
    float yarn_beta_slow;   // yarn: pairs turning less often than this are interpolated (1)
    float attention_factor; // cos and sin are multiplied by it (yarn: 0.1 ln s + 1; else 1)
    float llama3_low_freq_factor;  // llama3: wavelengths above original / this are interpolated (1)
    float llama3_high_freq_factor; // llama3: wavelengths below original / this are kept (4)
    const float *longrope_factors; // longrope: (2, rope_angles) short then long, from the file (NULL until mapped)
    int longrope_pairs;            // the pairs those factors are for: the file's rope_angles
} RopeSetting;

typedef struct {
    int dim;               // transformer width
    int hidden_dim;        // feed-forward width
    int n_layers;          // number of layers
    int n_heads;           // number of query heads
    int n_kv_heads;        // number of key/value heads (< n_heads: grouped-query attention)
    int vocab_size;        // vocabulary size
    int seq_len;           // positions in the context in use: the header's seq_len until main sets it
    int shared_classifier; // 1: the classifier reuses the token embedding
    int version;           // the header's version: ROPE 1 or 2, llama2.c v1 1, legacy 0
    WeightType weight_type; // the matrices' and the embedding's type (f32 but in ROPE version 2;
                            // unused with a type table)
    float norm_eps;        // RMSNorm epsilon
    // the RoPE settings, indexed by a layer's rope (LayerSpec): rope[LAYER_ROPE_FIRST]
    // every model's, rope[LAYER_ROPE_SECOND] Gemma 3's and 4's local layers' (theta 0
    // when the file has none), rope[LAYER_NOPE] all 0: no pair rotates
    RopeSetting rope[3];
    // ROPE version 2's block options (docs/format.md); 0 everywhere is the Llama block
    int head_size;              // width of one head; 0: dim / n_heads (head_size_of)
    int qkv_bias, qk_norm, post_norms, v_norm, layer_scalars; // the flags' bits, one int each
    int per_layer_dim;          // P: each layer's slice of the per-layer inputs (Gemma 4); 0: none
    float per_layer_multiplier; // the per-layer embedding row times it (sqrt(P) in the model's dtype)
    Activation activation;      // the feed-forward's gate
    float embedding_multiplier; // x = embedding row * it (Gemma: sqrt(dim)); 0: 1
    float attention_scale;      // scores = q.k * it; 0: 1 / sqrt(head_size)
    float attention_softcap;    // scores -> cap tanh(scores / cap) (Gemma 2); 0: none
    float final_softcap;        // logits -> cap tanh(logits / cap) (Gemma 2); 0: none
    // a mixture of experts (block flag 64; Qwen3-MoE, Mixtral): 0 everywhere without
    int n_experts;      // experts per layer (Qwen3-30B-A3B: 128; Mixtral: 8)
    int n_experts_used; // k, the experts a token uses (8; 2)
    int expert_hidden;  // each expert's feed-forward width (768; 14336)
    Routing routing;    // how the k experts are weighed
    uint64_t layer_table_offset, layer_table_bytes; // the per-layer table in the file; 0: none
    // ROPE version 2's weight_type 4: a type table in the file gives each matrix piece its
    // own type (piece_type, in file order: map_weights); 0 and 0: none, all weight_type
    uint64_t type_table_offset, type_table_bytes;
    unsigned char piece_type[MAX_PIECES];
    // per layer (from the table; without one, every layer as the header says, first setting, full)
    LayerSpec layer[MAX_LAYERS];
    // the layered tensors' totals over the layers (q_before etc. of a layer past the last)
    uint64_t q_rows, kv_rows, v_rows, hidden_rows, heads_floats, k_heads_floats;
    uint64_t sparse_layers; // the layers with experts
    int max_head_size, max_q_dim, max_kv_dim, max_hidden; // the widest layer's, for the run state
    int max_cache_positions; // the longest layer cache (place_kv_caches): a row of scores per token and head
} Config;

// A weight matrix as the file stores it: elements of `type`, row-major, from data
// on. matrix_at(m, i) is the same matrix from element i on (a layer, a row).
typedef struct {
    const void *data;
    WeightType type;
} Matrix;

static Matrix matrix_at(Matrix m, size_t i) {
    return (Matrix){(const char *)m.data + weight_bytes(m.type, i), m.type};
}
static Matrix f32_matrix(const float *p) { return (Matrix){p, WEIGHT_F32}; }

// One layer's matrices, each with its own type (a file with a type table may store
// them in different types; map_weights points them into the file). Data NULL: the
// layer has no such matrix (Gemma 4's KV-shared layers have no wk, wv; only a layer
// with experts has a router and experts).
typedef struct {
    Matrix wq;             // (n_heads * head_size, dim)
    Matrix wk;             // (n_kv_heads * head_size, dim)
    Matrix wv;             // (n_kv_heads * head_size, dim)
    Matrix wo;             // (dim, n_heads * head_size)
    Matrix w1;             // (hidden_dim, dim) gate
    Matrix w2;             // (dim, hidden_dim) down
    Matrix w3;             // (hidden_dim, dim) up
    Matrix per_layer_gate; // Gemma 4 E2B, E4B: (P, dim)
    Matrix per_layer_out;  // (dim, P)
    Matrix router;         // a mixture of experts: (n_experts, dim), one logit per expert
    Matrix expert_w1;      // (n_experts, expert_hidden, dim) gate
    Matrix expert_w2;      // (n_experts, dim, expert_hidden) down
    Matrix expert_w3;      // (n_experts, expert_hidden, dim) up
} LayerWeights;

typedef struct {
    Matrix token_embedding;   // (vocab_size, dim)
    const float *rms_att;     // (layer, dim) RMSNorm weights before attention
    const float *rms_ffn;     // (layer, dim) RMSNorm weights before the feed-forward
    LayerWeights layer[MAX_LAYERS]; // each layer's matrices
    const float *rms_final;   // (dim,)
    Matrix wcls;              // (vocab_size, dim) classifier
    // version 2's optional tensors (float32), NULL when the block has none
    const float *bq, *bk, *bv;              // (layer, n_heads * head_size), (layer, kv_dim) x 2: biases
    const float *q_norm, *k_norm;           // (layer, head_size): the per-head RMSNorms' weights
    const float *rms_post_att, *rms_post_ffn; // (layer, dim): the post-attention and post-feed-forward norms
    const float *rope_factors;              // (2, rope_angles): longrope's short, then long factors
    // Gemma 4's (block flags 4 and 5)
    const float *layer_scalars;             // (layer,): multiplies the residual stream after the layer
    Matrix per_layer_embedding;             // (vocab_size, layer * P)
    Matrix per_layer_in;                    // (layer * P, dim): the embedding's projection onto the slices
    const float *per_layer_in_norm;         // (P,)
    const float *rms_per_layer;             // (layer, dim)
    // Gemma 4 26B-A4B's vectors for its experts (ROUTING_GEMMA4), per sparse layer (the
    // experts' matrices, as every layer's, are in LayerWeights)
    const float *router_scale;              // (sparse layer, dim): the router's input times it
    const float *expert_scale;              // (sparse layer, n_experts): a chosen expert's weight times it
    const float *rms_pre_experts;           // (sparse layer, dim): the norm before the experts
    const float *rms_post_dense, *rms_post_experts; // (sparse layer, dim): the norms of the two branches' outputs
} TransformerWeights;

// Accumulators for -m inspect: how much of each head's signal lives at each rotary
// frequency, and where its attention goes. NULL when not inspecting.
typedef struct {
    double *q_norm;   // (layer, n_heads, head_size/2) sum over positions of |q chunk i|
    double *k_norm;   // (layer, n_heads, head_size/2) same for the key head it reads
    double *attn;     // (layer, n_heads, 3) sum over positions of weight on BOS, current, previous
    long positions;   // positions summed into q_norm, k_norm
    long attn_positions; // positions (pos >= 1) summed into attn
} InspectStats;

// The prompt is processed PREFILL_BLOCK tokens at a time (matrix-matrix products);
// decoding is the same code with a block of one token. Each block streams the
// weights from memory once, so larger blocks read less per token, up to where the
// block's activations no longer fit in the caches (docs/performance.md).
#define PREFILL_BLOCK 128

typedef struct {
    // activations for a block of up to PREFILL_BLOCK tokens, one row per token
    float *x;      // (block, dim) the residual stream
    float *xb;     // (block, dim) normalized input / attention output
    float *xb2;    // (block, dim) output of wo, w2
    float *hb;     // (block, hidden_dim) gate activations
    float *hb2;    // (block, hidden_dim) up activations
    float *q;      // (block, dim) queries
    float *k;      // (block, kv_dim) keys, written into the cache
    float *v;      // (block, kv_dim) values, written into the cache
    float *att;    // (block, n_heads, max_cache_positions) attention scores, by cache slot
    float *logits; // (block, vocab_size)
    float *scratch; // (block, max(dim, hidden_dim)) for matmul_tiled
    float *pl;      // (block, n_layers x P) Gemma 4's per-layer inputs; NULL without
    float *plb;     // (block, P) a layer's gated slice
    float *router_logits; // (block, n_experts) a mixture of experts' router; NULL without
    int *chosen;          // (block, k) the experts each token uses, best first
    float *chosen_weight; // (block, k) their weights
    float *expert_out;    // (block, k, dim) each chosen expert's output
    float *expert_x;      // (block, dim) the tokens one expert serves, gathered
    float *expert_in;     // (block, dim) the experts' input (Gemma 4: its own norm of x; else xb)
    float *dense_out;     // (block, dim) Gemma 4: the feed-forward's output, beside the experts' one
    float *q_head;  // (n_heads, block, head_size) a block's queries, head by head
    float *q_pairs; // (n_heads, block, head_size) the same, packed for matmul_tile
    // the KV cache, each head's positions side by side: attention reads one head's
    // keys (and values) for positions 0..pos as one contiguous run, which the
    // hardware prefetchers stream (a (pos, kv_dim) layout makes it a strided walk);
    // a sliding layer's ring holds its window's positions (kv_positions_of)
    float *key_cache;   // (layer, n_kv_heads, cache_positions, head_size)
    float *value_cache; // (layer, n_kv_heads, cache_positions, head_size)
    // RoPE tables, computed once: cos/sin of pos * frequency(i) for each rotated pair,
    // one pair of tables per setting, indexed as Config's rope (NULL for LAYER_NOPE, and
    // for the second setting when the file has none)
    float *rope_cos[3]; // (seq_len, the setting's rope_angles)
    float *rope_sin[3];
    InspectStats *inspect;
} RunState;

// The file formats run reads ("Loading a checkpoint"): llama2.c's two and ours.
typedef enum { FORMAT_LLAMA2C_LEGACY, FORMAT_LLAMA2C_V1, FORMAT_ROPE } CheckpointFormat;

// A section of the checkpoint file: its offset and length in bytes.
typedef struct {
    uint64_t offset, bytes;
} SectionSpan;

typedef struct {
    Config config;
    CheckpointFormat format;
    TransformerWeights weights;
    RunState state;
    void *mapped;     // the memory-mapped checkpoint
    size_t file_size; // its size in bytes
    SectionSpan tokenizer; // ROPE version 2: where the file's own tokenizer is (bytes 0: none)
} Transformer;

static int head_size_of(const Config *c) { return c->head_size ? c->head_size : c->dim / c->n_heads; }

// Where position pos of key/value head kvh of layer l is in the KV cache: its slot
// pos mod cache_positions (pos itself but on a sliding layer's ring) of layer l's
// own cache, or of the cache of the layer it shares (kv_source).
static size_t kv_cache_offset(const Config *c, int l, int kvh, int pos) {
    const LayerSpec *ls = &c->layer[l];
    int positions = ls->cache_positions, slot = pos < positions ? pos : pos % positions;
    return ls->cache_before + ((size_t)kvh * positions + slot) * ls->head_size;
}

static int has_second_rope(const Config *c) { return c->rope[LAYER_ROPE_SECOND].theta != 0.0f; }

// The head size RoPE setting `which` counts its frequencies over: its layers' (Gemma
// 4's second setting 256, against the first's 512), else the model's.
static int rope_head_size(const Config *c, int which) {
    return c->rope[which].head_size ? c->rope[which].head_size : head_size_of(c);
}

// rope_angles = floor(p * head_size / 2): the number of rotary pairs that rotate under
// RoPE setting `which` (0 on a NoPE layer, whose setting has p = 0).
// p is stored as float32, so 0.7 arrives as 0.699999988 and 0.7 * 20 / 2 as
// 6.99999988, which would floor to 6. Float32 is off by at most 6e-8 relative,
// i.e. 3e-5 of a pair for a head size of 1024, so adding 1e-4 of a pair before
// the floor gives the count Python's int(p * d // 2) gives for the decimal p.
static int rope_angles_of(const Config *c, int which) {
    int pairs = rope_head_size(c, which) / 2, n = (int)floor((double)c->rope[which].fraction * pairs + 1e-4);
    return n < pairs ? n : pairs;
}

// ----------------------------------------------------------------------------
// Rotary position embeddings (RoPE and p-RoPE)
//
// Pair i of a head is the two dims (2i, 2i+1) (llama2.c's adjacent layout). At
// position pos it is rotated by the angle pos * omega_i, where
//     omega_i = theta^(-2i / head_size),       i = 0 .. head_size/2 - 1
// is the angular frequency: i = 0 turns fastest (one radian per token), the last
// pairs slowest (a scaling rule, after the forward pass, may change them). The
// rotation is the 2x2 block of RoFormer's R(theta, m):
//     [x'_2i  ]   [cos a  -sin a] [x_2i  ]
//     [x'_2i+1] = [sin a   cos a] [x_2i+1],   a = pos * omega_i.
// p-RoPE rotates only pairs i < rope_angles = floor(p * head_size / 2), with the
// same omega_i as full RoPE; the others keep their values (an infinite wavelength).
// We loop over the rotated pairs only: the paper's pos / infinity is never computed.

// Every function below takes the model's Config and `which` of its RoPE settings
// (c->rope[which]: LAYER_ROPE_FIRST, or LAYER_ROPE_SECOND for Gemma 3's and 4's local
// layers), each setting with its own theta, p, head size and scaling rule.

// The unscaled frequency theta^(-2i/head_size), computed in float exactly as llama2.c
// does, so that its outputs match ours.
static float rope_base_frequency(const Config *c, int which, int i) {
    return 1.0f / powf(c->rope[which].theta, (float)(2 * i) / (float)rope_head_size(c, which));
}

// The scaling rules, after the forward pass ("Past the training length"), give each
// pair its frequency and the attention factor; with no rule they are
// rope_base_frequency and 1.
static float rope_frequency(const Config *c, int which, int i);
static float rope_attention_factor(const Config *c, int which);

// The plain version: rotates one head vector at position pos, computing the angles
// on the spot. The tests check it against the explicit matrix R(theta, m), and the
// table-driven rope_apply below (what the forward pass uses) against it.
__attribute__((unused)) static void rope_rotate_head(float *vec, const Config *c, int which, int pos) {
    int rope_angles = rope_angles_of(c, which);
    float factor = rope_attention_factor(c, which);
    for (int i = 0; i < rope_angles; i++) {
        float angle = pos * rope_frequency(c, which, i);
        float cos_a = cosf(angle) * factor, sin_a = sinf(angle) * factor;
        float x0 = vec[2 * i], x1 = vec[2 * i + 1];
        vec[2 * i] = x0 * cos_a - x1 * sin_a;
        vec[2 * i + 1] = x0 * sin_a + x1 * cos_a;
    }
}

// The refinement used in the forward pass: cos and sin of every (pos, pair) are
// computed once per run into tables (seq_len x rope_angles), since the same angles
// recur for every layer, head and token. Both carry the attention factor.
static void rope_build_tables(float *cos_table, float *sin_table, const Config *c, int which) {
    int rope_angles = rope_angles_of(c, which);
    float factor = rope_attention_factor(c, which), omega[MAX_DIM / 2];
    for (int i = 0; i < rope_angles; i++) omega[i] = rope_frequency(c, which, i);
    for (int pos = 0; pos < c->seq_len; pos++) {
        for (int i = 0; i < rope_angles; i++) {
            float angle = pos * omega[i];
            cos_table[(size_t)pos * rope_angles + i] = cosf(angle) * factor;
            sin_table[(size_t)pos * rope_angles + i] = sinf(angle) * factor;
        }
    }
}

// Rotates n_heads consecutive head vectors at one position, from the tables.
static void rope_apply(float *vec, int n_heads, int head_size, int rope_angles, const float *cos_pos,
                       const float *sin_pos) {
    for (int h = 0; h < n_heads; h++) {
        float *head = vec + h * head_size;
        for (int i = 0; i < rope_angles; i++) {
            float x0 = head[2 * i], x1 = head[2 * i + 1];
            head[2 * i] = x0 * cos_pos[i] - x1 * sin_pos[i];
            head[2 * i + 1] = x0 * sin_pos[i] + x1 * cos_pos[i];
        }
    }
}

// ----------------------------------------------------------------------------
// The forward pass: the dynamics of the Transformer
//
// Written in its plain form, the one to check against the equations. Where a loop
// has a faster version (SIMD, several rows at a time, tiles, threads), the plain
// function calls it when use_fast_kernels is set; the fast versions live together in
// the section "Making it fast" near the end, and each computes exactly the same sums,
// bit for bit (tests/test_rope.c compares them). Setting use_fast_kernels to 0
// runs the plain loops alone: RUN_PLAIN=1 ./run ... does, so that a debugger steps
// through the loops below and never into "Making it fast" (tests/test_plain_run.py).
// make debug builds run-debug with -DRUN_PLAIN, which starts with use_fast_kernels at 0.

#ifdef RUN_PLAIN
static int use_fast_kernels = 0;
#else
static int use_fast_kernels = 1;
#endif

// One matrix of several that multiply the same input: xout = W x, W of d rows.
typedef struct {
    float *xout;
    Matrix w;
    int d;
} Projection;

// Which logits forward_block computes: the classifier reads vocab_size x dim
// weights, as much as all the layers of a small model, so a prompt's blocks skip it
// but for the last token of the last block.
typedef enum { LOGITS_LAST = 0, LOGITS_ALL = 1, LOGITS_NONE = 2 } LogitsWanted;

// The steps forward_block calls, defined after it (read_order_layer_begins and _ends
// in "Making it fast", inspect's in "Inspect").
static void embedding_row(float *out, Matrix embedding, int token, int dim);
static void per_layer_inputs(Transformer *t, const int *tokens, int B);
static void rmsnorm(float *o, const float *x, const float *weight, int size, float eps);
static void matmuls(RunState *s, const float *x, const Projection *p, int n_proj, int B, int n);
static void attention(Transformer *t, int l, int B, int pos0);
static void matmul_tokens(RunState *s, float *xout, const float *x, Matrix w, int B, int n, int d);
static void feed_forward(const Config *c, RunState *s, const float *x, float *out, Matrix w1, Matrix w3, Matrix w2,
                         int hidden, int n);
static void mixture_of_experts(Transformer *t, int l, int B, const float *in);
static void experts_beside_feed_forward(Transformer *t, int l, int B);
static void add_per_layer_input(Transformer *t, int l, int B);
static void softcap(float *x, long n, float cap);
static void read_order_layer_begins(void);
static void read_order_layer_ends(void);
static void inspect_record_chunks(InspectStats *st, const Transformer *t, int layer, const float *q, const float *k,
                                  int pos);
static void inspect_count_positions(InspectStats *st, int B, int pos0);

// The forward pass for a block of B tokens at positions pos0 .. pos0+B-1 (B <=
// PREFILL_BLOCK, pos0 + B <= seq_len). A decoding step is the case B = 1: read it
// with B = 1 and every "for b" loop runs once. Fills the KV cache at those
// positions. Returns the logits, one row of vocab_size per token (LOGITS_ALL), only
// the last token's (LOGITS_LAST), or none (LOGITS_NONE: NULL).
//
// The Llama block is the spine: embed; per layer rmsnorm, q k v, RoPE, attention,
// Wo, residual; rmsnorm, SwiGLU feed-forward, residual; final rmsnorm, classifier.
// Every other family is a switch on it, read from the file's header, and each acts
// in one place:
//   at load, in the RoPE tables  each RoPE setting's theta and scaling rule, longrope
//     (build_run_state)            (Phi-3 128k, Phi-4-mini) included: rope_frequency
//                                  gives pair i its omega_i (longrope: divided by the
//                                  file's factor for the pair), rope_build_tables the
//                                  cos and sin of every position, which layers only read
//   here                         embedding_multiplier (Gemma: x * sqrt(dim))
//                                per_layer_dim (Gemma 4 E2B, E4B): per_layer_inputs,
//                                  add_per_layer_input
//                                qkv_bias (Qwen2), qk_norm (Qwen3, Gemma 3, 4), v_norm
//                                layer[l].rope: the setting whose tables turn q and k,
//                                  p-RoPE's rope_angles pairs (every model: all pairs
//                                  for full RoPE; Gemma 4's full layers 64 of 256),
//                                  none on NoPE layers (SmolLM3), the second setting
//                                  on Gemma 3's and 4's sliding layers
//                                layer[l]'s head_size, n_kv_heads, hidden_dim (Gemma 4:
//                                  each layer its own), kv_source (Gemma 4's KV
//                                  sharing: no k, v of its own), values_are_keys
//                                  (Gemma 4 31B: k = v)
//                                layer[l].window's ring: k and v go to the slot pos mod
//                                  cache_positions (kv_cache_offset): a sliding layer's
//                                  cache is a ring of W + PREFILL_BLOCK - 1 positions
//                                  (kv_positions_of), a full layer's holds seq_len
//                                post_norms (Gemma 2, 3, 4), layer_scalars (Gemma 4)
//                                layer[l].experts: a mixture of experts for the
//                                  feed-forward (Qwen3-MoE, Mixtral), or beside it
//                                  (Gemma 4 26B-A4B)
//                                final_softcap (Gemma 2, 4)
//   one down: feed_forward       activation: SwiGLU, or GeGLU (Gemma)
//   one down: mixture_of_experts routing: the router's rule (route_tokens, route_token;
//                                  Gemma 4's own input and per-expert scales)
//   two down: attention_head     layer[l].window: a sliding layer's keys first_visible ..
//     (attention -> it)            pos (Mistral, Phi-3, Gemma 2's, 3's and 4's local
//                                  layers), read from its ring as one or two runs of
//                                  slots (slot_runs)
//                                attention_scale (Gemma 2, 3; Gemma 4: 1)
//                                attention_softcap (Gemma 2)
//   export.py, before the file   Gemma 1-3's norm x * (1 + w): 1 + w is stored;
//                                Phi-3's fused qkv and gate_up split in three and two;
//                                Hugging Face's rotate_half pairs (i, i + d/2) permuted
//                                  into adjacent pairs (2i, 2i+1) in Wq and Wk rows
//                                  (and Wo's columns where the values are the keys);
//                                GPT-NeoX's partial_rotary_factor f as p-RoPE with
//                                  theta' = theta^(1/f)
static float *forward_block(Transformer *t, const int *tokens, int B, int pos0, LogitsWanted wanted) {
    const Config *c = &t->config;
    const TransformerWeights *w = &t->weights;
    RunState *s = &t->state;
    int dim = c->dim;
    float eps = c->norm_eps;

    // the token embeddings: x[b] = embedding[token b], widened to float32
    for (int b = 0; b < B; b++) embedding_row(s->x + (size_t)b * dim, w->token_embedding, tokens[b], dim);
    if (c->embedding_multiplier != 0.0f) // Gemma: x = embedding * sqrt(dim) (the file stores it as rounded)
        for (size_t i = 0; i < (size_t)B * dim; i++) s->x[i] *= c->embedding_multiplier;
    if (c->per_layer_dim) per_layer_inputs(t, tokens, B); // Gemma 4 E2B, E4B: each layer's slice, from x

    for (int l = 0; l < c->n_layers; l++) {
        if (B == 1 && use_fast_kernels) read_order_layer_begins(); // decode's reading-order trial ("Making it fast", 5)
        // this layer's shape: all layers alike but in Gemma 4 (LayerSpec); q_dim is dim in
        // the Llama block, wider in Qwen3 and Gemma 7B
        const LayerSpec *ls = &c->layer[l];
        int head_size = ls->head_size, n_kv_heads = ls->n_kv_heads, hidden = ls->hidden_dim;
        int q_dim = c->n_heads * head_size, kv_dim = n_kv_heads * head_size;
        int owns_cache = ls->kv_source == l; // Gemma 4's KV-shared layers compute no k, v

        // attention rmsnorm: xb = rmsnorm(x)
        for (int b = 0; b < B; b++)
            rmsnorm(s->xb + (size_t)b * dim, s->x + (size_t)b * dim, w->rms_att + (size_t)l * dim, dim, eps);

        // q = Wq xb, k = Wk xb, v = Wv xb (Gemma 4: no k, v on a KV-shared layer; no Wv
        // where the values are the keys, the raw key projection copied before k's norm)
        const LayerWeights *lw = &w->layer[l];
        Projection qkv[3] = {{s->q, lw->wq, q_dim}, {s->k, lw->wk, kv_dim}, {s->v, lw->wv, kv_dim}};
        matmuls(s, s->xb, qkv, !owns_cache ? 1 : ls->values_are_keys ? 2 : 3, B, dim);
        if (owns_cache && ls->values_are_keys) memcpy(s->v, s->k, (size_t)B * kv_dim * sizeof(float));
        if (c->qkv_bias) { // Qwen2: q += bq, k += bk, v += bv
            for (int b = 0; b < B; b++) {
                float *q = s->q + (size_t)b * q_dim, *k = s->k + (size_t)b * kv_dim, *v = s->v + (size_t)b * kv_dim;
                for (int i = 0; i < q_dim; i++) q[i] += w->bq[ls->q_before + i];
                for (int i = 0; i < kv_dim; i++) k[i] += w->bk[ls->kv_before + i];
                for (int i = 0; i < kv_dim; i++) v[i] += w->bv[ls->v_before + i];
            }
        }
        if (c->qk_norm) { // Qwen3, Gemma 3, 4: each query and key head RMSNormed over its head_size values
            const float *qn = w->q_norm + ls->heads_before, *kn = w->k_norm + ls->k_heads_before;
            for (int b = 0; b < B; b++) {
                for (int h = 0; h < c->n_heads; h++) {
                    float *q = s->q + (size_t)b * q_dim + h * head_size;
                    rmsnorm(q, q, qn, head_size, eps);
                }
                for (int h = 0; owns_cache && h < n_kv_heads; h++) {
                    float *k = s->k + (size_t)b * kv_dim + h * head_size;
                    rmsnorm(k, k, kn, head_size, eps);
                }
            }
        }
        if (c->v_norm && owns_cache) // Gemma 4: each value head RMSNormed, without a weight
            for (size_t h = 0; h < (size_t)B * n_kv_heads; h++)
                rmsnorm(s->v + h * head_size, s->v + h * head_size, NULL, head_size, eps);

        // RoPE: rotate q and k by their position with the layer's setting. Only the
        // first rope_angles = floor(p head_size / 2) pairs turn (p-RoPE; p = 1 is full
        // RoPE, all head_size / 2), the rest keep their values; a NoPE layer (SmolLM3's
        // every fourth) turns none. Then k, rotated, and v, never rotated, are cached:
        // a cached key already holds R(pos) k, so no step rotates it again.
        int rope = ls->rope, rope_angles = rope_angles_of(c, rope);
        for (int b = 0; b < B; b++) {
            int pos = pos0 + b;
            float *q = s->q + (size_t)b * q_dim, *k = s->k + (size_t)b * kv_dim, *v = s->v + (size_t)b * kv_dim;
            if (s->inspect) inspect_record_chunks(s->inspect, t, l, q, k, pos); // -m inspect only
            if (rope != LAYER_NOPE) {
                const float *cos_pos = s->rope_cos[rope] + (size_t)pos * rope_angles;
                const float *sin_pos = s->rope_sin[rope] + (size_t)pos * rope_angles;
                rope_apply(q, c->n_heads, head_size, rope_angles, cos_pos, sin_pos);
                if (owns_cache) rope_apply(k, n_kv_heads, head_size, rope_angles, cos_pos, sin_pos);
            }
            for (int kvh = 0; owns_cache && kvh < n_kv_heads; kvh++) {
                size_t at = kv_cache_offset(c, l, kvh, pos);
                memcpy(s->key_cache + at, k + kvh * head_size, head_size * sizeof(float));
                memcpy(s->value_cache + at, v + kvh * head_size, head_size * sizeof(float));
            }
        }
        if (s->inspect && l == 0) inspect_count_positions(s->inspect, B, pos0);

        // multi-head attention: xb = attention(q, cached k, cached v)
        attention(t, l, B, pos0);

        // x = x + Wo xb (the residual connection); Gemma 2, 3, 4 normalize Wo xb first
        matmul_tokens(s, s->xb2, s->xb, lw->wo, B, q_dim, dim);
        if (c->post_norms)
            for (int b = 0; b < B; b++)
                rmsnorm(s->xb2 + (size_t)b * dim, s->xb2 + (size_t)b * dim, w->rms_post_att + (size_t)l * dim, dim, eps);
        for (size_t i = 0; i < (size_t)B * dim; i++) s->x[i] += s->xb2[i];

        // ffn rmsnorm: xb = rmsnorm(x)
        for (int b = 0; b < B; b++)
            rmsnorm(s->xb + (size_t)b * dim, s->x + (size_t)b * dim, w->rms_ffn + (size_t)l * dim, dim, eps);

        // the feed-forward: x = x + W2 (act(W1 xb) * (W3 xb)), act silu (SwiGLU) or the
        // tanh GELU (GeGLU: Gemma); Gemma 2, 3, 4 normalize its output first. A layer
        // with experts (Qwen3-MoE, Mixtral) passes each token through k of them instead;
        // Gemma 4 26B-A4B's run beside the feed-forward.
        if (ls->experts && c->routing != ROUTING_GEMMA4) {
            mixture_of_experts(t, l, B, s->xb);
        } else {
            feed_forward(c, s, s->xb, s->xb2, lw->w1, lw->w3, lw->w2, hidden, B);
            if (ls->experts) experts_beside_feed_forward(t, l, B); // Gemma 4 26B-A4B
        }
        if (c->post_norms)
            for (int b = 0; b < B; b++)
                rmsnorm(s->xb2 + (size_t)b * dim, s->xb2 + (size_t)b * dim, w->rms_post_ffn + (size_t)l * dim, dim, eps);
        for (size_t i = 0; i < (size_t)B * dim; i++) s->x[i] += s->xb2[i];

        if (c->per_layer_dim) add_per_layer_input(t, l, B); // Gemma 4 E2B, E4B: x += this layer's input
        if (c->layer_scalars) // Gemma 4: the whole residual stream scaled by the layer's learned scalar
            for (size_t i = 0; i < (size_t)B * dim; i++) s->x[i] *= w->layer_scalars[l];
        if (B == 1 && use_fast_kernels) read_order_layer_ends();
    }

    // final rmsnorm and the classifier: logits = Wcls rmsnorm(x)
    if (wanted == LOGITS_NONE) return NULL;
    int first = wanted == LOGITS_ALL ? 0 : B - 1;
    for (int b = first; b < B; b++) rmsnorm(s->x + (size_t)b * dim, s->x + (size_t)b * dim, w->rms_final, dim, eps);
    matmul_tokens(s, s->logits, s->x + (size_t)first * dim, w->wcls, B - first, dim, c->vocab_size);
    if (c->final_softcap != 0.0f) softcap(s->logits, (long)(B - first) * c->vocab_size, c->final_softcap); // Gemma 2, 4
    return s->logits;
}

// One token at position pos: the decoding step. Returns vocab_size logits.
static float *forward(Transformer *t, int token, int pos) { return forward_block(t, &token, 1, pos, LOGITS_ALL); }

// Runs tokens[0..n) at positions pos0.. through the model in blocks, filling the
// KV cache. Returns the logits of the last token.
static float *prefill(Transformer *t, const int *tokens, int n, int pos0) {
    float *logits = NULL;
    for (int i = 0; i < n; i += PREFILL_BLOCK) {
        int len = n - i < PREFILL_BLOCK ? n - i : PREFILL_BLOCK;
        logits = forward_block(t, tokens + i, len, pos0 + i, i + len < n ? LOGITS_NONE : LOGITS_LAST);
    }
    return logits;
}

// The steps of forward_block, in the order it first calls them, each after the
// pieces it is built from: the embedding row, rmsnorm, the matrix products,
// attention, the feed-forward, the soft-cap; then the families' additions.

// The SIMD the compiler targets. The kernels' vector paths ("Making it fast") hold
// eight lanes in one AVX register (x86-64 with AVX2 and FMA; AVX-512 where present
// widens the prefill tile) or in two NEON registers (64-bit ARM). Every other target
// runs the plain loops, which compute the same lanes with the same roundings.
#define DOT_LANES 8 // the partial sums of every dot product (dot(), below)
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define USE_AVX2 1
#define USE_SIMD 1
#if defined(__AVX512F__)
#define USE_AVX512 1
#endif
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define USE_NEON 1
#define USE_SIMD 1
#endif

// The fast versions of the functions below, in "Making it fast".
#ifdef USE_SIMD
static float dot_simd(const float *a, const float *b, int n);
static float dot_weights_simd(Matrix w, const float *x, int n);
#endif
static void matmul_fast(float *xout, const float *x, Matrix w, int n, int d);
static void matmul_tiled(float *xout, const float *x, Matrix w, int B, int n, int d, float *scratch);
static void matmuls_fast(const float *x, int n, const Projection *p, int n_proj);
static void attention_scores_fast(float *att, const float *q, const float *keys, int n, int head_size);
static void attention_values_fast(float *out, const float *att, const float *values, int n, int head_size);
static void attention_block_scores(Transformer *t, int l, int h, int B, int pos0);
static int attention_across_threads(const Transformer *t, int l, int B, int pos0);
static int swiglu_fast(float *hb, const float *hb2, long n);
static int argmax_fast(const float *p, int n);
// -m inspect's accumulator of the attention weights, in "Inspect"
static void inspect_record_attention(InspectStats *st, const Config *c, int layer, int h, float bos, float current,
                                     float previous, int pos);

// The 16-bit weight types widened to float32, exactly (every bf16 and every f16 is
// a float32 value).
//   bf16: the top 16 bits of a float32; the widened value is those bits shifted up,
//     the low 16 fraction bits zero.
//   f16: sign s, 5 exponent bits e (bias 15), 10 fraction bits f:
//     e = 31: infinity (f = 0) or NaN (f kept, made quiet, as the hardware does)
//     0 < e < 31: (-1)^s 2^(e-15) 1.f, a float32 exponent of e - 15 + 127
//     e = 0: (-1)^s 2^-14 0.f (subnormal; 0 when f = 0): normalized by shifting f up
//     until its leading 1 reaches the implicit bit, one exponent step per shift
static inline float bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, f = h & 0x3ff;
    if (e == 0x1f) return bits_to_f32(sign | 0x7f800000u | f << 13 | (f ? 0x400000u : 0)); // inf, quiet NaN
    if (e != 0) return bits_to_f32(sign | (e - 15 + 127) << 23 | f << 13);
    if (f == 0) return bits_to_f32(sign); // +-0
    e = 1;
    while (!(f & 0x400)) { // subnormal: 2^-14 0.f = 2^(e-15) 1.f' after the shifts
        f <<= 1;
        e--;
    }
    return bits_to_f32(sign | (e - 15 + 127) << 23 | (f & 0x3ff) << 13);
}

// Widening the weights. Element i of a row of blocks: block i / weights, weight
// k = i % weights of it, by the type's equation (the table above WeightType). Each
// follows llama.cpp's dequantize_row_* (ggml-quants.c) operation for operation, and
// since every product is exact the fused and unfused forms agree.
static inline float f16_at(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return f16_to_f32(h);
}

// Q8_0: d (f16) at byte 0, then 32 int8 q. d * q (11 significant bits times 8: exact).
static inline float q8_0_weight(const unsigned char *block, int k) {
    return f16_at(block) * (float)(int8_t)block[2 + k];
}

// The 4 low bits of a Q4_0/Q4_1/Q5_0/Q5_1 weight: 16 bytes qs hold weight k < 16 in the
// low nibble of qs[k] and weight k + 16 in its high nibble.
static inline int low_nibble_of_32(const unsigned char *qs, int k) { return k < 16 ? qs[k] & 15 : qs[k - 16] >> 4; }

// Q4_0: d at 0, qs[16] at 2. d * (q - 8), q in 0..15.
static inline float q4_0_weight(const unsigned char *block, int k) {
    return (float)(low_nibble_of_32(block + 2, k) - 8) * f16_at(block);
}

// Q4_1: d at 0, m at 2, qs[16] at 4. d * q + m: the product exact, the sum rounded once.
static inline float q4_1_weight(const unsigned char *block, int k) {
    return (float)low_nibble_of_32(block + 4, k) * f16_at(block) + f16_at(block + 2);
}

// Q5_0 and Q5_1: the fifth bit of weight k is bit k of the 32-bit qh.
static inline int fifth_bit(const unsigned char *qh, int k) { return (qh[k / 8] >> (k % 8) & 1) << 4; }

// Q5_0: d at 0, qh[4] at 2, qs[16] at 6. d * (q - 16), q in 0..31.
static inline float q5_0_weight(const unsigned char *block, int k) {
    return (float)((low_nibble_of_32(block + 6, k) | fifth_bit(block + 2, k)) - 16) * f16_at(block);
}

// Q5_1: d at 0, m at 2, qh[4] at 4, qs[16] at 8. d * q + m.
static inline float q5_1_weight(const unsigned char *block, int k) {
    return (float)(low_nibble_of_32(block + 8, k) | fifth_bit(block + 4, k)) * f16_at(block) + f16_at(block + 2);
}

// The K-quants' 6-bit scale sc and min m of sub-block s (0..7), packed in 12 bytes:
// s < 4: the low 6 bits of bytes s and s + 4; s >= 4: 4 bits of byte s + 4 (low for
// sc, high for m) under the top 2 bits of byte s - 4 (sc) or s (m).
static inline void k_scale_min(const unsigned char *scales, int s, int *sc, int *m) {
    if (s < 4) {
        *sc = scales[s] & 63;
        *m = scales[s + 4] & 63;
    } else {
        *sc = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4;
        *m = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4;
    }
}

// The 4 low bits of Q4_K/Q5_K weight k (0..255): 128 bytes qs in four runs of 32;
// sub-block s = k / 32 reads run s / 2, the low nibbles when s is even, else the high.
static inline int k_nibble(const unsigned char *qs, int k) {
    int s = k / 32, byte = qs[s / 2 * 32 + k % 32];
    return s % 2 ? byte >> 4 : byte & 15;
}

// Q4_K: d at 0, dmin at 2, scales[12] at 4, qs[128] at 16. (d * sc) * q - dmin * m,
// sc and m sub-block k / 32's: the products exact, the difference rounded once.
static inline float q4_k_weight(const unsigned char *block, int k) {
    int sc, m;
    k_scale_min(block + 4, k / 32, &sc, &m);
    return f16_at(block) * (float)sc * (float)k_nibble(block + 16, k) - f16_at(block + 2) * (float)m;
}

// Q5_K: d at 0, dmin at 2, scales[12] at 4, qh[32] at 16, qs[128] at 48. As Q4_K, q's
// fifth bit being bit k / 32 of qh[k % 32].
static inline float q5_k_weight(const unsigned char *block, int k) {
    int sc, m, q = k_nibble(block + 48, k) | (block[16 + k % 32] >> (k / 32) & 1) << 4;
    k_scale_min(block + 4, k / 32, &sc, &m);
    return f16_at(block) * (float)sc * (float)q - f16_at(block + 2) * (float)m;
}

// Q6_K: ql[128] at 0, qh[64] at 128, scales[16] (int8) at 192, d at 208 (last).
// (d * sc) * (q - 32), q in 0..63. Each half of 128 weights has its own 64 bytes of
// ql, 32 of qh and 8 scales; within a half, weight r = 32 g + l (g = 0..3) takes the
// low (g < 2) or high nibble of ql[l + 32 (g % 2)], bits 2g and 2g+1 of qh[l] on top,
// and scale 2g + l / 16.
static inline float q6_k_weight(const unsigned char *block, int k) {
    int half = k / 128, g = k % 128 / 32, l = k % 32;
    const unsigned char *ql = block + 64 * half, *qh = block + 128 + 32 * half;
    int low = ql[l + 32 * (g % 2)] >> 4 * (g / 2) & 15, q = low | (qh[l] >> 2 * g & 3) << 4;
    int8_t sc = (int8_t)block[192 + 8 * half + 2 * g + l / 16];
    return f16_at(block + 208) * (float)sc * (float)(q - 32);
}

// Element k of the block at `block`, of a block type.
static inline float block_weight(const unsigned char *block, int k, WeightType type) {
    switch (type) {
    case WEIGHT_Q8_0: return q8_0_weight(block, k);
    case WEIGHT_Q4_0: return q4_0_weight(block, k);
    case WEIGHT_Q4_1: return q4_1_weight(block, k);
    case WEIGHT_Q5_0: return q5_0_weight(block, k);
    case WEIGHT_Q5_1: return q5_1_weight(block, k);
    case WEIGHT_Q4_K: return q4_k_weight(block, k);
    case WEIGHT_Q5_K: return q5_k_weight(block, k);
    case WEIGHT_Q6_K: return q6_k_weight(block, k);
    default: return 0.0f; // a float type: widen() reads it
    }
}

// Element i of weights stored as `type`, widened to float32.
static inline float widen(const void *data, size_t i, WeightType type) {
    if (type == WEIGHT_BF16) return bf16_to_f32(((const uint16_t *)data)[i]);
    if (type == WEIGHT_F16) return f16_to_f32(((const uint16_t *)data)[i]);
    if (type == WEIGHT_F32) return ((const float *)data)[i];
    BlockShape b = block_shapes[type];
    return block_weight((const unsigned char *)data + i / b.weights * b.bytes, (int)(i % b.weights), type);
}

// out = row `token` of the token embedding, widened to float32.
static void embedding_row(float *out, Matrix embedding, int token, int dim) {
    Matrix row = matrix_at(embedding, (size_t)token * dim);
    for (int j = 0; j < dim; j++) out[j] = widen(row.data, j, row.type);
}

// o = w * x / sqrt(mean(x^2) + eps)   (RMSNorm; the order of operations is llama2.c's)
static void rmsnorm(float *o, const float *x, const float *weight, int size, float eps) {
    float ss = 0.0f;
    for (int j = 0; j < size; j++) ss += x[j] * x[j];
    ss /= size;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < size; j++) o[j] = weight ? weight[j] * (ss * x[j]) : ss * x[j]; // no weight: Gemma 4's v norm
}

// a * b + c, rounded once (a fused multiply-add) wherever the target has one: x86-64
// with FMA, 64-bit ARM always. The build turns off the compiler's own contraction
// (-ffp-contract=off), so every dot product below is computed with exactly the same
// roundings, whichever kernel computes it and on whichever machine.
static inline float mul_add(float a, float b, float c) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
    return fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

// The dot product every matmul uses: eight interleaved partial sums (lane l takes
// j = l, l+8, l+16, ...; a tail shorter than eight goes to the first lanes), added
// pairwise at the end. A plain running sum gives the same value up to rounding, but
// one long chain of dependent additions cannot use SIMD; eight lanes are one AVX
// register (two NEON registers). This is the contract every fast kernel keeps.
static float reduce_lanes(const float acc[DOT_LANES]) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static float dot(const float *a, const float *b, int n) {
#ifdef USE_SIMD
    if (use_fast_kernels) return dot_simd(a, b, n); // the same lanes in SIMD registers
#endif
    float acc[DOT_LANES] = {0};
    int j = 0;
    for (; j + DOT_LANES <= n; j += DOT_LANES)
        for (int l = 0; l < DOT_LANES; l++) acc[l] = mul_add(a[j + l], b[j + l], acc[l]);
    for (int l = 0; j < n; j++, l++) acc[l] = mul_add(a[j], b[j], acc[l]);
    return reduce_lanes(acc);
}

// W[i,:] . x for a row of weights of any type: each weight widened to float32, then
// exactly dot()'s lanes and roundings, so a 16-bit row gives the bits the float32
// row holding the widened weights gives.
static float dot_weights(Matrix w, const float *x, int n) {
    if (w.type == WEIGHT_F32) return dot(w.data, x, n);
#ifdef USE_SIMD
    if (use_fast_kernels) return dot_weights_simd(w, x, n); // widened in SIMD registers
#endif
    float acc[DOT_LANES] = {0};
    int j = 0;
    for (; j + DOT_LANES <= n; j += DOT_LANES)
        for (int l = 0; l < DOT_LANES; l++) acc[l] = mul_add(widen(w.data, j + l, w.type), x[j + l], acc[l]);
    for (int l = 0; j < n; j++, l++) acc[l] = mul_add(widen(w.data, j, w.type), x[j], acc[l]);
    return reduce_lanes(acc);
}

// W (d,n) @ x (n,) -> xout (d,): one token, xout[i] = W[i,:] . x.
static void matmul(float *xout, const float *x, Matrix w, int n, int d) {
    if (use_fast_kernels) {
        matmul_fast(xout, x, w, n, d); // rows in groups of four, split across threads
        return;
    }
    for (int i = 0; i < d; i++) xout[i] = dot_weights(matrix_at(w, (size_t)i * n), x, n);
}

// X (B,n) @ W^T (n,d) -> XOUT (B,d): the B tokens of a block, xout[b*d + i] = W[i,:] . x[b,:],
// each token exactly as matmul computes it.
static void matmul_tokens(RunState *s, float *xout, const float *x, Matrix w, int B, int n, int d) {
    if (use_fast_kernels && B > 1) {
        matmul_tiled(xout, x, w, B, n, d, s->scratch); // tiles of rows x tokens, split across threads
        return;
    }
    for (int b = 0; b < B; b++) matmul(xout + (size_t)b * d, x + (size_t)b * n, w, n, d);
}

// Each projection of p applied to the B tokens of x (rows of n).

static void matmuls(RunState *s, const float *x, const Projection *p, int n_proj, int B, int n) {
    if (use_fast_kernels && B == 1) {
        matmuls_fast(x, n, p, n_proj); // all in one parallel region
        return;
    }
    for (int j = 0; j < n_proj; j++) matmul_tokens(s, p[j].xout, x, p[j].w, B, n, p[j].d);
}

// att[t] = q . k_t for the first n positions.
static void attention_scores(float *att, const float *q, const float *keys, int n, int head_size) {
    if (use_fast_kernels) {
        attention_scores_fast(att, q, keys, n, head_size); // four keys at a time
        return;
    }
    for (int tt = 0; tt < n; tt++) att[tt] = dot(q, keys + (size_t)tt * head_size, head_size);
}

// out += sum over the first n positions of att[t] * v_t, added one position at a time.
static void attention_values(float *out, const float *att, const float *values, int n, int head_size) {
    if (use_fast_kernels) {
        attention_values_fast(out, att, values, n, head_size); // four values per pass over out
        return;
    }
    for (int tt = 0; tt < n; tt++)
        for (int i = 0; i < head_size; i++) out[i] += att[tt] * values[(size_t)tt * head_size + i];
}

// x = exp(x - max) / sum(exp(x - max)), in place
static void softmax(float *x, int size) {
    float max_val = x[0];
    for (int i = 1; i < size; i++)
        if (x[i] > max_val) max_val = x[i];
    float sum = 0.0f;
    for (int i = 0; i < size; i++) {
        x[i] = expf(x[i] - max_val);
        sum += x[i];
    }
    for (int i = 0; i < size; i++) x[i] /= sum;
}

// The first position layer l's query at pos attends to: 0 (full attention), or, on
// a sliding layer of window W (Mistral, Gemma 2's and 3's local layers), the W
// latest positions, pos itself included (transformers: key s is seen when
// pos - W < s <= pos).
static int first_visible(const Config *c, int l, int pos) {
    int window = c->layer[l].window;
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// The positions first .. last of a cache of P positions as runs of slots: position t
// is in slot t mod P (P = seq_len: slot t). At most P positions wrap past the end of
// a sliding layer's ring at most once: slots start[0] .. start[0] + n[0] - 1, then
// 0 .. n[1] - 1 (n[1] = 0 when they do not wrap, always on a full layer).
typedef struct {
    int start[2], n[2];
} SlotRuns;

static SlotRuns slot_runs(int first, int last, int P) {
    int start = first < P ? first : first % P, count = last + 1 - first, n0 = start + count <= P ? count : P - start;
    return (SlotRuns){{start, 0}, {n0, count - n0}};
}

// x = exp(x - max) / sum(exp(x - max)) over the slots of r, summed in position order
// (run 0, then run 1): softmax() when there is one run.
static void softmax_runs(float *x, const SlotRuns *r) {
    float max_val = x[r->start[0]], sum = 0.0f;
    for (int i = 0; i < 2; i++)
        for (int j = r->start[i]; j < r->start[i] + r->n[i]; j++) max_val = x[j] > max_val ? x[j] : max_val;
    for (int i = 0; i < 2; i++)
        for (int j = r->start[i]; j < r->start[i] + r->n[i]; j++) {
            x[j] = expf(x[j] - max_val);
            sum += x[j];
        }
    for (int i = 0; i < 2; i++)
        for (int j = r->start[i]; j < r->start[i] + r->n[i]; j++) x[j] /= sum;
}

// Grouped-query causal attention of query head h in layer l for the B tokens of a
// block: token b, at position pos = pos0 + b, sees positions up to pos, the earlier
// tokens of its own block included (their keys and values are already in the cache).
// Key/value head h / group serves `group` query heads; the keys and values are layer
// l's cache, or (Gemma 4's KV sharing) its kv_source's.
//   score_t = q_h . k_t / sqrt(head_size),  t = first .. pos (first_visible)
//   a = softmax(score)
//   out_h = sum_t a_t v_t
// Key t sits in slot t mod P of the cache (P = cache_positions: seq_len, or a sliding
// layer's ring), and its score in the same slot of att: the slots of first .. pos are
// one run, or two where they wrap past the ring's end (slot_runs); each loop below
// walks the runs in position order.
static void attention_head(Transformer *t, int l, int h, int B, int pos0) {
    const Config *c = &t->config;
    RunState *s = &t->state;
    const LayerSpec *ls = &c->layer[l];
    int head_size = ls->head_size, group = c->n_heads / ls->n_kv_heads, q_dim = c->n_heads * head_size;
    int P = ls->cache_positions;
    size_t kv_offset = kv_cache_offset(c, l, h / group, 0);
    const float *keys = s->key_cache + kv_offset, *values = s->value_cache + kv_offset; // slot j: + j * head_size
    // the products q_h . k_t of a block's tokens as one matrix product ("Making it fast", 4)
    int scores_ready = use_fast_kernels && B > 1;
    if (scores_ready) attention_block_scores(t, l, h, B, pos0);
    for (int b = 0; b < B; b++) {
        int pos = pos0 + b, first = first_visible(c, l, pos);
        const float *q = s->q + (size_t)b * q_dim + h * head_size;
        float *att = s->att + ((size_t)b * c->n_heads + h) * c->max_cache_positions;
        SlotRuns runs = slot_runs(first, pos, P);
        for (int i = 0; i < 2; i++) {
            int j0 = runs.start[i], n = runs.n[i];
            if (!scores_ready) attention_scores(att + j0, q, keys + (size_t)j0 * head_size, n, head_size);
            if (c->attention_scale == 0.0f) { // the Llama block: 1 / sqrt(head_size)
                float root = sqrtf(head_size);
                for (int j = j0; j < j0 + n; j++) att[j] /= root;
            } else { // a model's own scale (Gemma 2, 3: query_pre_attn_scalar^-1/2)
                for (int j = j0; j < j0 + n; j++) att[j] *= c->attention_scale;
            }
            if (c->attention_softcap != 0.0f) { // Gemma 2: score -> cap tanh(score / cap), |score| < cap
                float cap = c->attention_softcap;
                for (int j = j0; j < j0 + n; j++) att[j] = cap * tanhf(att[j] / cap);
            }
        }
        softmax_runs(att, &runs);
        if (s->inspect) // the weights on BOS, the current and the previous position (0 out of the window)
            inspect_record_attention(s->inspect, c, l, h, first == 0 ? att[0] : 0.0f, att[pos % P],
                                     pos >= 1 && pos - 1 >= first ? att[(pos - 1) % P] : 0.0f, pos);
        float *out = s->xb + (size_t)b * q_dim + h * head_size;
        memset(out, 0, head_size * sizeof(float));
        for (int i = 0; i < 2; i++) // out = sum_t a_t v_t, run by run (attention_values adds to out)
            attention_values(out, att + runs.start[i], values + (size_t)runs.start[i] * head_size, runs.n[i],
                             head_size);
    }
}

// Attention of every head for the B tokens of a block at positions pos0 .. pos0+B-1,
// head by head.
static void attention(Transformer *t, int l, int B, int pos0) {
    int h, n_heads = t->config.n_heads;
    if (use_fast_kernels && attention_across_threads(t, l, B, pos0)) { // "Making it fast", 4
#pragma omp parallel for private(h)
        for (h = 0; h < n_heads; h++) attention_head(t, l, h, B, pos0);
        return;
    }
    for (h = 0; h < n_heads; h++) attention_head(t, l, h, B, pos0);
}

// SwiGLU's gate for one unit: silu(gate) * up, with silu(v) = v * sigmoid(v)
static inline float swiglu_unit(float gate, float up) { return gate * (1.0f / (1.0f + expf(-gate))) * up; }

// hb = silu(hb) * hb2 over n floats
static void swiglu(float *hb, const float *hb2, long n) {
    if (use_fast_kernels && swiglu_fast(hb, hb2, n)) return; // split across threads
    for (long i = 0; i < n; i++) hb[i] = swiglu_unit(hb[i], hb2[i]);
}

// GeGLU's gate for one unit (Gemma): gelu(gate) * up, with the tanh GELU
//   gelu(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
static inline float geglu_unit(float gate, float up) {
    const float k = 0.7978845608028654f; // sqrt(2 / pi)
    return 0.5f * gate * (1.0f + tanhf(k * (gate + 0.044715f * gate * gate * gate))) * up;
}

// hb = gelu(hb) * hb2 over n floats
static void geglu(float *hb, const float *hb2, long n) {
    for (long i = 0; i < n; i++) hb[i] = geglu_unit(hb[i], hb2[i]);
}

// The feed-forward of n tokens x (n, dim), of width hidden, into out (n, dim):
//   out = W2 (act(W1 x) * (W3 x)),  act silu (SwiGLU) or the tanh GELU (GeGLU: Gemma)
// a layer's (forward_block), or one expert's (expert_feed_forward).
static void feed_forward(const Config *c, RunState *s, const float *x, float *out, Matrix w1, Matrix w3, Matrix w2,
                         int hidden, int n) {
    Projection w13[2] = {{s->hb, w1, hidden}, {s->hb2, w3, hidden}};
    matmuls(s, x, w13, 2, n, c->dim);
    if (c->activation == ACTIVATION_GEGLU_TANH) geglu(s->hb, s->hb2, (long)n * hidden);
    else swiglu(s->hb, s->hb2, (long)n * hidden);
    matmul_tokens(s, out, s->hb, w2, n, hidden, c->dim);
}

// x = cap tanh(x / cap) over n floats (Gemma 2's final-logit soft-cap)
static void softcap(float *x, long n, float cap) {
    for (long i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

// The families' additions to a layer, which forward_block calls: Gemma 4's per-layer
// inputs (E2B, E4B), and the mixtures of experts (Qwen3-MoE, Mixtral, Gemma 4 26B-A4B).

// Gemma 4 E2B, E4B's per-layer inputs (block flag 32): a second embedding gives each
// token a slice of P values per layer, mixed with a projection of its embedding x:
//   pl = (rmsnorm(W_in x / sqrt(dim)) + e_pl[token] * m) / sqrt(2)   (the norm per slice)
// into s->pl, (B, n_layers x P); add_per_layer_input uses layer l's slice.
static void per_layer_inputs(Transformer *t, const int *tokens, int B) {
    const Config *c = &t->config;
    const TransformerWeights *w = &t->weights;
    RunState *s = &t->state;
    int P = c->per_layer_dim, LP = c->n_layers * P;
    float in_scale = (float)(1.0 / sqrt((double)c->dim)), mix = (float)M_SQRT1_2; // the model's dim^-0.5, 2^-0.5
    matmul_tokens(s, s->pl, s->x, w->per_layer_in, B, c->dim, LP);
    for (int b = 0; b < B; b++) {
        float *pl = s->pl + (size_t)b * LP;
        Matrix row = matrix_at(w->per_layer_embedding, (size_t)tokens[b] * LP);
        for (int i = 0; i < LP; i++) pl[i] *= in_scale;
        for (int l = 0; l < c->n_layers; l++) rmsnorm(pl + l * P, pl + l * P, w->per_layer_in_norm, P, c->norm_eps);
        for (int i = 0; i < LP; i++) pl[i] = (pl[i] + widen(row.data, i, row.type) * c->per_layer_multiplier) * mix;
    }
}

// After layer l's feed-forward (Gemma 4 E2B, E4B): a gate on x picks from the layer's
// slice of the per-layer inputs, projected back to dim, normed, added to x:
//   x = x + rmsnorm(W_out (gelu(W_gate x) * pl_l))
static void add_per_layer_input(Transformer *t, int l, int B) {
    const Config *c = &t->config;
    const TransformerWeights *w = &t->weights;
    RunState *s = &t->state;
    int P = c->per_layer_dim, dim = c->dim;
    matmul_tokens(s, s->plb, s->x, w->layer[l].per_layer_gate, B, dim, P);
    for (int b = 0; b < B; b++) {
        float *g = s->plb + (size_t)b * P;
        const float *pl = s->pl + (size_t)b * c->n_layers * P + (size_t)l * P;
        for (int i = 0; i < P; i++) g[i] = geglu_unit(g[i], pl[i]);
    }
    matmul_tokens(s, s->xb2, s->plb, w->layer[l].per_layer_out, B, P, dim);
    for (int b = 0; b < B; b++) {
        float *o = s->xb2 + (size_t)b * dim;
        rmsnorm(o, o, w->rms_per_layer + (size_t)l * dim, dim, c->norm_eps);
        for (int i = 0; i < dim; i++) s->x[(size_t)b * dim + i] += o[i];
    }
}

// A mixture of experts (block flag 64; Qwen3-MoE, Mixtral) in place of a layer's
// feed-forward: n_experts feed-forwards of width expert_hidden, of which each token
// passes through the k a router picks. A token reads k experts' weights, not all:
// Qwen3-30B-A3B's 8 of 128, Mixtral's 2 of 8.
//   r = W_router xb (one logit per expert),  p = softmax(r)
//   chosen = the k largest p, best first (on a tie the lower index, as torch.topk)
//   w_j = p_j, or p_j / (sum of the chosen p) (ROUTING_SOFTMAX_TOPK_NORM)
//   xb2 = sum over the chosen j, best first, of w_j W2_j (act(W1_j xb) * (W3_j xb))

// The router's choice for one token from its logits (which become p): chosen[0..k)
// and weight[0..k). expert_scale: Gemma 4's per-expert scales (else NULL).
static void route_token(const Config *c, float *logits, int *chosen, float *weight, const float *expert_scale) {
    int n = c->n_experts, k = c->n_experts_used;
    softmax(logits, n);
    for (int j = 0; j < k; j++) { // the largest p not chosen yet; the first of equal ones
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= chosen[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        chosen[j] = best, weight[j] = logits[best];
    }
    if (c->routing == ROUTING_SOFTMAX_TOPK_NORM || c->routing == ROUTING_GEMMA4) {
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum += weight[j];
        for (int j = 0; j < k; j++) weight[j] /= sum;
    }
    if (c->routing == ROUTING_GEMMA4) // then each times its expert's learned scale
        for (int j = 0; j < k; j++) weight[j] *= expert_scale[chosen[j]];
}

// Expert e of layer l on n tokens x (n, dim): out (n, dim) = W2_e (act(W1_e x) * (W3_e x)),
// the feed-forward of the block with the expert's own matrices.
static void expert_feed_forward(Transformer *t, int l, int e, const float *x, float *out, int n) {
    const Config *c = &t->config;
    const TransformerWeights *w = &t->weights;
    RunState *s = &t->state;
    int dim = c->dim, hidden = c->expert_hidden;
    const LayerWeights *lw = &w->layer[l];
    uint64_t expert = (uint64_t)e * hidden * dim; // expert e's matrices in the layer's pieces
    feed_forward(c, s, x, out, matrix_at(lw->expert_w1, expert), matrix_at(lw->expert_w3, expert),
                 matrix_at(lw->expert_w2, expert), hidden, n);
}

// The router's logits and choice for the B tokens of xb (Gemma 4: of the residual stream
// x, through a weightless RMSNorm, times a learned scale and dim^-1/2).
static void route_tokens(Transformer *t, int l, int B) {
    const Config *c = &t->config;
    const TransformerWeights *w = &t->weights;
    RunState *s = &t->state;
    int E = c->n_experts, K = c->n_experts_used, dim = c->dim;
    uint64_t sparse = c->layer[l].sparse_before;
    const float *in = s->xb, *expert_scale = NULL;
    if (c->routing == ROUTING_GEMMA4) {
        const float *scale = w->router_scale + sparse * dim;
        float root = (float)(1.0 / sqrt((double)dim));
        for (int b = 0; b < B; b++) {
            float *r = s->expert_x + (size_t)b * dim; // free until the experts run
            rmsnorm(r, s->x + (size_t)b * dim, NULL, dim, c->norm_eps);
            for (int i = 0; i < dim; i++) r[i] = r[i] * scale[i] * root;
        }
        in = s->expert_x, expert_scale = w->expert_scale + sparse * E;
    }
    matmul_tokens(s, s->router_logits, in, w->layer[l].router, B, dim, E);
    for (int b = 0; b < B; b++)
        route_token(c, s->router_logits + (size_t)b * E, s->chosen + (size_t)b * K, s->chosen_weight + (size_t)b * K,
                    expert_scale);
}

// xb2 = the weighted sum of each token's chosen experts' outputs (expert_out), best first.
static void combine_experts(const Config *c, RunState *s, int B) {
    int dim = c->dim, K = c->n_experts_used;
    for (int b = 0; b < B; b++) {
        float *out = s->xb2 + (size_t)b * dim;
        memset(out, 0, dim * sizeof(float));
        for (int j = 0; j < K; j++) {
            const float *y = s->expert_out + ((size_t)b * K + j) * dim;
            float weight = s->chosen_weight[(size_t)b * K + j];
            for (int i = 0; i < dim; i++) out[i] += weight * y[i];
        }
    }
}

// Layer l's experts on the B tokens of in (xb; Gemma 4: expert_in), into xb2: expert by
// expert, each on the tokens that chose it, gathered into a block of their own, so
// that its rows are read once a block rather than once a token; each token's output
// is what the expert computes for the token alone (a block's matmul computes each
// token's row as matmul does). Then each token's chosen outputs are combined.
static void mixture_of_experts(Transformer *t, int l, int B, const float *in) {
    const Config *c = &t->config;
    RunState *s = &t->state;
    int dim = c->dim, K = c->n_experts_used;
    route_tokens(t, l, B);
    for (int e = 0; e < c->n_experts; e++) {
        int n = 0; // the tokens that chose e (each at most once), gathered into expert_x; slot b K + j is
                   // token b's j-th choice
        for (int slot = 0; slot < B * K; slot++)
            if (s->chosen[slot] == e)
                memcpy(s->expert_x + (size_t)n++ * dim, in + (size_t)(slot / K) * dim, dim * sizeof(float));
        if (n == 0) continue;
        expert_feed_forward(t, l, e, s->expert_x, s->xb2, n); // xb2 is free until combine_experts
        n = 0; // each token's output into its slot of expert_out
        for (int slot = 0; slot < B * K; slot++)
            if (s->chosen[slot] == e)
                memcpy(s->expert_out + (size_t)slot * dim, s->xb2 + (size_t)n++ * dim, dim * sizeof(float));
    }
    combine_experts(c, s, B);
}

// Gemma 4 26B-A4B (ROUTING_GEMMA4): the experts beside the feed-forward, whose output
// is in xb2, both reading the residual stream x:
//   xb2 = rmsnorm(xb2, post_dense) + rmsnorm(experts(rmsnorm(x, pre_experts)), post_experts)
static void experts_beside_feed_forward(Transformer *t, int l, int B) {
    const Config *c = &t->config;
    const TransformerWeights *w = &t->weights;
    RunState *s = &t->state;
    int dim = c->dim;
    uint64_t sparse = c->layer[l].sparse_before * dim;
    for (int b = 0; b < B; b++) {
        size_t at = (size_t)b * dim;
        rmsnorm(s->dense_out + at, s->xb2 + at, w->rms_post_dense + sparse, dim, c->norm_eps);
        rmsnorm(s->expert_in + at, s->x + at, w->rms_pre_experts + sparse, dim, c->norm_eps);
    }
    mixture_of_experts(t, l, B, s->expert_in);
    for (int b = 0; b < B; b++) {
        float *out = s->xb2 + (size_t)b * dim;
        rmsnorm(out, out, w->rms_post_experts + sparse, dim, c->norm_eps);
        for (int i = 0; i < dim; i++) out[i] += s->dense_out[(size_t)b * dim + i];
    }
}

// ----------------------------------------------------------------------------
// Past the training length: the scaling rules
//
// A model trained on contexts of L positions (original_len) has seen pair i
// turn through at most L * omega_i radians. Past L, the slow pairs reach angles
// never seen in training, and attention breaks down. Each rule changes only the
// frequencies omega_i (and one attention factor), so that positions up to s * L
// (s = factor) look more like the trained ones. Nothing else in the forward
// pass changes, and since the KV cache holds keys rotated by R(n), a rule can be
// chosen at inference time without retraining.
//   none    omega_i
//   linear  omega_i / s: every position divided by s ("position interpolation",
//           Chen et al. 2023). The fast pairs, which resolve neighbouring tokens,
//           turn s times slower too.
//   ntk     theta' = theta * s^(d/(d-2)), d = head_size ("NTK-aware", bloc97 2023):
//           pair 0 keeps its frequency, the slowest pair is divided by s, those
//           between by less (a larger base stretches the slow end of the spectrum).
//   yarn    (Peng et al. 2023) by each pair's number of turns over L, r_i = L / wavelength_i:
//           r_i > beta_fast: kept; r_i < beta_slow: divided by s; a linear ramp
//           between. Plus an attention factor, 0.1 ln s + 1 by default, that
//           multiplies cos and sin (so q . k of the rotated pairs by its square):
//           interpolated attention is flatter, and this sharpens it again.
//   llama3  (Meta's Llama 3.1) by wavelength: above L / low_freq_factor divided by
//           s, below L / high_freq_factor kept, a smooth blend between.
// Each rule equals the rope-initialisation function of Hugging Face transformers
// with the same parameters (tests/scaling_reference.py). p-RoPE composes with every
// rule: the rule acts on the rotated pairs only (for yarn, whose ramp is counted
// over the rotated dims, as transformers counts it with partial_rotary_factor), and
// the unrotated pairs stay unrotated.

// The scaling rules' parameters, with their defaults where the file stores 0.
static float or_default(float value, float fallback) { return value != 0.0f ? value : fallback; }
static float yarn_beta_fast(const RopeSetting *r) { return or_default(r->yarn_beta_fast, 32.0f); }
static float yarn_beta_slow(const RopeSetting *r) { return or_default(r->yarn_beta_slow, 1.0f); }
static float llama3_low_freq(const RopeSetting *r) { return or_default(r->llama3_low_freq_factor, 1.0f); }
static float llama3_high_freq(const RopeSetting *r) { return or_default(r->llama3_high_freq_factor, 4.0f); }

// yarn's ramp: the (fractional) pair index at which a pair turns `rotations` times
// over the original length, for `dims` rotated dims with base `base`:
//   i = dims * ln(L / (2 pi rotations)) / (2 ln base)
static double yarn_correction_pair(double rotations, int dims, double base, int original_len) {
    return dims * log(original_len / (rotations * 2.0 * M_PI)) / (2.0 * log(base));
}

// yarn's weight of the interpolated frequency for pair i: 0 for the fast pairs
// (kept), 1 for the slow ones (divided by s), linear between. The bounds are
// rounded outwards and clamped to [0, dims - 1], as transformers does.
static double yarn_ramp(const Config *c, int which, int i) {
    const RopeSetting *r = &c->rope[which];
    int dims = 2 * rope_angles_of(c, which); // the rotated dims
    double base = pow(r->theta, (double)dims / rope_head_size(c, which)); // so that base^(-2i/dims) = theta^(-2i/head_size)
    double low = floor(yarn_correction_pair(yarn_beta_fast(r), dims, base, r->original_len));
    double high = ceil(yarn_correction_pair(yarn_beta_slow(r), dims, base, r->original_len));
    low = fmax(low, 0.0);
    high = fmin(high, dims - 1.0);
    if (low == high) high += 0.001; // no division by zero
    return fmin(fmax((i - low) / (high - low), 0.0), 1.0);
}

// llama3's frequency: interpolated past L / low_freq_factor, kept below L /
// high_freq_factor, and between a blend weighted by how often the pair turns over L.
static double llama3_frequency(const RopeSetting *r, double omega) {
    double s = r->factor, L = r->original_len, low = llama3_low_freq(r), high = llama3_high_freq(r);
    double wavelength = 2.0 * M_PI / omega;
    if (wavelength < L / high) return omega;
    if (wavelength > L / low) return omega / s;
    double smooth = (L / wavelength - low) / (high - low);
    return (1.0 - smooth) * omega / s + smooth * omega;
}

// omega_i of a rotating pair i under the rule in force, in radians per token.
static float rope_frequency(const Config *c, int which, int i) {
    const RopeSetting *r = &c->rope[which];
    float omega = rope_base_frequency(c, which, i), s = r->factor;
    int d = rope_head_size(c, which);
    switch (r->scaling) {
    case ROPE_SCALING_LINEAR:
        return omega / s;
    case ROPE_SCALING_NTK: {
        if (d <= 2) return omega; // a single pair: omega_0 = 1 whatever the base
        double theta = (double)r->theta * pow(s, (double)d / (d - 2));
        return (float)pow(theta, -2.0 * i / d);
    }
    case ROPE_SCALING_YARN: {
        double ramp = yarn_ramp(c, which, i);
        return (float)((double)omega / s * ramp + (double)omega * (1.0 - ramp));
    }
    case ROPE_SCALING_LLAMA3:
        return (float)llama3_frequency(r, omega);
    case ROPE_SCALING_LONGROPE: {
        // Phi-3 128k, Phi-4-mini: omega_i / ext_i, ext the short factors when the
        // context in use is within the trained length, the long ones beyond it (as
        // llama.cpp chooses, by the context rather than the text so far)
        if (!r->longrope_factors) return omega; // the header alone (no weights mapped yet)
        if (i >= r->longrope_pairs) return NAN;  // no factor for this pair: never read past them
        int longer = c->seq_len > r->original_len;
        return omega / r->longrope_factors[(longer ? r->longrope_pairs : 0) + i];
    }
    default:
        return omega;
    }
}

// The factor that multiplies cos and sin: the file's, else yarn's 0.1 ln s + 1 (1
// for s <= 1), else 1.
static float rope_attention_factor(const Config *c, int which) {
    const RopeSetting *r = &c->rope[which];
    if (r->attention_factor != 0.0f) return r->attention_factor;
    if (r->scaling == ROPE_SCALING_YARN && r->factor > 1) return (float)(0.1 * log(r->factor) + 1.0);
    if (r->scaling == ROPE_SCALING_LONGROPE && r->factor > 1 && r->original_len > 1) // sqrt(1 + ln s / ln L)
        return (float)sqrt(1.0 + log(r->factor) / log(r->original_len));
    return 1.0f;
}

// ----------------------------------------------------------------------------
// Errors: a function that fails writes one line here and returns -1; main prints
// it as "run: error: ..." and exits. Library code never exits, so fuzzers and
// tests can call it.

static char error_message[512];

static int fail(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(error_message, sizeof(error_message), fmt, args);
    va_end(args);
    return -1;
}

// Puts "where: " before the message a failed callee left: where is formatted as
// fail's message is ("checkpoint %s", path), and the line reads "where: message".
static int fail_in(const char *fmt, ...) {
    char reason[sizeof(error_message)], where[sizeof(error_message)];
    snprintf(reason, sizeof(reason), "%s", error_message);
    va_list args;
    va_start(args, fmt);
    vsnprintf(where, sizeof(where), fmt, args);
    va_end(args);
    return fail("%s: %s", where, reason);
}

// ----------------------------------------------------------------------------
// Shifting the KV cache: RoPE's relative property at work
//
// A key cached at position n holds R(n) k. Moved to position n - delta, it must
// hold R(n - delta) k, and since R(m)^T R(n) = R(n - m), that is R(-delta) R(n) k:
// one more rotation of each rotated pair by -delta * omega_i, without knowing k.
// R(-delta) is R(delta) with the sines negated: the angles of the tables' row for
// position delta, without the attention factor the tables carry (the key has it
// already). Values carry no position and move as they are; p-RoPE's unrotated
// pairs need nothing. Every scaling rule keeps the property: it only changes the
// omega_i. Chat's --shift rotate drops a conversation's
// oldest turns this way, as llama.cpp's context shift does, instead of running
// the kept tokens through the model again. (The two rotations round twice where a
// fresh key rounds once, so shifted keys differ from fresh ones by about 1e-6 of
// their size; tests/test_rope.c checks it.)
//
// On a sliding layer's ring of R positions (window W), only what stays visible
// moves: the next position, to + n, sees to + n - W + 1 .. to + n, so the last
// min(n, W - 1) positions move, and the kept positions before `to` that it sees must
// still be in the ring: written after from + n - R, the oldest position the ring
// holds. When they are not (a long conversation has overwritten the system block's
// slots), the keys are gone and the shift cannot be done by rotation.
static int kv_cache_can_shift(const Config *c, int to, int from, int n) {
    for (int l = 0; l < c->n_layers; l++) {
        const LayerSpec *ls = &c->layer[l];
        if (ls->cache_positions == c->seq_len) continue; // a full cache holds every position
        int oldest_seen = to + n - ls->window + 1 > 0 ? to + n - ls->window + 1 : 0;
        if (oldest_seen < to && oldest_seen < from + n - ls->cache_positions) return 0;
    }
    return 1;
}

// Moves positions from .. from+n-1 of every layer and head down to to .. to+n-1
// (0 <= to < from; kv_cache_can_shift first). On a ring, the moved positions' slots
// can be each other's, so they go through a copy. Returns -1 when that copy cannot
// be allocated.
static int kv_cache_shift(Transformer *t, int to, int from, int n) {
    const Config *c = &t->config;
    RunState *s = &t->state;
    int delta = from - to;
    static float cos_delta[3][MAX_DIM / 2], minus_sin_delta[3][MAX_DIM / 2]; // R(-delta) per setting, for rope_apply
    int rope_angles[3] = {0, 0, 0}; // LAYER_NOPE: nothing turns
    for (int which = LAYER_ROPE_FIRST; which <= LAYER_ROPE_SECOND; which++) {
        if (which == LAYER_ROPE_SECOND && !has_second_rope(c)) break;
        rope_angles[which] = rope_angles_of(c, which);
        for (int i = 0; i < rope_angles[which]; i++) { // the tables' angles for position delta, without the attention factor
            float angle = delta * rope_frequency(c, which, i);
            cos_delta[which][i] = cosf(angle);
            minus_sin_delta[which][i] = -sinf(angle);
        }
    }
    size_t copy_floats = 0; // the most a ring moves: W - 1 positions of a head's keys and values
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer[l].cache_positions < c->seq_len)
            copy_floats = copy_floats > 2 * (size_t)c->layer[l].window * c->layer[l].head_size
                              ? copy_floats : 2 * (size_t)c->layer[l].window * c->layer[l].head_size;
    float *copy = copy_floats ? malloc(copy_floats * sizeof(float)) : NULL;
    if (copy_floats && !copy) return fail("out of memory shifting the KV cache");
    for (int l = 0; l < c->n_layers; l++) {
        // each layer's keys turn back by its own setting's angles; a NoPE layer's keys carry no
        // position; a layer that shares another's cache (Gemma 4) moves with it
        const LayerSpec *ls = &c->layer[l];
        int which = ls->rope, head_size = ls->head_size;
        if (ls->kv_source != l) continue;
        int ring = ls->cache_positions < c->seq_len, moved = ring && n > ls->window - 1 ? ls->window - 1 : n;
        for (int kvh = 0; kvh < ls->n_kv_heads; kvh++) {
            // the full cache: position by position, upwards (a destination is never a later source);
            // a ring: its last `moved` positions into the copy, then out to their new slots
            for (int j = n - moved; j < n; j++) {
                size_t src = kv_cache_offset(c, l, kvh, from + j), dst = kv_cache_offset(c, l, kvh, to + j);
                float *key = ring ? copy + (size_t)(j - (n - moved)) * 2 * head_size : s->key_cache + dst;
                float *value = ring ? key + head_size : s->value_cache + dst;
                memcpy(value, s->value_cache + src, head_size * sizeof(float));
                memcpy(key, s->key_cache + src, head_size * sizeof(float));
                rope_apply(key, 1, head_size, rope_angles[which], cos_delta[which], minus_sin_delta[which]);
            }
            for (int j = n - moved; ring && j < n; j++) {
                size_t dst = kv_cache_offset(c, l, kvh, to + j);
                const float *key = copy + (size_t)(j - (n - moved)) * 2 * head_size;
                memcpy(s->key_cache + dst, key, head_size * sizeof(float));
                memcpy(s->value_cache + dst, key + head_size, head_size * sizeof(float));
            }
        }
    }
    free(copy);
    return 0;
}

// ----------------------------------------------------------------------------
// The sampler: logits -> next token. Same generator and order of operations as
// llama2.c, so that the same seed gives the same tokens.

typedef struct {
    float prob;
    int index;
} ProbIndex;

typedef struct {
    int vocab_size;
    ProbIndex *probindex; // scratch for top-p
    float temperature;
    float topp;
    unsigned long long rng_state;
} Sampler;

static int build_sampler(Sampler *s, int vocab_size, float temperature, float topp, unsigned long long seed) {
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->topp = topp;
    s->rng_state = seed;
    s->probindex = malloc((size_t)vocab_size * sizeof(ProbIndex));
    return s->probindex ? 0 : fail("out of memory building the sampler");
}

static void free_sampler(Sampler *s) { free(s->probindex); }

// xorshift rng (https://en.wikipedia.org/wiki/Xorshift#xorshift.2A)
static unsigned int random_u32(unsigned long long *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (*state * 0x2545F4914F6CDD1Dull) >> 32;
}

static float random_f32(unsigned long long *state) { return (random_u32(state) >> 8) / 16777216.0f; } // [0,1)

// Greedy decoding: the index of the largest value, the first of equal ones (an
// index replaces the best only when its value is greater). NaN is never greater,
// so a NaN is chosen only at index 0, where nothing then beats it.
static int sample_argmax(const float *probabilities, int n) {
    if (use_fast_kernels) return argmax_fast(probabilities, n); // the largest value, then where it first is
    int max_i = 0;
    for (int i = 1; i < n; i++)
        if (probabilities[i] > probabilities[max_i]) max_i = i;
    return max_i;
}

// Samples index i with probability probabilities[i]; coin in [0, 1).
static int sample_mult(const float *probabilities, int n, float coin) {
    float cdf = 0.0f;
    for (int i = 0; i < n; i++) {
        cdf += probabilities[i];
        if (coin < cdf) return i;
    }
    return n - 1; // in case of rounding errors
}

static int compare_prob_desc(const void *a, const void *b) {
    const ProbIndex *a_ = a, *b_ = b;
    if (a_->prob > b_->prob) return -1;
    if (a_->prob < b_->prob) return 1;
    return 0;
}

// Top-p (nucleus) sampling: sample from the smallest set of tokens whose
// probabilities add up to more than topp. Tokens below (1 - topp) / (n - 1) cannot
// be in that set and are dropped before sorting, as llama2.c does.
static int sample_topp(const float *probabilities, int n, float topp, ProbIndex *probindex, float coin) {
    int n0 = 0;
    const float cutoff = (1.0f - topp) / (n - 1);
    for (int i = 0; i < n; i++) {
        if (probabilities[i] >= cutoff) {
            probindex[n0].index = i;
            probindex[n0].prob = probabilities[i];
            n0++;
        }
    }
    if (n0 == 0) return sample_argmax(probabilities, n); // a flat distribution and a tiny topp: llama2.c would read probindex[-1]
    qsort(probindex, n0, sizeof(ProbIndex), compare_prob_desc);
    float cumulative_prob = 0.0f;
    int last_idx = n0 - 1;
    for (int i = 0; i < n0; i++) {
        cumulative_prob += probindex[i].prob;
        if (cumulative_prob > topp) {
            last_idx = i;
            break;
        }
    }
    float r = coin * cumulative_prob;
    float cdf = 0.0f;
    for (int i = 0; i <= last_idx; i++) {
        cdf += probindex[i].prob;
        if (r < cdf) return probindex[i].index;
    }
    return probindex[last_idx].index;
}

// Greedy at temperature 0; otherwise softmax(logits / T), then top-p or plain sampling.
static int sample(Sampler *s, float *logits) {
    if (s->temperature == 0.0f) return sample_argmax(logits, s->vocab_size);
    int best = sample_argmax(logits, s->vocab_size);
    if (!isfinite(logits[best] / s->temperature)) return best; // T -> 0 is greedy; dividing would give inf - inf
    for (int q = 0; q < s->vocab_size; q++) logits[q] /= s->temperature;
    softmax(logits, s->vocab_size);
    float coin = random_f32(&s->rng_state);
    if (s->topp <= 0 || s->topp >= 1) return sample_mult(logits, s->vocab_size, coin);
    return sample_topp(logits, s->vocab_size, s->topp, s->probindex, coin);
}

// ----------------------------------------------------------------------------
// Names for the numbers the program depends on

enum { EXIT_OK = 0, EXIT_BAD_INPUT = 1, EXIT_BAD_USAGE = 2 };       // exit codes
enum { TOKEN_UNK = 0, TOKEN_BOS = 1, TOKEN_EOS = 2, TOKEN_BYTE0 = 3 }; // SentencePiece ids

#define MAGIC_LLAMA2C_V1 0x616b3432u  // llama2.c's export "version 1": "ak42"
#define MAGIC_ROPE 0x45504f52u        // our format: the bytes "ROPE"
#define HEADER_BYTES 256              // both versioned formats pad their header to 256
#define ROPE_V2_ALIGNMENT 64          // ROPE version 2: every tensor starts at a multiple of 64 bytes
#define LEGACY_HEADER_BYTES 28        // llama2.c legacy: seven int32

// Sanity limits on header fields (MAX_DIM and MAX_LAYERS are with the Config): far
// above any real model, low enough that no product of them overflows 64 bits. The
// file size check does the real work.
#define MAX_HIDDEN (1 << 20)
#define MAX_VOCAB (1 << 22)
#define MAX_SEQ_LEN (1 << 20)
#define MAX_EXPERTS 1024     // a mixture of experts' count (Qwen3-30B-A3B: 128)
#define MAX_EXPERTS_USED 64  // the experts a token uses (Qwen3-30B-A3B: 8; Mixtral: 2)
// A sanity bound on the KV cache of the context in use (not on the header's seq_len:
// -c rescues a file that declares more). The machine's memory is checked as well
// (check_context_fits); this bound stays for machines with more than it.
#define MAX_KV_CACHE_BYTES (64ull << 30)
// cos and sin are multiplied by the attention factor, and so the attention scores
// by its square: bounded so that the scores stay finite. Every rule's own factor
// is below 10 (yarn's 0.1 ln s + 1 at the largest float32 s).
#define MAX_ROPE_ATTENTION_FACTOR 100.0f
// Threads (-T, OMP_NUM_THREADS): more than any machine this runs on has cores, and
// few enough that the OpenMP runtime can start them.
#define MAX_THREADS 1024

// The context run uses when -c is not given: the file's seq_len, capped here. Models
// now declare 32k to 131k positions, and the KV cache (float32 here) and the scores
// grow with the context: Llama 3.1 8B's 131,072 positions would take 32 GiB of cache
// before the first token. 4096 positions (Llama 2's and Phi-3-mini-4k's trained
// length, and a common default context of local runners) hold a long prompt or a
// chat session and cost that 8B model 1 GiB, within a laptop's memory; the stories
// models (256 to 1024) are under the cap. -c N asks for more, up to what memory
// allows; the start-up line says when the cap applies.
#define DEFAULT_CONTEXT 4096

// Where a model or tokenizer comes from, for the errors that say one is missing.
#define WHERE_TO_GET_MODELS "models/ has stories260K.bin and tok512.bin; the README's \"Models\" says where to get more"

// The names and counts of the model's enums (RopeScaling, WeightType, Activation, Routing)
static const char *rope_scaling_names[] = {"none", "linear", "ntk", "yarn", "llama3", "longrope"};
#define N_ROPE_SCALINGS 6
#define N_FLAG_SCALINGS 5 // --rope-scaling's: longrope needs the file's factors
static const char *weight_type_names[N_WEIGHT_TYPES] = {"f32",  "bf16", "f16",  "q8_0", "per piece", "q4_0",
                                                         "q4_1", "q5_0", "q5_1", "q4_k", "q5_k",      "q6_k"};
#define WEIGHT_TYPE_PER_PIECE 4 // the header's weight_type for a file with a type table
#define KNOWN_TYPES "0 f32, 1 bf16, 2 f16, 3 q8_0, 5 q4_0, 6 q4_1, 7 q5_0, 8 q5_1, 9 q4_k, 10 q5_k, 11 q6_k"
#define N_ACTIVATIONS 2
#define N_ROUTINGS 4

// The block options' flags (ROPE version 2, byte 112)
#define BLOCK_QKV_BIAS 1u   // q, k and v projections add a bias (Qwen2)
#define BLOCK_QK_NORM 2u    // an RMSNorm over each query and key head before RoPE (Qwen3, Gemma 3)
#define BLOCK_POST_NORMS 4u // RMSNorms on the attention's and the feed-forward's outputs (Gemma 2, 3, 4)
#define BLOCK_V_NORM 8u     // an RMSNorm without weight over each value head (Gemma 4)
#define BLOCK_LAYER_SCALAR 16u // a learned scalar multiplies the residual stream after each layer (Gemma 4)
#define BLOCK_PER_LAYER_INPUT 32u // per-layer inputs: a slice of a second embedding per layer (Gemma 4 E2B, E4B)
#define BLOCK_EXPERTS 64u   // a mixture of experts in place of the feed-forward (Qwen3-MoE, Mixtral)
#define BLOCK_FLAGS_KNOWN (BLOCK_QKV_BIAS | BLOCK_QK_NORM | BLOCK_POST_NORMS | BLOCK_V_NORM | BLOCK_LAYER_SCALAR | \
                           BLOCK_PER_LAYER_INPUT | BLOCK_EXPERTS)

// ----------------------------------------------------------------------------
// Loading a checkpoint: detect the format, check the header, check the file size,
// then point the weights into the mapped file.

static uint32_t read_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static int32_t read_i32(const unsigned char *p) { return (int32_t)read_u32(p); }
static float read_f32(const unsigned char *p) {
    uint32_t u = read_u32(p);
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}
static uint64_t read_u64(const unsigned char *p) { return (uint64_t)read_u32(p) | (uint64_t)read_u32(p + 4) << 32; }

// A RoPE setting's ten header fields, in the order both settings store them (the first
// at byte 44, the second at byte 152; docs/format.md): theta, fraction, factor, the
// rule, the original length, then the rules' five parameters.
static void read_rope_setting(const unsigned char *p, RopeSetting *r) {
    r->theta = read_f32(p);
    r->fraction = read_f32(p + 4);
    r->factor = read_f32(p + 8);
    r->scaling = (RopeScaling)read_i32(p + 12);
    r->original_len = read_i32(p + 16);
    r->yarn_beta_fast = read_f32(p + 20);
    r->yarn_beta_slow = read_f32(p + 24);
    r->attention_factor = read_f32(p + 28);
    r->llama3_low_freq_factor = read_f32(p + 32);
    r->llama3_high_freq_factor = read_f32(p + 36);
}

// x rounded up to a multiple of unit (a tensor's start in an aligned file, an allocation's size)
static uint64_t round_up(uint64_t x, uint64_t unit) { return (x + unit - 1) / unit * unit; }

static int check_range(const char *name, long value, long lo, long hi) {
    if (value < lo || value > hi)
        return fail("header field %s = %ld is out of range [%ld, %ld]", name, value, lo, hi);
    return 0;
}

// A rule's parameter: 0 (the default), or finite and > 0. `allowed`: whether the
// rule in force has this parameter at all (if not, it must be 0).
static int check_rope_parameter(const char *name, float value, int allowed, const RopeSetting *r) {
    if (value == 0.0f) return 0;
    if (!allowed) return fail("%s is %g, but the rope scaling rule %s has no such parameter", name, value,
                              rope_scaling_names[r->scaling]);
    if (!isfinite(value) || value < 0) return fail("%s %g must be finite and > 0 (0: the default)", name, value);
    return 0;
}

// The scaling rule and its parameters (see "Past the training length" in the RoPE
// section for what each means).
static int validate_rope_scaling(const RopeSetting *r) {
    int rule = r->scaling;
    if (rule < 0 || rule >= N_ROPE_SCALINGS)
        return fail("rope_scaling %d is not a rule this program knows (0 none, 1 linear, 2 ntk, 3 yarn, 4 llama3, "
                    "5 longrope)", rule);
    if (!isfinite(r->factor) || r->factor < 1) // every rule stretches; none shrinks
        return fail("rope_factor %g must be finite and >= 1", r->factor);
    if (r->original_len < 1 || r->original_len > MAX_SEQ_LEN)
        return fail("rope_original_len %d is out of range [1, %d]", r->original_len, MAX_SEQ_LEN);
    int yarn = rule == ROPE_SCALING_YARN, llama3 = rule == ROPE_SCALING_LLAMA3;
    if (check_rope_parameter("yarn_beta_fast", r->yarn_beta_fast, yarn, r) ||
        check_rope_parameter("yarn_beta_slow", r->yarn_beta_slow, yarn, r) ||
        check_rope_parameter("rope_attention_factor", r->attention_factor, 1, r) ||
        check_rope_parameter("llama3_low_freq_factor", r->llama3_low_freq_factor, llama3, r) ||
        check_rope_parameter("llama3_high_freq_factor", r->llama3_high_freq_factor, llama3, r))
        return -1;
    if (r->attention_factor > MAX_ROPE_ATTENTION_FACTOR)
        return fail("rope_attention_factor %g must be at most %g (the attention scores are multiplied by its square)",
                    r->attention_factor, MAX_ROPE_ATTENTION_FACTOR);
    if (llama3 && llama3_high_freq(r) <= llama3_low_freq(r))
        return fail("llama3_high_freq_factor %g must be above llama3_low_freq_factor %g", llama3_high_freq(r),
                    llama3_low_freq(r));
    // yarn keeps the pairs that turn more than beta_fast times over L and divides those
    // below beta_slow: reversed, the rule would divide the fast pairs and keep the slow
    if (yarn && yarn_beta_fast(r) < yarn_beta_slow(r))
        return fail("yarn_beta_fast %g must not be below yarn_beta_slow %g", yarn_beta_fast(r), yarn_beta_slow(r));
    return 0;
}

static float rope_frequency(const Config *c, int which, int i);

// The RoPE tables hold cos and sin of pos * omega_i for pos < seq_len. omega_i =
// theta^(-2i/head_size) is at most 1 for theta >= 1, but a theta below 1 makes it
// grow with i, and a tiny one (subnormal, say) makes it, or the angle at the last
// position, infinite in float32, and then cos and sin NaN. The largest angle of pair
// i is (seq_len - 1) * omega_i, computed as rope_build_tables computes it.
static int check_rope_angles(const Config *c, int which) {
    int rope_angles = rope_angles_of(c, which);
    for (int i = 0; i < rope_angles; i++) {
        float omega = rope_frequency(c, which, i), angle = (float)(c->seq_len - 1) * omega;
        if (!isfinite(omega) || !isfinite(angle))
            return fail("rope_theta %g is too small: pair %d turns %g radians per token, and at position %d the "
                        "angle is not finite in float32", c->rope[which].theta, i, omega, c->seq_len - 1);
    }
    return 0;
}

// check_rope_angles for each RoPE setting the layers use (-c changes the context
// of both); a failure in the second names it, as validate_config does.
static int check_every_rope_angles(const Config *c) {
    if (check_rope_angles(c, LAYER_ROPE_FIRST) != 0) return -1;
    if (!has_second_rope(c)) return 0;
    return check_rope_angles(c, LAYER_ROPE_SECOND) != 0 ? fail_in("second RoPE setting") : 0;
}

// Checks that the sizes are positive, bounded and consistent with each other.
static int validate_config(const Config *c) {
    if (check_range("dim", c->dim, 1, MAX_DIM) || check_range("hidden_dim", c->hidden_dim, 1, MAX_HIDDEN) ||
        check_range("n_layers", c->n_layers, 1, MAX_LAYERS) || check_range("n_heads", c->n_heads, 1, c->dim) ||
        check_range("n_kv_heads", c->n_kv_heads, 1, c->n_heads) ||
        check_range("vocab_size", c->vocab_size, TOKEN_EOS + 1, MAX_VOCAB) || check_range("seq_len", c->seq_len, 1, MAX_SEQ_LEN))
        return -1;
    if (c->head_size == 0 && c->dim % c->n_heads != 0)
        return fail("dim %d is not divisible by n_heads %d", c->dim, c->n_heads);
    if ((long long)c->n_heads * head_size_of(c) > MAX_DIM)
        return fail("n_heads %d x head_size %d is above %d", c->n_heads, head_size_of(c), MAX_DIM);
    if (c->n_heads % c->n_kv_heads != 0)
        return fail("n_heads %d is not divisible by n_kv_heads %d", c->n_heads, c->n_kv_heads);
    if (head_size_of(c) % 2 != 0) return fail("head size %d is odd; RoPE rotates pairs", head_size_of(c));
    if ((long long)c->n_layers * c->per_layer_dim > MAX_HIDDEN)
        return fail("n_layers %d x per_layer_input_dim %d is above %d", c->n_layers, c->per_layer_dim, MAX_HIDDEN);
    if (!isfinite(c->norm_eps) || c->norm_eps <= 0) return fail("norm_eps %g must be finite and > 0", c->norm_eps);
    const RopeSetting *first = &c->rope[LAYER_ROPE_FIRST], *second = &c->rope[LAYER_ROPE_SECOND];
    if (!isfinite(first->theta) || first->theta <= 0)
        return fail("rope_theta %g must be finite and > 0", first->theta);
    if (!(first->fraction >= 0 && first->fraction <= 1))
        return fail("rope_fraction %g must be in [0, 1]", first->fraction);
    if (validate_rope_scaling(first) != 0 || check_rope_angles(c, LAYER_ROPE_FIRST) != 0) return -1;
    if (has_second_rope(c)) { // the second setting: the same rules, its own fields
        if (!isfinite(second->theta) || second->theta <= 0)
            return fail("rope2_theta %g must be finite and > 0 (0: no second setting)", second->theta);
        if (!(second->fraction >= 0 && second->fraction <= 1))
            return fail("rope2_fraction %g must be in [0, 1]", second->fraction);
        if (validate_rope_scaling(second) != 0 || check_rope_angles(c, LAYER_ROPE_SECOND) != 0)
            return fail_in("second RoPE setting");
    }
    return 0; // the KV cache is sized by the context in use, and checked there (check_context_fits)
}

static uint64_t map_weights(TransformerWeights *w, const Config *c, CheckpointFormat format, uintptr_t base,
                            uint64_t offset);

// A float option of the block: 0 (its default), or finite and > 0.
static int check_block_option(const char *name, float value) {
    if (value != 0.0f && (!isfinite(value) || value < 0))
        return fail("%s %g must be finite and > 0 (0: the default)", name, value);
    return 0;
}

// A file of one block type: every matrix's row length a whole number of blocks (GGUF's
// blocks have no partial block): dim (the rows of wq, wk, wv, w1, w3, the embedding
// and the classifier), each layer's q_dim (wo) and hidden_dim (w2), P (the per-layer
// inputs' gate, output and embedding rows) and expert_hidden (the experts' down rows).
static int check_block_rows(const Config *c) {
    if (!is_block_type(c->weight_type) || c->type_table_bytes) return 0; // a type table's pieces: next_piece
    int block = block_shapes[c->weight_type].weights;
    const char *name = weight_type_names[c->weight_type];
    if (c->dim % block) return fail("%s weights need dim a multiple of %d, not %d", name, block, c->dim);
    if (c->per_layer_dim % block)
        return fail("%s weights need per_layer_input_dim a multiple of %d, not %d", name, block, c->per_layer_dim);
    for (int l = 0; l < c->n_layers; l++) {
        int q_dim = c->n_heads * c->layer[l].head_size, hidden = c->layer[l].hidden_dim;
        if (q_dim % block || hidden % block)
            return fail("%s weights need rows of a multiple of %d; layer %d has q_dim %d and hidden_dim %d", name,
                        block, l, q_dim, hidden);
    }
    if (c->expert_hidden % block) // the experts' down rows
        return fail("%s weights need expert_hidden a multiple of %d, not %d", name, block, c->expert_hidden);
    return 0;
}

// A mixture of experts' fields (header bytes 200..215): with block flag 64, the
// experts per layer, the k a token uses, each expert's width and the routing rule;
// without it, all 0.
static int parse_experts(const unsigned char *data, Config *c, int has_experts) {
    c->n_experts = read_i32(data + 200), c->n_experts_used = read_i32(data + 204);
    c->expert_hidden = read_i32(data + 208);
    int routing = read_i32(data + 212);
    if (!has_experts) {
        if (c->n_experts || c->n_experts_used || c->expert_hidden || routing)
            return fail("n_experts %d, n_experts_used %d, expert_hidden %d and routing %d must be 0 without block "
                        "flag 64", c->n_experts, c->n_experts_used, c->expert_hidden, routing);
        return 0;
    }
    if (c->n_experts < 1 || c->n_experts > MAX_EXPERTS)
        return fail("n_experts %d must be in [1, %d] with block flag 64", c->n_experts, MAX_EXPERTS);
    if (c->n_experts_used < 1 || c->n_experts_used > c->n_experts || c->n_experts_used > MAX_EXPERTS_USED)
        return fail("n_experts_used %d must be in [1, n_experts %d] and at most %d", c->n_experts_used, c->n_experts,
                    MAX_EXPERTS_USED);
    if (c->expert_hidden < 1 || c->expert_hidden > MAX_HIDDEN)
        return fail("expert_hidden %d must be in [1, %d] with block flag 64", c->expert_hidden, MAX_HIDDEN);
    if (routing < 1 || routing >= N_ROUTINGS)
        return fail("routing %d is not a rule this program knows (1 softmax, top-k, renormalized; 2 softmax, top-k; "
                    "3 Gemma 4's)", routing);
    c->routing = (Routing)routing;
    return 0;
}

// ROPE version 2's fields (bytes 84..95 and 112..191; docs/format.md): head_size,
// weight_type, a reserved int32; the block options; the per-layer table's place; the
// second RoPE setting; the experts' (parse_experts). (Bytes 96..111, the tokenizer
// section's, are checked by the caller.)
static int parse_header_v2(const unsigned char *data, Config *c) {
    int head_size = read_i32(data + 84), weight_type = read_i32(data + 88), reserved = read_i32(data + 92);
    if (head_size != 0 && (head_size < 2 || head_size > MAX_DIM || head_size % 2 != 0))
        return fail("head_size %d must be 0 (dim / n_heads) or even, in [2, %d]", head_size, MAX_DIM);
    if (weight_type < 0 || weight_type >= N_WEIGHT_TYPES)
        return fail("weight_type %d is not a type this program knows (" KNOWN_TYPES ", 4 per piece)", weight_type);
    if (reserved != 0) return fail("reserved header field at byte 92 is %d, not 0", reserved);
    c->head_size = head_size;
    c->weight_type = weight_type == WEIGHT_TYPE_PER_PIECE ? WEIGHT_F32 : (WeightType)weight_type; // 4: the table's
    c->type_table_offset = read_u64(data + 216);
    c->type_table_bytes = read_u64(data + 224);
    int has_table = c->type_table_offset != 0 || c->type_table_bytes != 0;
    if (weight_type == WEIGHT_TYPE_PER_PIECE && (c->type_table_offset == 0 || c->type_table_bytes == 0))
        return fail("weight_type 4 (per piece) needs a type table: type_table_offset %llu and type_table_bytes %llu",
                    (unsigned long long)c->type_table_offset, (unsigned long long)c->type_table_bytes);
    if (weight_type != WEIGHT_TYPE_PER_PIECE && has_table)
        return fail("type_table_offset %llu and type_table_bytes %llu must be 0 with weight_type %d (4: a type table)",
                    (unsigned long long)c->type_table_offset, (unsigned long long)c->type_table_bytes, weight_type);
    uint32_t flags = read_u32(data + 112);
    if (flags & ~BLOCK_FLAGS_KNOWN)
        return fail("block_flags 0x%x has bits this program does not know (1 qkv bias, 2 qk norm, 4 post norms, "
                    "8 v norm, 16 layer scalars, 32 per-layer inputs, 64 experts)", flags);
    c->qkv_bias = (flags & BLOCK_QKV_BIAS) != 0;
    c->qk_norm = (flags & BLOCK_QK_NORM) != 0;
    c->post_norms = (flags & BLOCK_POST_NORMS) != 0;
    c->v_norm = (flags & BLOCK_V_NORM) != 0;
    c->layer_scalars = (flags & BLOCK_LAYER_SCALAR) != 0;
    if (parse_experts(data, c, (flags & BLOCK_EXPERTS) != 0) != 0) return -1;
    c->per_layer_dim = read_i32(data + 192);
    c->per_layer_multiplier = read_f32(data + 196);
    if (flags & BLOCK_PER_LAYER_INPUT) {
        if (c->per_layer_dim < 1 || c->per_layer_dim > MAX_DIM)
            return fail("per_layer_input_dim %d must be in [1, %d] with block flag 32", c->per_layer_dim, MAX_DIM);
        if (!(isfinite(c->per_layer_multiplier) && c->per_layer_multiplier > 0))
            return fail("per_layer_embedding_multiplier %g must be finite and > 0", c->per_layer_multiplier);
    } else if (c->per_layer_dim != 0 || read_u32(data + 196) != 0) {
        return fail("per_layer_input_dim %d and per_layer_embedding_multiplier %g must be 0 without block flag 32",
                    c->per_layer_dim, c->per_layer_multiplier);
    }
    int activation = read_i32(data + 116);
    if (activation < 0 || activation >= N_ACTIVATIONS)
        return fail("activation %d is not one this program knows (0 swiglu, 1 geglu-tanh)", activation);
    c->activation = (Activation)activation;
    c->embedding_multiplier = read_f32(data + 120);
    c->attention_scale = read_f32(data + 124);
    c->attention_softcap = read_f32(data + 128);
    c->final_softcap = read_f32(data + 132);
    if (check_block_option("embedding_multiplier", c->embedding_multiplier) ||
        check_block_option("attention_scale", c->attention_scale) ||
        check_block_option("attention_softcap", c->attention_softcap) ||
        check_block_option("final_softcap", c->final_softcap))
        return -1;
    c->layer_table_offset = read_u64(data + 136);
    c->layer_table_bytes = read_u64(data + 144);
    RopeSetting *second = &c->rope[LAYER_ROPE_SECOND];
    read_rope_setting(data + 152, second); // bytes 152..191
    if (!has_second_rope(c)) {
        for (int i = 156; i < 192; i++)
            if (data[i] != 0) return fail("second RoPE setting field at byte %d is not zero, but rope2_theta is 0", i);
    } else {
        if (second->scaling == ROPE_SCALING_NONE && second->factor != 1.0f)
            return fail("rope2_factor %g with rope2_scaling 0 (none): the factor of no rule must be 1",
                        second->factor);
        if (second->original_len < 0)
            return fail("rope2_original_len %d must be >= 0 (0: seq_len)", second->original_len);
        if (second->scaling == ROPE_SCALING_LONGROPE)
            return fail("rope2_scaling 5 (longrope) is for the first setting only");
    }
    return 0;
}

// The per-layer table's place (header bytes 136..151): none (both 0), or 8 bytes per
// layer starting at the first multiple of 64 at or after the last tensor's end.
static int check_layer_table_place(const Config *c, uint64_t tensors_end) {
    if (c->layer_table_offset == 0 && c->layer_table_bytes == 0) return 0;
    uint64_t expected = round_up(tensors_end, ROPE_V2_ALIGNMENT);
    if (c->layer_table_offset != expected)
        return fail("layer_table_offset %llu is not %llu (the first multiple of 64 after the last tensor)",
                    (unsigned long long)c->layer_table_offset, (unsigned long long)expected);
    if (c->layer_table_bytes != 8ull * c->n_layers && c->layer_table_bytes != 32ull * c->n_layers)
        return fail("layer_table_bytes %llu is not 8 x n_layers = %llu (or 32 x n_layers = %llu)",
                    (unsigned long long)c->layer_table_bytes, 8ull * c->n_layers, 32ull * c->n_layers);
    return 0;
}

static uint64_t matrix_pieces(const Config *c);

// The type table (weight_type 4, header bytes 216..231): one byte per matrix piece
// (matrix_pieces), each a weight type, copied into c->piece_type. Read before the
// layout, whose sizes it sets; its place is checked after (check_type_table_place).
static int read_type_table(const unsigned char *data, size_t size, Config *c) {
    uint64_t pieces = matrix_pieces(c);
    if (c->type_table_bytes != pieces)
        return fail("type_table_bytes %llu is not %llu, one per matrix piece of this model",
                    (unsigned long long)c->type_table_bytes, (unsigned long long)pieces);
    if (c->type_table_offset < HEADER_BYTES || c->type_table_offset > size || pieces > size - c->type_table_offset)
        return fail("the type table (%llu bytes at %llu) is not inside the file's %zu bytes (truncated?)",
                    (unsigned long long)pieces, (unsigned long long)c->type_table_offset, size);
    for (uint64_t i = 0; i < pieces; i++) {
        unsigned char type = data[c->type_table_offset + i];
        if (type >= N_WEIGHT_TYPES || type == WEIGHT_TYPE_PER_PIECE)
            return fail("type table entry %llu is %d, not a type this program knows (" KNOWN_TYPES ")",
                        (unsigned long long)i, type);
        c->piece_type[i] = type;
    }
    return 0;
}

// The type table's place: the first multiple of 64 at or after the end of the tensors, or
// of the per-layer table when there is one (`end`).
static int check_type_table_place(const Config *c, uint64_t end) {
    uint64_t expected = round_up(end, ROPE_V2_ALIGNMENT);
    if (c->type_table_bytes && c->type_table_offset != expected)
        return fail("type_table_offset %llu is not %llu (the first multiple of 64 after the tensors and the layer "
                    "table)", (unsigned long long)c->type_table_offset, (unsigned long long)expected);
    return 0;
}

// Every layer as the header describes it: the first setting, full attention, the
// header's head size, key/value heads and width, its own KV cache; with experts
// (block flag 64) every layer has them in place of the feed-forward.
static void default_layers(Config *c) {
    for (int l = 0; l < c->n_layers; l++)
        c->layer[l] = (LayerSpec){.rope = LAYER_ROPE_FIRST, .head_size = head_size_of(c), .n_kv_heads = c->n_kv_heads,
                                  .hidden_dim = c->n_experts && c->routing != ROUTING_GEMMA4 ? 0 : c->hidden_dim,
                                  .kv_source = l,
                                  .experts = c->n_experts > 0};
}

// The per-layer table (docs/format.md): n_layers records of two int32 { rope: 0 NoPE,
// 1 the first setting, 2 the second; window: 0 full attention, else W >= 1 keys, the
// current one included }, or of eight (Gemma 4) that add the layer's head_size,
// n_kv_heads and hidden_dim (0: the header's), kv_source (0: its own cache; s + 1:
// layer s's), values (1: the values are the key projection) and experts (1: the
// layer has the experts, 0: a feed-forward; 0 without block flag 64).
// Without a table, default_layers.
static int parse_layer_table(const unsigned char *table, Config *c) {
    int fields = c->layer_table_bytes == 32ull * c->n_layers ? 8 : 2;
    for (int l = 0; l < c->n_layers; l++) {
        const unsigned char *r = table + 4 * fields * l;
        int rope = read_i32(r), window = read_i32(r + 4);
        if (rope < LAYER_NOPE || rope > LAYER_ROPE_SECOND)
            return fail("layer %d: rope %d is not 0 (NoPE), 1 (first setting) or 2 (second)", l, rope);
        if (rope == LAYER_ROPE_SECOND && !has_second_rope(c))
            return fail("layer %d uses the second RoPE setting, but rope2_theta is 0 (none)", l);
        if (window < 0) return fail("layer %d: window %d must be >= 0 (0: full attention)", l, window);
        LayerSpec *ls = &c->layer[l];
        ls->rope = rope, ls->window = window;
        if (fields == 2) continue;
        int head_size = read_i32(r + 8), kv_heads = read_i32(r + 12), hidden = read_i32(r + 16);
        int source = read_i32(r + 20), values = read_i32(r + 24), experts = read_i32(r + 28);
        if (head_size != 0 && (head_size < 2 || head_size % 2 != 0 || (long long)head_size * c->n_heads > MAX_DIM))
            return fail("layer %d: head_size %d must be 0 (the header's) or even, >= 2, with n_heads %d x it <= %d", l,
                        head_size, c->n_heads, MAX_DIM);
        if (kv_heads != 0 && (kv_heads < 1 || kv_heads > c->n_heads || c->n_heads % kv_heads != 0))
            return fail("layer %d: n_kv_heads %d must be 0 (the header's) or divide n_heads %d", l, kv_heads, c->n_heads);
        if (hidden != 0 && (hidden < 1 || hidden > MAX_HIDDEN))
            return fail("layer %d: hidden_dim %d must be 0 (the header's) or in [1, %d]", l, hidden, MAX_HIDDEN);
        if (source < 0 || source > l)
            return fail("layer %d: kv_source %d must be 0 (its own cache) or an earlier layer + 1", l, source);
        if (values != 0 && values != 1) return fail("layer %d: values %d must be 0 (wv) or 1 (the keys)", l, values);
        if (experts != 0 && (experts != 1 || !c->n_experts))
            return fail("layer %d: experts %d must be 0 (a feed-forward)%s", l, experts,
                        c->n_experts ? " or 1 (the experts)" : " without block flag 64");
        int beside = c->routing == ROUTING_GEMMA4; // Gemma 4: the experts run beside the feed-forward
        if (experts && hidden && !beside)
            return fail("layer %d: hidden_dim %d on a layer with experts (no feed-forward)", l, hidden);
        if (head_size) ls->head_size = head_size;
        if (kv_heads) ls->n_kv_heads = kv_heads;
        ls->experts = experts;
        ls->hidden_dim = experts && !beside ? 0 : hidden ? hidden : c->hidden_dim;
        ls->values_are_keys = values;
        if (source > 0) {
            const LayerSpec *src = &c->layer[source - 1];
            if (src->kv_source != source - 1)
                return fail("layer %d: kv_source layer %d shares another layer's cache itself", l, source - 1);
            if (src->rope != ls->rope || src->window != ls->window || src->head_size != ls->head_size ||
                src->n_kv_heads != ls->n_kv_heads)
                return fail("layer %d: kv_source layer %d differs in rope, window, head_size or n_kv_heads", l,
                            source - 1);
            if (values) return fail("layer %d: values 1 on a layer that shares layer %d's cache", l, source - 1);
            ls->kv_source = source - 1;
        }
    }
    // each RoPE setting's frequencies are counted over one head size: its layers'
    for (int l = 0; l < c->n_layers; l++) {
        const LayerSpec *ls = &c->layer[l];
        if (ls->rope == LAYER_ROPE_FIRST && ls->head_size != head_size_of(c))
            return fail("layer %d: head_size %d, but the first RoPE setting's layers have the header's %d", l,
                        ls->head_size, head_size_of(c));
        RopeSetting *second = &c->rope[LAYER_ROPE_SECOND];
        if (ls->rope == LAYER_ROPE_SECOND && second->head_size && ls->head_size != second->head_size)
            return fail("layer %d: head_size %d, but an earlier layer of the second RoPE setting has %d", l,
                        ls->head_size, second->head_size);
        if (ls->rope == LAYER_ROPE_SECOND) second->head_size = ls->head_size;
    }
    return 0;
}

// The positions layer l's own cache holds. A full-attention layer keeps the whole
// context, seq_len. A sliding layer of window W (Mistral; Gemma 2's, 3's, 4's local
// layers) never looks further back than W positions, so its cache is a ring:
// position t lives in slot t mod R, and a new position overwrites the one R back.
// R is not W: a block of B tokens (up to PREFILL_BLOCK) writes all its keys before
// its first token attends, and that token, at pos0, still needs pos0 - W + 1; the
// block's last write, pos0 + B - 1, overwrites pos0 + B - 1 - R, which must be older:
//   pos0 + B - 1 - R < pos0 - W + 1   <=>   R >= W + B - 1,
// so R = W + PREFILL_BLOCK - 1. A window that leaves R >= seq_len is the whole
// context: such a layer keeps seq_len positions, as a full one.
static int kv_positions_of_window(int window) { return window + PREFILL_BLOCK - 1; }
static int kv_positions_of(const Config *c, int l) {
    int window = c->layer[l].window;
    return window > 0 && window < c->seq_len - (PREFILL_BLOCK - 1) ? kv_positions_of_window(window) : c->seq_len;
}
static int is_ring(const Config *c, int l) { return kv_positions_of(c, l) < c->seq_len; }

static int max_int(int a, int b) { return a > b ? a : b; }

// Lays out the KV cache for the context in use (c->seq_len): the caches of the
// layers that own one (all but Gemma 4's KV-shared layers) back to back, each
// (n_kv_heads, cache_positions, head_size). A shared layer reads its source's.
// Returns the floats of one of the two caches (keys; the values' is the same).
static uint64_t place_kv_caches(Config *c) {
    uint64_t before = 0;
    c->max_cache_positions = 0;
    for (int l = 0; l < c->n_layers; l++) {
        LayerSpec *ls = &c->layer[l], *src = &c->layer[ls->kv_source];
        if (ls->kv_source == l) {
            ls->cache_positions = kv_positions_of(c, l), ls->cache_before = before;
            before += (uint64_t)ls->n_kv_heads * ls->head_size * ls->cache_positions;
        } else {
            ls->cache_positions = src->cache_positions, ls->cache_before = src->cache_before;
        }
        c->max_cache_positions = max_int(c->max_cache_positions, ls->cache_positions);
    }
    return before;
}

// Where each layer's pieces start in the layered tensors (docs/format.md), and the
// totals: a layer's q rows in wq, bq and wo; its own cache's rows in wk, bk (and the
// KV cache); its v rows in wv, bv; its hidden rows in w1, w2, w3; its head in
// q_norm and k_norm. With all layers alike, layer l's piece starts l pieces in.
static void place_layers(Config *c) {
    uint64_t q = 0, kv = 0, v = 0, hidden = 0, heads = 0, k_heads = 0, sparse = 0;
    c->max_head_size = c->max_q_dim = c->max_kv_dim = 0;
    c->max_hidden = c->n_experts ? c->expert_hidden : 0; // an expert's activations use hb, hb2 too
    for (int l = 0; l < c->n_layers; l++) {
        LayerSpec *ls = &c->layer[l];
        ls->q_before = q, ls->kv_before = kv, ls->v_before = v, ls->hidden_before = hidden;
        ls->heads_before = heads, ls->k_heads_before = k_heads, ls->sparse_before = sparse;
        sparse += ls->experts;
        int q_dim = c->n_heads * ls->head_size, kv_dim = ls->n_kv_heads * ls->head_size;
        q += q_dim, hidden += ls->hidden_dim, heads += ls->head_size;
        if (ls->kv_source == l) kv += kv_dim, k_heads += ls->head_size, v += ls->values_are_keys ? 0 : kv_dim;
        c->max_head_size = max_int(c->max_head_size, ls->head_size), c->max_q_dim = max_int(c->max_q_dim, q_dim);
        c->max_kv_dim = max_int(c->max_kv_dim, kv_dim), c->max_hidden = max_int(c->max_hidden, ls->hidden_dim);
    }
    c->q_rows = q, c->kv_rows = kv, c->v_rows = v, c->hidden_rows = hidden, c->heads_floats = heads;
    c->k_heads_floats = k_heads, c->sparse_layers = sparse;
    place_kv_caches(c); // for the file's seq_len; build_run_state again for the context in use
}

// ROPE version 2's tokenizer section (bytes 96..111): where it starts and how long
// it is, or 0 and 0 for a file without one.
static void read_tokenizer_span(const unsigned char *data, SectionSpan *tokenizer) {
    tokenizer->offset = read_u64(data + 96);
    tokenizer->bytes = read_u64(data + 104);
}

// The tokenizer section sits at the first multiple of 64 after the last tensor
// (which ends at *expected_size) and ends the file.
static int place_tokenizer_section(const SectionSpan *tokenizer, uint64_t *expected_size) {
    uint64_t start = round_up(*expected_size, ROPE_V2_ALIGNMENT);
    if (tokenizer->offset == 0) {
        if (tokenizer->bytes != 0)
            return fail("tokenizer_bytes is %llu but tokenizer_offset is 0", (unsigned long long)tokenizer->bytes);
        return 0;
    }
    if (tokenizer->offset != start)
        return fail("tokenizer_offset %llu is not %llu, the first multiple of 64 after the tensors (and the layer table)",
                    (unsigned long long)tokenizer->offset, (unsigned long long)start);
    if (tokenizer->bytes == 0 || tokenizer->bytes > (1ull << 40))
        return fail("tokenizer_bytes %llu is out of range", (unsigned long long)tokenizer->bytes);
    *expected_size = tokenizer->offset + tokenizer->bytes;
    return 0;
}

// Reads the header of any of the formats from the first bytes of a file. Sets
// *data_offset to where the weights start, *expected_size to the size the header
// implies, and *tokenizer to the file's own tokenizer section (ROPE version 2;
// else none). Works on memory only, so the fuzzer can drive it.
static int parse_header(const unsigned char *data, size_t size, Config *c, CheckpointFormat *format,
                        size_t *data_offset, uint64_t *expected_size, SectionSpan *tokenizer) {
    tokenizer->offset = tokenizer->bytes = 0;
    memset(c, 0, sizeof(*c));
    RopeSetting *first = &c->rope[LAYER_ROPE_FIRST], *second = &c->rope[LAYER_ROPE_SECOND];
    c->norm_eps = 1e-5f; // the llama2.c formats: fixed by llama2.c's model.py
    first->theta = 10000.0f;
    first->fraction = 1.0f;
    first->factor = 1.0f;
    if (size < LEGACY_HEADER_BYTES) return fail("file is too small (%zu bytes) to hold a checkpoint header", size);
    uint32_t magic = read_u32(data);
    if (magic == MAGIC_ROPE || magic == MAGIC_LLAMA2C_V1) {
        if (size < HEADER_BYTES) return fail("file is too small (%zu bytes) for its 256-byte header", size);
        int version = read_i32(data + 4);
        if (magic == MAGIC_LLAMA2C_V1 && version != 1)
            return fail("llama2.c checkpoint version %d is not supported (only 1)", version);
        if (magic == MAGIC_ROPE && version != 1 && version != 2)
            return fail("ROPE checkpoint version %d is not supported (only 1 and 2)", version);
        *format = magic == MAGIC_ROPE ? FORMAT_ROPE : FORMAT_LLAMA2C_V1;
        c->version = version;
    } else {
        *format = FORMAT_LLAMA2C_LEGACY;
    }
    const unsigned char *p = *format == FORMAT_LLAMA2C_LEGACY ? data : data + 8;
    c->dim = read_i32(p);
    c->hidden_dim = read_i32(p + 4);
    c->n_layers = read_i32(p + 8);
    c->n_heads = read_i32(p + 12);
    c->n_kv_heads = read_i32(p + 16);
    c->vocab_size = read_i32(p + 20);
    c->seq_len = read_i32(p + 24);
    if (*format == FORMAT_LLAMA2C_LEGACY) {
        // a negative vocab_size is llama2.c's way of saying "unshared classifier"
        c->shared_classifier = c->vocab_size > 0;
        if (c->vocab_size < 0 && c->vocab_size != INT32_MIN) c->vocab_size = -c->vocab_size;
    } else if (*format == FORMAT_LLAMA2C_V1) {
        if (data[36] > 1) return fail("shared-classifier flag is %d, expected 0 or 1", data[36]);
        c->shared_classifier = data[36];
        for (int i = 37; i < HEADER_BYTES; i++)
            if (data[i] != 0) return fail("header padding byte %d is not zero", i);
    } else {
        int shared = read_i32(data + 36);
        if (shared != 0 && shared != 1) return fail("shared_classifier is %d, expected 0 or 1", shared);
        c->shared_classifier = shared;
        c->norm_eps = read_f32(data + 40);
        read_rope_setting(data + 44, first); // bytes 44..83
        int reserved_from = 84;
        if (c->version == 2) {
            if (parse_header_v2(data, c) != 0) return -1;
            read_tokenizer_span(data, tokenizer);
            reserved_from = 232; // 96..111 the tokenizer section, 112..215 the block options, second setting,
                                 // per-layer inputs, experts; 216..231 the type table
        }
        for (int i = reserved_from; i < HEADER_BYTES; i++)
            if (data[i] != 0) return fail("reserved header byte %d is not zero (a newer format?)", i);
        // files written before the rules: rule 0 with a factor is linear scaling
        if (first->scaling == ROPE_SCALING_NONE && first->factor != 1.0f) first->scaling = ROPE_SCALING_LINEAR;
        if (first->original_len < 0)
            return fail("rope_original_len %d must be >= 0 (0: seq_len)", first->original_len);
        if (first->scaling == ROPE_SCALING_LONGROPE && c->version != 2)
            return fail("rope_scaling 5 (longrope) needs version 2, which stores its factors");
    }
    if (first->original_len == 0) first->original_len = c->seq_len; // the trained length, unless the file says
    if (second->original_len == 0 && has_second_rope(c)) second->original_len = c->seq_len;
    if (validate_config(c) != 0) return -1;
    default_layers(c);
    // records of eight fields change the tensors' sizes: read before the layout (records
    // of two change none, and are read once the file's size has been checked)
    if (c->layer_table_bytes == 32ull * c->n_layers && c->layer_table_offset >= HEADER_BYTES &&
        c->layer_table_offset <= size && c->layer_table_bytes <= size - c->layer_table_offset &&
        parse_layer_table(data + c->layer_table_offset, c) != 0)
        return -1;
    if (second->head_size && check_every_rope_angles(c) != 0) return -1; // the second over its own head size
    place_layers(c);
    if (check_block_rows(c) != 0) return -1;
    if (c->type_table_bytes && read_type_table(data, size, c) != 0) return -1; // the pieces' sizes follow from it
    *data_offset = *format == FORMAT_LLAMA2C_LEGACY ? LEGACY_HEADER_BYTES : HEADER_BYTES;
    TransformerWeights unused;
    *expected_size = map_weights(&unused, c, *format, 0, *data_offset); // where the last tensor ends
    if (*expected_size == 0) return -1; // a block piece's rows refused
    if (check_layer_table_place(c, *expected_size) != 0) return -1;
    if (c->layer_table_bytes) *expected_size = c->layer_table_offset + c->layer_table_bytes;
    if (check_type_table_place(c, *expected_size) != 0) return -1;
    if (c->type_table_bytes) *expected_size = c->type_table_offset + c->type_table_bytes;
    if (c->version == 2) return place_tokenizer_section(tokenizer, expected_size); // after the tables, if any
    return 0;
}

// Walks the tensors in file order: `at` is where the next one starts, in bytes from
// the start of the file. Version 2 starts each tensor at a multiple of 64 bytes: on
// a cache line, and a float32 norm after a 16-bit matrix of an odd number of weights
// still on a multiple of 4. The other versions store them back to back.
typedef struct {
    uintptr_t base;  // the file's first byte in memory (0 when only sizes are wanted)
    uint64_t at;     // offset of the next tensor
    size_t alignment;
    WeightType type; // the matrices' and the embedding's, without a type table
    const unsigned char *types; // with one: each matrix piece's type, in file order; else NULL
    int piece;       // the matrix pieces walked so far (the next one's entry in types)
    int failed;      // a matrix was refused (next_piece)
} TensorLayout;

static uint64_t next_tensor(TensorLayout *t, uint64_t bytes) {
    t->at = round_up(t->at, t->alignment);
    uint64_t start = t->at;
    t->at += bytes;
    return start;
}
// a norm or another vector: always float32
static const float *next_vector(TensorLayout *t, uint64_t elements) {
    return (const float *)(t->base + next_tensor(t, elements * sizeof(float)));
}

// Where a block's f16 scales lie (d, then m or dmin when the type has one; -1: none).
static const int scale_places[N_WEIGHT_TYPES][2] = {
    [WEIGHT_Q8_0] = {0, -1}, [WEIGHT_Q4_0] = {0, -1}, [WEIGHT_Q4_1] = {0, 2}, [WEIGHT_Q5_0] = {0, -1},
    [WEIGHT_Q5_1] = {0, 2},  [WEIGHT_Q4_K] = {0, 2},  [WEIGHT_Q5_K] = {0, 2}, [WEIGHT_Q6_K] = {208, -1}};

// A block matrix's scales: each a finite f16 (exponent bits not all ones), so that
// every weight is a number.
static int check_block_scales(const unsigned char *blocks, uint64_t elements, WeightType type, const char *name) {
    BlockShape b = block_shapes[type];
    for (uint64_t i = 0; i < elements / (uint64_t)b.weights; i++, blocks += b.bytes)
        for (int s = 0; s < 2 && scale_places[type][s] >= 0; s++) {
            uint16_t h;
            memcpy(&h, blocks + scale_places[type][s], sizeof(h));
            if ((h & 0x7c00) == 0x7c00)
                return fail("%s: the %s of %s block %llu is %g; scales must be finite", name,
                            s == 0 ? "scale" : type == WEIGHT_Q4_1 || type == WEIGHT_Q5_1 ? "min m" : "dmin",
                            weight_type_names[type], (unsigned long long)i, f16_to_f32(h));
        }
    return 0;
}

// A block piece's rows must be whole blocks (GGUF's blocks have no partial block). A
// file of one type has had every row length checked at once (check_block_rows); with
// a type table, each block piece is checked here.
static int check_block_piece_rows(uint64_t rows, uint64_t row_length, WeightType type, const char *name) {
    int block = block_shapes[type].weights;
    if (rows == 0 || row_length % (uint64_t)block == 0) return 0;
    return fail("%s is %s with rows of %llu weights, not a multiple of %d", name, weight_type_names[type],
                (unsigned long long)row_length, block);
}

// The next matrix piece, rows x row_length elements: the embedding, a classifier, or one
// layer's piece of a layered tensor (layer: its index; -1 for a whole matrix). Without a
// type table it has the file's type, and a layered tensor's pieces lie back to back (the
// tensor starts aligned: `first`); with one, each piece has its table entry's type and
// starts at its own multiple of 64. Once mapped, a block piece's scales are checked.
static Matrix next_piece(TensorLayout *t, uint64_t rows, uint64_t row_length, const char *name, int layer, int first) {
    WeightType type = t->types ? (WeightType)t->types[t->piece] : t->type;
    uint64_t elements = rows * row_length;
    t->piece++;
    if (t->types || first) t->at = round_up(t->at, t->alignment);
    Matrix m = {elements ? (const void *)(t->base + t->at) : NULL, type};
    t->at += weight_bytes(type, elements);
    if (!is_block_type(type) || t->failed) return m;
    char piece[64]; // its name in a message: "wq", or "wq of layer 3" for a layer's piece
    if (layer < 0) snprintf(piece, sizeof(piece), "%s", name);
    else snprintf(piece, sizeof(piece), "%s of layer %d", name, layer);
    if ((t->types && check_block_piece_rows(rows, row_length, type, piece) != 0) ||
        (t->base && check_block_scales(m.data, elements, type, piece) != 0))
        t->failed = 1;
    return m;
}
// a matrix that is one piece (the embedding, the classifier, Gemma 4's per-layer inputs)
static Matrix next_matrix(TensorLayout *t, uint64_t rows, uint64_t row_length, const char *name) {
    return next_piece(t, rows, row_length, name, -1, 1);
}

// The matrix pieces a file holds, in the type table's order: the embedding, each layer's
// wq, wk, wv, wo, w1, w2, w3 (tensor by tensor), the classifier unless shared, Gemma 4's
// per-layer embedding and projection, its gate and output per layer, and for each layer
// with experts its router and three expert tensors (tensor by tensor).
static uint64_t matrix_pieces(const Config *c) {
    uint64_t layers = c->n_layers;
    return 1 + 7 * layers + !c->shared_classifier + (c->per_layer_dim ? 2 + 2 * layers : 0) + 4 * c->sparse_layers;
}

// Points the weights into the file mapped at base (0: computes only the layout),
// the first tensor at `offset`. Returns where the last tensor ends: the file's size;
// 0 when a matrix is refused (next_piece).
// llama2.c's version 1 stores all the norms first, then the embedding and the
// matrices; the legacy format and ours start with the embedding and interleave the
// norms. (Integer arithmetic on base, so that the layout of a header whose sizes
// are far past the end of its file is no pointer arithmetic out of bounds.)
static uint64_t map_weights(TransformerWeights *w, const Config *c, CheckpointFormat format, uintptr_t base,
                            uint64_t offset) {
    // each layered tensor is the layers' pieces in layer order, each the layer's own shape
    // (docs/format.md; all alike but in Gemma 4): wq (q_dim, dim), wk (its cache's kv_dim,
    // dim; none on a KV-shared layer), wv (the same, none where the values are the keys),
    // wo (dim, q_dim), w1 and w3 (hidden, dim), w2 (dim, hidden)
    uint64_t dim = c->dim, layers = c->n_layers, vocab = c->vocab_size;
    int L = c->n_layers;
    size_t alignment = format == FORMAT_ROPE && c->version == 2 ? ROPE_V2_ALIGNMENT : 1;
    TensorLayout t = {base, offset, alignment, c->weight_type, c->type_table_bytes ? c->piece_type : NULL, 0, 0};
    uint64_t q_rows[MAX_LAYERS], kv_rows[MAX_LAYERS], v_rows[MAX_LAYERS];
    for (int l = 0; l < L; l++) {
        const LayerSpec *ls = &c->layer[l];
        int owns_cache = ls->kv_source == l;
        q_rows[l] = (uint64_t)c->n_heads * ls->head_size;
        kv_rows[l] = owns_cache ? (uint64_t)ls->n_kv_heads * ls->head_size : 0;
        v_rows[l] = owns_cache && !ls->values_are_keys ? kv_rows[l] : 0;
    }
    if (format == FORMAT_LLAMA2C_V1) {
        w->rms_att = next_vector(&t, layers * dim);
        w->rms_ffn = next_vector(&t, layers * dim);
        w->rms_final = next_vector(&t, dim);
    }
    w->token_embedding = next_matrix(&t, vocab, dim, "token_embedding");
    if (format != FORMAT_LLAMA2C_V1) w->rms_att = next_vector(&t, layers * dim);
    for (int l = 0; l < L; l++) w->layer[l].wq = next_piece(&t, q_rows[l], dim, "wq", l, l == 0);
    for (int l = 0; l < L; l++) w->layer[l].wk = next_piece(&t, kv_rows[l], dim, "wk", l, l == 0);
    for (int l = 0; l < L; l++) w->layer[l].wv = next_piece(&t, v_rows[l], dim, "wv", l, l == 0);
    for (int l = 0; l < L; l++) w->layer[l].wo = next_piece(&t, dim, q_rows[l], "wo", l, l == 0);
    if (format != FORMAT_LLAMA2C_V1) w->rms_ffn = next_vector(&t, layers * dim);
    for (int l = 0; l < L; l++) w->layer[l].w1 = next_piece(&t, c->layer[l].hidden_dim, dim, "w1", l, l == 0);
    for (int l = 0; l < L; l++) w->layer[l].w2 = next_piece(&t, dim, c->layer[l].hidden_dim, "w2", l, l == 0);
    for (int l = 0; l < L; l++) w->layer[l].w3 = next_piece(&t, c->layer[l].hidden_dim, dim, "w3", l, l == 0);
    if (format != FORMAT_LLAMA2C_V1) w->rms_final = next_vector(&t, dim);
    if (format == FORMAT_LLAMA2C_LEGACY) next_vector(&t, (uint64_t)c->seq_len * head_size_of(c)); // freq_cis, skipped
    w->wcls = c->shared_classifier ? w->token_embedding : next_matrix(&t, vocab, dim, "wcls");
    // version 2's optional tensors, after version 1's, in this order (float32)
    w->bq = c->qkv_bias ? next_vector(&t, c->q_rows) : NULL;
    w->bk = c->qkv_bias ? next_vector(&t, c->kv_rows) : NULL;
    w->bv = c->qkv_bias ? next_vector(&t, c->v_rows) : NULL;
    w->q_norm = c->qk_norm ? next_vector(&t, c->heads_floats) : NULL;
    w->k_norm = c->qk_norm ? next_vector(&t, c->k_heads_floats) : NULL;
    w->rms_post_att = c->post_norms ? next_vector(&t, layers * dim) : NULL;
    w->rms_post_ffn = c->post_norms ? next_vector(&t, layers * dim) : NULL;
    w->rope_factors = c->rope[LAYER_ROPE_FIRST].scaling == ROPE_SCALING_LONGROPE
                          ? next_vector(&t, 2ull * rope_angles_of(c, LAYER_ROPE_FIRST)) : NULL;
    // Gemma 4's, after those
    w->layer_scalars = c->layer_scalars ? next_vector(&t, layers) : NULL;
    uint64_t P = c->per_layer_dim;
    Matrix none = {NULL, WEIGHT_F32};
    w->per_layer_embedding = w->per_layer_in = none;
    w->per_layer_in_norm = w->rms_per_layer = NULL;
    for (int l = 0; l < L; l++) w->layer[l].per_layer_gate = w->layer[l].per_layer_out = none;
    if (P) {
        w->per_layer_embedding = next_matrix(&t, vocab, layers * P, "per_layer_embedding");
        w->per_layer_in = next_matrix(&t, layers * P, dim, "per_layer_in");
        w->per_layer_in_norm = next_vector(&t, P);
        for (int l = 0; l < L; l++) w->layer[l].per_layer_gate = next_piece(&t, P, dim, "per_layer_gate", l, l == 0);
        for (int l = 0; l < L; l++) w->layer[l].per_layer_out = next_piece(&t, dim, P, "per_layer_out", l, l == 0);
        w->rms_per_layer = next_vector(&t, layers * dim);
    }
    // a mixture of experts' (block flag 64), last: for each layer with experts, its
    // piece of each tensor (n_experts of them, back to back)
    uint64_t sparse = c->sparse_layers, experts = c->n_experts, expert_hidden = c->expert_hidden;
    for (int l = 0; l < L; l++) {
        LayerWeights *lw = &w->layer[l];
        lw->router = lw->expert_w1 = lw->expert_w2 = lw->expert_w3 = none;
    }
    for (int l = 0; l < L; l++)
        if (c->layer[l].experts)
            w->layer[l].router = next_piece(&t, experts, dim, "router", l, c->layer[l].sparse_before == 0);
    for (int l = 0; l < L; l++)
        if (c->layer[l].experts)
            w->layer[l].expert_w1 = next_piece(&t, experts * expert_hidden, dim, "expert_w1", l,
                                               c->layer[l].sparse_before == 0);
    for (int l = 0; l < L; l++)
        if (c->layer[l].experts)
            w->layer[l].expert_w2 = next_piece(&t, experts * dim, expert_hidden, "expert_w2", l,
                                               c->layer[l].sparse_before == 0);
    for (int l = 0; l < L; l++)
        if (c->layer[l].experts)
            w->layer[l].expert_w3 = next_piece(&t, experts * expert_hidden, dim, "expert_w3", l,
                                               c->layer[l].sparse_before == 0);
    if (c->routing == ROUTING_GEMMA4) { // Gemma 4's, last
        w->router_scale = next_vector(&t, sparse * dim);
        w->expert_scale = next_vector(&t, sparse * experts);
        w->rms_pre_experts = next_vector(&t, sparse * dim);
        w->rms_post_dense = next_vector(&t, sparse * dim);
        w->rms_post_experts = next_vector(&t, sparse * dim);
    } else {
        w->router_scale = w->expert_scale = w->rms_pre_experts = w->rms_post_dense = w->rms_post_experts = NULL;
    }
    return t.failed ? 0 : t.at;
}

// Input files are opened and read by open_regular_file and read_whole_file
// (Utilities, below); check_tokenizer_start looks at a tokenizer's first bytes.
static int open_regular_file(const char *path, const char *what, size_t *size);
static char *read_whole_file(const char *path, const char *what, size_t *size);
static int check_tokenizer_start(const char *path, int vocab_size);

// Longrope's factors, from the mapped file, into the first setting: finite and > 0,
// and the angles they give finite.
static int use_longrope_factors(Config *c, const float *factors) {
    RopeSetting *first = &c->rope[LAYER_ROPE_FIRST];
    first->longrope_factors = factors;
    first->longrope_pairs = rope_angles_of(c, LAYER_ROPE_FIRST);
    for (int i = 0; i < 2 * first->longrope_pairs; i++)
        if (!isfinite(factors[i]) || factors[i] <= 0)
            return fail("longrope factor %d is %g; it must be finite and > 0", i, factors[i]);
    return check_rope_angles(c, LAYER_ROPE_FIRST);
}

// Opens and maps a checkpoint. Nothing is allocated until the file size agrees
// with the header.
static int load_checkpoint(Transformer *t, const char *path) {
    memset(t, 0, sizeof(*t));
    size_t size = 0;
    int fd = open_regular_file(path, "checkpoint ", &size);
    if (fd < 0) return -1;
    if (size == 0) {
        close(fd);
        return fail("checkpoint %s is empty", path);
    }
    void *mapped = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (mapped == MAP_FAILED) return fail("cannot map checkpoint %s: %s", path, strerror(errno));
    // run reads its own format only: export.py converts a GGUF file, which keeps the parsing of
    // that complex untrusted container out of C
    if (size >= 4 && memcmp(mapped, "GGUF", 4) == 0) {
        munmap(mapped, size);
        return fail("%s is a GGUF file; convert it first: python3 export.py %s model.bin", path, path);
    }
    size_t offset = 0;
    uint64_t expected = 0;
    if (parse_header(mapped, size, &t->config, &t->format, &offset, &expected, &t->tokenizer) != 0) {
        munmap(mapped, size);
        return fail_in("checkpoint %s", path);
    }
    if (expected != size) {
        munmap(mapped, size);
        if (t->config.version == 2)
            return fail("checkpoint %s has %zu bytes but its header (weight_type %s) implies %llu (truncated, a "
                        "weight_type that disagrees with the data, or not a checkpoint?)",
                        path, size, t->config.type_table_bytes ? "per piece" : weight_type_names[t->config.weight_type],
                        (unsigned long long)expected);
        return fail("checkpoint %s has %zu bytes but its header implies %llu (truncated, or not a checkpoint?)",
                    path, size, (unsigned long long)expected);
    }
    if (t->config.layer_table_bytes == 8ull * t->config.n_layers &&
        parse_layer_table((const unsigned char *)mapped + t->config.layer_table_offset, &t->config) != 0) {
        munmap(mapped, size);
        return fail_in("checkpoint %s", path);
    }
    t->mapped = mapped;
    t->file_size = size;
    if (map_weights(&t->weights, &t->config, t->format, (uintptr_t)mapped, offset) == 0 ||
        (t->weights.rope_factors && use_longrope_factors(&t->config, t->weights.rope_factors) != 0)) {
        munmap(mapped, size);
        memset(t, 0, sizeof(*t));
        return fail_in("checkpoint %s", path);
    }
    return 0;
}

// The bytes of matrices a decoding step reads: the layers' (wq and wo, q_dim x dim; wk
// and wv, kv_dim x dim; w1, w2, w3, hidden x dim), with experts the router and the k
// chosen experts of each layer with them, and the classifier, each piece in its own
// type. *all (if not NULL): the same with every expert, the file's matrices less the
// embedding's.
static double matrix_bytes_per_token(const Config *c, const TransformerWeights *w, double *all) {
    uint64_t dim = c->dim, experts = c->n_experts, expert = dim * c->expert_hidden;
    double read = (double)weight_bytes(w->wcls.type, (uint64_t)c->vocab_size * dim), every = read;
    for (int l = 0; l < c->n_layers; l++) {
        const LayerSpec *ls = &c->layer[l];
        const LayerWeights *lw = &w->layer[l];
        int owns_cache = ls->kv_source == l;
        uint64_t q = dim * c->n_heads * ls->head_size, kv = owns_cache ? dim * ls->n_kv_heads * ls->head_size : 0;
        uint64_t v = ls->values_are_keys ? 0 : kv, hidden = dim * ls->hidden_dim;
        double layer = (double)(weight_bytes(lw->wq.type, q) + weight_bytes(lw->wk.type, kv) +
                                weight_bytes(lw->wv.type, v) + weight_bytes(lw->wo.type, q) +
                                weight_bytes(lw->w1.type, hidden) + weight_bytes(lw->w2.type, hidden) +
                                weight_bytes(lw->w3.type, hidden));
        read += layer, every += layer;
        if (ls->experts) {
            double router = (double)weight_bytes(lw->router.type, experts * dim);
            double one = (double)(weight_bytes(lw->expert_w1.type, expert) + weight_bytes(lw->expert_w2.type, expert) +
                                  weight_bytes(lw->expert_w3.type, expert));
            read += router + one * c->n_experts_used, every += router + one * (double)experts;
        }
    }
    if (all) *all = every;
    return read;
}

// ----------------------------------------------------------------------------
// Run state: activations, KV cache and RoPE tables

static void free_run_state(RunState *s) {
    free(s->router_logits);
    free(s->chosen);
    free(s->chosen_weight);
    free(s->expert_out);
    free(s->expert_x);
    free(s->expert_in);
    free(s->dense_out);
    free(s->pl);
    free(s->plb);
    free(s->x);
    free(s->xb);
    free(s->xb2);
    free(s->hb);
    free(s->hb2);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->logits);
    free(s->scratch);
    free(s->q_head);
    free(s->q_pairs);
    free(s->key_cache);
    free(s->value_cache);
    for (int which = 0; which < 3; which++) {
        free(s->rope_cos[which]);
        free(s->rope_sin[which]);
    }
    memset(s, 0, sizeof(*s));
}

// n floats starting on a multiple of `alignment` (aligned_alloc wants the size a
// multiple of it too).
static float *alloc_floats_aligned(size_t n, size_t alignment) {
    size_t bytes = round_up(n * sizeof(float), alignment);
    return aligned_alloc(alignment, bytes > 0 ? bytes : alignment);
}

// An array of n floats that starts on a 64-byte cache line, so that the kernels'
// vector loads never straddle two lines. It is not zeroed: every array of the run
// state is written before it is read, and the big ones (the scores, and the KV// cache where huge pages are not given) take memory only as positions are used, as
// with calloc.
static float *alloc_floats(size_t n) { return alloc_floats_aligned(n, 64); }

// The KV cache asks for huge pages ("Making it fast").
static float *alloc_floats_in_huge_pages(size_t n);

// What build_run_state allocates, in floats: a fixed part (a block's activations and
// logits, the rings of the sliding layers' caches) and a part per position of the
// context (the caches of the full-attention layers, a block's scores, the RoPE
// tables), so that a context's needs are known before anything is allocated. The
// scores are a row per token and head as long as the longest layer cache: per
// position while any layer keeps the whole context, else fixed (Mistral: every
// layer slides).
static int has_full_cache(const Config *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (!is_ring(c, l)) return 1;
    return 0;
}

static int longest_ring(const Config *c) {
    int longest = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (is_ring(c, l)) longest = max_int(longest, kv_positions_of(c, l));
    return longest;
}

// keys and values of the layers that own a cache (all but Gemma 4's KV-shared ones):
// a sliding layer's ring (fixed), a full layer's per position
static uint64_t kv_cache_fixed_floats(const Config *c) {
    uint64_t floats = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer[l].kv_source == l && is_ring(c, l))
            floats += 2ull * c->layer[l].n_kv_heads * c->layer[l].head_size * kv_positions_of(c, l);
    return floats;
}

static uint64_t kv_cache_floats_per_position(const Config *c) {
    uint64_t floats = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer[l].kv_source == l && !is_ring(c, l)) floats += 2ull * c->layer[l].n_kv_heads * c->layer[l].head_size;
    return floats;
}

static uint64_t run_state_fixed_floats(const Config *c) {
    uint64_t B = PREFILL_BLOCK, dim = c->dim, hidden = c->max_hidden, kv_dim = c->max_kv_dim;
    uint64_t wide = max_int(dim, c->max_q_dim); // xb holds a normalized x and the heads' outputs
    uint64_t per_layer = (uint64_t)c->per_layer_dim * (c->n_layers + 1); // pl, plb (Gemma 4)
    uint64_t scores = has_full_cache(c) ? 0 : B * c->n_heads * longest_ring(c);
    // router_logits, chosen and chosen_weight, expert_out, expert_x expert_in dense_out (experts only)
    uint64_t experts = c->n_experts ? c->n_experts + 2ull * c->n_experts_used * (1 + dim) + 3 * dim : 0;
    // x xb2, xb q q_head q_pairs, hb hb2, k v, logits, scratch, pl plb, the experts'
    return B * (2 * dim + 4 * wide + 2 * hidden + 2 * kv_dim + (uint64_t)c->vocab_size +
                max_int(max_int(hidden, wide), c->per_layer_dim) + per_layer + experts) +
           scores + kv_cache_fixed_floats(c);
}

// The width of a setting's cos and sin tables: its rotated pairs, and at least one
// (a setting that rotates nothing still gets a table to point at).
static int rope_table_width(const Config *c, int which) { return max_int(rope_angles_of(c, which), 1); }

static uint64_t run_state_floats_per_position(const Config *c) {
    uint64_t angles = rope_table_width(c, LAYER_ROPE_FIRST);
    if (has_second_rope(c)) angles += rope_table_width(c, LAYER_ROPE_SECOND);
    uint64_t scores = has_full_cache(c) ? (uint64_t)PREFILL_BLOCK * c->n_heads : 0;
    return kv_cache_floats_per_position(c) + scores + 2 * angles;
}

// The smallest memory limit (a number in the file `file`) of a cgroup and its
// parents: root is where the cgroup tree is mounted, path the cgroup's place in it.
// "max" (cgroup v2's "no limit") does not parse as a number and limits nothing.
static uint64_t cgroup_file_limit(const char *root, const char *path, const char *file) {
    char dir[PATH_MAX], name[PATH_MAX + 64];
    uint64_t limit = UINT64_MAX;
    size_t root_len = strlen(root);
    snprintf(dir, sizeof(dir), "%s%s", root, path);
    for (;;) {
        snprintf(name, sizeof(name), "%s/%s", dir, file);
        FILE *f = fopen(name, "r");
        unsigned long long value;
        if (f) {
            if (fscanf(f, "%llu", &value) == 1 && value < limit) limit = value;
            fclose(f);
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= root_len || !slash) break;
        *slash = '\0'; // up to the parent cgroup
    }
    return limit;
}

// The memory limit of the cgroup this process runs in (Linux), UINT64_MAX if none:
// /proc/self/cgroup names it, "0::PATH" for cgroup v2 (limit in memory.max), or a
// line whose controllers include "memory" for v1 (memory.limit_in_bytes).
static uint64_t cgroup_memory_limit(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return UINT64_MAX;
    char line[PATH_MAX + 128];
    uint64_t limit = UINT64_MAX;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':'), *path = controllers ? strchr(controllers + 1, ':') : NULL;
        if (!path) continue;
        *controllers++ = '\0';
        *path++ = '\0';
        uint64_t l = UINT64_MAX;
        if (strcmp(line, "0") == 0 && controllers[0] == '\0') {
            l = cgroup_file_limit("/sys/fs/cgroup", path, "memory.max");
        } else {
            char *save = NULL;
            for (char *name = strtok_r(controllers, ",", &save); name; name = strtok_r(NULL, ",", &save))
                if (strcmp(name, "memory") == 0)
                    l = cgroup_file_limit("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes");
        }
        if (l < limit) limit = l;
    }
    fclose(f);
    return limit;
}

// The memory the run state may take: the machine's physical memory, or the cgroup's
// limit where that is lower (a container's). 0 if unknown. *what names which.
static uint64_t memory_limit(const char **what) {
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    uint64_t physical = pages > 0 && page_size > 0 ? (uint64_t)pages * (uint64_t)page_size : 0;
    uint64_t cgroup = cgroup_memory_limit();
    *what = "physical memory";
    if (cgroup < physical || (physical == 0 && cgroup != UINT64_MAX)) {
        *what = "cgroup memory limit";
        return cgroup;
    }
    return physical;
}

static double gib(uint64_t bytes) { return bytes / (double)(1ull << 30); }

// Checks, before anything is allocated, that the run state for the context in use
// (c->seq_len positions) fits in memory and the KV cache under MAX_KV_CACHE_BYTES;
// else fails naming the size needed and the largest -c that fits. The weights are not
// counted: they are mapped from the file, pages the kernel can drop and read again,
// while the run state is memory that has nowhere to go but swap.
static int check_context_fits(const Config *c) {
    uint64_t fixed = run_state_fixed_floats(c) * sizeof(float);
    uint64_t per_position = run_state_floats_per_position(c) * sizeof(float);
    uint64_t kv_fixed = kv_cache_fixed_floats(c) * sizeof(float);
    uint64_t kv_per_position = kv_cache_floats_per_position(c) * sizeof(float);
    uint64_t need = fixed + per_position * c->seq_len, kv = kv_fixed + kv_per_position * c->seq_len;
    const char *what;
    uint64_t memory = memory_limit(&what);
    // the largest context under both limits (the memory's, when known); the sliding
    // layers' rings do not grow with it
    uint64_t largest = MAX_SEQ_LEN;
    if (kv_per_position > 0)
        largest = kv_fixed < MAX_KV_CACHE_BYTES ? (MAX_KV_CACHE_BYTES - kv_fixed) / kv_per_position : 0;
    if (memory > 0) {
        uint64_t in_memory = memory > fixed ? (memory - fixed) / per_position : 0;
        if (in_memory < largest) largest = in_memory;
    }
    if (largest > MAX_SEQ_LEN) largest = MAX_SEQ_LEN;
    if (memory > 0 && need > memory)
        return fail("a context of %d positions needs %.2f GiB of memory (KV cache %.2f GiB), more than the %s of "
                    "%.2f GiB; the largest -c that fits is %llu",
                    c->seq_len, gib(need), gib(kv), what, gib(memory), (unsigned long long)largest);
    if (kv > MAX_KV_CACHE_BYTES)
        return fail("a context of %d positions: the KV cache would need %.2f GiB, over run's bound of %.0f GiB; the "
                    "largest -c under it is %llu",
                    c->seq_len, gib(kv), gib(MAX_KV_CACHE_BYTES), (unsigned long long)largest);
    return 0;
}

// Allocates the state for the current config: c->seq_len positions, the context in
// use, which main checks first (check_context_fits). run_state_fixed_floats and
// run_state_floats_per_position count these arrays: one added here is added there.
// Call again (after free_run_state) when the rotary settings change, to rebuild the
// tables.
static int build_run_state(RunState *s, Config *c) {
    memset(s, 0, sizeof(*s));
    size_t B = PREFILL_BLOCK, kv_dim = c->max_kv_dim;
    size_t cache = place_kv_caches(c); // every layer's own cache (a sliding layer's ring), back to back
    size_t angles = rope_table_width(c, LAYER_ROPE_FIRST);
    size_t wide = max_int(c->dim, c->max_q_dim); // xb: a normalized x, then the heads' outputs
    s->x = alloc_floats(B * c->dim);
    s->xb = alloc_floats(B * wide);
    s->xb2 = alloc_floats(B * c->dim);
    s->hb = alloc_floats(B * c->max_hidden);
    s->hb2 = alloc_floats(B * c->max_hidden);
    s->q = alloc_floats(B * c->max_q_dim);
    s->k = alloc_floats(B * kv_dim);
    s->v = alloc_floats(B * kv_dim);
    s->att = alloc_floats(B * c->n_heads * (size_t)c->max_cache_positions);
    s->logits = alloc_floats(B * c->vocab_size);
    s->scratch = alloc_floats(B * max_int(max_int(c->max_hidden, wide), c->per_layer_dim));
    s->q_head = alloc_floats(B * c->max_q_dim);
    s->q_pairs = alloc_floats(B * c->max_q_dim);
    if (c->per_layer_dim) {
        s->pl = alloc_floats(B * c->n_layers * (size_t)c->per_layer_dim);
        s->plb = alloc_floats(B * (size_t)c->per_layer_dim);
        if (!s->pl || !s->plb) {
            free_run_state(s);
            return fail("out of memory allocating the run state (per-layer inputs)");
        }
    }
    if (c->n_experts) {
        size_t K = c->n_experts_used;
        s->router_logits = alloc_floats(B * c->n_experts);
        s->chosen = malloc(B * K * sizeof(int));
        s->chosen_weight = alloc_floats(B * K);
        s->expert_out = alloc_floats(B * K * c->dim);
        s->expert_x = alloc_floats(B * c->dim);
        s->expert_in = alloc_floats(B * c->dim);
        s->dense_out = alloc_floats(B * c->dim);
        if (!s->router_logits || !s->chosen || !s->chosen_weight || !s->expert_out || !s->expert_x || !s->expert_in ||
            !s->dense_out) {
            free_run_state(s);
            return fail("out of memory allocating the run state (experts)");
        }
    }
    // the KV cache in huge pages ("Making it fast", 5), but for RUN_PLAIN=1
    s->key_cache = use_fast_kernels ? alloc_floats_in_huge_pages(cache) : alloc_floats(cache);
    s->value_cache = use_fast_kernels ? alloc_floats_in_huge_pages(cache) : alloc_floats(cache);
    float **cos1 = &s->rope_cos[LAYER_ROPE_FIRST], **sin1 = &s->rope_sin[LAYER_ROPE_FIRST];
    *cos1 = alloc_floats((size_t)c->seq_len * angles);
    *sin1 = alloc_floats((size_t)c->seq_len * angles);
    if (!s->x || !s->xb || !s->xb2 || !s->hb || !s->hb2 || !s->q || !s->k || !s->v || !s->att || !s->logits ||
        !s->scratch || !s->q_head || !s->q_pairs || !s->key_cache || !s->value_cache || !*cos1 || !*sin1) {
        free_run_state(s);
        return fail("out of memory allocating the run state (KV cache %zu MiB)", cache * 2 * sizeof(float) >> 20);
    }
    rope_build_tables(*cos1, *sin1, c, LAYER_ROPE_FIRST);
    if (has_second_rope(c)) { // Gemma 3's local layers: their own theta
        float **cos2 = &s->rope_cos[LAYER_ROPE_SECOND], **sin2 = &s->rope_sin[LAYER_ROPE_SECOND];
        size_t angles2 = rope_table_width(c, LAYER_ROPE_SECOND);
        *cos2 = alloc_floats((size_t)c->seq_len * angles2);
        *sin2 = alloc_floats((size_t)c->seq_len * angles2);
        if (!*cos2 || !*sin2) {
            free_run_state(s);
            return fail("out of memory allocating the second RoPE setting's tables");
        }
        rope_build_tables(*cos2, *sin2, c, LAYER_ROPE_SECOND);
    }
    return 0;
}

static void free_transformer(Transformer *t) {
    free_run_state(&t->state);
    if (t->mapped) munmap(t->mapped, t->file_size);
    memset(t, 0, sizeof(*t));
}

// ----------------------------------------------------------------------------
// The tokenizer: text <-> token ids, by Byte Pair Encoding (BPE).
//
// BPE starts from small symbols (bytes or characters) and repeatedly merges an
// adjacent pair into the token their concatenation is, until no pair merges. Two
// families decide which pair goes first:
//  - SentencePiece (kind 1, llama2.c's tokenizer.bin; kind 3, the same models'
//    tokenizer.json): the text gets a leading space (the "dummy prefix", where the
//    model has one), starts as one symbol per UTF-8 character (bytes <0xXX> for a
//    character the vocabulary lacks: byte fallback), and kind 1 merges the pair whose
//    concatenation has the highest score, kind 3 the pair with the lowest merge rank.
//  - byte-level BPE (kind 2: GPT-2, Llama 3, Qwen, SmolLM2; minbpe's RegexTokenizer):
//    (a) normalize (NFC, where the model asks for it); (b) pre-tokenize: cut the text
//    into words by the model's pattern (" hello", "'s", "123", "  "), so that no
//    token crosses a word boundary; (c) each word becomes one token per UTF-8 byte
//    (every byte is a token: no text is unknown); (d) merge the adjacent pair with
//    the lowest rank in the model's merge list, again and again. Ties go to the
//    leftmost pair, in every kind. For example, GPT-2 cuts "Hello world" into
//    "Hello" and " world"; " world" starts as its six bytes ' ' w o r l d, and the
//    merges join pairs of them ("or", " w", then " wor", ...), lowest rank first,
//    until " world" is one token. A merge list is the training run replayed:
//    merge k joined the most frequent pair left after merges 0 .. k-1.
// Pieces of type "control" (<s>, <|eot_id|>) are never produced from user text; a
// typed "<|eot_id|>" is text. "User-defined" pieces are matched whole first.
//
// Two file formats: llama2.c's tokenizer.bin (int32 max_token_length; then per
// token: float32 score, int32 length, the bytes; always kind 1) and our TOKN
// section (docs/format.md), standalone or inside a version 2 checkpoint, which adds
// the kind, the special ids, the merges and the Unicode tables the byte-level
// pre-tokenizers need. SentencePiece's '▁' is stored as a plain space in both.

typedef enum { TOKENIZER_SENTENCEPIECE = 1, TOKENIZER_BYTE_LEVEL = 2, TOKENIZER_SP_JSON = 3 } TokenizerKind;
// ChatML with Qwen2.5's or SmolLM2's default system prompt: QWEN25, SMOLLM2
typedef enum {
    TEMPLATE_NONE, TEMPLATE_LLAMA2, TEMPLATE_LLAMA3, TEMPLATE_CHATML, TEMPLATE_GEMMA, TEMPLATE_ZEPHYR, TEMPLATE_MISTRAL,
    TEMPLATE_QWEN25, TEMPLATE_SMOLLM2, TEMPLATE_GEMMA4, TEMPLATE_GEMMA4_LARGE,
    N_CHAT_TEMPLATES // the count, last, so that a new template cannot fall outside the loader's range check
} ChatTemplate; // numbered as the TOKN section stores them
#define MAX_END_TOKENS 8

#define MAGIC_TOKN 0x4E4B4F54u // the bytes "TOKN"
#define TOKN_HEADER_BYTES 128
#define N_TOKN_COUNTS 5 // the table sizes at bytes 80..99: merges, class ranges, decompositions, compositions, ccc
#define MAX_PIECE_BYTES 65536
#define MAX_CODE_POINT 0x10FFFFu
#define MAX_DECOMPOSITION 4 // the longest full canonical decomposition in Unicode (U+1F82: 4)

// piece types, as TOKN stores them; PIECE_UNKNOWN is tokenizer.bin's <unk> (id 0),
// never matched in text but printed as "<unk>" when a model emits it, as before TOKN
enum { PIECE_NORMAL, PIECE_CONTROL, PIECE_USER, PIECE_BYTE, PIECE_UNUSED, PIECE_UNKNOWN };
enum { PRETOKENIZER_NONE, PRETOKENIZER_GPT2, PRETOKENIZER_LLAMA3, PRETOKENIZER_QWEN2, PRETOKENIZER_O200K };
#define N_PRETOKENIZERS 5
enum { // the TOKN flags
    FLAG_DUMMY_PREFIX = 1,   // SentencePiece: a space before non-empty text
    FLAG_BYTE_FALLBACK = 2,  // characters without a piece become <0xXX> byte pieces
    FLAG_IGNORE_MERGES = 4,  // a word that is a piece is one token (Llama 3)
    FLAG_SPLIT_DIGITS = 8,   // every digit its own word before the pattern (SmolLM2)
    FLAG_NFC = 16,           // normalize to NFC first (Qwen)
    FLAG_PREFIX_EACH_SEGMENT = 32, // the dummy prefix before every segment between user-defined pieces
    FLAG_SPLIT_NEWLINES = 64, // kind 3: BPE within runs of newlines and runs of other characters (Gemma 4 GGUF)
    ALL_FLAGS = 127
};
// Unicode classes of the byte-level patterns, as the TOKN class table stores them
enum { CLASS_LU = 1, CLASS_LL = 2, CLASS_LO = 4, CLASS_M = 8, CLASS_N = 16, CLASS_SPACE = 32 };
#define CLASS_L (CLASS_LU | CLASS_LL | CLASS_LO)
#define INVALID_BYTE_BASE 0x110000u // a byte of malformed UTF-8, kept as the code point 0x110000 + byte

typedef struct {
    const char *str;
    int length;
    int id;
} TokenIndex;

typedef struct { uint32_t first, last, value; } CodeRange;          // classes or combining class of [first, last]
typedef struct { uint32_t cp, first, second; } Decomposition;        // cp -> first second (second 0: one)
typedef struct { uint32_t first, second, composite; } Composition;   // first second -> composite
typedef struct { uint64_t pair; int rank, id; } MergeSlot;           // pair: (left + 1) << 32 | (right + 1); 0 empty

typedef struct {
    TokenizerKind kind;
    char **vocab;             // the piece of each token, NUL-terminated ("" past n_tokens)
    int *vocab_length;        // its length in bytes
    float *vocab_scores;      // kind 1: merge priority, higher merges first
    unsigned char *vocab_type; // PIECE_NORMAL, PIECE_CONTROL, ...
    char *piece_text;         // the storage of all pieces
    TokenIndex *sorted_vocab; // the pieces that text may produce, sorted for lookup
    int n_sorted;
    TokenIndex *user_pieces;  // the user-defined pieces, by first byte, longest first
    int n_user;
    int user_bucket[257];     // user_pieces[user_bucket[b] .. user_bucket[b + 1]) start with byte b
    int vocab_size;           // the model's rows
    int n_tokens;             // pieces stored (<= vocab_size); the other rows are never produced
    int max_token_length;
    int bos_id, add_bos, eot_id, n_eos, eos_ids[MAX_END_TOKENS];
    int pretokenizer;
    uint32_t flags;
    ChatTemplate chat_template;
    int byte_ids[256];        // the token of each raw byte (byte-level: the one-byte piece; else <0xXX>)
    int unk_id;
    MergeSlot *merges;        // kinds 2, 3: (left, right) -> rank and result, open addressing
    uint64_t merge_mask;
    int n_merges;
    CodeRange *classes; int n_classes;
    Decomposition *decompositions; int n_decompositions;
    Composition *compositions; int n_compositions;
    CodeRange *ccc; int n_ccc;
    int nfc_growth;           // NFC makes text at most this many times longer in bytes
    unsigned char byte_pieces[512]; // "\x00\0\x01\0..." for byte fallback tokens
} Tokenizer;

// Piece order: bytes compared as unsigned, a prefix first (strcmp's order, with lengths).
static int compare_pieces(const char *a, int la, const char *b, int lb) {
    int c = memcmp(a, b, (size_t)(la < lb ? la : lb));
    return c != 0 ? c : (la > lb) - (la < lb);
}

static int compare_tokens(const void *a, const void *b) {
    const TokenIndex *x = a, *y = b;
    return compare_pieces(x->str, x->length, y->str, y->length);
}

// Recognizes a byte-fallback piece "<0xXX>" and returns its byte, or -1.
static int byte_piece_value(const char *piece, int length) {
    if (length != 6 || strncmp(piece, "<0x", 3) != 0 || piece[5] != '>') return -1;
    int value = 0;
    for (int i = 3; i < 5; i++) {
        char ch = piece[i];
        int digit = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (digit < 0) return -1;
        value = value * 16 + digit;
    }
    return value;
}

static void free_tokenizer(Tokenizer *t) {
    free(t->vocab);
    free(t->vocab_length);
    free(t->vocab_scores);
    free(t->vocab_type);
    free(t->piece_text);
    free(t->sorted_vocab);
    free(t->user_pieces);
    free(t->merges);
    free(t->classes);
    free(t->decompositions);
    free(t->compositions);
    free(t->ccc);
    memset(t, 0, sizeof(*t));
}

// Binary search of the sorted vocabulary; -1 if str is not a piece text can produce.
static int piece_lookup(const Tokenizer *t, const char *str, int length) {
    TokenIndex key = {.str = str, .length = length};
    const TokenIndex *found = bsearch(&key, t->sorted_vocab, t->n_sorted, sizeof(TokenIndex), compare_tokens);
    return found ? found->id : -1;
}
static int str_lookup(const char *str, const Tokenizer *t) { return piece_lookup(t, str, (int)strlen(str)); }

// Allocates the per-token arrays for vocab_size rows and the piece storage.
static int alloc_vocab(Tokenizer *t, int vocab_size, size_t text_bytes, const char *name) {
    t->vocab_size = vocab_size;
    t->vocab = calloc(vocab_size, sizeof(char *));
    t->vocab_length = calloc(vocab_size, sizeof(int));
    t->vocab_scores = calloc(vocab_size, sizeof(float));
    t->vocab_type = calloc(vocab_size, 1);
    t->sorted_vocab = calloc(vocab_size, sizeof(TokenIndex));
    t->piece_text = malloc(text_bytes + 1);
    if (!t->vocab || !t->vocab_length || !t->vocab_scores || !t->vocab_type || !t->sorted_vocab || !t->piece_text)
        return fail("out of memory loading tokenizer %s", name);
    t->piece_text[text_bytes] = '\0';
    for (int i = 0; i < vocab_size; i++) t->vocab[i] = t->piece_text + text_bytes; // "" until set
    for (int i = 0; i < 256; i++) {
        t->byte_pieces[i * 2] = (unsigned char)i;
        t->byte_pieces[i * 2 + 1] = '\0';
    }
    return 0;
}

// The lookup table: the pieces of the given types, sorted. Pieces with an embedded
// NUL (C strings cannot hold them in text) and empty ones are left out.
static void sort_vocab(Tokenizer *t, int type_a, int type_b) {
    t->n_sorted = 0;
    for (int i = 0; i < t->n_tokens; i++) {
        int type = t->vocab_type[i];
        if (type != type_a && type != type_b) continue;
        if (t->vocab_length[i] == 0 || (t->kind != TOKENIZER_BYTE_LEVEL && (int)strlen(t->vocab[i]) != t->vocab_length[i]))
            continue;
        t->sorted_vocab[t->n_sorted++] = (TokenIndex){t->vocab[i], t->vocab_length[i], i};
    }
    qsort(t->sorted_vocab, t->n_sorted, sizeof(TokenIndex), compare_tokens);
}

// The number of pieces in a tokenizer.bin, or -1 when it is not one: to say how
// many tokens a tokenizer that does not fit the model has.
static long count_legacy_pieces(const unsigned char *data, size_t size) {
    size_t off = 4;
    long n = 0;
    while (size - off >= 8) {
        int len = read_i32(data + off + 4);
        if (len < 0 || (size_t)len > size - off - 8) return -1;
        off += 8 + (size_t)len;
        n++;
    }
    return off == size ? n : -1;
}

// The error code of a tokenizer that is well-formed but of another vocabulary size.
#define TOKENIZER_WRONG_SIZE -2

// Builds a tokenizer from the bytes of a llama2.c tokenizer.bin. The file must hold
// exactly vocab_size pieces. Ids 0, 1, 2 are <unk>, <s>, </s>; byte pieces <0xXX>
// follow from 3.
static int build_legacy_tokenizer(Tokenizer *t, const unsigned char *data, size_t size, int vocab_size,
                                  const char *name) {
    if (size < 4) return fail("tokenizer %s is too small (%zu bytes)", name, size);
    int max_len = read_i32(data);
    if (max_len < 1 || max_len > 1024) return fail("tokenizer %s: max_token_length %d is out of range", name, max_len);
    if (alloc_vocab(t, vocab_size, size, name) != 0) return -1;
    t->kind = TOKENIZER_SENTENCEPIECE;
    t->max_token_length = max_len;
    t->n_tokens = vocab_size;
    t->bos_id = TOKEN_BOS;
    t->add_bos = 1;
    t->eot_id = -1;
    t->n_eos = 1;
    t->eos_ids[0] = TOKEN_EOS;
    for (int k = 1; k < MAX_END_TOKENS; k++) t->eos_ids[k] = -1;
    t->flags = FLAG_DUMMY_PREFIX | FLAG_BYTE_FALLBACK;
    t->chat_template = TEMPLATE_LLAMA2;
    t->unk_id = TOKEN_UNK;
    size_t off = 4, text_off = 0;
    for (int i = 0; i < vocab_size; i++) {
        if (size - off < 8) {
            fail("tokenizer %s ends at token %d, but the model has %d tokens", name, i, vocab_size);
            return count_legacy_pieces(data, size) >= 0 ? TOKENIZER_WRONG_SIZE : -1;
        }
        t->vocab_scores[i] = read_f32(data + off);
        int len = read_i32(data + off + 4);
        off += 8;
        if (len < 0 || len > max_len || (size_t)len > size - off)
            return fail("tokenizer %s: token %d has a bad length %d", name, i, len);
        if (!isfinite(t->vocab_scores[i])) return fail("tokenizer %s: token %d has a non-finite score", name, i);
        t->vocab[i] = t->piece_text + text_off;
        memcpy(t->vocab[i], data + off, len);
        t->vocab[i][len] = '\0';
        text_off += (size_t)len + 1;
        t->vocab_length[i] = len;
        off += len;
    }
    if (off != size) {
        long pieces = count_legacy_pieces(data, size);
        if (pieces < 0)
            return fail("tokenizer %s has more than the model's %d tokens (%zu bytes left over)", name, vocab_size,
                        size - off);
        fail("tokenizer %s has more than the model's %d tokens (it has %ld)", name, vocab_size, pieces);
        return TOKENIZER_WRONG_SIZE;
    }
    // Text may produce every piece except the control tokens and the byte pieces
    // (SentencePiece never matches "<s>" or "<0x0A>" in user text).
    for (int i = 0; i < vocab_size; i++) {
        int control = i == TOKEN_BOS || i == TOKEN_EOS;
        t->vocab_type[i] = i == TOKEN_UNK ? PIECE_UNKNOWN : control ? PIECE_CONTROL
                           : byte_piece_value(t->vocab[i], t->vocab_length[i]) >= 0 ? PIECE_BYTE : PIECE_NORMAL;
    }
    for (int b = 0; b < 256; b++) t->byte_ids[b] = b + TOKEN_BYTE0 < vocab_size ? b + TOKEN_BYTE0 : TOKEN_UNK;
    sort_vocab(t, PIECE_NORMAL, PIECE_NORMAL);
    return 0;
}

// Reading a TOKN section: every read is checked against the section's end.
typedef struct {
    const unsigned char *data;
    size_t size, off;
    const char *name;
} SectionReader;

static int section_has(SectionReader *r, uint64_t n, const char *what) {
    if (n > r->size - r->off) return fail("tokenizer %s ends inside its %s", r->name, what);
    return 0;
}

static uint32_t utf8_length_of(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// The TOKN header: the kind, the special ids, the flags and the table sizes.
static int read_tokn_header(Tokenizer *t, const unsigned char *h, const char *name, int counts[N_TOKN_COUNTS]) {
    int version = read_i32(h + 4), kind = read_i32(h + 8), n_tokens = read_i32(h + 12);
    if (version != 1) return fail("tokenizer %s: TOKN version %d is not supported (only 1)", name, version);
    if (kind < TOKENIZER_SENTENCEPIECE || kind > TOKENIZER_SP_JSON)
        return fail("tokenizer %s: kind %d is not one this program knows (1, 2, 3)", name, kind);
    t->kind = (TokenizerKind)kind;
    if (n_tokens < 1 || n_tokens > MAX_VOCAB) return fail("tokenizer %s: n_tokens %d is out of range", name, n_tokens);
    t->n_tokens = n_tokens; // more than vocab_size only if the extra ones are control pieces (drop_extra_pieces)
    t->max_token_length = read_i32(h + 16);
    if (t->max_token_length < 1 || t->max_token_length > MAX_PIECE_BYTES)
        return fail("tokenizer %s: max_token_length %d is out of range", name, t->max_token_length);
    t->bos_id = read_i32(h + 20);
    t->add_bos = read_i32(h + 24);
    t->eot_id = read_i32(h + 28);
    t->n_eos = read_i32(h + 32);
    if (t->bos_id < -1 || t->bos_id >= n_tokens) return fail("tokenizer %s: bos_id %d is out of range", name, t->bos_id);
    if (t->add_bos != 0 && t->add_bos != 1) return fail("tokenizer %s: add_bos is %d, expected 0 or 1", name, t->add_bos);
    if (t->add_bos && t->bos_id < 0) return fail("tokenizer %s: add_bos is 1 but there is no bos_id", name);
    if (t->eot_id < -1 || t->eot_id >= n_tokens) return fail("tokenizer %s: eot_id %d is out of range", name, t->eot_id);
    if (t->n_eos < 1 || t->n_eos > MAX_END_TOKENS)
        return fail("tokenizer %s: n_eos %d is out of range [1, %d]", name, t->n_eos, MAX_END_TOKENS);
    for (int k = 0; k < MAX_END_TOKENS; k++) {
        t->eos_ids[k] = read_i32(h + 36 + 4 * k);
        int used = k < t->n_eos;
        if (used && (t->eos_ids[k] < 0 || t->eos_ids[k] >= n_tokens))
            return fail("tokenizer %s: eos_ids[%d] = %d is out of range", name, k, t->eos_ids[k]);
        if (!used && t->eos_ids[k] != -1)
            return fail("tokenizer %s: unused eos_ids[%d] is %d, expected -1", name, k, t->eos_ids[k]);
    }
    t->pretokenizer = read_i32(h + 68);
    t->flags = read_u32(h + 72);
    int template = read_i32(h + 76);
    if (t->pretokenizer < 0 || t->pretokenizer >= N_PRETOKENIZERS ||
        (t->kind != TOKENIZER_BYTE_LEVEL && t->pretokenizer != PRETOKENIZER_NONE))
        return fail("tokenizer %s: pretokenizer %d is out of range for kind %d", name, t->pretokenizer, kind);
    if (t->flags & ~(uint32_t)ALL_FLAGS) return fail("tokenizer %s: unknown flags 0x%x", name, t->flags);
    if ((t->flags & FLAG_SPLIT_NEWLINES) && (t->kind != TOKENIZER_SP_JSON || (t->flags & FLAG_DUMMY_PREFIX)))
        return fail("tokenizer %s: flag split_newlines needs kind 3 without add_dummy_prefix", name);
    if (template < 0 || template >= N_CHAT_TEMPLATES)
        return fail("tokenizer %s: chat_template %d is out of range", name, template);
    t->chat_template = (ChatTemplate)template;
    static const char *count_names[N_TOKN_COUNTS] = {"n_merges", "n_class_ranges", "n_decompositions",
                                                     "n_compositions", "n_ccc_ranges"};
    for (int k = 0; k < N_TOKN_COUNTS; k++) {
        counts[k] = read_i32(h + 80 + 4 * k);
        if (counts[k] < 0) return fail("tokenizer %s: %s %d is negative", name, count_names[k], counts[k]);
    }
    if (t->kind == TOKENIZER_SENTENCEPIECE && counts[0] != 0)
        return fail("tokenizer %s: a kind 1 tokenizer has no merges (n_merges %d)", name, counts[0]);
    for (int i = 100; i < TOKN_HEADER_BYTES; i++)
        if (h[i] != 0) return fail("tokenizer %s: reserved header byte %d is not zero", name, i);
    return 0;
}

// The pieces: { float32 score; int32 type; int32 length; bytes; zero padding to 4 }.
static int read_tokn_pieces(Tokenizer *t, SectionReader *r) {
    size_t text_off = 0;
    for (int i = 0; i < t->n_tokens; i++) {
        if (section_has(r, 12, "pieces") != 0) return -1;
        const unsigned char *p = r->data + r->off;
        float score = read_f32(p);
        int type = read_i32(p + 4), len = read_i32(p + 8);
        r->off += 12;
        if (!isfinite(score)) return fail("tokenizer %s: token %d has a non-finite score", r->name, i);
        if (type < PIECE_NORMAL || type > PIECE_UNUSED)
            return fail("tokenizer %s: token %d has a bad type %d", r->name, i, type);
        if (len < 0 || len > t->max_token_length)
            return fail("tokenizer %s: token %d has a bad length %d", r->name, i, len);
        uint64_t padded = ((uint64_t)len + 3) / 4 * 4;
        if (section_has(r, padded, "pieces") != 0) return -1;
        for (uint64_t k = len; k < padded; k++)
            if (r->data[r->off + k] != 0) return fail("tokenizer %s: token %d's padding is not zero", r->name, i);
        t->vocab_scores[i] = score;
        t->vocab_type[i] = (unsigned char)type;
        t->vocab_length[i] = len;
        t->vocab[i] = t->piece_text + text_off;
        memcpy(t->vocab[i], r->data + r->off, len);
        t->vocab[i][len] = '\0';
        text_off += (size_t)len + 1;
        r->off += padded;
        if (type == PIECE_BYTE && byte_piece_value(t->vocab[i], len) < 0)
            return fail("tokenizer %s: token %d is of type byte but is not <0xXX>", r->name, i);
    }
    return 0;
}

static int special_token(const Tokenizer *t, const char *piece);

// The token of each raw byte, and <unk>. Byte-level: every byte must be a piece.
static int find_byte_tokens(Tokenizer *t, const char *name) {
    t->unk_id = special_token(t, "<unk>");
    for (int b = 0; b < 256; b++) t->byte_ids[b] = -1;
    for (int i = t->n_tokens - 1; i >= 0; i--) {
        if (t->kind == TOKENIZER_BYTE_LEVEL && t->vocab_length[i] == 1 && t->vocab_type[i] == PIECE_NORMAL)
            t->byte_ids[(unsigned char)t->vocab[i][0]] = i;
        if (t->kind != TOKENIZER_BYTE_LEVEL && t->vocab_type[i] == PIECE_BYTE)
            t->byte_ids[byte_piece_value(t->vocab[i], t->vocab_length[i])] = i;
    }
    for (int b = 0; t->kind == TOKENIZER_BYTE_LEVEL && b < 256; b++)
        if (t->byte_ids[b] < 0)
            return fail("tokenizer %s: the byte-level vocabulary has no piece for byte 0x%02X", name, b);
    return 0;
}

// The merge table: (left, right) -> (rank, result), hashed. A pair listed twice
// keeps its last rank, as Hugging Face's tokenizers builds its map.
static MergeSlot *merge_slot(const Tokenizer *t, int left, int right) {
    uint64_t pair = (uint64_t)(left + 1) << 32 | (uint32_t)(right + 1);
    uint64_t h = pair; // splitmix64's finalizer: every bit of the pair moves every bit of the hash
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    for (uint64_t i = h;; i++) {
        MergeSlot *s = &t->merges[i & t->merge_mask];
        if (s->pair == pair || s->pair == 0) return s; // the pair's slot, or the empty one it would take
    }
}

static int read_tokn_merges(Tokenizer *t, SectionReader *r, int n_merges) {
    if (section_has(r, (uint64_t)n_merges * 8, "merges") != 0) return -1;
    uint64_t slots = 2;
    while (slots < 2 * (uint64_t)n_merges) slots *= 2;
    t->merges = malloc(slots * sizeof(MergeSlot));
    char *buffer = malloc(2 * (size_t)t->max_token_length);
    if (!t->merges || !buffer) {
        free(buffer);
        return fail("out of memory loading tokenizer %s", r->name);
    }
    for (uint64_t i = 0; i < slots; i++) t->merges[i] = (MergeSlot){0, 0, -1};
    t->merge_mask = slots - 1;
    t->n_merges = n_merges;
    for (int m = 0; m < n_merges; m++) {
        int left = read_i32(r->data + r->off), right = read_i32(r->data + r->off + 4);
        r->off += 8;
        if (left < 0 || left >= t->n_tokens || right < 0 || right >= t->n_tokens) {
            free(buffer);
            return fail("tokenizer %s: merge %d names token ids %d %d, out of range", r->name, m, left, right);
        }
        int la = t->vocab_length[left], lb = t->vocab_length[right];
        int id = -1;
        if (la + lb <= t->max_token_length) {
            memcpy(buffer, t->vocab[left], la);
            memcpy(buffer + la, t->vocab[right], lb);
            id = piece_lookup(t, buffer, la + lb);
        }
        if (id < 0) {
            free(buffer);
            return fail("tokenizer %s: merge %d (%d %d) makes no piece of the vocabulary", r->name, m, left, right);
        }
        MergeSlot *s = merge_slot(t, left, right);
        s->pair = (uint64_t)(left + 1) << 32 | (uint32_t)(right + 1);
        s->rank = m;
        s->id = id;
    }
    free(buffer);
    return 0;
}

// A table of n rows of three uint32, checked for order by check_row.
static int read_u32_rows(SectionReader *r, int n, const char *what, uint32_t **rows) {
    if (section_has(r, (uint64_t)n * 12, what) != 0) return -1;
    *rows = malloc((size_t)(n > 0 ? n : 1) * 12);
    if (!*rows) return fail("out of memory loading tokenizer %s", r->name);
    for (int i = 0; i < 3 * n; i++) (*rows)[i] = read_u32(r->data + r->off + 4 * (size_t)i);
    r->off += (size_t)n * 12;
    return 0;
}

// Ranges: first <= last <= U+10FFFF, sorted and disjoint.
static int check_ranges(const CodeRange *ranges, int n, uint32_t max_value, const char *what, const char *name) {
    for (int i = 0; i < n; i++) {
        if (ranges[i].first > ranges[i].last || ranges[i].last > MAX_CODE_POINT || ranges[i].value > max_value ||
            (i > 0 && ranges[i].first <= ranges[i - 1].last))
            return fail("tokenizer %s: %s row %d (%u..%u: %u) is out of order or range", name, what, i, ranges[i].first,
                        ranges[i].last, ranges[i].value);
    }
    return 0;
}

static const Decomposition *find_decomposition(const Tokenizer *t, uint32_t cp);

// How many code points cp decomposes into, fully; -1 past MAX_DECOMPOSITION or
// a cycle. *bytes gets their UTF-8 length.
static int decomposed_length(const Tokenizer *t, uint32_t cp, int depth, uint32_t *bytes) {
    const Decomposition *d = find_decomposition(t, cp);
    if (!d) {
        *bytes += utf8_length_of(cp);
        return 1;
    }
    if (depth >= MAX_DECOMPOSITION) return -1;
    int n = decomposed_length(t, d->first, depth + 1, bytes);
    if (n > 0 && d->second != 0) {
        int m = decomposed_length(t, d->second, depth + 1, bytes);
        n = m < 0 ? -1 : n + m;
    }
    return n > MAX_DECOMPOSITION ? -1 : n;
}

static int read_tokn_unicode(Tokenizer *t, SectionReader *r, const int counts[N_TOKN_COUNTS]) {
    const char *name = r->name;
    if (read_u32_rows(r, counts[1], "class ranges", (uint32_t **)&t->classes) != 0) return -1;
    t->n_classes = counts[1];
    if (check_ranges(t->classes, t->n_classes, 63, "class", name) != 0) return -1;
    if (read_u32_rows(r, counts[2], "decompositions", (uint32_t **)&t->decompositions) != 0) return -1;
    t->n_decompositions = counts[2];
    for (int i = 0; i < t->n_decompositions; i++) {
        const Decomposition *d = &t->decompositions[i];
        if (d->cp > MAX_CODE_POINT || d->first == 0 || d->first > MAX_CODE_POINT || d->second > MAX_CODE_POINT ||
            (i > 0 && d->cp <= d[-1].cp))
            return fail("tokenizer %s: decomposition row %d (U+%04X) is out of order or range", name, i, d->cp);
    }
    if (read_u32_rows(r, counts[3], "compositions", (uint32_t **)&t->compositions) != 0) return -1;
    t->n_compositions = counts[3];
    for (int i = 0; i < t->n_compositions; i++) {
        const Composition *c = &t->compositions[i];
        int ordered = i == 0 || c->first > c[-1].first || (c->first == c[-1].first && c->second > c[-1].second);
        if (c->first > MAX_CODE_POINT || c->second > MAX_CODE_POINT || c->composite > MAX_CODE_POINT || !ordered ||
            c->composite == 0 || utf8_length_of(c->composite) > utf8_length_of(c->first) + utf8_length_of(c->second))
            return fail("tokenizer %s: composition row %d (U+%04X U+%04X) is out of order or range", name, i, c->first,
                        c->second);
    }
    if (read_u32_rows(r, counts[4], "ccc ranges", (uint32_t **)&t->ccc) != 0) return -1;
    t->n_ccc = counts[4];
    if (check_ranges(t->ccc, t->n_ccc, 254, "ccc", name) != 0) return -1;
    // Bound how much NFC can lengthen text, for encode_capacity: a Hangul syllable
    // decomposes to three 3-byte jamo; each listed decomposition to what it lists.
    t->nfc_growth = 3;
    for (int i = 0; i < t->n_decompositions; i++) {
        uint32_t bytes = 0, cp = t->decompositions[i].cp;
        if (decomposed_length(t, cp, 0, &bytes) < 0)
            return fail("tokenizer %s: decomposition of U+%04X is longer than %d code points or circular", name, cp,
                        MAX_DECOMPOSITION);
        int growth = (int)((bytes + utf8_length_of(cp) - 1) / utf8_length_of(cp));
        if (growth > t->nfc_growth) t->nfc_growth = growth;
    }
    return 0;
}

// The user-defined pieces, by first byte and longest first, for matching them
// whole in text; user_bucket[b] is where those starting with byte b begin.
static int compare_user_pieces(const void *a, const void *b) {
    const TokenIndex *x = a, *y = b;
    int fx = (unsigned char)x->str[0], fy = (unsigned char)y->str[0];
    if (fx != fy) return fx - fy;
    return x->length != y->length ? y->length - x->length : compare_tokens(a, b);
}

static int index_user_pieces(Tokenizer *t, const char *name) {
    int n = 0;
    for (int i = 0; i < t->n_tokens; i++) n += t->vocab_type[i] == PIECE_USER;
    t->user_pieces = malloc((size_t)(n > 0 ? n : 1) * sizeof(TokenIndex));
    if (!t->user_pieces) return fail("out of memory loading tokenizer %s", name);
    for (int i = 0; i < t->n_tokens; i++)
        if (t->vocab_type[i] == PIECE_USER && t->vocab_length[i] > 0 && (int)strlen(t->vocab[i]) == t->vocab_length[i])
            t->user_pieces[t->n_user++] = (TokenIndex){t->vocab[i], t->vocab_length[i], i};
    qsort(t->user_pieces, t->n_user, sizeof(TokenIndex), compare_user_pieces);
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < t->n_user && (unsigned char)t->user_pieces[k].str[0] < b) k++;
        t->user_bucket[b] = k;
    }
    return 0;
}

// A tokenizer with more pieces than the model has rows fits if the extra ones are
// control or unused pieces that no special id names (Gemma 3's <image_soft_token>
// is piece 262144 of an embedding of 262144 rows): they are dropped.
static int drop_extra_pieces(Tokenizer *t, int vocab_size, const char *name) {
    if (t->n_tokens <= vocab_size) return 0;
    int named = t->bos_id >= vocab_size || t->eot_id >= vocab_size;
    for (int k = 0; k < t->n_eos; k++) named |= t->eos_ids[k] >= vocab_size;
    for (int i = vocab_size; i < t->n_tokens && !named; i++)
        named = t->vocab_type[i] != PIECE_CONTROL && t->vocab_type[i] != PIECE_UNUSED;
    if (named) {
        fail("tokenizer %s has %d tokens, more than the model's %d", name, t->n_tokens, vocab_size);
        return TOKENIZER_WRONG_SIZE;
    }
    t->n_tokens = vocab_size;
    return 0;
}

// Builds a tokenizer from a TOKN section (docs/format.md) for a model of
// vocab_size rows, checking every field, count, id, length and table order.
static int build_tokn_tokenizer(Tokenizer *t, const unsigned char *data, size_t size, int vocab_size, const char *name) {
    if (size < TOKN_HEADER_BYTES) return fail("tokenizer %s is too small (%zu bytes) for its TOKN header", name, size);
    int counts[N_TOKN_COUNTS] = {0};
    int result = read_tokn_header(t, data, name, counts);
    if (result != 0) return result;
    if ((uint64_t)t->n_tokens * 12 > size - TOKN_HEADER_BYTES) // a piece takes 12 bytes at least
        return fail("tokenizer %s ends inside its pieces", name);
    if (alloc_vocab(t, t->n_tokens > vocab_size ? t->n_tokens : vocab_size, size, name) != 0) return -1;
    SectionReader r = {data, size, TOKN_HEADER_BYTES, name};
    if (read_tokn_pieces(t, &r) != 0) return -1;
    if ((result = drop_extra_pieces(t, vocab_size, name)) != 0) return result;
    t->vocab_size = vocab_size;
    sort_vocab(t, PIECE_NORMAL, PIECE_USER);
    for (int i = 1; i < t->n_sorted; i++)
        if (compare_tokens(&t->sorted_vocab[i - 1], &t->sorted_vocab[i]) == 0)
            return fail("tokenizer %s: tokens %d and %d are the same piece", name, t->sorted_vocab[i - 1].id,
                        t->sorted_vocab[i].id);
    if (find_byte_tokens(t, name) != 0 || read_tokn_merges(t, &r, counts[0]) != 0 ||
        read_tokn_unicode(t, &r, counts) != 0 || index_user_pieces(t, name) != 0)
        return -1;
    if (r.off != size) return fail("tokenizer %s has %zu bytes after its last table", name, size - r.off);
    return 0;
}

// The Unicode tables: binary searches of the section's sorted rows.
static const CodeRange *find_range(const CodeRange *ranges, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (cp < ranges[mid].first) hi = mid - 1;
        else if (cp > ranges[mid].last) lo = mid + 1;
        else return &ranges[mid];
    }
    return NULL;
}

// The CLASS_ bits of a code point (0 for none, and for a byte of malformed UTF-8).
static int char_classes(const Tokenizer *t, uint32_t cp) {
    const CodeRange *r = find_range(t->classes, t->n_classes, cp);
    return r ? (int)r->value : 0;
}

static int combining_class(const Tokenizer *t, uint32_t cp) {
    const CodeRange *r = find_range(t->ccc, t->n_ccc, cp);
    return r ? (int)r->value : 0;
}

static const Decomposition *find_decomposition(const Tokenizer *t, uint32_t cp) {
    int lo = 0, hi = t->n_decompositions - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (cp < t->decompositions[mid].cp) hi = mid - 1;
        else if (cp > t->decompositions[mid].cp) lo = mid + 1;
        else return &t->decompositions[mid];
    }
    return NULL;
}

// UTF-8 <-> code points. A byte that does not start a well-formed sequence
// (overlong, surrogate, past U+10FFFF, cut short) becomes INVALID_BYTE_BASE + byte,
// which has no class and encodes back to the same byte.
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *out) {
    size_t count = 0;
    for (size_t i = 0; i < n;) {
        unsigned char b = s[i];
        int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        uint32_t cp = len == 1 ? b : len == 2 ? b & 0x1F : len == 3 ? b & 0x0F : b & 0x07;
        int ok = len > 0 && i + len <= n;
        for (int k = 1; ok && k < len; k++) {
            ok = (s[i + k] & 0xC0) == 0x80;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        static const uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (ok && (cp < smallest[len] || cp > MAX_CODE_POINT || (cp >= 0xD800 && cp <= 0xDFFF))) ok = 0;
        out[count++] = ok ? cp : INVALID_BYTE_BASE + b;
        i += ok ? (size_t)len : 1;
    }
    return count;
}

static int utf8_encode(uint32_t cp, unsigned char *out) {
    if (cp >= INVALID_BYTE_BASE) { out[0] = (unsigned char)(cp - INVALID_BYTE_BASE); return 1; }
    if (cp < 0x80) { out[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { out[0] = 0xC0 | cp >> 6; out[1] = 0x80 | (cp & 0x3F); return 2; }
    if (cp < 0x10000) {
        out[0] = 0xE0 | cp >> 12; out[1] = 0x80 | (cp >> 6 & 0x3F); out[2] = 0x80 | (cp & 0x3F);
        return 3;
    }
    out[0] = 0xF0 | cp >> 18; out[1] = 0x80 | (cp >> 12 & 0x3F); out[2] = 0x80 | (cp >> 6 & 0x3F);
    out[3] = 0x80 | (cp & 0x3F);
    return 4;
}

// NFC (Unicode Standard Annex #15): decompose every character canonically, put each
// run of combining marks in the order of their combining classes (stably), then
// compose each mark with the last starter before it, unless a mark of the same or
// a higher class, or a starter, stands between them. Hangul syllables decompose and
// compose by arithmetic: S = 0xAC00 + (L * 21 + V) * 28 + T.
enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7,
       HANGUL_L_COUNT = 19, HANGUL_V_COUNT = 21, HANGUL_T_COUNT = 28, HANGUL_COUNT = 11172 };

static void decompose(const Tokenizer *t, uint32_t cp, uint32_t *out, size_t *n, int depth) {
    if (depth == 0 && cp >= HANGUL_S && cp < HANGUL_S + HANGUL_COUNT) { // (no listed mapping leads to one)
        uint32_t s = cp - HANGUL_S;
        out[(*n)++] = HANGUL_L + s / (HANGUL_V_COUNT * HANGUL_T_COUNT);
        out[(*n)++] = HANGUL_V + s % (HANGUL_V_COUNT * HANGUL_T_COUNT) / HANGUL_T_COUNT;
        if (s % HANGUL_T_COUNT != 0) out[(*n)++] = HANGUL_T + s % HANGUL_T_COUNT;
        return;
    }
    const Decomposition *d = depth < MAX_DECOMPOSITION ? find_decomposition(t, cp) : NULL;
    if (!d) {
        out[(*n)++] = cp;
        return;
    }
    decompose(t, d->first, out, n, depth + 1);
    if (d->second != 0) decompose(t, d->second, out, n, depth + 1);
}

// The primary composite of a and b, or 0.
static uint32_t compose(const Tokenizer *t, uint32_t a, uint32_t b) {
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_L_COUNT && b >= HANGUL_V && b < HANGUL_V + HANGUL_V_COUNT)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_V_COUNT + (b - HANGUL_V)) * HANGUL_T_COUNT;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_COUNT && (a - HANGUL_S) % HANGUL_T_COUNT == 0 && b > HANGUL_T &&
        b < HANGUL_T + HANGUL_T_COUNT)
        return a + (b - HANGUL_T);
    int lo = 0, hi = t->n_compositions - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const Composition *c = &t->compositions[mid];
        if (a < c->first || (a == c->first && b < c->second)) hi = mid - 1;
        else if (a > c->first || b > c->second) lo = mid + 1;
        else return c->composite;
    }
    return 0;
}

static int compare_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

// Sorts each run of non-starters by combining class, keeping equal classes in
// order (the key holds the class, then the position). keys: room for n.
static void canonical_order(const Tokenizer *t, uint32_t *cps, size_t n, uint64_t *keys) {
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && combining_class(t, cps[j]) != 0) j++;
        if (j - i > 1) {
            for (size_t k = i; k < j; k++)
                keys[k - i] = (uint64_t)combining_class(t, cps[k]) << 44 | (uint64_t)(k - i) << 21 | cps[k];
            qsort(keys, j - i, sizeof(uint64_t), compare_u64);
            for (size_t k = i; k < j; k++) cps[k] = (uint32_t)(keys[k - i] & 0x1FFFFF);
        }
        i = j > i ? j : i + 1;
    }
}

// NFC of in[0..n) into out (room for n * MAX_DECOMPOSITION); returns its length.
static size_t nfc(const Tokenizer *t, const uint32_t *in, size_t n, uint32_t *out, uint64_t *keys) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) decompose(t, in[i], out, &m, 0);
    canonical_order(t, out, m, keys);
    if (m == 0) return 0;
    // compose: starter is where the last starter went; last_class the class of the
    // last character kept (256 before any starter: nothing composes)
    size_t starter = 0, kept = 1;
    int last_class = combining_class(t, out[0]) == 0 ? 0 : 256;
    for (size_t i = 1; i < m; i++) {
        uint32_t ch = out[i];
        int cc = combining_class(t, ch);
        uint32_t composite = last_class != 256 ? compose(t, out[starter], ch) : 0;
        if (composite != 0 && (last_class < cc || last_class == 0)) {
            out[starter] = composite;
            continue;
        }
        if (cc == 0) starter = kept;
        last_class = cc;
        out[kept++] = ch;
    }
    return kept;
}

// Pre-tokenizers: the byte-level models' regular expressions, as hand-written
// scanners. Each scan_* returns the end of the match at i, trying the pattern's
// alternatives in order, the first that matches winning (as regex alternation
// does), with the backtracking the pattern needs. The text is s->cp[0..end) with
// each character's CLASS_ bits in s->cls; end is the end of the input for the
// lookahead in \s+(?!\S). Every character matches some alternative, so the words
// cover the text.
typedef struct {
    const uint32_t *cp;
    const unsigned char *cls;
    size_t end;
} Scan;

static int has_class(const Scan *s, size_t i, int bits) { return i < s->end && (s->cls[i] & bits); }
static int is_newline(const Scan *s, size_t i) { return i < s->end && (s->cp[i] == '\r' || s->cp[i] == '\n'); }
static int is_space(const Scan *s, size_t i) { return has_class(s, i, CLASS_SPACE) || is_newline(s, i); }
// [^\s\p{L}\p{N}]: punctuation, symbols, marks, controls
static int is_other(const Scan *s, size_t i) {
    return i < s->end && !is_space(s, i) && !(s->cls[i] & (CLASS_L | CLASS_N));
}
static size_t skip_class(const Scan *s, size_t i, int bits) { while (has_class(s, i, bits)) i++; return i; }
static size_t skip_other(const Scan *s, size_t i) { while (is_other(s, i)) i++; return i; }
static size_t skip_space(const Scan *s, size_t i) { while (is_space(s, i)) i++; return i; }

// 's|'t|'re|'ve|'m|'ll|'d, with any_case: (?i:...), where 'ſ' (U+017F) folds to s.
static size_t match_contraction(const Scan *s, size_t i, int any_case) {
    static const char *const endings[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (i >= s->end || s->cp[i] != '\'') return i;
    for (int k = 0; k < 7; k++) {
        size_t j = i + 1;
        const char *e = endings[k];
        for (; *e && j < s->end; e++, j++) {
            uint32_t c = s->cp[j];
            if (any_case && c >= 'A' && c <= 'Z') c += 'a' - 'A';
            if (any_case && c == 0x17F) c = 's';
            if (c != (uint32_t)*e) break;
        }
        if (*e == '\0') return j;
    }
    return i;
}

// \s*[\r\n]+ : through the last newline of the whitespace run at i (the regex's
// backtracking gives back the spaces after it); i when the run has none.
static size_t match_spaces_to_newline(const Scan *s, size_t i) {
    size_t end = i;
    for (size_t j = i; is_space(s, j); j++)
        if (is_newline(s, j)) end = j + 1;
    return end;
}

// \s+(?!\S)|\s+ : a whitespace run, less its last space when a non-space follows
// (that space then starts the next word: " world").
static size_t match_spaces(const Scan *s, size_t i) {
    size_t j = skip_space(s, i);
    if (j < s->end && j - i > 1) return j - 1;
    return j;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
static size_t scan_gpt2(const Scan *s, size_t i) {
    size_t e = match_contraction(s, i, 0);
    if (e > i) return e;
    size_t j = s->cp[i] == ' ' ? i + 1 : i; // " ?": a space is none of the classes that follow it
    if (has_class(s, j, CLASS_L)) return skip_class(s, j, CLASS_L);
    if (has_class(s, j, CLASS_N)) return skip_class(s, j, CLASS_N);
    if (is_other(s, j)) return skip_other(s, j);
    return match_spaces(s, i);
}

// Llama 3 (cl100k), and Qwen2 with max_digits 1:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
static size_t scan_llama3(const Scan *s, size_t i, int max_digits) {
    size_t e = match_contraction(s, i, 1);
    if (e > i) return e;
    int prefix = !is_newline(s, i) && !has_class(s, i, CLASS_L | CLASS_N); // [^\r\n\p{L}\p{N}]
    if (prefix && has_class(s, i + 1, CLASS_L)) return skip_class(s, i + 1, CLASS_L);
    if (has_class(s, i, CLASS_L)) return skip_class(s, i, CLASS_L);
    if (has_class(s, i, CLASS_N)) {
        size_t j = i;
        while (j - i < (size_t)max_digits && has_class(s, j, CLASS_N)) j++;
        return j;
    }
    size_t j = s->cp[i] == ' ' ? i + 1 : i;
    if (is_other(s, j)) {
        j = skip_other(s, j);
        while (is_newline(s, j)) j++;
        return j;
    }
    e = match_spaces_to_newline(s, i);
    return e > i ? e : match_spaces(s, i);
}

// o200k (GPT-4o, Phi-4-mini): words split by case, with marks:
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|...)?|
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|...)?|
// \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
#define CLASS_UPPERISH (CLASS_LU | CLASS_LO | CLASS_M) // Lu Lt Lm Lo M
#define CLASS_LOWERISH (CLASS_LL | CLASS_LO | CLASS_M) // Ll Lm Lo M

// The first alternative from `start`: U* greedy, then W+ needs one character, so
// U* gives back characters until one it gave back (or the next) is in W too.
static size_t match_o200k_lower_word(const Scan *s, size_t start) {
    size_t a = skip_class(s, start, CLASS_UPPERISH);
    if (has_class(s, a, CLASS_LOWERISH)) return skip_class(s, a, CLASS_LOWERISH);
    for (size_t k = a; k > start; k--)
        if (has_class(s, k - 1, CLASS_LOWERISH)) return k; // W+ from k - 1 stops at k (c[k] is not in W)
    return start;
}

static size_t scan_o200k(const Scan *s, size_t i) {
    int prefix = !is_newline(s, i) && !has_class(s, i, CLASS_L | CLASS_N);
    size_t starts[2] = {i + 1, i};
    for (int k = prefix ? 0 : 1; k < 2; k++) { // with the optional character, then without
        size_t e = match_o200k_lower_word(s, starts[k]);
        if (e > starts[k]) return match_contraction(s, e, 1);
    }
    for (int k = prefix ? 0 : 1; k < 2; k++)
        if (has_class(s, starts[k], CLASS_UPPERISH)) {
            size_t e = skip_class(s, skip_class(s, starts[k], CLASS_UPPERISH), CLASS_LOWERISH);
            return match_contraction(s, e, 1);
        }
    if (has_class(s, i, CLASS_N)) {
        size_t j = i;
        while (j - i < 3 && has_class(s, j, CLASS_N)) j++;
        return j;
    }
    size_t j = s->cp[i] == ' ' ? i + 1 : i;
    if (is_other(s, j)) {
        j = skip_other(s, j);
        while (is_newline(s, j) || (j < s->end && s->cp[j] == '/')) j++;
        return j;
    }
    size_t e = match_spaces_to_newline(s, i);
    return e > i ? e : match_spaces(s, i);
}

// The end of the word that starts at i, by the tokenizer's pattern.
static size_t next_word(const Tokenizer *t, const Scan *s, size_t i) {
    size_t e;
    switch (t->pretokenizer) {
    case PRETOKENIZER_GPT2: e = scan_gpt2(s, i); break;
    case PRETOKENIZER_LLAMA3: e = scan_llama3(s, i, 3); break;
    case PRETOKENIZER_QWEN2: e = scan_llama3(s, i, 1); break;
    case PRETOKENIZER_O200K: e = scan_o200k(s, i); break;
    default: e = s->end; // no pattern: the whole text is one word
    }
    return e > i ? e : i + 1;
}

// Decoding: the text of token `token` when it follows `prev_token`. Control and
// unused tokens, and ids past the stored pieces, are "". SentencePiece's leading
// space after BOS is dropped (it is the dummy prefix); byte pieces "<0xXX>" become
// the byte itself; byte-level pieces are raw bytes already (a character may come
// in pieces over several tokens: the terminal puts it together).
static const char *decode(const Tokenizer *t, int prev_token, int token) {
    if (token < 0 || token >= t->n_tokens) return "";
    int type = t->vocab_type[token];
    if (type == PIECE_CONTROL || type == PIECE_UNUSED) return "";
    if (type == PIECE_BYTE) return (const char *)t->byte_pieces + byte_piece_value(t->vocab[token], 6) * 2;
    const char *piece = t->vocab[token];
    if (t->kind != TOKENIZER_BYTE_LEVEL && (t->flags & FLAG_DUMMY_PREFIX) && prev_token >= 0 &&
        prev_token == t->bos_id && piece[0] == ' ')
        piece++;
    return piece;
}

// Prints a piece, leaving out raw control bytes (a model can emit "<0x1B>", the
// terminal escape). Whitespace and UTF-8 bytes (>= 0x80) pass through.
static void safe_print(const char *piece) {
    for (const unsigned char *p = (const unsigned char *)piece; *p; p++)
        if (isprint(*p) || isspace(*p) || *p >= 0x80) putchar(*p);
}

// The id of a control, user-defined or unknown piece by its exact text ("<|eot_id|>"), -1
// if the vocabulary has none.
static int special_token(const Tokenizer *t, const char *piece) {
    int length = (int)strlen(piece);
    for (int i = 0; i < t->n_tokens; i++)
        if (t->vocab_type[i] != PIECE_NORMAL && t->vocab_type[i] != PIECE_BYTE && t->vocab_length[i] == length &&
            memcmp(t->vocab[i], piece, length) == 0)
            return i;
    return -1;
}

// Whether generation ends at id: one of the model's end tokens, or its end of turn.
static int is_end_token(const Tokenizer *t, int id) {
    if (id < 0) return 0;
    for (int k = 0; k < t->n_eos; k++)
        if (t->eos_ids[k] == id) return 1;
    return id == t->eot_id;
}

// The room encode needs for a text of text_bytes bytes: at most one token per byte
// of the (normalized) text, plus BOS, a dummy prefix and EOS.
static size_t encode_capacity(const Tokenizer *t, size_t text_bytes) {
    size_t growth = (t->flags & FLAG_NFC) && t->nfc_growth > 1 ? (size_t)t->nfc_growth : 1;
    size_t prefixes = t->flags & FLAG_PREFIX_EACH_SEGMENT ? text_bytes + 1 : 1;
    return text_bytes * growth + prefixes + 2;
}

// The token of a byte that has no piece of its own (byte fallback), or -1.
static int byte_token(const Tokenizer *t, unsigned char byte) {
    int id = t->flags & FLAG_BYTE_FALLBACK ? t->byte_ids[byte] : -1;
    return id >= 0 ? id : t->unk_id;
}

// A possible merge of the adjacent tokens left and right (indices into the token
// array) into id. versions detect candidates made stale by an earlier merge.
// SentencePiece (kind 1) ranks candidates by score, the others by merge rank.
typedef struct {
    float score; // kind 1: the merged piece's score, higher first
    int rank;    // kinds 2, 3: the merge's rank, lower first
    int left, right, id;
    unsigned left_version, right_version;
} MergeCandidate;

typedef struct {
    MergeCandidate *heap; // a binary heap: best candidate first, leftmost on ties
    int size;
    int *ids, *next, *prev; // the tokens as a linked list; merged ones have id -1
    unsigned *version;
} MergeState;

static int candidate_first(const MergeCandidate *a, const MergeCandidate *b) {
    if (a->score != b->score) return a->score > b->score;
    if (a->rank != b->rank) return a->rank < b->rank;
    return a->left < b->left;
}

static void heap_push(MergeState *m, MergeCandidate c) {
    int i = m->size++;
    while (i > 0 && candidate_first(&c, &m->heap[(i - 1) / 2])) {
        m->heap[i] = m->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    m->heap[i] = c;
}

static MergeCandidate heap_pop(MergeState *m) {
    MergeCandidate top = m->heap[0], last = m->heap[--m->size];
    int i = 0;
    while (1) {
        int child = 2 * i + 1;
        if (child >= m->size) break;
        if (child + 1 < m->size && candidate_first(&m->heap[child + 1], &m->heap[child])) child++;
        if (!candidate_first(&m->heap[child], &last)) break;
        m->heap[i] = m->heap[child];
        i = child;
    }
    if (m->size > 0) m->heap[i] = last;
    return top;
}

// Queues the merge of left and right if there is one: kind 1, if their
// concatenation is a piece; kinds 2, 3, if the merge list has the pair.
static void consider_pair(const Tokenizer *t, MergeState *m, int left, int right, char *buffer) {
    int a = m->ids[left], b = m->ids[right];
    MergeCandidate c = {0.0f, 0, left, right, -1, m->version[left], m->version[right]};
    if (t->kind == TOKENIZER_SENTENCEPIECE) {
        int la = t->vocab_length[a], lb = t->vocab_length[b];
        if (la + lb > t->max_token_length) return;
        memcpy(buffer, t->vocab[a], la);
        memcpy(buffer + la, t->vocab[b], lb);
        buffer[la + lb] = '\0';
        c.id = str_lookup(buffer, t);
        if (c.id == -1 || !(t->vocab_scores[c.id] > -FLT_MAX)) return;
        c.score = t->vocab_scores[c.id];
    } else {
        const MergeSlot *s = t->n_merges > 0 ? merge_slot(t, a, b) : NULL;
        if (!s || s->id < 0) return;
        c.rank = s->rank;
        c.id = s->id;
    }
    heap_push(m, c);
}

// BPE on tokens[0..n): repeatedly merges the best adjacent pair (leftmost on
// ties). A merge changes only the pairs next to it, so the candidates wait in a
// priority queue and those a merge made stale are skipped when they come up: O(n
// log n) instead of a rescan of the whole text per merge. Returns the new count.
static int merge_pairs(const Tokenizer *t, int *tokens, int n, char *buffer) {
    if (n < 2) return n;
    MergeState m = {0};
    m.heap = malloc((size_t)3 * n * sizeof(MergeCandidate)); // n - 1 pairs, then at most 2 per merge
    m.next = malloc((size_t)n * sizeof(int));
    m.prev = malloc((size_t)n * sizeof(int));
    m.version = calloc((size_t)n, sizeof(unsigned));
    m.ids = tokens;
    int count = -1;
    if (!m.heap || !m.next || !m.prev || !m.version) {
        fail("out of memory encoding text");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        m.next[i] = i + 1 < n ? i + 1 : -1;
        m.prev[i] = i - 1;
    }
    for (int i = 0; i + 1 < n; i++) consider_pair(t, &m, i, i + 1, buffer);
    while (m.size > 0) {
        MergeCandidate c = heap_pop(&m);
        if (m.next[c.left] != c.right || m.version[c.left] != c.left_version || m.version[c.right] != c.right_version)
            continue; // stale: a neighbour merged since
        m.ids[c.left] = c.id;
        m.version[c.left]++;
        m.ids[c.right] = -1;
        m.version[c.right]++;
        m.next[c.left] = m.next[c.right];
        if (m.next[c.right] >= 0) m.prev[m.next[c.right]] = c.left;
        if (m.prev[c.left] >= 0) consider_pair(t, &m, m.prev[c.left], c.left, buffer);
        if (m.next[c.left] >= 0) consider_pair(t, &m, c.left, m.next[c.left], buffer);
    }
    count = 0;
    for (int i = 0; i >= 0; i = m.next[i]) tokens[count++] = m.ids[i];
done:
    free(m.heap);
    free(m.next);
    free(m.prev);
    free(m.version);
    return count;
}

// SentencePiece BPE (kinds 1, 3) of text[0..len): an optional dummy-prefix space,
// one token per UTF-8 character (byte fallback for characters not in the
// vocabulary), then merges. Writes the tokens at tokens; returns their count.
static int encode_sentencepiece(const Tokenizer *t, const char *text, size_t len, int prefix, int *tokens, char *buffer) {
    int n = 0;
    if (prefix) { // SentencePiece adds a space in front of non-empty text (add_dummy_prefix)
        int space = str_lookup(" ", t);
        if (space < 0) space = byte_token(t, ' ');
        if (space >= 0) tokens[n++] = space;
    }
    // One token per UTF-8 character. A character starts at a byte that is not a
    // continuation byte (10xxxxxx) and has at most 4 bytes; malformed sequences
    // fall back to one token per byte.
    size_t str_len = 0;
    for (size_t i = 0; i < len; i++) {
        if ((text[i] & 0xC0) != 0x80) str_len = 0;
        buffer[str_len++] = text[i];
        buffer[str_len] = '\0';
        if (i + 1 < len && (text[i + 1] & 0xC0) == 0x80 && str_len < 4) continue;
        if (strcmp(buffer, "\xE2\x96\x81") == 0) // a typed '▁' is a space to SentencePiece (and to
            strcpy(buffer, " ");                  // tokenizer.json's Replace normalizer): pieces store ' ' 
        int id = str_lookup(buffer, t);
        if (id != -1) {
            tokens[n++] = id;
        } else {
            for (size_t k = 0; k < str_len; k++) {
                int b = byte_token(t, (unsigned char)buffer[k]);
                if (b >= 0) tokens[n++] = b;
            }
        }
        str_len = 0;
    }
    // Merge the best adjacent pair until no pair forms a piece. Ties go to the
    // leftmost pair, as in SentencePiece.
    return merge_pairs(t, tokens, n, buffer);
}

// Gemma 4's tokenizer as llama.cpp runs it from a GGUF file (FLAG_SPLIT_NEWLINES;
// llama-vocab.cpp, pre-tokenizer gemma4 "[^\n]+|[\n]+"): text[0..len) is cut into
// runs of newlines and runs of other characters, and BPE (kind 3, no dummy prefix)
// runs within each run, never across one. A run of newlines that is itself a piece
// is that one token, whatever the merges would make of it. Returns the token count.
static int encode_newline_runs(const Tokenizer *t, const char *text, size_t len, int *tokens, char *buffer) {
    int n = 0;
    for (size_t start = 0; start < len;) {
        int newlines = text[start] == '\n';
        size_t end = start + 1;
        while (end < len && (text[end] == '\n') == newlines) end++;
        size_t run = end - start;
        int id = newlines && run <= MAX_PIECE_BYTES ? piece_lookup(t, text + start, (int)run) : -1;
        int got = 1;
        if (id >= 0)
            tokens[n] = id;
        else
            got = encode_sentencepiece(t, text + start, end - start, 0, tokens + n, buffer);
        if (got < 0) return -1;
        n += got;
        start = end;
    }
    return n;
}

// Scratch space for byte-level encoding of one segment of text.
typedef struct {
    uint32_t *cps, *normal;  // the code points; NFC
    unsigned char *cls;      // their classes
    uint64_t *keys;          // for canonical ordering
    unsigned char *bytes;    // one word's bytes
} ByteLevelScratch;

// One word: a piece by itself (ignore_merges), else its bytes merged by rank.
static int encode_word(const Tokenizer *t, const uint32_t *cps, size_t n, int *tokens, ByteLevelScratch *w, char *buffer) {
    int length = 0;
    for (size_t i = 0; i < n; i++) length += utf8_encode(cps[i], w->bytes + length);
    if (t->flags & FLAG_IGNORE_MERGES) {
        int id = piece_lookup(t, (const char *)w->bytes, length);
        if (id >= 0) {
            tokens[0] = id;
            return 1;
        }
    }
    for (int i = 0; i < length; i++) tokens[i] = t->byte_ids[w->bytes[i]];
    return merge_pairs(t, tokens, length, buffer);
}

// Byte-level BPE of text[0..len): NFC if the model asks, pre-tokenize, then each
// word's bytes merged by rank.
static int encode_byte_level(const Tokenizer *t, const char *text, size_t len, int *tokens, ByteLevelScratch *w,
                             char *buffer) {
    size_t n = utf8_decode((const unsigned char *)text, len, w->cps);
    const uint32_t *cps = w->cps;
    if (t->flags & FLAG_NFC) {
        n = nfc(t, w->cps, n, w->normal, w->keys);
        cps = w->normal;
    }
    for (size_t i = 0; i < n; i++) w->cls[i] = (unsigned char)char_classes(t, cps[i]);
    int count = 0;
    // split_digits: every digit is a piece by itself; the pattern runs within each piece
    for (size_t start = 0; start < n;) {
        size_t end = start + 1;
        if (t->flags & FLAG_SPLIT_DIGITS) {
            if (!(w->cls[start] & CLASS_N))
                while (end < n && !(w->cls[end] & CLASS_N)) end++;
        } else {
            end = n;
        }
        Scan s = {cps, w->cls, end};
        for (size_t i = start; i < end;) {
            size_t e = next_word(t, &s, i);
            int got = encode_word(t, cps + i, e - i, tokens + count, w, buffer);
            if (got < 0) return -1;
            count += got;
            i = e;
        }
        start = end;
    }
    return count;
}

// The longest user-defined piece that text[0..left) starts with: its index in
// user_pieces, or -1. The pieces that start with text's first byte come in groups
// of one length, longest first, each sorted: one binary search per length
// (Gemma 3 has some 6000 pieces starting with '<', in a dozen lengths).
static int user_piece_at(const Tokenizer *t, const char *text, size_t left) {
    if (t->n_user == 0) return -1;
    int first = (unsigned char)text[0], end = t->user_bucket[first + 1];
    for (int k = t->user_bucket[first]; k < end;) {
        int length = t->user_pieces[k].length, group_end = k;
        while (group_end < end && t->user_pieces[group_end].length == length) group_end++;
        if ((size_t)length <= left) {
            TokenIndex key = {.str = text, .length = length};
            const TokenIndex *found =
                bsearch(&key, t->user_pieces + k, group_end - k, sizeof(TokenIndex), compare_tokens);
            if (found) return (int)(found - t->user_pieces);
        }
        k = group_end;
    }
    return -1;
}

// Encodes text into tokens (room for encode_capacity(t, strlen(text))). bos: start
// with the model's BOS, if it has one; eos: end with its first end token. The text
// is cut at user-defined pieces, each one token; the segments between them go to
// the kind's encoder. User text never produces a control token.
static int encode(const Tokenizer *t, const char *text, int bos, int eos, int *tokens, int *n_tokens) {
    size_t len = strlen(text);
    size_t buffer_size = (size_t)t->max_token_length * 2 + 1 + 4;
    char *buffer = malloc(buffer_size);
    ByteLevelScratch w = {0};
    int result = 0;
    *n_tokens = 0;
    if (!buffer) return fail("out of memory encoding text");
    if (t->kind == TOKENIZER_BYTE_LEVEL) {
        size_t cp_room = len + 1, normal_room = (t->flags & FLAG_NFC) ? cp_room * MAX_DECOMPOSITION : 1;
        w.cps = malloc(cp_room * sizeof(uint32_t));
        w.normal = malloc(normal_room * sizeof(uint32_t));
        w.keys = malloc(normal_room * sizeof(uint64_t));
        w.cls = malloc(normal_room > cp_room ? normal_room : cp_room);
        w.bytes = malloc(4 * (normal_room > cp_room ? normal_room : cp_room));
        if (!w.cps || !w.normal || !w.keys || !w.cls || !w.bytes) result = fail("out of memory encoding text");
    }
    if (bos && t->bos_id >= 0) tokens[(*n_tokens)++] = t->bos_id;
    for (size_t start = 0, i = 0; result == 0 && start <= len;) {
        int user = -1;
        while (i < len && (user = user_piece_at(t, text + i, len - i)) < 0) i++;
        // the segment text[start..i), then the user-defined piece at i if any
        int got = 0, first = start == 0;
        if (t->kind == TOKENIZER_BYTE_LEVEL) {
            got = encode_byte_level(t, text + start, i - start, tokens + *n_tokens, &w, buffer);
        } else {
            int prefix = (t->flags & FLAG_DUMMY_PREFIX) &&
                         (t->kind == TOKENIZER_SENTENCEPIECE ? first && len > 0
                                                             : i > start && (first || (t->flags & FLAG_PREFIX_EACH_SEGMENT)));
            got = t->flags & FLAG_SPLIT_NEWLINES
                      ? encode_newline_runs(t, text + start, i - start, tokens + *n_tokens, buffer)
                      : encode_sentencepiece(t, text + start, i - start, prefix, tokens + *n_tokens, buffer);
        }
        if (got < 0) {
            result = -1;
            break;
        }
        *n_tokens += got;
        if (user < 0) break;
        tokens[(*n_tokens)++] = t->user_pieces[user].id;
        start = i = i + t->user_pieces[user].length;
    }
    if (result == 0 && eos && t->n_eos > 0) tokens[(*n_tokens)++] = t->eos_ids[0];
    free(buffer);
    free(w.cps);
    free(w.normal);
    free(w.keys);
    free(w.cls);
    free(w.bytes);
    return result;
}

// Builds a tokenizer from the bytes of a tokenizer file or section: TOKN by its
// magic, else llama2.c's tokenizer.bin. Returns 0, -1, or TOKENIZER_WRONG_SIZE
// for a tokenizer of another vocabulary size.
static int build_tokenizer_from_memory(Tokenizer *t, const unsigned char *data, size_t size, int vocab_size,
                                       const char *name) {
    memset(t, 0, sizeof(*t));
    int result = size >= 4 && read_u32(data) == MAGIC_TOKN ? build_tokn_tokenizer(t, data, size, vocab_size, name)
                                                           : build_legacy_tokenizer(t, data, size, vocab_size, name);
    if (result != 0) free_tokenizer(t);
    return result;
}

// Whether path names a tokenizer run cannot read but export.py converts: a
// tokenizer.model (SentencePiece protobuf) or a tokenizer.json.
static int is_convertible_tokenizer(const char *path, const unsigned char *data, size_t size) {
    size_t n = strlen(path);
    int json = n >= 5 && strcmp(path + n - 5, ".json") == 0, model = n >= 6 && strcmp(path + n - 6, ".model") == 0;
    size_t i = 0;
    while (i < size && isspace(data[i])) i++;
    return json || model || (i < size && data[i] == '{');
}

static int build_tokenizer(Tokenizer *t, const char *path, int vocab_size) {
    memset(t, 0, sizeof(*t));
    size_t size = 0;
    int checked = check_tokenizer_start(path, vocab_size); // a wrong file is refused before it is read whole
    if (checked != 0) return checked;
    char *data = read_whole_file(path, "tokenizer ", &size);
    if (!data) return -1;
    int result;
    if (!(size >= 4 && read_u32((unsigned char *)data) == MAGIC_TOKN) &&
        is_convertible_tokenizer(path, (unsigned char *)data, size))
        result = fail("tokenizer %s is a Hugging Face or SentencePiece file; convert it first: "
                      "python3 export.py --tokenizer %s -o tok.bin, then -z tok.bin", path, path);
    else
        result = build_tokenizer_from_memory(t, (const unsigned char *)data, size, vocab_size, path);
    free(data);
    return result;
}

// ----------------------------------------------------------------------------
// Utilities

// Opens an input file (checkpoint, tokenizer, text) for reading: returns its
// descriptor and size, or -1 with an error naming it as `what` ("checkpoint ",
// "tokenizer ", or "" for a text file). Only regular files: with O_NONBLOCK a
// FIFO cannot block the open, and fstat then refuses it like a directory.
static int open_regular_file(const char *path, const char *what, size_t *size) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return fail("cannot open %s%s: %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail("%s%s is not a regular file", what, path);
    }
    *size = (size_t)st.st_size;
    return fd;
}

// Reads up to n bytes from fd into buffer; returns how many it read (fewer at the
// end of the file), or -1 with errno set.
static ssize_t read_fully(int fd, char *buffer, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buffer + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

// Reads the first bytes of an input file (up to n, fewer when it is shorter) and
// its size, so that a file of the wrong kind is refused before it is read whole.
// Returns how many bytes it read, or -1 with an error.
static ssize_t read_file_start(const char *path, const char *what, char *buffer, size_t n, size_t *size) {
    int fd = open_regular_file(path, what, size);
    if (fd < 0) return -1;
    ssize_t got = read_fully(fd, buffer, n);
    int error = errno;
    close(fd);
    if (got < 0) return fail("cannot read %s%s: %s", what, path, strerror(error));
    return got;
}

// Reads a whole input file into memory, with a NUL after its last byte.
static char *read_whole_file(const char *path, const char *what, size_t *size) {
    int fd = open_regular_file(path, what, size);
    if (fd < 0) return NULL;
    char *data = *size < SIZE_MAX ? malloc(*size + 1) : NULL;
    if (!data) {
        close(fd);
        fail("out of memory reading %s%s (%zu bytes)", what, path, *size);
        return NULL;
    }
    ssize_t got = read_fully(fd, data, *size);
    int error = errno;
    close(fd);
    if (got < 0 || (size_t)got != *size) {
        free(data);
        if (got < 0) fail("cannot read %s%s: %s", what, path, strerror(error));
        else fail("cannot read %s%s: it has %zd bytes, not the %zu it had when opened", what, path, got, *size);
        return NULL;
    }
    data[*size] = '\0';
    return data;
}

// A tokenizer's first bytes, checked before it is read whole (a checkpoint of many
// gigabytes given as -z is refused at once): llama2.c's tokenizer.bin starts with
// max_token_length, 1..1024, and holds vocab_size records of a float32 score, an
// int32 length and at most max_token_length bytes, so it is no larger than
// 4 + vocab_size * (8 + max_token_length). The same messages as the full parse.
static int check_tokenizer_start(const char *path, int vocab_size) {
    unsigned char start[4];
    size_t size = 0;
    ssize_t got = read_file_start(path, "tokenizer ", (char *)start, sizeof(start), &size);
    if (got < 0) return -1;
    if (got < 4 || memcmp(start, "TOKN", 4) == 0) return 0; // too short, or the TOKN format: its parser checks
    if (is_convertible_tokenizer(path, start, (size_t)got)) return 0; // build_tokenizer says to convert it
    int max_len = read_i32(start);
    if (max_len < 1 || max_len > 1024) return fail("tokenizer %s: max_token_length %d is out of range", path, max_len);
    uint64_t largest = 4 + (uint64_t)vocab_size * (8 + (uint64_t)max_len);
    if (size > largest) {
        fail("tokenizer %s has more than the model's %d tokens (%zu bytes, where %d tokens of at most %d bytes "
             "take at most %llu)", path, vocab_size, size, vocab_size, max_len, (unsigned long long)largest);
        return TOKENIZER_WRONG_SIZE;
    }
    return 0;
}

static double time_in_s(void) {
    struct timespec time;
    clock_gettime(CLOCK_MONOTONIC, &time);
    return time.tv_sec + time.tv_nsec * 1e-9;
}

// Encodes a prompt as the model's tokenizer does (BOS first where the model adds
// one) into a fresh array.
static int encode_prompt(const Tokenizer *tok, const char *text, int **tokens, int *n) {
    *tokens = malloc(encode_capacity(tok, strlen(text)) * sizeof(int));
    if (!*tokens) return fail("out of memory encoding the prompt");
    if (encode(tok, text, tok->add_bos, 0, *tokens, n) != 0) {
        free(*tokens);
        return -1;
    }
    return 0;
}

// Non-finite logits: stop rather than print garbage. The RoPE tables are checked
// finite when the settings are (check_rope_angles), so what is left is a NaN or an
// infinity in the weights, or an activation beyond float32's range; which one, this
// check does not know, and the message says so.
static int check_logits(const float *logits, int vocab_size, int pos) {
    int any_bad = 0; // first a pass without branches, which the compiler vectorizes
    for (int i = 0; i < vocab_size; i++) any_bad |= !isfinite(logits[i]);
    if (!any_bad) return 0;
    for (int i = 0; i < vocab_size; i++)
        if (!isfinite(logits[i]))
            return fail("non-finite logits at position %d (logit %d is %g): the checkpoint's weights hold NaN or "
                        "infinity, or the forward pass overflowed float32", pos, i, logits[i]);
    return 0;
}

// -v: "label: id id id" on stderr.
static void print_token_ids(const char *label, const int *ids, int n) {
    fprintf(stderr, "%s:", label);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

// Tokens per second over a span in seconds, 0 when nothing was timed.
static double rate(int n, double seconds) { return seconds > 0 ? n / seconds : 0.0; }

// ----------------------------------------------------------------------------
// Generation: the prompt, then the continuation, streamed as llama2.c prints it.

// Generation ends at any of the model's end tokens (is_end_token: its EOS set and its
// end of turn), and with a SentencePiece tokenizer at BOS: llama2.c's models end a
// document by starting the next. The end token is not printed; other special tokens
// print as nothing (decode).
static int ends_generation(const Tokenizer *tok, int id) {
    return is_end_token(tok, id) || (tok->kind == TOKENIZER_SENTENCEPIECE && id == tok->bos_id);
}

static int generate(Transformer *t, Tokenizer *tok, Sampler *sampler, const char *prompt, int steps, int verbose) {
    int *prompt_tokens, n_prompt;
    if (encode_prompt(tok, prompt, &prompt_tokens, &n_prompt) != 0) return -1;
    if (n_prompt == 0) {
        free(prompt_tokens);
        return fail("the model has no BOS token to start from: give a prompt (-p TEXT)");
    }
    if (n_prompt > t->config.seq_len) {
        free(prompt_tokens);
        return fail("the prompt has %d tokens, more than the context of %d", n_prompt, t->config.seq_len);
    }

    // llama2.c runs positions 0 .. steps-1 and prints one token after each: the
    // next prompt token while there is one, else a sampled one. So a prompt of more
    // than `steps` tokens is cut, and nothing is sampled.
    // the first prompt token is printed too when it is text, not BOS
    if (prompt_tokens[0] != tok->bos_id) safe_print(decode(tok, -1, prompt_tokens[0]));
    if (n_prompt > steps) {
        for (int pos = 0; pos < steps; pos++) safe_print(decode(tok, prompt_tokens[pos], prompt_tokens[pos + 1]));
        printf("\n");
        free(prompt_tokens);
        return 0;
    }

    // prefill: the whole prompt in blocks; its last logits predict the first new token
    double t0 = time_in_s();
    float *logits = prefill(t, prompt_tokens, n_prompt, 0);
    double t1 = time_in_s();
    for (int pos = 0; pos + 1 < n_prompt; pos++) safe_print(decode(tok, prompt_tokens[pos], prompt_tokens[pos + 1]));
    fflush(stdout);

    // decode: sample from the logits at position pos, then run the new token at pos + 1
    int token = prompt_tokens[n_prompt - 1], n_generated = 0;
    int *generated = malloc((size_t)(steps - n_prompt + 1) * sizeof(int));
    if (!generated) {
        free(prompt_tokens);
        return fail("out of memory");
    }
    for (int pos = n_prompt - 1; pos < steps; pos++) {
        if (pos > n_prompt - 1) logits = forward(t, token, pos);
        if (check_logits(logits, t->config.vocab_size, pos) != 0) {
            printf("\n");
            free(generated);
            free(prompt_tokens);
            return -1;
        }
        int next = sample(sampler, logits);
        if (ends_generation(tok, next)) break;
        safe_print(decode(tok, token, next));
        fflush(stdout);
        generated[n_generated++] = token = next;
    }
    printf("\n");
    fflush(stdout); // the line ends before the timing line on stderr, even where both go to one pipe
    double t2 = time_in_s();
    if (verbose) print_token_ids("generated", generated, n_generated);
    free(generated);
    fprintf(stderr, "timing: prefill %d tokens %.1f tok/s, decode %d tokens %.1f tok/s\n", n_prompt,
            rate(n_prompt, t1 - t0), n_generated, rate(n_generated > 0 ? n_generated - 1 : 0, t2 - t1));
    free(prompt_tokens);
    return 0;
}

// ----------------------------------------------------------------------------
// Tokenize: the prompt's token ids, one per line with the piece as printable text.

// Writes byte c to f with control characters escaped: \n, \r, \t, else \xNN.
static void put_escaped_byte(unsigned char c, FILE *f) {
    if (c == '\n') fputs("\\n", f);
    else if (c == '\r') fputs("\\r", f);
    else if (c == '\t') fputs("\\t", f);
    else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
    else fputc(c, f);
}

// A piece on stdout with its control characters and backslashes escaped, so that the
// escapes can be read back unambiguously.
static void print_escaped(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\') fputs("\\\\", stdout);
        else put_escaped_byte(*p, stdout);
    }
}

static int tokenize(const Tokenizer *tok, const char *prompt) {
    int *tokens, n;
    if (encode_prompt(tok, prompt, &tokens, &n) != 0) return -1;
    for (int i = 0; i < n; i++) {
        printf("%d\t", tokens[i]);
        print_escaped(tok->vocab[tokens[i]]);
        printf("\n");
    }
    free(tokens);
    return 0;
}

// -m tokenize -f FILE: each of the file's texts, separated by NUL bytes, as above,
// with an empty line after each (a batch for the tokenizer tests).
static int tokenize_file(const Tokenizer *tok, const char *path) {
    size_t size = 0;
    char *data = read_whole_file(path, "", &size);
    if (!data) return -1;
    int result = 0;
    for (size_t start = 0; start <= size && result == 0;) {
        result = tokenize(tok, data + start);
        printf("\n");
        start += strlen(data + start) + 1;
    }
    free(data);
    return result;
}

// ----------------------------------------------------------------------------
// Perplexity: how well the model predicts a text, token by token.
//
// The tokens are BOS + encode(text), as for generation. Position t's logits
// predict token t+1; nll is the mean of -log softmax(logits_t)[token_{t+1}] over
// the predicted tokens and perplexity = exp(nll). A text longer than the context
// is cut into consecutive windows of seq_len - 1 text tokens, each scored after a
// fresh BOS, so every text token is predicted exactly once. A model without BOS
// (Qwen) sees the text alone: its first token is context only, and each window
// after the first starts with the last token of the one before.

// -log softmax(logits)[target], computed stably in double.
static double token_nll(const float *logits, int vocab_size, int target) {
    float max_val = logits[0];
    for (int i = 1; i < vocab_size; i++)
        if (logits[i] > max_val) max_val = logits[i];
    double sum = 0.0;
    for (int i = 0; i < vocab_size; i++) sum += exp((double)logits[i] - max_val);
    return log(sum) - ((double)logits[target] - max_val);
}

// Scores window = BOS + text tokens; adds the nll of its predictions to *total, and
// writes "position,nll" rows to csv when it is not NULL.
static int score_window(Transformer *t, const int *window, int n, double *total, FILE *csv) {
    int vocab_size = t->config.vocab_size;
    for (int i = 0; i + 1 < n; i += PREFILL_BLOCK) {
        int len = n - 1 - i < PREFILL_BLOCK ? n - 1 - i : PREFILL_BLOCK; // predictions in this block
        float *logits = forward_block(t, window + i, len, i, LOGITS_ALL);
        for (int b = 0; b < len; b++) {
            const float *row = logits + (size_t)b * vocab_size;
            if (check_logits(row, vocab_size, i + b) != 0) return -1;
            double nll = token_nll(row, vocab_size, window[i + b + 1]);
            *total += nll;
            if (csv) fprintf(csv, "%d,%.9g\n", i + b, nll);
        }
    }
    return 0;
}

// csv_path: where to write one row per scored token (its position in its window and
// its nll), or NULL.
static int perplexity(Transformer *t, const Tokenizer *tok, const char *text, const char *csv_path) {
    int *tokens, n;
    if (encode_prompt(tok, text, &tokens, &n) != 0) return -1;
    int lead = tok->add_bos && tok->bos_id >= 0; // 1: BOS starts each window
    int n_text = n - lead, n_predicted = n_text - !lead;
    if (n_predicted < 1) {
        free(tokens);
        return fail("the text is empty: nothing to predict");
    }
    int per_window = t->config.seq_len - lead; // text tokens per window, after its BOS
    if (per_window < 1 + !lead) {
        free(tokens);
        return fail("seq_len %d leaves no room for a prediction%s", t->config.seq_len, lead ? " after BOS" : "");
    }
    int *window = malloc((size_t)t->config.seq_len * sizeof(int));
    FILE *csv = window && csv_path ? fopen(csv_path, "w") : NULL;
    int result = 0;
    if (!window) result = fail("out of memory");
    else if (csv_path && !csv) result = fail("cannot write %s: %s", csv_path, strerror(errno));
    if (csv) fprintf(csv, "position,nll\n");
    const int *text_tokens = tokens + lead;
    int n_windows = 0;
    double total = 0.0, t0 = time_in_s();
    // without BOS, windows overlap by one token: the last of one is the context of the next
    for (int start = 0; start + !lead < n_text && result == 0; start += per_window - !lead) {
        int len = n_text - start < per_window ? n_text - start : per_window;
        if (lead) window[0] = tok->bos_id;
        memcpy(window + lead, text_tokens + start, (size_t)len * sizeof(int));
        result = score_window(t, window, len + lead, &total, csv);
        n_windows++;
    }
    if (csv) {
        int write_failed = ferror(csv); // a row that could not be written, before the last flush
        if ((fclose(csv) != 0 || write_failed) && result == 0) result = fail("cannot write %s", csv_path);
    }
    if (result == 0) {
        double seconds = time_in_s() - t0, nll = total / n_predicted;
        printf("tokens: %d\n", n_predicted);
        printf("windows: %d\n", n_windows);
        printf("nll: %.6f\n", nll);
        printf("perplexity: %.6f\n", exp(nll));
        fprintf(stderr, "timing: scored %d tokens %.1f tok/s\n", n_predicted, rate(n_predicted, seconds));
    }
    free(window);
    free(tokens);
    return result;
}

// ----------------------------------------------------------------------------
// Inspect: which rotary frequencies each head uses, and where it attends.
//
// For each layer, head and rotary pair i (i = 0 the highest frequency) we report
// the mean over positions of |q chunk i| and |k chunk i|, the 2-norms of the
// pair's two dims. The rotation does not change them, so they say how much of the
// head's signal lives at frequency omega_i. Heads that attend by position (to the
// current or the previous token) need high frequencies; the paper finds semantic
// content on the lowest ones. The attention summary is the mean weight each head
// gives, over positions 1..n-1, to BOS, to the current and to the previous token.

// Inspect's accumulators (-m inspect): the query/key chunk norms and the attention
// summary of each position. The rotation preserves |chunk i|, so measuring before
// or after it gives the same number.
// The stats of layer l, head h start at ((l * n_heads) + h) * stride: the widest
// layer's pairs (Gemma 4's layers differ), of which layer l uses head_size / 2.
static size_t inspect_stride(const Config *c) { return (size_t)c->max_head_size / 2; }

// A layer that shares another's cache (Gemma 4) computes no keys: its keys are the
// source layer's, cached (and rotated: the norms are the same) at this position.
static void inspect_record_chunks(InspectStats *st, const Transformer *t, int layer, const float *q, const float *k,
                                  int pos) {
    const Config *c = &t->config;
    const LayerSpec *ls = &c->layer[layer];
    int head_size = ls->head_size, pairs = head_size / 2, group = c->n_heads / ls->n_kv_heads;
    for (int h = 0; h < c->n_heads; h++) {
        const float *qh = q + h * head_size, *kh = k + (h / group) * head_size;
        if (ls->kv_source != layer) kh = t->state.key_cache + kv_cache_offset(c, layer, h / group, pos);
        double *qn = st->q_norm + ((size_t)layer * c->n_heads + h) * inspect_stride(c);
        double *kn = st->k_norm + ((size_t)layer * c->n_heads + h) * inspect_stride(c);
        for (int i = 0; i < pairs; i++) {
            qn[i] += sqrt((double)qh[2 * i] * qh[2 * i] + (double)qh[2 * i + 1] * qh[2 * i + 1]);
            kn[i] += sqrt((double)kh[2 * i] * kh[2 * i] + (double)kh[2 * i + 1] * kh[2 * i + 1]);
        }
    }
}

// bos, current, previous: the weights of positions 0, pos and pos - 1
static void inspect_record_attention(InspectStats *st, const Config *c, int layer, int h, float bos, float current,
                                     float previous, int pos) {
    if (pos < 1) return; // position 0 can only attend to itself
    double *a = st->attn + ((size_t)layer * c->n_heads + h) * 3;
    a[0] += bos;
    a[1] += current;
    a[2] += previous;
}

// Counts the B positions of a block starting at pos0 (once per block, in layer 0).
static void inspect_count_positions(InspectStats *st, int B, int pos0) {
    st->positions += B;
    for (int b = 0; b < B; b++) st->attn_positions += pos0 + b >= 1;
}

// One shaded cell per value, scaled to the row's maximum (Unicode block characters).
static void print_shade(double value, double max_value) {
    static const char *shades[] = {" ", "\u2591", "\u2592", "\u2593", "\u2588"};
    int level = max_value > 0 ? (int)(value / max_value * 4.0 + 0.5) : 0;
    if (level < 0) level = 0;
    if (level > 4) level = 4;
    fputs(shades[level], stdout);
}

// The RoPE setting the report shows for layer l: its own (the first on a NoPE layer,
// as the report has always marked its pairs).
static int inspect_setting(const Config *c, int l) {
    return c->layer[l].rope == LAYER_ROPE_SECOND ? LAYER_ROPE_SECOND : LAYER_ROPE_FIRST;
}

static void print_inspect_report(const Config *c, const InspectStats *st) {
    if (c->layer_table_bytes) { // the per-layer table: which layers do not rotate, which slide
        printf("layers:");
        for (int l = 0; l < c->n_layers; l++) {
            const LayerSpec *ls = &c->layer[l];
            printf(" L%d %s", l, ls->rope == LAYER_NOPE ? "NoPE" : ls->rope == LAYER_ROPE_SECOND ? "rope2" : "rope");
            if (ls->window) printf(" sliding %d", ls->window);
            else printf(" full");
            if (ls->head_size != head_size_of(c)) printf(" head %d", ls->head_size);
            if (ls->kv_source != l) printf(" keys of L%d", ls->kv_source); // Gemma 4's KV sharing
            printf(l + 1 < c->n_layers ? "," : "\n");
        }
    }
    printf("frequency usage: mean |q chunk| (left) and |k chunk| (right) per rotary pair,\n");
    printf("highest frequency first, shaded to each row's maximum; '|' marks where the\n");
    printf("unrotated pairs of p-RoPE begin (%d of %d pairs rotate)\n", rope_angles_of(c, LAYER_ROPE_FIRST),
           head_size_of(c) / 2);
    for (int l = 0; l < c->n_layers; l++) {
        int pairs = c->layer[l].head_size / 2, rope_angles = rope_angles_of(c, inspect_setting(c, l));
        for (int h = 0; h < c->n_heads; h++) {
            const double *qn = st->q_norm + ((size_t)l * c->n_heads + h) * inspect_stride(c);
            const double *kn = st->k_norm + ((size_t)l * c->n_heads + h) * inspect_stride(c);
            double qmax = 0, kmax = 0;
            for (int i = 0; i < pairs; i++) {
                if (qn[i] > qmax) qmax = qn[i];
                if (kn[i] > kmax) kmax = kn[i];
            }
            printf("L%-2d H%-2d q ", l, h);
            for (int i = 0; i < pairs; i++) {
                if (i == rope_angles) putchar('|');
                print_shade(qn[i], qmax);
            }
            printf("  k ");
            for (int i = 0; i < pairs; i++) {
                if (i == rope_angles) putchar('|');
                print_shade(kn[i], kmax);
            }
            printf("\n");
        }
    }
    printf("\nattention: mean weight on BOS, current and previous token (positions 1..%ld)\n", st->attn_positions);
    printf("layer head    bos   current  previous\n");
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_heads; h++) {
            const double *a = st->attn + ((size_t)l * c->n_heads + h) * 3;
            double n = st->attn_positions > 0 ? (double)st->attn_positions : 1.0;
            printf("%5d %4d  %6.3f  %8.3f  %8.3f\n", l, h, a[0] / n, a[1] / n, a[2] / n);
        }
}

// The CSV has two kinds of rows, told apart by the first column:
//   chunk,layer,head,pair,frequency,q_norm,k_norm,rotated
//   attention,layer,head,bos,current,previous
static int write_inspect_csv(FILE *f, const char *path, const Config *c, const InspectStats *st) {
    double n = st->positions > 0 ? (double)st->positions : 1.0;
    double na = st->attn_positions > 0 ? (double)st->attn_positions : 1.0;
    fprintf(f, "kind,layer,head,pair,frequency,q_norm,k_norm,rotated,bos,current,previous\n");
    for (int l = 0; l < c->n_layers; l++) {
        int pairs = c->layer[l].head_size / 2, which = inspect_setting(c, l), rope_angles = rope_angles_of(c, which);
        for (int h = 0; h < c->n_heads; h++)
            for (int i = 0; i < pairs; i++) {
                size_t idx = ((size_t)l * c->n_heads + h) * inspect_stride(c) + i;
                fprintf(f, "chunk,%d,%d,%d,%.9g,%.9g,%.9g,%d,,,\n", l, h, i,
                        i < rope_angles ? rope_frequency(c, which, i) : 0.0f, st->q_norm[idx] / n,
                        st->k_norm[idx] / n, i < rope_angles);
            }
    }
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_heads; h++) {
            const double *a = st->attn + ((size_t)l * c->n_heads + h) * 3;
            fprintf(f, "attention,%d,%d,,,,,,%.9g,%.9g,%.9g\n", l, h, a[0] / na, a[1] / na, a[2] / na);
        }
    return fflush(f) != 0 || ferror(f) ? fail("cannot write %s: %s", path, strerror(errno)) : 0;
}

// Every statistic is a sum of finite numbers unless the forward pass met a NaN or
// an infinity: then inspect stops as generate and ppl do.
static int check_inspect_stats(const Config *c, const InspectStats *st) {
    size_t cells = (size_t)c->n_layers * c->n_heads, pairs = inspect_stride(c);
    for (size_t i = 0; i < cells * pairs; i++)
        if (!isfinite(st->q_norm[i]) || !isfinite(st->k_norm[i]))
            return fail("non-finite queries or keys in layer %zu, head %zu: the checkpoint's weights hold NaN or "
                        "infinity, or the forward pass overflowed float32", i / pairs / c->n_heads,
                        i / pairs % c->n_heads);
    for (size_t i = 0; i < cells * 3; i++)
        if (!isfinite(st->attn[i]))
            return fail("non-finite attention weights in layer %zu, head %zu: the checkpoint's weights hold NaN or "
                        "infinity, or the forward pass overflowed float32", i / 3 / c->n_heads, i / 3 % c->n_heads);
    return 0;
}

static int inspect(Transformer *t, const Tokenizer *tok, const char *prompt, const char *csv_path) {
    const Config *c = &t->config;
    int *tokens, n;
    if (encode_prompt(tok, prompt, &tokens, &n) != 0) return -1;
    if (n > c->seq_len) {
        free(tokens);
        return fail("the prompt has %d tokens, more than the context of %d", n, c->seq_len);
    }
    size_t cells = (size_t)c->n_layers * c->n_heads;
    InspectStats st = {0};
    st.q_norm = calloc(cells * inspect_stride(c), sizeof(double));
    st.k_norm = calloc(cells * inspect_stride(c), sizeof(double));
    st.attn = calloc(cells * 3, sizeof(double));
    // the CSV is opened first, so that a path that cannot be written fails before the run
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    int result = 0;
    if (csv_path && !csv) {
        result = fail("cannot write %s: %s", csv_path, strerror(errno));
    } else if (!st.q_norm || !st.k_norm || !st.attn) {
        result = fail("out of memory");
    } else {
        t->state.inspect = &st;
        float *logits = prefill(t, tokens, n, 0);
        t->state.inspect = NULL;
        result = check_inspect_stats(c, &st);
        if (result == 0) result = check_logits(logits, c->vocab_size, n - 1);
        if (result == 0) {
            printf("inspect: %d tokens\n", n);
            print_inspect_report(c, &st);
            if (csv) result = write_inspect_csv(csv, csv_path, c, &st);
        }
    }
    if (csv && fclose(csv) != 0 && result == 0) result = fail("cannot write %s: %s", csv_path, strerror(errno));
    free(st.q_norm);
    free(st.k_norm);
    free(st.attn);
    free(tokens);
    return result;
}

// ----------------------------------------------------------------------------
// Chat: a multi-turn conversation in the model's chat template.
//
// A chat template is the text a model was fine-tuned to see around each message. The
// families write it differently (chat_formats, below, spells each one out as Hugging
// Face renders its Jinja template), but all in the same shape:
//   turn 1: [BOS] [system block] user block, assistant header  <- the prompt
//           the reply, sampled until an end token
//   turn n: the token that closes the previous reply, user block, assistant header
// For Llama 2 that is
//   turn 1: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {reply}</s>
//   turn n: <s>[INST] {user} [/INST] {reply}</s>
// The token that closes a reply (</s>, <|eot_id|>, <|im_end|>, <end_of_turn>) is fed at
// the start of the next turn, so no forward pass is spent on it if none follows.
// Special tokens are written in the formats by their text and looked up with
// special_token(); the text between them is encoded with encode() without BOS, as
// Hugging Face's tokenizers split the special tokens out first and then encode the
// text between them. The user's and the system's text never produce a special token:
// a typed "<|eot_id|>" stays text.
//
// The KV cache carries the conversation: a turn processes only its own new tokens.
// A conversation longer than the context drops its oldest whole turns, keeping the
// system prompt, until the next turn and room for a reply fit (shift_context):
// --shift recompute runs the kept transcript through the model again, exactly as a
// fresh session over it would; --shift rotate moves the kept keys and values down
// and re-rotates the keys (kv_cache_shift), recomputing nothing.

// One family's template. In the formats, %B is the model's BOS (nothing when it has
// none), %E its first end token (eos_ids[0]), %S the system prompt, %U the user's
// text, %D today's date ("24 Nov 2026") and %T the empty thought channel Gemma 4
// 26B/31B's generation prompt writes with thinking off (empty_thought; nothing with
// --think, or in the history); the texts in `specials` are special tokens.
// Everything else is text.
#define MAX_FORMAT_SPECIALS 5
typedef struct {
    const char *name;           // as --template takes it
    const char *first;          // the first turn, with a system prompt
    const char *first_plain;    // the first turn without one; NULL: `first` with default_system or ""
    const char *next;           // a later turn, from the token that closes the previous reply
    const char *default_system; // what the template writes when no system prompt is given, or NULL
    const char *specials[MAX_FORMAT_SPECIALS]; // the special tokens the formats write, by their text
    int trim;                   // TRIM_USER, TRIM_SYSTEM: Jinja's |trim on the message
    const char *think_first;    // --think: the first turn (thinking on), or NULL: no thinking switch
    const char *empty_thought;  // what %T writes with thinking off
    int thoughts;               // 1: replies hold <|channel>thought<channel|>, dropped from the history
} ChatFormat;

enum { TRIM_USER = 1, TRIM_SYSTEM = 2 };

// Indexed by ChatTemplate, the number the tokenizer stores. Each is the model's own
// template rendered for [system, user] and [system, user, assistant, user] with
// add_generation_prompt (tests/test_chat_templates.py checks them against Jinja).
static const ChatFormat chat_formats[] = {
    [TEMPLATE_NONE] = {"none", NULL, NULL, NULL, NULL, {NULL}, 0, NULL, NULL, 0},
    // Llama 2 chat, as run has always written it (Hugging Face's template also strips
    // each message, and writes a space between a reply and its </s>)
    [TEMPLATE_LLAMA2] = {"llama2", "%B[INST] <<SYS>>\n%S\n<</SYS>>\n\n%U [/INST]", "%B[INST] %U [/INST]",
                         "%E%B[INST] %U [/INST]", NULL, {NULL}, 0, NULL, NULL, 0},
    // Llama 3.2 Instruct: a system header always, with the knowledge cutoff and the date
    [TEMPLATE_LLAMA3] = {"llama3",
                         "%B<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                         "Today Date: %D\n\n%S<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n%U<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n",
                         NULL,
                         "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n%U<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n",
                         NULL, {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}, TRIM_USER | TRIM_SYSTEM,
                         NULL, NULL, 0},
    // ChatML: Qwen3, SmolLM3 and others without a default system prompt
    [TEMPLATE_CHATML] = {"chatml",
                         "<|im_start|>system\n%S<|im_end|>\n<|im_start|>user\n%U<|im_end|>\n<|im_start|>assistant\n",
                         "<|im_start|>user\n%U<|im_end|>\n<|im_start|>assistant\n",
                         "<|im_end|>\n<|im_start|>user\n%U<|im_end|>\n<|im_start|>assistant\n", NULL,
                         {"<|im_start|>", "<|im_end|>"}, 0, NULL, NULL, 0},
    // Gemma: no system role; the system prompt opens the first user turn
    [TEMPLATE_GEMMA] = {"gemma", "%B<start_of_turn>user\n%S\n\n%U<end_of_turn>\n<start_of_turn>model\n",
                        "%B<start_of_turn>user\n%U<end_of_turn>\n<start_of_turn>model\n",
                        "<end_of_turn>\n<start_of_turn>user\n%U<end_of_turn>\n<start_of_turn>model\n", NULL,
                        {"<start_of_turn>", "<end_of_turn>"}, TRIM_USER, NULL, NULL, 0},
    // Zephyr (TinyLlama-Chat): <|user|> and friends are plain text; every message ends
    // with EOS. The template writes no BOS; the tokenizer adds it, as the model card's
    // pipeline does.
    [TEMPLATE_ZEPHYR] = {"zephyr", "%B<|system|>\n%S%E\n<|user|>\n%U%E\n<|assistant|>\n",
                         "%B<|user|>\n%U%E\n<|assistant|>\n", "%E\n<|user|>\n%U%E\n<|assistant|>\n", NULL,
                         {NULL}, 0, NULL, NULL, 0},
    // Mistral Instruct: [INST] without <<SYS>>; the system prompt opens the first user turn
    [TEMPLATE_MISTRAL] = {"mistral", "%B [INST] %S\n\n%U [/INST]", "%B [INST] %U [/INST]", "%E [INST] %U [/INST]",
                          NULL, {NULL}, 0, NULL, NULL, 0},
    // ChatML with a default system prompt: Qwen2.5, SmolLM2
    [TEMPLATE_QWEN25] = {"qwen2.5",
                         "<|im_start|>system\n%S<|im_end|>\n<|im_start|>user\n%U<|im_end|>\n<|im_start|>assistant\n",
                         NULL, "<|im_end|>\n<|im_start|>user\n%U<|im_end|>\n<|im_start|>assistant\n",
                         "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                         {"<|im_start|>", "<|im_end|>"}, 0, NULL, NULL, 0},
    [TEMPLATE_SMOLLM2] = {"smollm2",
                          "<|im_start|>system\n%S<|im_end|>\n<|im_start|>user\n%U<|im_end|>\n<|im_start|>assistant\n",
                          NULL, "<|im_end|>\n<|im_start|>user\n%U<|im_end|>\n<|im_start|>assistant\n",
                          "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                          {"<|im_start|>", "<|im_end|>"}, 0, NULL, NULL, 0},
    // Gemma 4 E2B/E4B, thinking off: a system turn of its own (unlike Gemma 1-3); the
    // model's turns are "model"; <bos> is the template's own first token. (26B/31B's
    // template also writes an empty thought channel after "model\n": not this one.)
    // With --think, <|think|>\n opens the system turn, written then even without a
    // system prompt. A reply may hold a thought, <|channel>thought\n...<channel|>, before
    // its answer: the template drops it from the history (render_history).
    [TEMPLATE_GEMMA4] = {"gemma4", "%B<|turn>system\n%S<turn|>\n<|turn>user\n%U<turn|>\n<|turn>model\n",
                         "%B<|turn>user\n%U<turn|>\n<|turn>model\n", "<turn|>\n<|turn>user\n%U<turn|>\n<|turn>model\n",
                         NULL, {"<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>"}, TRIM_USER | TRIM_SYSTEM,
                         "%B<|turn>system\n<|think|>\n%S<turn|>\n<|turn>user\n%U<turn|>\n<|turn>model\n", NULL, 1},
    // Gemma 4 26B/31B: the same, but with thinking off the generation prompt ends with an
    // empty thought channel (%T), which the history leaves out
    [TEMPLATE_GEMMA4_LARGE] = {"gemma4-large",
                               "%B<|turn>system\n%S<turn|>\n<|turn>user\n%U<turn|>\n<|turn>model\n%T",
                               "%B<|turn>user\n%U<turn|>\n<|turn>model\n%T",
                               "<turn|>\n<|turn>user\n%U<turn|>\n<|turn>model\n%T", NULL,
                               {"<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>"}, TRIM_USER | TRIM_SYSTEM,
                               "%B<|turn>system\n<|think|>\n%S<turn|>\n<|turn>user\n%U<turn|>\n<|turn>model\n%T",
                               "<|channel>thought\n<channel|>", 1},
};
#define N_CHAT_FORMATS ((int)(sizeof(chat_formats) / sizeof(chat_formats[0])))
_Static_assert(N_CHAT_FORMATS == N_CHAT_TEMPLATES, "every template the loader accepts has its format");

typedef enum { SHIFT_RECOMPUTE, SHIFT_ROTATE } ShiftMode;

typedef struct {
    const char *system_prompt; // -y, or asked for when interactive
    const char *first_user;    // -p: the first user turn
    int reply_limit;           // -n: at most this many tokens per reply; 0 = no limit
    int interactive;           // stdin is a terminal: show prompts
    int no_cache;              // --no-cache: recompute the whole transcript each turn
    int verbose;               // -v: print the token ids of each turn on stderr
    int think;                 // --think: thinking on (the template's enable_thinking)
    int past;                  // rendering an earlier turn of the history: %T writes nothing
    ShiftMode shift;           // --shift: how the oldest turns are dropped
    int template_id;           // --template, else the tokenizer's (a ChatTemplate)
    int template_from_flag;    // 1: template_id came from --template; 0: from the tokenizer
    const ChatFormat *format;  // chat() sets it from template_id
    char date[32];             // chat() sets it: today, for %D
} ChatOptions;

// Where one turn's tokens sit in the conversation, in three spans (Llama 2's as
// the example):
//   [start, user_start)        the template's head: the previous reply's closing
//                              token and the user header, "</s><s>[INST]"; for the
//                              first turn BOS and the system block, "<s>[INST]" or
//                              "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n"
//   [user_start, reply_start)  the user's text and the assistant header, "{user} [/INST]"
//   [reply_start, end)         the reply
// user_start is -1 when the head's tokens are not a prefix of the turn's (a merge
// across the boundary); such a turn cannot be cut there, and rotate falls back to
// recompute.
typedef struct {
    char *user; // the user's text, kept to encode the turn again when it becomes the first
    int start, user_start, reply_start, end;
} ChatTurn;

typedef struct {
    int *tokens;     // every token in the KV cache, in order (seq_len of them at most)
    int n_tokens;
    ChatTurn *turns; // the turns in the cache, oldest first
    int n_turns;
} Conversation;

// Reads one line from stdin without its line ending; NULL at end of input, and
// NULL with *failed set for a line holding a NUL byte (a C string would end there,
// cutting the line; -f refuses such text too).
static char *read_line(char **buffer, size_t *capacity, int *failed) {
    ssize_t n = getline(buffer, capacity, stdin);
    if (n < 0) return NULL;
    const char *nul = memchr(*buffer, '\0', (size_t)n);
    if (nul) {
        *failed = 1;
        fail("a line of standard input contains a NUL byte at offset %zu of the line: not text", (size_t)(nul - *buffer));
        return NULL;
    }
    while (n > 0 && ((*buffer)[n - 1] == '\n' || (*buffer)[n - 1] == '\r')) (*buffer)[--n] = '\0';
    return *buffer;
}

// Today's date for %D as Llama 3.2's template writes it (strftime "%d %b %Y", the C
// locale's month names). SOURCE_DATE_EPOCH (seconds since 1970, UTC) fixes it, for
// reproducible output.
static int chat_date(char *out, size_t size) {
    time_t now = time(NULL);
    struct tm tm;
    const char *epoch = getenv("SOURCE_DATE_EPOCH");
    if (epoch) {
        char *end;
        errno = 0;
        long long seconds = strtoll(epoch, &end, 10);
        if (end == epoch || *end != '\0' || errno == ERANGE || seconds < 0)
            return fail("SOURCE_DATE_EPOCH must be a number of seconds, got '%s'", epoch);
        now = (time_t)seconds;
        if (!gmtime_r(&now, &tm)) return fail("SOURCE_DATE_EPOCH %s is out of range", epoch);
    } else {
        localtime_r(&now, &tm);
    }
    strftime(out, size, "%d %b %Y", &tm);
    return 0;
}

// Checks that the tokenizer has the tokens a format writes (a --template that does
// not fit the model).
// from_flag: the template came from --template (else the tokenizer named it), so that
// the message blames what the user gave.
static int check_chat_format(const Tokenizer *tok, const ChatFormat *f, int from_flag) {
    char source[64];
    snprintf(source, sizeof(source), from_flag ? "--template %s" : "the tokenizer's own template (%s)", f->name);
    for (int i = 0; i < MAX_FORMAT_SPECIALS && f->specials[i]; i++)
        if (special_token(tok, f->specials[i]) < 0)
            return fail("the tokenizer has no %s token: %s does not fit this model", f->specials[i], source);
    if (strstr(f->next, "%E") && tok->n_eos < 1)
        return fail("the tokenizer has no end token: %s does not fit this model", source);
    return 0;
}

// A growing list of token ids: one turn's.
typedef struct {
    int *ids;
    int n, cap;
} TokenList;

static int push_tokens(TokenList *list, const int *ids, int n) {
    if (list->n + n > list->cap) {
        int cap = (list->n + n) * 2 + 16;
        int *grown = realloc(list->ids, (size_t)cap * sizeof(int));
        if (!grown) return fail("out of memory");
        list->ids = grown, list->cap = cap;
    }
    memcpy(list->ids + list->n, ids, (size_t)n * sizeof(int));
    list->n += n;
    return 0;
}

// Encodes text (no BOS) onto the list.
static int push_text(const Tokenizer *tok, TokenList *list, const char *text, size_t length) {
    if (length == 0) return 0;
    char *copy = strndup(text, length);
    int *ids = copy ? malloc(encode_capacity(tok, length) * sizeof(int)) : NULL, n = 0;
    int result = !ids ? fail("out of memory") : encode(tok, copy, 0, 0, ids, &n);
    if (result == 0) result = push_tokens(list, ids, n);
    free(copy);
    free(ids);
    return result;
}

// Appends text to a string being built, trimmed of surrounding whitespace if trim.
static void append_text(char *out, size_t *length, const char *text, int trim) {
    size_t n = strlen(text);
    if (trim) {
        while (n > 0 && isspace((unsigned char)text[0])) text++, n--;
        while (n > 0 && isspace((unsigned char)text[n - 1])) n--;
    }
    memcpy(out + *length, text, n);
    *length += n;
    out[*length] = '\0';
}

enum { NOT_SPECIAL = -2 };

// The special token the format writes at p: %B (the model's BOS; -1 when it has
// none), %E (its first end token) or one of the format's specials by its text. Sets
// *skip to the characters it takes. NOT_SPECIAL when p starts none.
static int special_at(const Tokenizer *tok, const ChatFormat *f, const char *p, size_t *skip) {
    if (p[0] == '%' && (p[1] == 'B' || p[1] == 'E')) {
        *skip = 2;
        return p[1] == 'B' ? tok->bos_id : tok->eos_ids[0];
    }
    for (int i = 0; i < MAX_FORMAT_SPECIALS && f->specials[i]; i++) {
        *skip = strlen(f->specials[i]);
        if (strncmp(p, f->specials[i], *skip) == 0) return special_token(tok, f->specials[i]);
    }
    return NOT_SPECIAL;
}

// The tokens of one turn: format with its placeholders filled in. Text runs (the
// format's own text with the system's and the user's substituted) are encoded
// whole when a special token or the end comes. With head_only, stops before the
// user's text, and leaves out the spaces just before it (they belong to the user's
// first word in both SentencePiece and byte-level BPE).
static int render_turn(const Tokenizer *tok, const ChatOptions *opt, const char *format, const char *system,
                       const char *user, int head_only, TokenList *out) {
    const ChatFormat *f = opt->format;
    // room for the text: the format's, and at each % the longest thing it may stand for
    size_t longest = strlen(system) > strlen(user) ? strlen(system) : strlen(user), length = 0, skip;
    if (strlen(opt->date) > longest) longest = strlen(opt->date);
    size_t cap = strlen(format) + 1;
    for (const char *p = format; *p; p++) cap += *p == '%' ? longest : 0;
    char *text = malloc(cap);
    if (!text) return fail("out of memory");
    text[0] = '\0';
    int result = 0;
    for (const char *p = format; *p && result == 0;) {
        int special = special_at(tok, f, p, &skip);
        if (special != NOT_SPECIAL) { // the text so far, then the special token
            result = push_text(tok, out, text, length);
            length = 0, text[0] = '\0';
            if (result == 0 && special >= 0) result = push_tokens(out, &special, 1);
            p += skip;
        } else if (p[0] == '%' && p[1] == 'U') {
            if (head_only) break;
            append_text(text, &length, user, f->trim & TRIM_USER);
            p += 2;
        } else if (p[0] == '%' && p[1] == 'S') {
            append_text(text, &length, system, f->trim & TRIM_SYSTEM);
            p += 2;
        } else if (p[0] == '%' && p[1] == 'D') {
            append_text(text, &length, opt->date, 0);
            p += 2;
        } else if (p[0] == '%' && p[1] == 'T') { // the text so far, then the empty thought
            result = push_text(tok, out, text, length);
            length = 0, text[0] = '\0';
            if (result == 0 && !opt->think && !opt->past && f->empty_thought)
                result = render_turn(tok, opt, f->empty_thought, "", "", 0, out);
            p += 2;
        } else {
            text[length++] = *p++, text[length] = '\0';
        }
    }
    if (head_only)
        while (length > 0 && text[length - 1] == ' ') text[--length] = '\0';
    if (result == 0) result = push_text(tok, out, text, length);
    free(text);
    return result;
}

// Encodes a user turn: the first turn in the cache carries the system prompt (or the
// template's default), a later one starts with the token that closes the previous
// reply. Sets *n and *user_offset (where the user's text begins, or -1; see
// ChatTurn). Returns a new array, NULL on error (the message in error_message).
static int *encode_turn(const Tokenizer *tok, const ChatOptions *opt, const char *user, int first, int *n,
                        int *user_offset) {
    const ChatFormat *f = opt->format;
    const char *system = opt->system_prompt && opt->system_prompt[0] ? opt->system_prompt : f->default_system;
    const char *format = !first                    ? f->next
                         : opt->think                ? f->think_first
                         : system || !f->first_plain ? f->first
                                                     : f->first_plain;
    TokenList turn = {0}, head = {0};
    if (render_turn(tok, opt, format, system ? system : "", user, 0, &turn) != 0 ||
        render_turn(tok, opt, format, system ? system : "", user, 1, &head) != 0) {
        free(turn.ids), free(head.ids);
        return NULL;
    }
    *n = turn.n;
    int is_prefix = head.n <= turn.n && memcmp(head.ids, turn.ids, head.n * sizeof(int)) == 0;
    *user_offset = is_prefix ? head.n : -1;
    free(head.ids);
    if (!turn.ids) fail("the chat template gives this turn no tokens"); // every format writes some
    return turn.ids;
}

// In piped mode a reply is one line; these escapes keep it one line.
static void print_reply_piece(const char *piece, int interactive) {
    if (interactive) {
        safe_print(piece);
        return;
    }
    for (const unsigned char *p = (const unsigned char *)piece; *p; p++) {
        if (*p == '\n') fputs("\\n", stdout);
        else if (*p == '\r') fputs("\\r", stdout);
        else if (*p == '\t') fputs("\\t", stdout);
        else if (*p == '\\') fputs("\\\\", stdout);
        else if (isprint(*p) || *p >= 0x80) putchar(*p);
    }
}

static void print_turn_ids(const char *kind, int turn, const int *ids, int n) {
    char label[64];
    snprintf(label, sizeof(label), "chat: turn %d %s", turn, kind);
    print_token_ids(label, ids, n);
}

// How many tokens the conversation keeps after dropping its d oldest turns
// (0 < d < n_turns), or -1 when rotate cannot cut there. Recompute keeps turn d
// encoded again as the first turn (it now carries the system prompt) and all that
// follows its prompt; rotate keeps the first turn's head (the system block) and
// everything from turn d's user text on.
static int kept_length(const Conversation *conv, const Tokenizer *tok, const ChatOptions *opt, ShiftMode mode,
                       int d) {
    const ChatTurn *turn = &conv->turns[d];
    ChatOptions past = *opt; // turn d is history now: no empty thought after its header
    past.past = 1;
    opt = &past;
    if (mode == SHIFT_ROTATE) {
        int keep = conv->turns[0].user_start;
        return keep < 0 || turn->user_start < 0 ? -1 : keep + conv->n_tokens - turn->user_start;
    }
    int n_first, user_offset;
    int *first = encode_turn(tok, opt, turn->user, 1, &n_first, &user_offset);
    if (!first) return -1;
    free(first);
    return n_first + conv->n_tokens - turn->reply_start;
}

// Drops the d oldest turns and frees their text; the others' spans move down by delta.
static void forget_turns(Conversation *conv, int d, int delta) {
    for (int i = 0; i < d; i++) free(conv->turns[i].user);
    memmove(conv->turns, conv->turns + d, (conv->n_turns - d) * sizeof(ChatTurn));
    conv->n_turns -= d;
    for (int i = 0; i < conv->n_turns; i++) {
        ChatTurn *turn = &conv->turns[i];
        turn->start = i == 0 ? 0 : turn->start - delta;
        if (turn->user_start >= 0 && i > 0) turn->user_start -= delta;
        turn->reply_start -= delta;
        turn->end -= delta;
    }
}

// --shift recompute: encode turn d again as the first turn (with the system
// prompt), keep its reply and all later tokens, and run them through the model
// from position 0 (unless --no-cache, whose next prefill does that anyway).
static int shift_by_recompute(Transformer *t, const Tokenizer *tok, const ChatOptions *opt, Conversation *conv,
                              int d) {
    ChatTurn *turn = &conv->turns[d];
    ChatOptions past = *opt; // turn d is history now: no empty thought after its header
    past.past = 1;
    int n_first, user_offset;
    int *first = encode_turn(tok, &past, turn->user, 1, &n_first, &user_offset);
    if (!first) return -1;
    int n_rest = conv->n_tokens - turn->reply_start, delta = turn->reply_start - n_first;
    // the kept tokens: [first prompt][turn d's reply and all after it]
    memmove(conv->tokens + n_first, conv->tokens + turn->reply_start, n_rest * sizeof(int));
    memcpy(conv->tokens, first, n_first * sizeof(int));
    free(first);
    conv->n_tokens = n_first + n_rest;
    turn->user_start = user_offset;
    turn->reply_start = n_first + delta; // forget_turns moves it down by delta
    forget_turns(conv, d, delta);
    if (!opt->no_cache) prefill(t, conv->tokens, conv->n_tokens, 0);
    return 0;
}

// --shift rotate: keep the first turn's head (the system block, positions
// 0..keep-1) and move everything from turn d's user text on down to position keep.
static int shift_by_rotation(Transformer *t, Conversation *conv, int d) {
    int keep = conv->turns[0].user_start, from = conv->turns[d].user_start, n = conv->n_tokens - from;
    if (kv_cache_shift(t, keep, from, n) != 0) return -1;
    memmove(conv->tokens + keep, conv->tokens + from, n * sizeof(int));
    conv->n_tokens = keep + n;
    conv->turns[d].user_start = keep;
    forget_turns(conv, d, from - keep);
    return 0;
}

// Makes room for a turn of n_turn tokens and a reply of `room` tokens by dropping
// the fewest oldest turns that do it (or all of them). Returns how many were
// dropped, or -1 on error. With all dropped, the conversation is empty and the
// turn must be encoded again as the first.
static int shift_context(Transformer *t, const Tokenizer *tok, const ChatOptions *opt, Conversation *conv,
                         int n_turn, int room) {
    int seq_len = t->config.seq_len, d, rotate = opt->shift == SHIFT_ROTATE;
    for (;;) {
        for (d = 1; d < conv->n_turns; d++) {
            int kept = kept_length(conv, tok, opt, rotate ? SHIFT_ROTATE : SHIFT_RECOMPUTE, d);
            if (kept < 0 && rotate) { // the template could not be cut at a token boundary
                fprintf(stderr, "run: cannot cut the cached turns at a token boundary; recomputing instead\n");
                rotate = 0;
                kept = kept_length(conv, tok, opt, SHIFT_RECOMPUTE, d);
            }
            if (kept < 0) return -1;
            if (kept + n_turn + room <= seq_len) break;
        }
        if (d == conv->n_turns) { // drop them all
            forget_turns(conv, d, conv->n_tokens);
            conv->n_tokens = 0;
            return d;
        }
        int keep = conv->turns[0].user_start, from = conv->turns[d].user_start;
        if (!rotate || kv_cache_can_shift(&t->config, keep, from, conv->n_tokens - from)) break;
        fprintf(stderr, "run: a sliding layer's cache no longer holds the kept system block; recomputing instead\n");
        rotate = 0; // and choose the turns to drop again, by the recomputed lengths
    }
    int result = rotate ? shift_by_rotation(t, conv, d) : shift_by_recompute(t, tok, opt, conv, d);
    return result == 0 ? d : -1;
}

// Samples and prints a reply until an end token (ends_generation), the reply limit
// or the end of the context, appending its tokens to the conversation (each is run
// through the model as it is sampled, so the cache holds the whole reply). The end
// token itself is not kept: the template's closing token starts the next turn. A
// notice goes to stderr only after the reply's line is ended.
static int stream_reply(Transformer *t, const Tokenizer *tok, Sampler *sampler, const ChatOptions *opt,
                        float *logits, Conversation *conv) {
    int seq_len = t->config.seq_len, reply_start = conv->n_tokens, prev = tok->bos_id, result = 0, full = 0;
    // Gemma 4: a thought, <|channel>...<channel|>, streams to stderr, the answer to stdout
    int open = opt->format->thoughts ? special_token(tok, "<|channel>") : -1;
    int close = opt->format->thoughts ? special_token(tok, "<channel|>") : -1, thought = 0;
    if (opt->interactive) printf("Assistant: ");
    while (1) {
        int pos = conv->n_tokens;
        if (opt->reply_limit > 0 && pos - reply_start >= opt->reply_limit) break;
        if (pos >= seq_len) {
            full = 1;
            break;
        }
        if (check_logits(logits, t->config.vocab_size, pos - 1) != 0) {
            result = -1;
            break;
        }
        int next = sample(sampler, logits);
        if (ends_generation(tok, next)) break;
        if (next == open && open >= 0) {
            thought = 1;
            fputs("thought: ", stderr);
        } else if (next == close && close >= 0) {
            if (thought) fputc('\n', stderr);
            thought = 0;
        } else if (thought) {
            fputs(decode(tok, prev, next), stderr);
        } else {
            print_reply_piece(decode(tok, prev, next), opt->interactive);
        }
        fflush(stdout);
        conv->tokens[pos] = next;
        logits = forward(t, next, pos);
        conv->n_tokens++;
        prev = next;
    }
    printf("\n");
    fflush(stdout);
    if (thought) fputc('\n', stderr); // a thought the reply ended in
    if (full) fprintf(stderr, "run: the context of %d tokens is full; the reply is cut here\n", seq_len);
    return result;
}

// Gemma 4: the template renders an earlier reply as its answer alone: everything from
// <|channel> to <channel|> removed (strip_thinking), the rest trimmed, encoded again
// as text, and with no empty thought channel after the model header. Rewrites the
// turn's end of the conversation to that and runs the model over it from the first
// token that differs (the cache past the new end is overwritten by the next turn).
// The answer's other special tokens stay tokens, as the tokenizer splits them out of
// the rendered text.
static int render_history(Transformer *t, const Tokenizer *tok, const ChatOptions *opt, Conversation *conv,
                          ChatTurn *turn) {
    int open = special_token(tok, "<|channel>"), close = special_token(tok, "<channel|>");
    int from = turn->reply_start; // the reply; less the empty thought: the model header's end
    TokenList empty = {0}, answer = {0};
    if (!opt->think && opt->format->empty_thought &&
        render_turn(tok, opt, opt->format->empty_thought, "", "", 0, &empty) != 0)
        return -1;
    from -= empty.n;
    free(empty.ids);
    // the answer: the reply's pieces outside <|channel>...<channel|> as text, and its
    // other special tokens (which the tokenizer would split out of the rendered text)
    // as marks: their ids and where in the text they stand
    int n_reply = turn->end - turn->reply_start, n_marks = 0;
    size_t cap = 1, length = 0;
    for (int i = turn->reply_start; i < turn->end; i++) cap += strlen(decode(tok, -1, conv->tokens[i]));
    char *text = malloc(cap);
    int *marks = malloc((size_t)(n_reply + 1) * sizeof(int));
    size_t *at = malloc((size_t)(n_reply + 1) * sizeof(size_t));
    if (!text || !marks || !at) {
        free(text), free(marks), free(at);
        return fail("out of memory");
    }
    text[0] = '\0';
    for (int i = turn->reply_start, inside = 0; i < turn->end; i++) {
        int id = conv->tokens[i], type = tok->vocab_type[id];
        if (id == open) inside = 1;
        else if (id == close) inside = 0;
        else if (inside) continue;
        else if (type == PIECE_CONTROL || type == PIECE_UNUSED) marks[n_marks] = id, at[n_marks++] = length;
        else append_text(text, &length, decode(tok, -1, id), 0);
    }
    // |trim: the whitespace before the first mark and after the last one
    size_t begin = 0, end = length;
    while (begin < (n_marks ? at[0] : length) && isspace((unsigned char)text[begin])) begin++;
    while (end > (n_marks ? at[n_marks - 1] : begin) && isspace((unsigned char)text[end - 1])) end--;
    int result = 0;
    for (int k = 0; k <= n_marks && result == 0; k++) { // the text up to mark k, then the mark
        size_t upto = k < n_marks ? at[k] : end;
        result = push_text(tok, &answer, text + begin, upto - begin);
        if (result == 0 && k < n_marks) result = push_tokens(&answer, &marks[k], 1);
        begin = upto;
    }
    free(text), free(marks), free(at);
    if (result == 0 && from + answer.n > t->config.seq_len) { // encoded again, a reply that filled the context
        fprintf(stderr, "run: the reply, encoded again as the history renders it, is cut to the context\n");
        answer.n = t->config.seq_len - from;
    }
    if (result == 0) {
        int same = 0; // tokens the cache already holds
        while (same < answer.n && from + same < turn->end && conv->tokens[from + same] == answer.ids[same]) same++;
        if (answer.n > 0) memcpy(conv->tokens + from, answer.ids, (size_t)answer.n * sizeof(int));
        conv->n_tokens = turn->end = from + answer.n;
        turn->reply_start = from;
        if (!opt->no_cache && answer.n > same) prefill(t, conv->tokens + from + same, answer.n - same, from + same);
    }
    free(answer.ids);
    return result;
}

// Reads the next user turn: -p first, then one line of stdin each, skipping empty
// lines. NULL at end of input (on a terminal, Ctrl-D: the line is ended for the
// shell), or with *failed set on a line read_line refuses.
static const char *next_user_turn(const ChatOptions *opt, int turn, char **line, size_t *line_cap, int *failed) {
    if (turn == 0 && opt->first_user && opt->first_user[0] != '\0') {
        if (opt->interactive) printf("User: %s\n", opt->first_user);
        return opt->first_user;
    }
    while (1) {
        if (opt->interactive) {
            printf("User: ");
            fflush(stdout);
        }
        const char *user = read_line(line, line_cap, failed);
        if (opt->interactive && feof(stdin)) printf("\n"); // Ctrl-D, perhaps after some text: end the line
        if (!user || user[0] != '\0') return user;
    }
}

static void free_conversation(Conversation *conv) {
    for (int i = 0; i < conv->n_turns; i++) free(conv->turns[i].user);
    free(conv->turns);
    free(conv->tokens);
}

static int chat(Transformer *t, const Tokenizer *tok, Sampler *sampler, ChatOptions opt) {
    int seq_len = t->config.seq_len;
    // room kept for a reply when the context is shifted: the reply limit, or half the context
    int room = opt.reply_limit > 0 ? opt.reply_limit : seq_len / 2;
    Conversation conv = {malloc((size_t)seq_len * sizeof(int)), 0, malloc((size_t)seq_len * sizeof(ChatTurn)), 0};
    char *line = NULL, *system_line = NULL;
    size_t line_cap = 0, system_cap = 0;
    int turn = 0, result = 0, failed = 0, ended = 0;
    if (!conv.tokens || !conv.turns) {
        free_conversation(&conv);
        return fail("out of memory");
    }
    opt.format = &chat_formats[opt.template_id];
    if (opt.think && !opt.format->think_first) {
        free_conversation(&conv);
        return fail("--think: the chat template %s has no thinking switch (gemma4 and gemma4-large have)",
                    opt.format->name);
    }
    int dated = strstr(opt.format->first, "%D") != NULL;
    if (check_chat_format(tok, opt.format, opt.template_from_flag) != 0 ||
        (dated && chat_date(opt.date, sizeof(opt.date)) != 0)) {
        free_conversation(&conv);
        return -1;
    }

    if (opt.interactive) printf("Chat (template %s); Ctrl-D on an empty line leaves.\n", opt.format->name);
    if (!opt.system_prompt && opt.interactive) {
        printf("System prompt (optional): ");
        fflush(stdout);
        opt.system_prompt = read_line(&system_line, &system_cap, &failed);
        if (!opt.system_prompt && !failed) printf("\n"), ended = 1; // Ctrl-D already
    }
    while (!failed && !ended) {
        // 1. the user's turn
        const char *user = next_user_turn(&opt, turn, &line, &line_cap, &failed);
        if (!user) break; // end of input: the session ends cleanly (unless the line was refused)

        // 2. refuse a turn that leaves no room for a reply token even in an empty
        // context (where it would carry the system prompt)
        int n_turn, user_offset;
        int *turn_tokens = encode_turn(tok, &opt, user, 1, &n_turn, &user_offset);
        if (!turn_tokens) {
            result = -1;
            break;
        }
        if (n_turn >= seq_len) {
            fail("turn %d needs %d tokens but only %d of the context's %d remain", turn + 1, n_turn, seq_len - 1,
                 seq_len);
            free(turn_tokens);
            if (opt.interactive) { // the user may write something shorter, or end with Ctrl-D
                fprintf(stderr, "run: %s\n", error_message);
                continue;
            }
            result = -1;
            break;
        }

        // 3. its tokens after the conversation so far; when it and room for a reply
        // do not fit, drop the oldest turns (if all go, it is the first turn again)
        if (conv.n_turns > 0) {
            free(turn_tokens);
            turn_tokens = encode_turn(tok, &opt, user, 0, &n_turn, &user_offset);
            if (turn_tokens && conv.n_tokens + n_turn + room > seq_len) {
                int dropped = shift_context(t, tok, &opt, &conv, n_turn, room);
                if (dropped < 0) {
                    free(turn_tokens);
                    result = -1;
                    break;
                }
                fprintf(stderr, "run: the context is full: dropped the oldest %d turn%s, kept %d tokens (--shift %s)\n",
                        dropped, dropped == 1 ? "" : "s", conv.n_tokens,
                        opt.shift == SHIFT_ROTATE ? "rotate" : "recompute");
                if (conv.n_turns == 0) {
                    free(turn_tokens);
                    turn_tokens = encode_turn(tok, &opt, user, 1, &n_turn, &user_offset);
                }
            }
            if (!turn_tokens) {
                result = -1;
                break;
            }
        }
        ChatTurn *record = &conv.turns[conv.n_turns];
        record->user = strdup(user);
        if (!record->user) {
            free(turn_tokens);
            result = fail("out of memory");
            break;
        }
        conv.n_turns++;
        record->start = conv.n_tokens;
        record->user_start = user_offset < 0 ? -1 : conv.n_tokens + user_offset;
        record->reply_start = conv.n_tokens + n_turn;
        memcpy(conv.tokens + conv.n_tokens, turn_tokens, (size_t)n_turn * sizeof(int));
        if (opt.verbose) print_turn_ids("prompt", turn + 1, turn_tokens, n_turn);
        free(turn_tokens);

        // 4. prefill: the new tokens only, or with --no-cache the whole transcript
        float *logits;
        if (opt.no_cache)
            logits = prefill(t, conv.tokens, conv.n_tokens + n_turn, 0);
        else
            logits = prefill(t, conv.tokens + conv.n_tokens, n_turn, conv.n_tokens);
        conv.n_tokens += n_turn;

        // 5. the reply
        if (stream_reply(t, tok, sampler, &opt, logits, &conv) != 0) {
            result = -1;
            break;
        }
        record->end = conv.n_tokens;
        if (opt.verbose) print_turn_ids("reply", turn + 1, conv.tokens + record->reply_start, record->end - record->reply_start);
        if (opt.format->thoughts) { // the turn as the template renders it in the history
            if (render_history(t, tok, &opt, &conv, record) != 0) {
                result = -1;
                break;
            }
            if (opt.verbose) print_turn_ids("history", turn + 1, conv.tokens + record->start, record->end - record->start);
        }
        turn++;
    }
    free(line);
    free(system_line);
    free_conversation(&conv);
    return failed ? -1 : result;
}

// ----------------------------------------------------------------------------
// Making it fast
//
// Everything above defines what the program computes; everything here computes the
// same thing faster, bit for bit. Each function refines a plain one above and is
// called from it, only when use_fast_kernels is set: RUN_PLAIN=1 runs none of this
// section. None calls a step of the plain path back; they build only on the pieces
// both paths compute with: the dot products (dot, dot_weights: the lanes and
// roundings every kernel keeps), mul_add, reduce_lanes, widen, swiglu_unit, and the
// addressing of the matrices and the cache (matrix_at, kv_cache_offset, slot_runs).
//   Decoding a token streams every weight from memory once, so it is bound by memory
// bandwidth: its kernels keep many reads in flight, in patterns the hardware
// prefetchers follow. A prompt goes through in blocks of tokens, and each weight
// loaded feeds every token of the block, so prefill is bound by arithmetic: its
// kernel keeps the multiply-add units busy. docs/performance.md has the measurements
// behind each choice. Weights stored in 16 bits are widened in the registers as they
// are loaded (lanes_load_weights), and the arithmetic after the load is the float32
// kernels': the same bits from half the bytes.
//   1. dot() in SIMD registers
//   2. decode: rows in groups of four, in the reading order that decode's first
//      tokens timed fastest, the rows split across threads (with AVX-512, the rows of
//      every block type two to a register)
//   3. prefill: tiles of rows x tokens
//   4. attention: a block's scores as a matrix product, the heads across threads;
//      SwiGLU across threads; greedy decoding's argmax
//   5. memory: the KV cache in huge pages, pages touched before the clock starts,
//      threads pinned to cores; the trial of the decode reading orders

// 1. dot() in SIMD registers --------------------------------------------------
//
// Lanes: dot()'s eight partial sums as one value, in an AVX register or a pair of
// NEON registers, with the four operations the kernels need. lanes_fma is one fused
// multiply-add per lane, as mul_add is; lanes_sum adds the lanes in reduce_lanes()'s
// order. The kernels below are written once against them.

#if defined(USE_AVX2)
typedef __m256 Lanes;
static inline Lanes lanes_zero(void) { return _mm256_setzero_ps(); }
static inline Lanes lanes_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void lanes_store(float *p, Lanes v) { _mm256_storeu_ps(p, v); }
static inline Lanes lanes_fma(Lanes a, Lanes b, Lanes acc) { return _mm256_fmadd_ps(a, b, acc); } // acc + a * b
// each step adds a copy with neighbours swapped (a + b == b + a exactly); the sum ends in lane 0
static inline float lanes_sum(Lanes v) {
    v = _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));      // (l0+l1), (l2+l3), ...
    v = _mm256_add_ps(v, _mm256_permute_ps(v, 0x4E));      // (l0+l1)+(l2+l3), (l4+l5)+(l6+l7)
    v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 1)); // the two halves of four added
    return _mm256_cvtss_f32(v);
}
#ifndef USE_AVX512 // the AVX2 prefill tile's (AVX-512 has a tile of its own)
// lanes_sum of a, b, c, d into out[0..3]. Each step adds neighbouring lanes of two
// registers, shuffled side by side (shuffle_ps takes lanes 0 and 2, or 1 and 3, of
// each four from both, in each 128-bit half), so each sum keeps reduce_lanes' order,
// in seven instructions where four lanes_sum take twenty-four.
static inline void lanes_sum4(float out[4], Lanes a, Lanes b, Lanes c, Lanes d) {
    Lanes ab = _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD)); // a01 a23 b01 b23 | a45 ..
    Lanes cd = _mm256_add_ps(_mm256_shuffle_ps(c, d, 0x88), _mm256_shuffle_ps(c, d, 0xDD)); // c01 c23 d01 d23 | c45 ..
    Lanes v = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x88), _mm256_shuffle_ps(ab, cd, 0xDD)); // a0123 .. d0123 | a4567 ..
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}
// v, held in a register: the empty asm says v may have changed, so the compiler
// cannot load it again from memory at each use (see the prefill tile).
static inline Lanes lanes_keep(Lanes v) {
    __asm__("" : "+x"(v));
    return v;
}
#endif
#elif defined(USE_NEON)
typedef struct {
    float32x4_t lo, hi; // lanes 0-3, 4-7
} Lanes;
static inline Lanes lanes_zero(void) { return (Lanes){vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
static inline Lanes lanes_load(const float *p) { return (Lanes){vld1q_f32(p), vld1q_f32(p + 4)}; }
static inline void lanes_store(float *p, Lanes v) {
    vst1q_f32(p, v.lo);
    vst1q_f32(p + 4, v.hi);
}
static inline Lanes lanes_fma(Lanes a, Lanes b, Lanes acc) { // acc + a * b
    return (Lanes){vfmaq_f32(acc.lo, a.lo, b.lo), vfmaq_f32(acc.hi, a.hi, b.hi)};
}
static inline float lanes_sum(Lanes v) {
    float32x4_t pairs = vpaddq_f32(v.lo, v.hi);  // (l0+l1), (l2+l3), (l4+l5), (l6+l7)
    float32x4_t quads = vpaddq_f32(pairs, pairs); // (l0+l1)+(l2+l3), (l4+l5)+(l6+l7), ...
    return vgetq_lane_f32(quads, 0) + vgetq_lane_f32(quads, 1);
}
// lanes_sum of a, b, c, d into out[0..3], in seven pairwise additions
static inline void lanes_sum4(float out[4], Lanes a, Lanes b, Lanes c, Lanes d) {
    float32x4_t ab = vpaddq_f32(vpaddq_f32(a.lo, a.hi), vpaddq_f32(b.lo, b.hi)); // a0123 a4567 b0123 b4567
    float32x4_t cd = vpaddq_f32(vpaddq_f32(c.lo, c.hi), vpaddq_f32(d.lo, d.hi)); // c0123 c4567 d0123 d4567
    vst1q_f32(out, vpaddq_f32(ab, cd));                                          // a, b, c, d
}
// ARM's multiply-adds take no memory operand, so there is no load to fold
static inline Lanes lanes_keep(Lanes v) { return v; }
#endif

// Eight 16-bit weights widened to float32 lanes in the register, each exactly as
// widen() widens it, so the kernels' arithmetic after the load is the float32
// kernels' (and the bytes read are half).
#if defined(USE_AVX2)
// bf16: zero-extended to 32 bits, then shifted into the top half
static inline Lanes lanes_load_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#if defined(__F16C__)
// f16: F16C's conversion (exact: subnormals widened, NaN made quiet)
static inline Lanes lanes_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#else
static inline Lanes lanes_load_f16(const uint16_t *p) { // an AVX2 CPU without F16C: one at a time
    float widened[DOT_LANES];
    for (int l = 0; l < DOT_LANES; l++) widened[l] = f16_to_f32(p[l]);
    return lanes_load(widened);
}
#endif
#elif defined(USE_NEON)
// bf16: vshll widens each 16-bit value to 32 bits, shifted into the top half
static inline Lanes lanes_load_bf16(const uint16_t *p) {
    uint16x8_t v = vld1q_u16(p);
    return (Lanes){vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)),
                   vreinterpretq_f32_u32(vshll_high_n_u16(v, 16))};
}
// f16: the conversion instruction (exact, as F16C's)
static inline Lanes lanes_load_f16(const uint16_t *p) {
    float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(p));
    return (Lanes){vcvt_f32_f16(vget_low_f16(v)), vcvt_high_f32_f16(v)};
}
#endif

// Q8_0: eight of a block's int8 values, sign-extended to 32 bits, converted to
// float32 (exact), each multiplied by the block's scale d, widened and copied into
// every lane (run_factors): d * q exactly, as q8_0_weight computes it.
#if defined(USE_AVX2)
static inline Lanes lanes_q8_0_values(const unsigned char *q, Lanes d) {
    __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(wide), d);
}
#elif defined(USE_NEON)
static inline Lanes lanes_q8_0_values(const unsigned char *q, Lanes d) {
    int16x8_t wide = vmovl_s8(vld1_s8((const int8_t *)q));
    return (Lanes){vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide))), d.lo),
                   vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(wide)), d.hi)};
}
#endif

// The 4-, 5- and 6-bit blocks: eight of a block's small integers q widened to 32-bit
// integer lanes (Ints), their bits assembled there, converted to float32 (exact), and
// the type's equation applied with the same operations as its plain widening above
// (q4_0_weight ...): the same bits. Ints are one AVX register or two NEON registers.
#if defined(USE_AVX2)
typedef __m256i Ints;
// Bytes h .. h+7 of the sixteen at p (h = 0 or 8), zero-extended: the sixteen are copied
// into both halves of the register (a load), and one byte shuffle within each half puts
// byte h + l at the bottom of lane l. An in-half shuffle can issue on more ports than a
// widening across the halves (vpmovzxbd), which competes with the nibble tables' permutes
// for one (the measurement: docs/performance.md, "4-, 5- and 6-bit blocks").
static inline Ints ints_of_bytes(const unsigned char *p, int h) {
    const __m256i pick = _mm256_setr_epi8(h, -1, -1, -1, h + 1, -1, -1, -1, h + 2, -1, -1, -1, h + 3, -1, -1, -1,
                                          h + 4, -1, -1, -1, h + 5, -1, -1, -1, h + 6, -1, -1, -1, h + 7, -1, -1, -1);
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)), pick);
}
static inline Ints ints_and(Ints v, int mask) { return _mm256_and_si256(v, _mm256_set1_epi32(mask)); }
__attribute__((unused)) // (the AVX2 build's Q4_0 widens without it)
static inline Ints ints_add(Ints v, int c) { return _mm256_add_epi32(v, _mm256_set1_epi32(c)); }
static inline Ints ints_shift_right(Ints v, int n) { return _mm256_srl_epi32(v, _mm_cvtsi32_si128(n)); }
static inline Lanes lanes_of_ints(Ints v) { return _mm256_cvtepi32_ps(v); }
static inline Lanes lanes_set(float f) { return _mm256_set1_ps(f); }
static inline Lanes lanes_broadcast(const float *p) { return _mm256_broadcast_ss(p); }
static inline Lanes lanes_mul(Lanes a, Lanes b) { return _mm256_mul_ps(a, b); }
static inline Lanes lanes_mul_sub(Lanes a, Lanes b, Lanes c) { return _mm256_fmsub_ps(a, b, c); } // a * b - c
// An f16 scale of a block, by the conversion instruction. Its memory form converts the
// eight f16s at p with a load and no shuffle, where the register form and the scalar
// load into a register take two uops on the port the nibble tables' permutes use: so it
// reads sixteen bytes, the scale and the fourteen after it, all inside the block for
// every type's scales but q6_k's, two bytes from its block's end (scale_ending_at).
static inline float scale_at(const unsigned char *p) {
#if defined(__F16C__)
    return _mm256_cvtss_f32(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
#else
    return f16_at(p);
#endif
}
static inline float scale_ending_at(const unsigned char *end) { // the f16 at end - 2
#if defined(__F16C__)
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(end - 16)));
    return _mm_cvtss_f32(_mm_permute_ps(_mm256_extractf128_ps(v, 1), 3));
#else
    return f16_at(end - 2);
#endif
}
#elif defined(USE_NEON)
typedef struct {
    uint32x4_t lo, hi;
} Ints;
static inline Ints ints_of_bytes(const unsigned char *p, int h) { // bytes h .. h+7 of the sixteen at p
    uint16x8_t v = vmovl_u8(vld1_u8(p + h));
    return (Ints){vmovl_u16(vget_low_u16(v)), vmovl_high_u16(v)};
}
static inline Ints ints_and(Ints v, int mask) {
    return (Ints){vandq_u32(v.lo, vdupq_n_u32((uint32_t)mask)), vandq_u32(v.hi, vdupq_n_u32((uint32_t)mask))};
}
static inline Ints ints_add(Ints v, int c) {
    return (Ints){vaddq_u32(v.lo, vdupq_n_u32((uint32_t)c)), vaddq_u32(v.hi, vdupq_n_u32((uint32_t)c))};
}
static inline Ints ints_shift_right(Ints v, int n) {
    return (Ints){vshlq_u32(v.lo, vdupq_n_s32(-n)), vshlq_u32(v.hi, vdupq_n_s32(-n))};
}
static inline Lanes lanes_of_ints(Ints v) {
    return (Lanes){vcvtq_f32_s32(vreinterpretq_s32_u32(v.lo)), vcvtq_f32_s32(vreinterpretq_s32_u32(v.hi))};
}
static inline Lanes lanes_set(float f) { return (Lanes){vdupq_n_f32(f), vdupq_n_f32(f)}; }
static inline Lanes lanes_broadcast(const float *p) { return lanes_set(*p); }
static inline Lanes lanes_mul(Lanes a, Lanes b) { return (Lanes){vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
static inline Lanes lanes_mul_sub(Lanes a, Lanes b, Lanes c) { // a * b - c, rounded once
    return (Lanes){vfmaq_f32(vnegq_f32(c.lo), a.lo, b.lo), vfmaq_f32(vnegq_f32(c.hi), a.hi, b.hi)};
}
static inline float scale_at(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
static inline float scale_ending_at(const unsigned char *end) { return scale_at(end - 2); } // the f16 at end - 2
#endif

// Runs of 32 small integers assembled a byte each (Bytes: one AVX register, two NEON
// registers), for the 5- and 6-bit types: their bits come from two or three places, and
// assembling a run's 32 at once costs a handful of byte operations where eight at a
// time in 32-bit lanes costs as many per eight. ints_of_run_bytes then widens eight of
// them (signed) into Ints.
#if defined(USE_AVX2)
typedef __m256i Bytes;
static inline Bytes bytes_load(const unsigned char *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline Bytes bytes_load16_twice(const unsigned char *p) { // p[0..15], then p[0..15] again
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
}
static inline Bytes bytes_and(Bytes v, int mask) { return _mm256_and_si256(v, _mm256_set1_epi8((char)mask)); }
static inline Bytes bytes_or(Bytes a, Bytes b) { return _mm256_or_si256(a, b); }
static inline Bytes bytes_add(Bytes v, int c) { return _mm256_add_epi8(v, _mm256_set1_epi8((char)c)); }
static inline Bytes bytes_shift_right(Bytes v, int n) { // each byte >> n (16-bit shifts, then the bits
    return bytes_and(_mm256_srl_epi16(v, _mm_cvtsi32_si128(n)), 0xff >> n); // from the next byte cleared)
}
static inline Bytes bytes_shift_left(Bytes v, int n) {
    return bytes_and(_mm256_sll_epi16(v, _mm_cvtsi32_si128(n)), (0xff << n) & 0xff);
}
static inline Bytes bytes_first_half_low_nibbles(Bytes v) { // bytes 0..15: v's & 15; 16..31: v's >> 4
    return _mm256_blend_epi32(bytes_and(v, 15), bytes_shift_right(v, 4), 0xf0);
}
static inline Bytes bytes_of_bits(uint32_t bits) { // byte k: 1 if bit k of bits is set, else 0
    const Bytes byte_of_bit = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                               2, 3, 3, 3, 3, 3, 3, 3, 3);
    const Bytes bit_of_byte = _mm256_set1_epi64x(0x8040201008040201ll);
    Bytes spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), byte_of_bit);
    return bytes_and(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte), 1);
}
static inline Ints ints_of_run_bytes(Bytes v, int h) { // bytes h .. h+7, sign-extended
    __m128i half = h < 16 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1);
    return _mm256_cvtepi8_epi32(h % 16 ? _mm_srli_si128(half, 8) : half);
}
#elif defined(USE_NEON)
typedef struct {
    uint8x16_t lo, hi;
} Bytes;
static inline Bytes bytes_load(const unsigned char *p) { return (Bytes){vld1q_u8(p), vld1q_u8(p + 16)}; }
static inline Bytes bytes_load16_twice(const unsigned char *p) {
    uint8x16_t v = vld1q_u8(p);
    return (Bytes){v, v};
}
static inline Bytes bytes_and(Bytes v, int mask) {
    uint8x16_t m = vdupq_n_u8((uint8_t)mask);
    return (Bytes){vandq_u8(v.lo, m), vandq_u8(v.hi, m)};
}
static inline Bytes bytes_or(Bytes a, Bytes b) { return (Bytes){vorrq_u8(a.lo, b.lo), vorrq_u8(a.hi, b.hi)}; }
static inline Bytes bytes_add(Bytes v, int c) {
    uint8x16_t k = vdupq_n_u8((uint8_t)c);
    return (Bytes){vaddq_u8(v.lo, k), vaddq_u8(v.hi, k)};
}
static inline Bytes bytes_shift_right(Bytes v, int n) {
    int8x16_t by = vdupq_n_s8((int8_t)-n);
    return (Bytes){vshlq_u8(v.lo, by), vshlq_u8(v.hi, by)};
}
static inline Bytes bytes_shift_left(Bytes v, int n) {
    int8x16_t by = vdupq_n_s8((int8_t)n);
    return (Bytes){vshlq_u8(v.lo, by), vshlq_u8(v.hi, by)};
}
static inline Bytes bytes_first_half_low_nibbles(Bytes v) {
    return (Bytes){vandq_u8(v.lo, vdupq_n_u8(15)), vshrq_n_u8(v.hi, 4)};
}
static inline Bytes bytes_of_bits(uint32_t bits) {
    static const uint8_t bit_of_byte[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t mask = vld1q_u8(bit_of_byte);
    uint8x16_t lo = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    uint8x16_t hi = vcombine_u8(vdup_n_u8((uint8_t)(bits >> 16)), vdup_n_u8((uint8_t)(bits >> 24)));
    return (Bytes){vminq_u8(vandq_u8(lo, mask), vdupq_n_u8(1)), vminq_u8(vandq_u8(hi, mask), vdupq_n_u8(1))};
}
static inline Ints ints_of_run_bytes(Bytes v, int h) {
    uint8x16_t half = h < 16 ? v.lo : v.hi;
    int16x8_t wide = vmovl_s8(h % 16 ? vget_high_s8(vreinterpretq_s8_u8(half)) : vget_low_s8(vreinterpretq_s8_u8(half)));
    return (Ints){vreinterpretq_u32_s32(vmovl_s16(vget_low_s16(wide))),
                  vreinterpretq_u32_s32(vmovl_high_s16(wide))};
}
#endif

#ifdef USE_SIMD
// low_nibble_of_32 for weights k .. k+7 (k a multiple of 8). With `unmasked`, a low
// nibble keeps its byte's high one above it: for the nibble tables' permute, which
// reads a lane's low four bits only.
static inline Ints ints_low_nibbles_of_32(const unsigned char *qs, int k, int unmasked) {
    if (k >= 16) return ints_shift_right(ints_of_bytes(qs, k - 16), 4);
    return unmasked ? ints_of_bytes(qs, k) : ints_and(ints_of_bytes(qs, k), 15);
}
// k_nibble for weights k .. k+7 of a Q4_K/Q5_K block (`unmasked` as above)
static inline Ints ints_k_nibbles(const unsigned char *qs, int k, int unmasked) {
    Ints bytes = ints_of_bytes(qs + k / 64 * 32 + k % 32 / 16 * 16, k % 16);
    if (k / 32 % 2) return ints_shift_right(bytes, 4);
    return unmasked ? bytes : ints_and(bytes, 15);
}

#if defined(USE_AVX2) && !defined(USE_AVX512)
// Q4_0 without the nibble tables (AVX2): eight nibbles moved into 32-bit lanes by byte
// shuffles alone, with no shift, mask or offset a lane, so that the conversion, the
// factor's multiply and the multiply-add are all a weight costs after the shuffle, as for
// Q8_0. The sixteen bytes at p, copied into both halves, are made bytes of 16 * (q - 8),
// signed, first (the compiler shares them between the run's vectors): the high nibbles
// masked in place and their top bit inverted (subtracting 8 from a 4-bit number held in a
// byte's top half), the low ones looked up by a shuffle. A second shuffle puts byte h + l
// in the top byte of lane l, the bytes below it zero: the lane is (q - 8) * 2^28 as a
// signed integer, exact in float32, and the factor is d * 2^-28 (integer_unit: exact,
// |d| >= 2^-24 when not 0), so that their product is the plain widening's d * (q - 8).
#define NIBBLES_MOVED 1
static inline Ints ints_of_q4_0_nibbles_moved(const unsigned char *p, int h, int high) {
    const __m256i minus_8_times_16 = _mm256_setr_epi8(-128, -112, -96, -80, -64, -48, -32, -16, 0, 16, 32, 48, 64, 80,
                                                      96, 112, -128, -112, -96, -80, -64, -48, -32, -16, 0, 16, 32,
                                                      48, 64, 80, 96, 112);
    Bytes v = bytes_load16_twice(p);
    Bytes b = high ? _mm256_xor_si256(bytes_and(v, 0xf0), _mm256_set1_epi8((char)0x80))
                   : _mm256_shuffle_epi8(minus_8_times_16, bytes_and(v, 15));
    const int fill = 0x808080; // bytes 0-2 of each lane zeroed (a shuffle index with its top bit set)
    return _mm256_shuffle_epi8(b, _mm256_setr_epi32(fill | h << 24, fill | (h + 1) << 24, fill | (h + 2) << 24,
                                                    fill | (h + 3) << 24, fill | (h + 4) << 24, fill | (h + 5) << 24,
                                                    fill | (h + 6) << 24, fill | (h + 7) << 24));
}
#endif

// The factors of a run of 32 weights of a block (weights k .. k+31, k a multiple of
// 32), each copied into every lane, so that a kernel widens them once a run:
//   q8_0, q4_0, q5_0: a = d;  q4_1, q5_1: a = d, b = m;
//   q4_k, q5_k: a = d * sc, b = dmin * m of sub-block k / 32 (each product exact);
//   q6_k: a = d * sc for the run's first 16 weights, b = d * sc for its last 16.
// With AVX-512, a 4-bit run's sixteen possible weights are there too (table_lo, q =
// 0..7, and table_hi, q = 8..15), each computed by the type's equation: a weight is
// then one permute by its nibble, with no conversion or multiply (lanes_block_values).
#if defined(USE_AVX512) && defined(__AVX512VL__)
#define NIBBLE_TABLES 1 // vpermt2ps: a permute over two registers' sixteen floats
#endif
typedef struct {
    Lanes a, b;
    Bytes q; // q5_0, q5_1, q5_k, q6_k: the run's 32 integers, assembled (run_bytes)
#if defined(NIBBLE_TABLES)
    Lanes table_lo, table_hi;
#endif
} RunFactors;

#if defined(NIBBLE_TABLES)
// The sixteen weights of a 4-bit run, by q: q4_0's (q - 8) * d, q4_k's (d*sc) * q - dmin*m
static inline __attribute__((always_inline)) void run_table(RunFactors *f, WeightType type) {
    Ints q_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), q_hi = ints_add(q_lo, 8);
    if (type == WEIGHT_Q4_0) {
        f->table_lo = lanes_mul(lanes_of_ints(ints_add(q_lo, -8)), f->a);
        f->table_hi = lanes_mul(lanes_of_ints(ints_add(q_hi, -8)), f->a);
    } else {
        f->table_lo = lanes_mul_sub(f->a, lanes_of_ints(q_lo), f->b);
        f->table_hi = lanes_mul_sub(f->a, lanes_of_ints(q_hi), f->b);
    }
}
// The weights whose nibbles are q (eight 32-bit lanes, each 0..15): table[q]
static inline Lanes lanes_by_nibble(const RunFactors *f, Ints q) {
    return _mm256_permutex2var_ps(f->table_lo, q, f->table_hi);
}
#endif

// The integers of a 5- or 6-bit run (weights k .. k+31), a byte each, offsets applied:
//   q5_0: q - 16, q5_1: q, q5_k: q (sub-block k / 32), q6_k: q - 32, each -32..31
static inline __attribute__((always_inline)) Bytes run_bytes(const unsigned char *block, int k, WeightType type) {
    uint32_t qh;
    switch (type) {
    case WEIGHT_Q5_0:
    case WEIGHT_Q5_1: {
        const unsigned char *bits = block + (type == WEIGHT_Q5_0 ? 2 : 4);
        qh = (uint32_t)bits[0] | (uint32_t)bits[1] << 8 | (uint32_t)bits[2] << 16 | (uint32_t)bits[3] << 24;
        Bytes q = bytes_or(bytes_first_half_low_nibbles(bytes_load16_twice(bits + 4)),
                           bytes_shift_left(bytes_of_bits(qh), 4));
        return type == WEIGHT_Q5_0 ? bytes_add(q, -16) : q;
    }
    case WEIGHT_Q5_K: {
        Bytes qs = bytes_load(block + 48 + k / 64 * 32);
        Bytes low = k / 32 % 2 ? bytes_shift_right(qs, 4) : bytes_and(qs, 15);
        return bytes_or(low, bytes_shift_left(bytes_and(bytes_shift_right(bytes_load(block + 16), k / 32), 1), 4));
    }
    default: { // Q6_K
        int half = k / 128, g = k % 128 / 32;
        const unsigned char *ql = block + 64 * half + 32 * (g % 2), *qh6 = block + 128 + 32 * half;
        Bytes low = g / 2 ? bytes_shift_right(bytes_load(ql), 4) : bytes_and(bytes_load(ql), 15);
        Bytes high = bytes_shift_left(bytes_and(bytes_shift_right(bytes_load(qh6), 2 * g), 3), 4);
        return bytes_add(bytes_or(low, high), -32);
    }
    }
}

// A block's scale factors, widened once a block: a[s] = d * sc and b[s] = dmin * m of each
// K-quant sub-block s (q6_k: a[s] = d * sc of its sixteen), or a[0] = d, b[0] = m (0 for
// the types without one). Each product is exact, as in the plain widening.
typedef struct {
    float a[16], b[8];
} BlockFactors;
// With NIBBLES_MOVED, Q4_0's a is d * 2^-28, for its lanes' (q - 8) * 2^28 (integer_unit).
// (run_scale_factors: the entries run k / 32 reads; block_factors: all of them)
static inline float integer_unit(WeightType type) {
#if defined(NIBBLES_MOVED)
    if (type == WEIGHT_Q4_0) return 0x1p-28f;
#endif
    (void)type;
    return 1.0f;
}
static inline __attribute__((always_inline)) void run_scale_factors(BlockFactors *bf, const unsigned char *block,
                                                                     int k, WeightType type) {
    if (type == WEIGHT_Q4_K || type == WEIGHT_Q5_K) {
        int sc, m;
        k_scale_min(block + 4, k / 32, &sc, &m);
        bf->a[k / 32] = scale_at(block) * (float)sc, bf->b[k / 32] = scale_at(block + 2) * (float)m;
    } else if (type == WEIGHT_Q6_K) {
        for (int sb = k / 16; sb < k / 16 + 2; sb++)
            bf->a[sb] = scale_ending_at(block + 210) * (float)(int8_t)block[192 + sb];
    } else {
        bf->a[0] = scale_at(block) * integer_unit(type);
        bf->b[0] = type == WEIGHT_Q4_1 || type == WEIGHT_Q5_1 ? scale_at(block + 2) : 0.0f;
    }
}
#if defined(USE_AVX2)
// k_scale_min of all eight sub-blocks at once: sc and m of sub-block s in lane s. Each
// lane picks its bytes of the twelve with a byte shuffle (scales, copied into both halves
// of the register), then masks and shifts them as k_scale_min does:
//   s < 4:  sc = q[s] & 63,       m = q[s + 4] & 63
//   s >= 4: sc = (q[s + 4] & 15) | (q[s - 4] >> 6) << 4,  m = (q[s + 4] >> 4) | (q[s] >> 6) << 4
static inline void ints_k_scales_mins(const unsigned char *scales, Ints *sc, Ints *m) {
    __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)scales)); // 12 bytes and 4 past
    const __m256i sc_low = _mm256_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11), m_low = _mm256_setr_epi32(4, 5, 6, 7, 8, 9, 10, 11);
    const __m256i sc_high = _mm256_setr_epi32(-1, -1, -1, -1, 0, 1, 2, 3), m_high = _mm256_setr_epi32(-1, -1, -1, -1, 4, 5, 6, 7);
    const __m256i low_bits = _mm256_setr_epi32(63, 63, 63, 63, 15, 15, 15, 15), m_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    // (-1: a zero byte; the picks' other three bytes of a lane are -1 too: byte k of lane s picks byte k of pick s)
    const __m256i one_byte = _mm256_set1_epi32((int)0xffffff00);
    __m256i low = _mm256_shuffle_epi8(q, _mm256_or_si256(sc_low, one_byte));
    __m256i high = _mm256_shuffle_epi8(q, _mm256_or_si256(sc_high, one_byte));
    *sc = _mm256_or_si256(_mm256_and_si256(low, low_bits), _mm256_and_si256(_mm256_srli_epi32(high, 2), _mm256_set1_epi32(0x30)));
    low = _mm256_shuffle_epi8(q, _mm256_or_si256(m_low, one_byte));
    high = _mm256_shuffle_epi8(q, _mm256_or_si256(m_high, one_byte));
    *m = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(low, m_shift), low_bits),
                         _mm256_and_si256(_mm256_srli_epi32(high, 2), _mm256_set1_epi32(0x30)));
}
#endif
static inline __attribute__((always_inline)) void block_factors(BlockFactors *bf, const unsigned char *block,
                                                                 WeightType type) {
#if defined(USE_AVX2)
    // The K-quants' factors eight at a time (the same exact products): the scalar
    // loop's sixteen or twenty-four conversions and multiplies were most of a
    // block's work outside the weights.
    if (type == WEIGHT_Q4_K || type == WEIGHT_Q5_K) {
        Ints sc, m;
        ints_k_scales_mins(block + 4, &sc, &m);
        lanes_store(bf->a, lanes_mul(lanes_set(scale_at(block)), lanes_of_ints(sc)));
        lanes_store(bf->b, lanes_mul(lanes_set(scale_at(block + 2)), lanes_of_ints(m)));
        return;
    }
    if (type == WEIGHT_Q6_K) { // the sixteen signed 8-bit scales
        Bytes sc = bytes_load16_twice(block + 192);
        Lanes d = lanes_set(scale_ending_at(block + 210));
        lanes_store(bf->a, lanes_mul(d, lanes_of_ints(ints_of_run_bytes(sc, 0))));
        lanes_store(bf->a + 8, lanes_mul(d, lanes_of_ints(ints_of_run_bytes(sc, 8))));
        return;
    }
#endif
    for (int k = 0; k < block_shapes[type].weights; k += 32) run_scale_factors(bf, block, k, type);
}

// The factors of run k / 32 of a block whose factors are bf
static inline __attribute__((always_inline)) RunFactors run_factors(const unsigned char *block, int k,
                                                                     WeightType type, const BlockFactors *bf) {
    RunFactors f;
    switch (type) {
    case WEIGHT_Q4_K:
    case WEIGHT_Q5_K: f = (RunFactors){.a = lanes_broadcast(&bf->a[k / 32]), .b = lanes_broadcast(&bf->b[k / 32])}; break;
    case WEIGHT_Q6_K: f = (RunFactors){.a = lanes_broadcast(&bf->a[k / 16]), .b = lanes_broadcast(&bf->a[k / 16 + 1])}; break;
    default: f = (RunFactors){.a = lanes_broadcast(&bf->a[0]), .b = lanes_broadcast(&bf->b[0])}; break;
    }
#if defined(NIBBLE_TABLES)
    if (type == WEIGHT_Q4_0 || type == WEIGHT_Q4_K) run_table(&f, type);
#endif
    if (type == WEIGHT_Q5_0 || type == WEIGHT_Q5_1 || type == WEIGHT_Q5_K || type == WEIGHT_Q6_K)
        f.q = run_bytes(block, k, type);
    return f;
}

// Eight weights of the block at `block`, from weight k on (a multiple of 8), given the
// factors of the run of 32 they lie in: the equations of q8_0_weight ... q6_k_weight,
// eight at a time. d * q + m and (d*sc) * q - dmin*m are one fused multiply-add:
// the product is exact, so rounding once after it or after the sum is the same.
static inline __attribute__((always_inline)) Lanes lanes_block_values(const unsigned char *block, int k,
                                                                       WeightType type, RunFactors f) {
    switch (type) {
    case WEIGHT_Q4_0: // d * (q - 8)
#if defined(NIBBLE_TABLES)
        return lanes_by_nibble(&f, ints_low_nibbles_of_32(block + 2, k, 1));
#elif defined(NIBBLES_MOVED)
        return lanes_mul(lanes_of_ints(ints_of_q4_0_nibbles_moved(block + 2, k % 16, k >= 16)), f.a);
#else
        return lanes_mul(lanes_of_ints(ints_add(ints_low_nibbles_of_32(block + 2, k, 0), -8)), f.a);
#endif
    case WEIGHT_Q4_1: // d * q + m
        return lanes_fma(lanes_of_ints(ints_low_nibbles_of_32(block + 4, k, 0)), f.a, f.b);
    case WEIGHT_Q5_0: // d * (q - 16), q - 16 from the run's bytes
        return lanes_mul(lanes_of_ints(ints_of_run_bytes(f.q, k % 32)), f.a);
    case WEIGHT_Q5_1: // d * q + m
        return lanes_fma(lanes_of_ints(ints_of_run_bytes(f.q, k % 32)), f.a, f.b);
    case WEIGHT_Q4_K: // (d * sc) * q - dmin * m
#if defined(NIBBLE_TABLES)
        return lanes_by_nibble(&f, ints_k_nibbles(block + 16, k, 1));
#else
        return lanes_mul_sub(f.a, lanes_of_ints(ints_k_nibbles(block + 16, k, 0)), f.b);
#endif
    case WEIGHT_Q5_K: // as Q4_K, q from the run's bytes
        return lanes_mul_sub(f.a, lanes_of_ints(ints_of_run_bytes(f.q, k % 32)), f.b);
    case WEIGHT_Q6_K: // (d * sc) * (q - 32), q - 32 from the run's bytes
        return lanes_mul(k % 32 < 16 ? f.a : f.b, lanes_of_ints(ints_of_run_bytes(f.q, k % 32)));
    default: // Q8_0: d * q
        return lanes_q8_0_values(block + 2 + k, f.a);
    }
}

// Eight weights of `type` from element i of data on, as float32 lanes.
static inline __attribute__((always_inline)) Lanes lanes_load_weights(const void *data, size_t i, WeightType type) {
    if (type == WEIGHT_BF16) return lanes_load_bf16((const uint16_t *)data + i);
    if (type == WEIGHT_F16) return lanes_load_f16((const uint16_t *)data + i);
    if (type == WEIGHT_F32) return lanes_load((const float *)data + i);
    BlockShape b = block_shapes[type];
    const unsigned char *block = (const unsigned char *)data + i / b.weights * b.bytes;
    int k = (int)(i % b.weights);
    BlockFactors bf;
    run_scale_factors(&bf, block, k / 32 * 32, type); // only this run's
    return lanes_block_values(block, k, type, run_factors(block, k / 32 * 32, type, &bf));
}

// The kernels below that read weights are written once for a weight type given as
// a parameter, always inlined, and called with the type as a constant (one copy per
// type: the test of the type leaves the loops).

// dot(): one lanes_fma per eight floats; a tail shorter than eight goes to the
// first lanes as in the plain loop. a: weights of `type` (x and the cached keys are
// float32).
static inline __attribute__((always_inline)) float dot_lanes(const void *a, WeightType type, const float *b, int n) {
    float acc[DOT_LANES];
    int j = 0;
    Lanes lanes = lanes_zero();
    for (; j + DOT_LANES <= n; j += DOT_LANES)
        lanes = lanes_fma(lanes_load_weights(a, j, type), lanes_load(b + j), lanes);
    if (j == n) return lanes_sum(lanes);
    lanes_store(acc, lanes);
    for (int l = 0; j < n; j++, l++) acc[l] = mul_add(widen(a, j, type), b[j], acc[l]);
    return reduce_lanes(acc);
}

// dot_lanes of a row of blocks (n a multiple of the block: rows are whole blocks), with
// each block's factors widened once (block_factors, run_factors) rather than once a
// vector: the same multiply-adds in the same order.
static inline __attribute__((always_inline)) float dot_blocks(const void *a, WeightType type, const float *b, int n) {
    BlockShape s = block_shapes[type];
    Lanes lanes = lanes_zero();
    for (int j = 0; j < n; j += s.weights) {
        const unsigned char *block = (const unsigned char *)a + (size_t)j / s.weights * s.bytes;
        BlockFactors bf;
        block_factors(&bf, block, type);
        for (int k = 0; k < s.weights; k += 32) {
            RunFactors f = run_factors(block, k, type, &bf);
            for (int h = k; h < k + 32; h += DOT_LANES)
                lanes = lanes_fma(lanes_block_values(block, h, type, f), lanes_load(b + j + h), lanes);
        }
    }
    return lanes_sum(lanes);
}

static float dot_simd(const float *a, const float *b, int n) { return dot_lanes(a, WEIGHT_F32, b, n); }

static float dot_weights_simd(Matrix w, const float *x, int n) {
    switch (w.type) { // one copy of dot_lanes or dot_blocks per type
    case WEIGHT_BF16: return dot_lanes(w.data, WEIGHT_BF16, x, n);
    case WEIGHT_F16: return dot_lanes(w.data, WEIGHT_F16, x, n);
    case WEIGHT_Q8_0: return dot_blocks(w.data, WEIGHT_Q8_0, x, n);
    case WEIGHT_Q4_0: return dot_blocks(w.data, WEIGHT_Q4_0, x, n);
    case WEIGHT_Q4_1: return dot_blocks(w.data, WEIGHT_Q4_1, x, n);
    case WEIGHT_Q5_0: return dot_blocks(w.data, WEIGHT_Q5_0, x, n);
    case WEIGHT_Q5_1: return dot_blocks(w.data, WEIGHT_Q5_1, x, n);
    case WEIGHT_Q4_K: return dot_blocks(w.data, WEIGHT_Q4_K, x, n);
    case WEIGHT_Q5_K: return dot_blocks(w.data, WEIGHT_Q5_K, x, n);
    case WEIGHT_Q6_K: return dot_blocks(w.data, WEIGHT_Q6_K, x, n);
    default: return dot_lanes(w.data, WEIGHT_F32, x, n);
    }
}
#endif

// 2. Decode: rows in groups of four, split across threads ----------------------

#ifdef USE_SIMD
// Asks for the cache line `ahead` bytes past p, into L1 (a hint: it never faults,
// and the address is computed as an integer, so it may lie past the row's end).
static inline void prefetch_ahead(const void *p, size_t ahead) {
    __builtin_prefetch((const void *)((uintptr_t)p + ahead), 0, 3);
}
#endif

// Software prefetch in the decode matmul: how far ahead each row asks for its
// lines, and the shortest rows that ask (shorter rows lost more than they gained).
#define PREFETCH_AHEAD_BYTES 1024
#define PREFETCH_MIN_ROW 512 // weights: 2 KB of float32, 1 KB of a 16-bit type

// Four dot products: out[r * gap] = dot(w_r, x, n) for the rows w_r = w + r * gap * n,
// r = 0..3, gap rows apart. Each row's arithmetic is exactly dot()'s.
// One row's lanes form a single chain of dependent multiply-adds (each waits for the
// last), which streams weights slower than memory delivers them; four rows give four
// independent chains that share the loads of x. The loop takes one 64-byte cache
// line of each row per step (two vectors, in dot()'s order); with `prefetch`, each
// step first asks for each row's line PREFETCH_AHEAD_BYTES further on, which keeps
// more reads in flight than the hardware prefetchers do (a 16-bit row's line holds
// two steps, and is asked for twice: a hint for a line already coming costs little).
#ifdef USE_SIMD
#if defined(USE_AVX2) && !defined(USE_AVX512)
// Q4_0, Q4_K and Q6_K rows in the AVX2 build (all but the norms of a Q4_0 or Q4_K_M
// file), for dot_rows4_blocks below: a run of 32 weights of each row per step, taken a
// row's whole run at a time (row_run) rather than a vector of each row at a time, so that
// what its four vectors share (the run's bytes, loaded and masked once, and its
// factors) stays in registers: across four rows at once they outnumbered AVX2's
// sixteen, and the spills and the reloads cost more than the widening. The four rows'
// chains stay independent, and the core overlaps them. Each vector's integers are
// moved into its lanes by one byte shuffle within each half of the register (no
// widening across the halves, vpmovsxbd, which is slow on some CPUs), to a byte of
// the lane where each is exact: q at byte b of a lane, the other bytes zero, is the
// integer q * 2^(8b), and the run's factor carries 2^(-8b) (a power of two: exact, far
// from float32's smallest numbers for every f16 scale). Each row's multiply-adds are
// dot()'s, in its order: the same bits.
#define ROW_RUNS 1
// The shuffle's control: lane l gets byte `from` + l of the sixteen in its half (lanes
// 0-3 from the low half, 4-7 from the high one, which holds the same sixteen) at byte
// `place`; the other bytes of the control have their top bit set, which writes zero.
static inline __m256i lane_bytes_at(int from, int place) {
    int pick[DOT_LANES];
    for (int l = 0; l < DOT_LANES; l++)
        pick[l] = (int)(0x80808080u & ~(0xffu << 8 * place)) | (from + l) << 8 * place;
    return _mm256_setr_epi32(pick[0], pick[1], pick[2], pick[3], pick[4], pick[5], pick[6], pick[7]);
}
static inline Lanes lanes_of_lane_bytes(Bytes v, __m256i control) {
    return lanes_of_ints(_mm256_shuffle_epi8(v, control));
}
// The K-quants' factors of a row's block for row_run: block_factors', each d * sc times
// its run's power of two (exact):
//   q4_k: a[s] = d * sc * 2^-16 for an even sub-block s (its low nibbles, masked, at
//         byte 2 of the lanes: q * 2^16), 2^-20 for an odd one (its high nibbles masked
//         in place, 16 q, at byte 2: q * 2^20); b[s] = dmin * m
//   q6_k: a[t] = d * sc * 2^-24 for each sixteen weights t (q - 32 at byte 3)
// (Q4_0's one scale row_run reads itself.)
static inline __attribute__((always_inline)) void row_run_factors(BlockFactors *bf, const unsigned char *block,
                                                                   WeightType type) {
    if (type == WEIGHT_Q4_0) return;
    block_factors(bf, block, type);
    const Lanes unit = type == WEIGHT_Q4_K ? _mm256_setr_ps(0x1p-16f, 0x1p-20f, 0x1p-16f, 0x1p-20f, 0x1p-16f,
                                                            0x1p-20f, 0x1p-16f, 0x1p-20f)
                                           : lanes_set(0x1p-24f);
    for (int t = 0; t < (type == WEIGHT_Q4_K ? 8 : 16); t += DOT_LANES)
        lanes_store(bf->a + t, lanes_mul(lanes_load(bf->a + t), unit));
}
// acc plus run k (weights k .. k+31) of one row's block times x[0..31], in dot()'s
// order: the equations of q4_0_weight, q4_k_weight and q6_k_weight, a vector at a time.
static inline __attribute__((always_inline)) Lanes row_run(const unsigned char *block, int k, WeightType type,
                                                          const BlockFactors *bf, const float *x, Lanes acc) {
    if (type == WEIGHT_Q4_0) { // d * (q - 8): bytes of 16 * (q - 8) at byte 3, times d * 2^-28
        Lanes d = lanes_set(scale_at(block) * integer_unit(WEIGHT_Q4_0));
        for (int h = 0; h < 32; h += DOT_LANES)
            acc = lanes_fma(lanes_mul(lanes_of_ints(ints_of_q4_0_nibbles_moved(block + 2, h % 16, h >= 16)), d),
                            lanes_load(x + h), acc);
    } else if (type == WEIGHT_Q4_K) { // (d * sc) * q - dmin * m: sub-block s's nibbles of 32 bytes
        int s = k / 32, nibbles = s % 2 ? 0xf0 : 15;
        const unsigned char *qs = block + 16 + s / 2 * 32;
        const __m256i first = lane_bytes_at(0, 2), next = lane_bytes_at(8, 2);
        Bytes q0 = bytes_and(bytes_load16_twice(qs), nibbles), q16 = bytes_and(bytes_load16_twice(qs + 16), nibbles);
        Lanes a = lanes_broadcast(&bf->a[s]), b = lanes_broadcast(&bf->b[s]);
        acc = lanes_fma(lanes_mul_sub(a, lanes_of_lane_bytes(q0, first), b), lanes_load(x), acc);
        acc = lanes_fma(lanes_mul_sub(a, lanes_of_lane_bytes(q0, next), b), lanes_load(x + 8), acc);
        acc = lanes_fma(lanes_mul_sub(a, lanes_of_lane_bytes(q16, first), b), lanes_load(x + 16), acc);
        acc = lanes_fma(lanes_mul_sub(a, lanes_of_lane_bytes(q16, next), b), lanes_load(x + 24), acc);
    } else { // Q6_K, (d * sc) * (q - 32): each sixteen's q assembled from ql and qh as q6_k_weight reads them
        int half = k / 128, g = k % 128 / 32;
        const __m256i first = lane_bytes_at(0, 3), next = lane_bytes_at(8, 3);
        for (int l = 0; l < 32; l += 16) {
            Bytes ql = bytes_load16_twice(block + 64 * half + 32 * (g % 2) + l);
            Bytes qh = bytes_load16_twice(block + 128 + 32 * half + l);
            Bytes low = g < 2 ? bytes_and(ql, 15) : bytes_shift_right(ql, 4);
            // bits 2g and 2g+1 of qh at bits 4 and 5 (a 16-bit shift: the mask drops what crossed bytes)
            Bytes high = g < 2 ? _mm256_slli_epi16(qh, 4 - 2 * g) : g == 2 ? qh : _mm256_srli_epi16(qh, 2);
            Bytes q = bytes_add(bytes_or(low, bytes_and(high, 0x30)), -32);
            Lanes a = lanes_broadcast(&bf->a[k / 16 + l / 16]);
            acc = lanes_fma(lanes_mul(lanes_of_lane_bytes(q, first), a), lanes_load(x + l), acc);
            acc = lanes_fma(lanes_mul(lanes_of_lane_bytes(q, next), a), lanes_load(x + l + 8), acc);
        }
    }
    return acc;
}
// The types row_run takes
static inline int by_row_runs(WeightType type) {
    return type == WEIGHT_Q4_0 || type == WEIGHT_Q4_K || type == WEIGHT_Q6_K;
}
#endif

// Rows of blocks (n a multiple of 32, and of the block): a run of 32 weights of each
// row per step, four vectors; each row's factors (run_factors: its scales, widened
// and copied into the lanes) once a run rather than once a vector. Each row's
// multiply-adds are dot()'s, in its order (a run's vectors are j, j + 8, j + 16,
// j + 24). With `prefetch`, each run first asks for each row's line
// PREFETCH_AHEAD_BYTES further on. With ROW_RUNS (above), the types it takes go a row's
// whole run at a time instead (row_run), the rest as here.
// (Not called where ROW_PAIRS takes every block type: dot_rows4_of_blocks.)
static inline __attribute__((always_inline, unused)) void dot_rows4_blocks(float *out, const void *w, WeightType type,
                                                                    const float *x, int n, size_t gap, int prefetch) {
    BlockShape b = block_shapes[type];
    const unsigned char *row[4];
    for (int r = 0; r < 4; r++) row[r] = (const unsigned char *)w + weight_bytes(type, r * gap * n);
    Lanes lanes[4] = {lanes_zero(), lanes_zero(), lanes_zero(), lanes_zero()};
    for (int j = 0; j < n; j += b.weights) {
        size_t at = (size_t)j / b.weights * b.bytes; // the block of weight j
        BlockFactors bf[4];
        for (int r = 0; r < 4; r++) {
#if defined(ROW_RUNS)
            if (by_row_runs(type)) {
                row_run_factors(&bf[r], row[r] + at, type);
                continue;
            }
#endif
            block_factors(&bf[r], row[r] + at, type);
        }
        // the block's runs and each run's vectors unrolled: their places in the block
        // (which nibble, which bits of qh, which scale) become constants
#pragma GCC unroll 8
        for (int k = 0; k < b.weights; k += 32) {
            if (prefetch)
                for (int r = 0; r < 4; r++) prefetch_ahead(row[r] + at + k * b.bytes / b.weights, PREFETCH_AHEAD_BYTES);
#if defined(ROW_RUNS)
            if (by_row_runs(type)) {
                for (int r = 0; r < 4; r++) lanes[r] = row_run(row[r] + at, k, type, &bf[r], x + j + k, lanes[r]);
                continue;
            }
#endif
            RunFactors f[4];
            for (int r = 0; r < 4; r++) f[r] = run_factors(row[r] + at, k, type, &bf[r]);
#pragma GCC unroll 4
            for (int h = 0; h < 32; h += DOT_LANES) {
                Lanes xv = lanes_load(x + j + k + h);
                for (int r = 0; r < 4; r++)
                    lanes[r] = lanes_fma(lanes_block_values(row[r] + at, k + h, type, f[r]), xv, lanes[r]);
            }
        }
    }
    for (int r = 0; r < 4; r++) out[r * gap] = lanes_sum(lanes[r]);
}

#if defined(NIBBLE_TABLES) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VBMI__)
// Two rows to a register: with 512-bit registers, rows r and r+1 of a group share one,
// row r's eight lanes in lanes 0-7 and row r+1's in lanes 8-15, x's eight floats copied
// into both halves, so that one instruction takes a step of both rows: each row's lanes
// still form dot()'s chain, in its order (the same roundings), in half the instructions.
// Every block type, whose work once a run (a table, a scale, bits from two places) is
// then done once for two rows. A run's integers are gathered from both rows' bytes by one
// byte permute across the register (vpermb: any byte to any place).
#define ROW_PAIRS 1
typedef __m512i PairBytes;
// The 32 bytes at p (row r's) in bytes 0-31 and the 32 at q (row r+1's) in bytes 32-63
static inline PairBytes pair_bytes_load(const unsigned char *p, const unsigned char *q) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                              _mm256_loadu_si256((const __m256i *)q), 1);
}
// Bitwise (a & mask) | b and (a & mask) ^ b (vpternlogd: a function of three registers'
// bits; its immediate is the function's truth table over a = 0xF0, mask = 0xCC, b = 0xAA)
static inline PairBytes pair_bytes_and_or(PairBytes a, int mask, PairBytes b) {
    return _mm512_ternarylogic_epi32(a, _mm512_set1_epi8((char)mask), b, 0xEA);
}
static inline PairBytes pair_bytes_and_xor(PairBytes a, int mask, int b) {
    return _mm512_ternarylogic_epi32(a, _mm512_set1_epi8((char)mask), _mm512_set1_epi8((char)b), 0x6A);
}
// Bits `mask` from a, the others from b
static inline PairBytes pair_bytes_select(int mask, PairBytes a, PairBytes b) {
    return _mm512_ternarylogic_epi32(_mm512_set1_epi8((char)mask), a, b, 0xCA);
}
// The run's 32 bytes of both rows (bytes 0-31 row r's, 32-63 row r+1's) permuted so that
// byte t of lane l (l < 8) is row r's byte 8t + l, and of lane 8 + l row r+1's: step t's
// integers, one in each lane, for the four steps of eight. With `top`, step t's alone, in
// the top byte of each lane and the bytes below it zero (the lane is the byte * 2^24).
static inline __m512i pair_steps(PairBytes v, int top, int t) {
    static const unsigned char all_steps[64] = {
        0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27, 4, 12, 20, 28, 5, 13, 21, 29,
        6, 14, 22, 30, 7, 15, 23, 31, 32, 40, 48, 56, 33, 41, 49, 57, 34, 42, 50, 58, 35, 43, 51, 59,
        36, 44, 52, 60, 37, 45, 53, 61, 38, 46, 54, 62, 39, 47, 55, 63};
    __m512i pick = _mm512_loadu_si512(all_steps);
    if (!top) return _mm512_permutexvar_epi8(pick, v);
    // byte 3 of each lane picks what byte t picked, and the mask zeroes the bytes below it
    pick = _mm512_slli_epi32(_mm512_srli_epi32(pick, 8 * t), 24);
    return _mm512_maskz_permutexvar_epi8(0x8888888888888888ull, pick, v);
}
// A legacy block's 32 nibbles of two rows (qs at p and q, sixteen bytes each: weight k < 16
// the low nibble of byte k, k + 16 its high one), each row's sixteen bytes twice: weights
// 0-15 are the low nibbles of the first copy, 16-31 the high ones of the second (moved
// down; the bits above them are not yet masked).
static inline PairBytes pair_nibbles_of_32(const unsigned char *p, const unsigned char *q) {
    PairBytes v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)), 0xff00,
                                              _mm_loadu_si128((const __m128i *)q));
    return _mm512_mask_srli_epi16(v, 0xff00ff00, v, 4);
}
// Q5_0's and Q5_1's fifth bits of two rows (qh at p and q): bit j of the mask, weight j of
// row r (j < 32) or weight j - 32 of row r+1
static inline __mmask64 pair_fifth_bits(const unsigned char *p, const unsigned char *q) {
    uint32_t h0, h1;
    memcpy(&h0, p, 4), memcpy(&h1, q, 4);
    return _cvtu64_mask64((uint64_t)h0 | (uint64_t)h1 << 32);
}
// Row r's factor *a in lanes 0-7 and row r+1's *b in lanes 8-15
static inline __m512 pair_factor(const float *a, const float *b) {
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(*a), 0xff00, _mm_load_ss(b));
}
static inline float pair_lanes_sum(__m512 v, int half) { // lanes_sum of row r's (0) or r+1's (1) lanes
    return lanes_sum(half ? _mm512_extractf32x8_ps(v, 1) : _mm512_castps512_ps256(v));
}

// Two rows' run of 32 weights (from weight k of blocks b0 and b1, whose factors are f0
// and f1) multiplied by x's (xv[t]: its eight floats from k + 8t, in both halves) and
// added to acc, four steps, each as dot_rows4_blocks takes it for each row.
//   Q4_0, Q4_1, Q4_K: the run's sixteen possible weights, by its type's equation, are a table
// in one register per row; a step's nibbles, row r+1's with 16 added, permute the two
// tables (vpermt2ps over their 32 entries) into both rows' weights. The run's nibbles are
// masked (and row r+1's marked) once, in bytes, and permuted once for all four steps:
// step t's index is byte t of each lane, and vpermt2ps reads a lane's low 5 bits only,
// so each further step costs a shift.
//   Q6_K: the run's 6-bit q is assembled in bytes, once, as (q - 32) * 4: ql's nibble in
// bits 2-5 and qh's two bits in 6-7, bit 7 inverted (subtracting 32 from a 6-bit number
// is inverting its top bit, the result read as signed). A step's bytes go to the top of
// each lane: (q - 32) * 2^26 exactly, converted to float32 and times (d * sc) * 2^-26,
// which is the plain widening's (d * sc) * (q - 32) (the scale only moves exponents:
// |d * sc| >= 2^-24 when not 0, so no bit is lost).
//   Q8_0, Q5_0, Q5_1, Q5_K the same way: the bytes q * 2^24 (Q8_0's int8), (q - 16) * 8
// (Q5_0: the top bit inverted), q * 4 (Q5_1, Q5_K), the fifth bits added by a masked byte
// add, and the factor d * 2^-24, d * 2^-27, d * 2^-26 or (d * sc) * 2^-26; Q5_1's m and Q5_K's
// dmin * m are the fused multiply-add's, rounded once as in the plain widening.
static inline __attribute__((always_inline)) __m512 pair_run(__m512 acc, const unsigned char *b0,
                                                              const unsigned char *b1, const BlockFactors *f0,
                                                              const BlockFactors *f1, int k, WeightType type,
                                                              const __m512 xv[4]) {
    const __m512 q_values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const PairBytes second_row = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi8(16), 1);
    if (type == WEIGHT_Q6_K) {
        int half = k / 128, g = k % 128 / 32;
        int ql = 64 * half + 32 * (g % 2), qh = 128 + 32 * half;
        PairBytes nibbles = pair_bytes_load(b0 + ql, b1 + ql), bits = pair_bytes_load(b0 + qh, b1 + qh);
        nibbles = g / 2 ? _mm512_srli_epi16(nibbles, 2) : _mm512_slli_epi16(nibbles, 2); // to bits 2-5
        if (g < 3) bits = _mm512_slli_epi16(bits, 6 - 2 * g); // bits 2g, 2g+1 to bits 6-7
        PairBytes q = pair_bytes_select(0x3c, nibbles, pair_bytes_and_xor(bits, 0xc0, 0x80));
        for (int t = 0; t < 4; t++) {
            int sb = k / 16 + t / 2; // the scale of weights k + 8t ..
            __m512 scale = pair_factor(&f0->a[sb], &f1->a[sb]);
            acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(pair_steps(q, 1, t)), scale), xv[t], acc);
        }
        return acc;
    }
    if (type == WEIGHT_Q8_0) { // a step's bytes in the top byte of each lane: q * 2^24, times d * 2^-24
        PairBytes q = pair_bytes_load(b0 + 2, b1 + 2);
        __m512 scale = pair_factor(&f0->a[0], &f1->a[0]);
        for (int t = 0; t < 4; t++)
            acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(pair_steps(q, 1, t)), scale), xv[t], acc);
        return acc;
    }
    if (type == WEIGHT_Q5_0 || type == WEIGHT_Q5_1) {
        int qh = type == WEIGHT_Q5_0 ? 2 : 4; // qs follows qh's four bytes
        PairBytes n = pair_nibbles_of_32(b0 + qh + 4, b1 + qh + 4), q;
        __mmask64 fifth = pair_fifth_bits(b0 + qh, b1 + qh);
        if (type == WEIGHT_Q5_0) { // n * 8 + 128 is (q - 16) * 8 when the fifth bit is 0; add 128 when it is 1
            q = pair_bytes_and_or(_mm512_slli_epi16(n, 3), 0x78, _mm512_set1_epi8((char)0x80));
            q = _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8((char)0x80));
        } else { // n * 4, plus 64 when the fifth bit is 1: q * 4
            q = _mm512_and_si512(_mm512_slli_epi16(n, 2), _mm512_set1_epi8(0x3c));
            q = _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8(64));
        }
        __m512 scale = pair_factor(&f0->a[0], &f1->a[0]);
        __m512 m = pair_factor(&f0->b[0], &f1->b[0]);
        for (int t = 0; t < 4; t++) {
            __m512 ints = _mm512_cvtepi32_ps(pair_steps(q, 1, t));
            __m512 w = type == WEIGHT_Q5_0 ? _mm512_mul_ps(ints, scale) : _mm512_fmadd_ps(ints, scale, m);
            acc = _mm512_fmadd_ps(w, xv[t], acc);
        }
        return acc;
    }
    if (type == WEIGHT_Q5_K) { // sub-block s: Q4_K's nibbles and bit s of each of qh's 32 bytes, as q * 4
        int s = k / 32;
        PairBytes v = pair_bytes_load(b0 + 48 + s / 2 * 32, b1 + 48 + s / 2 * 32);
        PairBytes q = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(v, 2) : _mm512_slli_epi16(v, 2), _mm512_set1_epi8(0x3c));
        __mmask64 fifth = _mm512_test_epi8_mask(pair_bytes_load(b0 + 16, b1 + 16), _mm512_set1_epi8((char)(1 << s)));
        q = _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8(64));
        __m512 scale = pair_factor(&f0->a[s], &f1->a[s]);
        __m512 m = pair_factor(&f0->b[s], &f1->b[s]);
        for (int t = 0; t < 4; t++) // (d * sc * 2^-26) * (q * 2^26) - dmin * m, rounded once
            acc = _mm512_fmadd_ps(_mm512_fmsub_ps(_mm512_cvtepi32_ps(pair_steps(q, 1, t)), scale, m), xv[t], acc);
        return acc;
    }
    PairBytes v;
    __m512 table0, table1;
    if (type == WEIGHT_Q4_0) {
        v = pair_nibbles_of_32(b0 + 2, b1 + 2);
        table0 = _mm512_mul_ps(_mm512_sub_ps(q_values, _mm512_set1_ps(8.0f)), _mm512_set1_ps(f0->a[0]));
        table1 = _mm512_mul_ps(_mm512_sub_ps(q_values, _mm512_set1_ps(8.0f)), _mm512_set1_ps(f1->a[0]));
    } else if (type == WEIGHT_Q4_1) { // d * q + m, rounded once
        v = pair_nibbles_of_32(b0 + 4, b1 + 4);
        table0 = _mm512_fmadd_ps(q_values, _mm512_set1_ps(f0->a[0]), _mm512_set1_ps(f0->b[0]));
        table1 = _mm512_fmadd_ps(q_values, _mm512_set1_ps(f1->a[0]), _mm512_set1_ps(f1->b[0]));
    } else { // Q4_K: sub-block s's 32 bytes are its run's, the low nibbles if s is even
        int s = k / 32;
        v = pair_bytes_load(b0 + 16 + s / 2 * 32, b1 + 16 + s / 2 * 32);
        if (s % 2) v = _mm512_srli_epi16(v, 4);
        table0 = _mm512_fmsub_ps(_mm512_set1_ps(f0->a[s]), q_values, _mm512_set1_ps(f0->b[s]));
        table1 = _mm512_fmsub_ps(_mm512_set1_ps(f1->a[s]), q_values, _mm512_set1_ps(f1->b[s]));
    }
    __m512i steps = pair_steps(pair_bytes_and_or(v, 15, second_row), 0, 0); // bit 4 picks row r+1's table
    for (int t = 0; t < 4; t++) {
        __m512i index = t ? _mm512_srli_epi32(steps, 8 * t) : steps;
        acc = _mm512_fmadd_ps(_mm512_permutex2var_ps(table0, index, table1), xv[t], acc);
    }
    return acc;
}

// Four rows of blocks, as dot_rows4_blocks computes them (the same
// lanes and roundings): rows 0 and 1 in one register, 2 and 3 in another.
static inline __attribute__((always_inline)) void dot_rows4_pairs(float *out, const void *w, WeightType type,
                                                                   const float *x, int n, size_t gap, int prefetch) {
    BlockShape b = block_shapes[type];
    const unsigned char *row[4];
    for (int r = 0; r < 4; r++) row[r] = (const unsigned char *)w + weight_bytes(type, r * gap * n);
    __m512 rows01 = _mm512_setzero_ps(), rows23 = _mm512_setzero_ps();
    for (int j = 0; j < n; j += b.weights) {
        size_t at = (size_t)j / b.weights * b.bytes; // the block of weight j
        BlockFactors bf[4];
        for (int r = 0; r < 4; r++) {
            block_factors(&bf[r], row[r] + at, type);
            if (type == WEIGHT_Q6_K) // d * sc * 2^-26, for the lanes' (q - 32) * 2^26
                for (int s = 0; s < 16; s += DOT_LANES)
                    lanes_store(bf[r].a + s, lanes_mul(lanes_load(bf[r].a + s), lanes_set(0x1p-26f)));
            if (type == WEIGHT_Q8_0) bf[r].a[0] *= 0x1p-24f; // d * 2^-24, for the lanes' q * 2^24
            if (type == WEIGHT_Q5_0) bf[r].a[0] *= 0x1p-27f; // for (q - 16) * 2^27
            if (type == WEIGHT_Q5_1) bf[r].a[0] *= 0x1p-26f; // for q * 2^26
            if (type == WEIGHT_Q5_K) lanes_store(bf[r].a, lanes_mul(lanes_load(bf[r].a), lanes_set(0x1p-26f)));
        }
        // bf left in memory (the empty asm may have changed it): a factor is then broadcast
        // from memory, a load, where the compiler's own moves between registers (keeping
        // block_factors' results there) take the port the permutes need
        __asm__("" : "+m"(bf));
#pragma GCC unroll 8
        for (int k = 0; k < b.weights; k += 32) {
            if (prefetch)
                for (int r = 0; r < 4; r++) prefetch_ahead(row[r] + at + k * b.bytes / b.weights, PREFETCH_AHEAD_BYTES);
            __m512 xv[4];
            for (int t = 0; t < 4; t++) xv[t] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + j + k + 8 * t));
            rows01 = pair_run(rows01, row[0] + at, row[1] + at, &bf[0], &bf[1], k, type, xv);
            rows23 = pair_run(rows23, row[2] + at, row[3] + at, &bf[2], &bf[3], k, type, xv);
        }
    }
    out[0] = pair_lanes_sum(rows01, 0), out[gap] = pair_lanes_sum(rows01, 1);
    out[2 * gap] = pair_lanes_sum(rows23, 0), out[3 * gap] = pair_lanes_sum(rows23, 1);
}
#endif

// Four rows of blocks: two rows a register where the build can (ROW_PAIRS: AVX-512 with
// VBMI), else a register a row. The bits are the same.
static inline __attribute__((always_inline)) void dot_rows4_of_blocks(float *out, const void *w, WeightType type,
                                                                       const float *x, int n, size_t gap, int prefetch) {
#if defined(ROW_PAIRS)
    dot_rows4_pairs(out, w, type, x, n, gap, prefetch);
#else
    dot_rows4_blocks(out, w, type, x, n, gap, prefetch);
#endif
}

static inline __attribute__((always_inline)) void dot_rows4_lanes(float *out, const void *w, WeightType type,
                                                                   const float *x, int n, size_t gap, int prefetch) {
    size_t wr[4] = {0, gap * n, 2 * gap * n, 3 * gap * n}; // where each row starts, in weights
    float acc[4][DOT_LANES];
    Lanes lanes[4] = {lanes_zero(), lanes_zero(), lanes_zero(), lanes_zero()};
    int j = 0;
    for (; j + 2 * DOT_LANES <= n; j += 2 * DOT_LANES) {
        if (prefetch)
            for (int r = 0; r < 4; r++)
                prefetch_ahead((const char *)w + weight_bytes(type, wr[r] + j), PREFETCH_AHEAD_BYTES);
        for (int h = j; h < j + 2 * DOT_LANES; h += DOT_LANES) {
            Lanes xv = lanes_load(x + h);
            for (int r = 0; r < 4; r++) lanes[r] = lanes_fma(lanes_load_weights(w, wr[r] + h, type), xv, lanes[r]);
        }
    }
    for (; j + DOT_LANES <= n; j += DOT_LANES) { // at most one vector left
        Lanes xv = lanes_load(x + j);
        for (int r = 0; r < 4; r++) lanes[r] = lanes_fma(lanes_load_weights(w, wr[r] + j, type), xv, lanes[r]);
    }
    for (int r = 0; r < 4; r++) {
        if (j == n) {
            out[r * gap] = lanes_sum(lanes[r]);
            continue;
        }
        lanes_store(acc[r], lanes[r]);
        for (int jj = j, l = 0; jj < n; jj++, l++) acc[r][l] = mul_add(widen(w, wr[r] + jj, type), x[jj], acc[r][l]);
        out[r * gap] = reduce_lanes(acc[r]);
    }
}
#endif

static void dot_rows4(float *out, Matrix w, const float *x, int n, size_t gap, int prefetch) {
#ifdef USE_SIMD
    switch (w.type) { // one copy of the kernel per type
    case WEIGHT_BF16: dot_rows4_lanes(out, w.data, WEIGHT_BF16, x, n, gap, prefetch); break;
    case WEIGHT_F16: dot_rows4_lanes(out, w.data, WEIGHT_F16, x, n, gap, prefetch); break;
    case WEIGHT_Q8_0: dot_rows4_of_blocks(out, w.data, WEIGHT_Q8_0, x, n, gap, prefetch); break;
    case WEIGHT_Q4_0: dot_rows4_of_blocks(out, w.data, WEIGHT_Q4_0, x, n, gap, prefetch); break;
    case WEIGHT_Q4_1: dot_rows4_of_blocks(out, w.data, WEIGHT_Q4_1, x, n, gap, prefetch); break;
    case WEIGHT_Q5_0: dot_rows4_of_blocks(out, w.data, WEIGHT_Q5_0, x, n, gap, prefetch); break;
    case WEIGHT_Q5_1: dot_rows4_of_blocks(out, w.data, WEIGHT_Q5_1, x, n, gap, prefetch); break;
    case WEIGHT_Q4_K: dot_rows4_of_blocks(out, w.data, WEIGHT_Q4_K, x, n, gap, prefetch); break;
    case WEIGHT_Q5_K: dot_rows4_of_blocks(out, w.data, WEIGHT_Q5_K, x, n, gap, prefetch); break;
    case WEIGHT_Q6_K: dot_rows4_of_blocks(out, w.data, WEIGHT_Q6_K, x, n, gap, prefetch); break;
    default: dot_rows4_lanes(out, w.data, WEIGHT_F32, x, n, gap, prefetch); break;
    }
#else
    (void)prefetch; // the plain build leaves prefetching to the hardware
    for (int r = 0; r < 4; r++) out[r * gap] = dot_weights(matrix_at(w, r * gap * n), x, n);
#endif
}

// A parallel region costs a few microseconds (waking the other threads, the barrier
// at its end), the time of some ten thousand multiply-adds. Work smaller than this is
// done by the calling thread alone, without entering OpenMP; so is all work when
// there is only one thread (-T 1), where a region would be all cost.
#define PARALLEL_MIN_WORK 65536

static int worth_a_parallel_region(long work) {
#ifdef _OPENMP
    return work >= PARALLEL_MIN_WORK && omp_get_max_threads() > 1;
#else
    (void)work;
    return 0;
#endif
}

// The reading orders of a decode matmul. Every order computes each output row with
// exactly dot()'s lanes and roundings (one row is one chain, whatever is read beside
// it), so they give the same bits and differ only in the pattern of addresses they
// ask memory for. Which pattern streams fastest depends on the CPU's prefetchers
// (docs/performance.md), so decode's first tokens try each on the model's own layers
// (read_order_layer_begins, section 5), and decode keeps the fastest.
//   quarters-prefetch: four chains (dot_rows4) on the rows i, i + d/4, i + d/2,
//     i + 3d/4, with a software prefetch ahead in each: four plain sequential
//     streams, plus more reads in flight than the hardware prefetchers keep.
//   quarters: the same four streams, left to the hardware prefetchers.
//   adjacent: four chains on the rows 4i .. 4i+3: one stream, read four rows at once.
//   rows: one row at a time (one chain): a single stream, as a plain loop reads it.
typedef enum { READ_QUARTERS_PREFETCH, READ_QUARTERS, READ_ADJACENT, READ_ROWS, N_READ_ORDERS } ReadOrder;
static const char *read_order_names[N_READ_ORDERS] = {"quarters-prefetch", "quarters", "adjacent", "rows"};

// The order decode uses: a property of the machine (and the model's sizes), one for
// the process. quarters-prefetch until the trial chooses: the best where it was
// measured on most machines (docs/performance.md, "ReadOrder").
static ReadOrder read_order = READ_QUARTERS_PREFETCH;

// matmul() for one token, rows in groups of four: group i of d/4 is the rows i, i +
// d/4, i + d/2, i + 3d/4 (quarters) or 4i .. 4i+3 (adjacent, rows). The threads split
// the groups into contiguous bands (matmul_band), one of them also taking the d % 4
// rows left.
static void matmul_band(float *xout, const float *x, Matrix w, int n, int d, int lo, int hi) {
    int quarter = d / 4, prefetch = read_order == READ_QUARTERS_PREFETCH && n >= PREFETCH_MIN_ROW;
    if (read_order == READ_QUARTERS_PREFETCH || read_order == READ_QUARTERS) {
        for (int i = lo; i < hi; i++) dot_rows4(xout + i, matrix_at(w, (size_t)i * n), x, n, quarter, prefetch);
    } else if (read_order == READ_ADJACENT) {
        for (int i = lo; i < hi; i++) dot_rows4(xout + 4 * i, matrix_at(w, (size_t)4 * i * n), x, n, 1, 0);
    } else {
        for (int i = 4 * lo; i < 4 * hi; i++) xout[i] = dot_weights(matrix_at(w, (size_t)i * n), x, n);
    }
}

static void matmul_leftover_rows(float *xout, const float *x, Matrix w, int n, int d) {
    for (int i = 4 * (d / 4); i < d; i++) xout[i] = dot_weights(matrix_at(w, (size_t)i * n), x, n);
}

static void matmul_rows(float *xout, const float *x, Matrix w, int n, int d) {
    matmul_band(xout, x, w, n, d, 0, d / 4);
    matmul_leftover_rows(xout, x, w, n, d);
}

// How the threads split a decode matmul's rows: thread k takes the fraction
// row_split.share[k] of them. The plain split is an equal share each. On shared
// machines one core is at times slower than the other for minutes on end, and with
// equal shares the fast thread waits for the slow one at the end of every matmul.
// So each thread times its own part, and every SPLIT_WINDOW matmuls the shares move
// halfway towards the threads' measured speeds (rows per second), unless they are
// already within SPLIT_DEADBAND of them. The dead band keeps an equal split equal on
// equally fast cores: a thread keeps the same rows from token to token, so what fits
// in its caches stays there (a dynamic schedule gives that up, and was slower).
// Which thread computes a row never changes its arithmetic: the output is the same,
// bit for bit, whatever the shares.
#if defined(_OPENMP) || defined(RUN_TESTING) // (a build without OpenMP has one thread, no split)
#define SPLIT_MAX_THREADS 64 // more threads than this take equal shares
#define SPLIT_WINDOW 64      // matmuls timed between two updates: about one token of a 12-layer model
#define SPLIT_DEADBAND 0.02  // shares this close to the measured speeds' stay as they are

typedef struct {
    int n_threads;                     // the team the shares are for; 0 = not yet set
    double share[SPLIT_MAX_THREADS];   // fractions of the rows, summing to 1
    double seconds[SPLIT_MAX_THREADS]; // each thread's time on its rows since the last update
    int timed;                         // matmuls timed since the last update
} RowSplit;

static RowSplit row_split; // a property of the machine, not of a model: one for the process

static void split_equally(RowSplit *split, int n_threads) {
    memset(split, 0, sizeof(*split));
    split->n_threads = n_threads;
    for (int k = 0; k < n_threads; k++) split->share[k] = 1.0 / n_threads;
}

// Rows [lo, hi) of `rows` for thread k of n_threads: the bands follow each other in
// thread order, thread k's band starting where the shares before it end.
static void band_of_thread(const double *share, int k, int n_threads, int rows, int *lo, int *hi) {
    double before = 0.0;
    for (int j = 0; j < k; j++) before += share[j];
    *lo = (int)(rows * before + 0.5);
    *hi = k == n_threads - 1 ? rows : (int)(rows * (before + share[k]) + 0.5);
    if (*lo > rows) *lo = rows;
    if (*hi > rows) *hi = rows;
    if (*hi < *lo) *hi = *lo;
}

// Moves the shares towards the speeds measured over a window: thread k's speed is
// its share over its time (its rows per second, up to a common factor), and its
// target share speed_k / (sum of speeds), but at least a quarter of an equal share
// (a thread stalled by the host for a whole window must not lose its rows for
// good). If any share is more than SPLIT_DEADBAND from its target, every share
// moves halfway to it. The shares still sum to 1.
static void move_shares_towards_speeds(RowSplit *split) {
    int n = split->n_threads;
    double target[SPLIT_MAX_THREADS], total = 0.0, sum = 0.0, off = 0.0;
    for (int k = 0; k < n; k++) {
        target[k] = split->share[k] / split->seconds[k];
        total += target[k];
    }
    for (int k = 0; k < n; k++) {
        target[k] = fmax(target[k] / total, 0.25 / n);
        sum += target[k];
    }
    for (int k = 0; k < n; k++) off = fmax(off, fabs(target[k] / sum - split->share[k]));
    if (off <= SPLIT_DEADBAND) return;
    for (int k = 0; k < n; k++) split->share[k] += 0.5 * (target[k] / sum - split->share[k]);
}

// Adds one matmul's per-thread times; every SPLIT_WINDOW matmuls, moves the shares
// (unless a clock too coarse to time a band left a thread with no time: no
// evidence) and starts a new window.
static void record_thread_times(RowSplit *split, const double *seconds) {
    int measured = 1;
    for (int k = 0; k < split->n_threads; k++) split->seconds[k] += seconds[k];
    if (++split->timed < SPLIT_WINDOW) return;
    for (int k = 0; k < split->n_threads; k++) measured &= split->seconds[k] > 0.0;
    if (measured) move_shares_towards_speeds(split);
    for (int k = 0; k < split->n_threads; k++) split->seconds[k] = 0.0;
    split->timed = 0;
}
#endif

// Several matrices applied to one token's x (q, k and v; or W1 and W3), split across
// threads in one parallel region: each thread takes its band of the first matrix,
// then, without waiting for the others, its band of the next, so a token pays for
// one region per group instead of one per matrix.
//   Returns 0, having done nothing, when the region did not get the team the shares
// are for (OMP_DYNAMIC), or in a build without OpenMP.
static int matmuls_in_bands(const float *x, int n, const Projection *p, int n_proj) {
#ifdef _OPENMP
    int n_threads = omp_get_max_threads();
    if (n_threads > SPLIT_MAX_THREADS) n_threads = SPLIT_MAX_THREADS;
    if (row_split.n_threads != n_threads) split_equally(&row_split, n_threads);
    double seconds[SPLIT_MAX_THREADS] = {0};
    int whole_team = 1;
#pragma omp parallel num_threads(n_threads)
    {
        int k = omp_get_thread_num(), fits = omp_get_num_threads() == n_threads;
        if (k == 0 && !fits) whole_team = 0;
        double start = omp_get_wtime();
        for (int j = 0; j < n_proj && fits; j++) {
            int lo, hi;
            band_of_thread(row_split.share, k, n_threads, p[j].d / 4, &lo, &hi);
            matmul_band(p[j].xout, x, p[j].w, n, p[j].d, lo, hi);
            if (k == n_threads - 1) matmul_leftover_rows(p[j].xout, x, p[j].w, n, p[j].d);
        }
        seconds[k] = omp_get_wtime() - start;
    }
    if (whole_team) record_thread_times(&row_split, seconds);
    return whole_team;
#else
    (void)x, (void)n, (void)p, (void)n_proj;
    return 0;
#endif
}

// matmuls() for one token: in one parallel region when that is worth it, else on
// the calling thread.
static void matmuls_fast(const float *x, int n, const Projection *p, int n_proj) {
    long work = 0;
    for (int j = 0; j < n_proj; j++) work += (long)n * p[j].d;
    if (worth_a_parallel_region(work) && matmuls_in_bands(x, n, p, n_proj)) return;
    for (int j = 0; j < n_proj; j++) matmul_rows(p[j].xout, x, p[j].w, n, p[j].d);
}

static void matmul_fast(float *xout, const float *x, Matrix w, int n, int d) {
    Projection p = {xout, w, d};
    matmuls_fast(x, n, &p, 1);
}

// 3. Prefill: tiles of rows x tokens -------------------------------------------

// X (B,n) @ W^T (n,d) -> XOUT (B,d) for a block: a tile of TILE_ROWS weight rows
// meets TILE_TOKENS tokens, so each weight loaded feeds several multiply-adds and
// the work is bound by arithmetic, not memory. Each output is still exactly dot()'s
// arithmetic (lanes, order, reduction), so the block result equals, bit for bit,
// what matmul gives token by token.
//   AVX2, NEON and plain C: 4 rows x 3 tokens. Each step of eight floats loads the
//     3 token vectors, then each weight row once, which meets all three: 7 loads
//     for 12 multiply-adds, and 12 accumulators, 3 token vectors and 1 weight
//     vector fill the 16 AVX registers (the 32 NEON registers, a Lanes being two).
//     lanes_keep holds the loaded vectors in registers: otherwise compilers fold
//     the token loads into the x86 multiply-adds that use them, one load per use
//     (15 loads for 12 multiply-adds), and the tile waits on its loads. Four rows
//     per tile also let lanes_sum4 finish the four sums of a token at once.
//   AVX-512: a 16-float register holds two tokens' eight lanes side by side (token
//     b in lanes 0-7, b+1 in 8-15) against a weight vector broadcast to both
//     halves, so one instruction does two of dot()'s steps without changing them.
//     pack_token_pairs first lays the tokens out in pairs so that one load fills
//     such a register. 6 rows x 8 tokens: 24 accumulators, 6 weight vectors and 1
//     token pair fill 31 of the 32 registers.
#ifdef USE_AVX512
#define TILE_ROWS 6
#define TILE_TOKENS 8
#else
#define TILE_ROWS 4
#define TILE_TOKENS 3
#endif

#ifdef USE_AVX512
// a block rounded up to whole tiles still fits the block-sized buffers (pack_token_pairs)
_Static_assert(PREFILL_BLOCK % TILE_TOKENS == 0, "PREFILL_BLOCK must be a multiple of TILE_TOKENS");
#endif

#ifdef USE_AVX512
// packed[(p * chunks + c) * 16 + h * 8 + l] = x[2p + h][8c + l]: tokens in pairs,
// eight floats of each in turn (chunks = n / 8, rounded down). The last tile is
// padded with copies of the last token, whose results matmul_tile drops.
static void pack_token_pair(float *packed, const float *x, int B, int n, int p) {
    int chunks = n / DOT_LANES;
    for (int c = 0; c < chunks; c++)
        for (int h = 0; h < 2; h++) {
            int token = 2 * p + h < B ? 2 * p + h : B - 1;
            memcpy(packed + ((size_t)p * chunks + c) * 16 + h * 8, x + (size_t)token * n + c * 8,
                   DOT_LANES * sizeof(float));
        }
}

// the pairs of B tokens rounded up to whole tiles
static int token_pairs_of(int B) { return (B + TILE_TOKENS - 1) / TILE_TOKENS * TILE_TOKENS / 2; }

static void pack_token_pairs(float *packed, const float *x, int B, int n) {
    for (int p = 0; p < token_pairs_of(B); p++) pack_token_pair(packed, x, B, n, p);
}
#endif

#if defined(USE_AVX512)
// reduce_lanes() for two tokens in each of four registers a, b, c, d at once. Each
// register holds two tokens' eight lanes side by side; the eight sums leave in one
// register, [a, b, c, d] of the first token in lanes 0-3 and of the second token in
// lanes 8-11. Each step adds two registers' neighbouring lanes, shuffled side by side
// (shuffle_ps takes lanes 0 and 2, or 1 and 3, of each four from both), so every sum
// is still reduce_lanes' ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), in eleven instructions
// where reducing the registers one at a time (a swap and an add per step, three
// steps each) takes twenty-four: in a tile over short rows the sums are a large
// share of the time.
static inline __m512 reduce_four_lane_pairs(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD)); // a01 a23 b01 b23
    __m512 cd = _mm512_add_ps(_mm512_shuffle_ps(c, d, 0x88), _mm512_shuffle_ps(c, d, 0xDD)); // c01 c23 d01 d23
    __m512 v = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x88), _mm512_shuffle_ps(ab, cd, 0xDD)); // a0123 .. d0123
    return _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1)); // + a4567 .. d4567, from the next four lanes
}
#endif

#if defined(USE_AVX512)
_Static_assert(TILE_ROWS == 6 && TILE_TOKENS % 4 == 0, "the AVX-512 tile's sums are stored in groups of four");

// Stores four sums of reduce_four_lane_pairs for token b and token b + 1: the tile's
// rows r0 .. r0 + 3 (r0 = 0) for one token pair, or (r0 = 4) rows 4 and 5 for tokens
// b, b + 2 (first token of each pair in lanes 0-3) and b + 1, b + 3 (lanes 8-11).
// n_tokens: how many of the tile's tokens from b on are real; rows and tokens past the
// tile's real ones are not stored.
static void store_sums(float *xout, int d, int i0, int n_rows, int b, int n_tokens, int r0, __m512 sums) {
    float s[16];
    _mm512_storeu_ps(s, sums);
    for (int half = 0; half < 2; half++) { // the first token of the pair(s), then the second
        for (int k = 0; k < 4; k++) {
            int r = r0 == 0 ? k : 4 + k % 2, token = r0 == 0 ? half : half + 2 * (k / 2);
            if (r < n_rows && token < n_tokens) xout[(size_t)(b + token) * d + i0 + r] = s[8 * half + k];
        }
    }
}
#endif

// One tile: rows i0 .. i0 + n_rows - 1 and tokens b0 .. b0 + n_tokens - 1; row i and
// token b give xout[b * d + i] (d: the length of an output row). A short tile
// (fewer than TILE_ROWS rows or TILE_TOKENS tokens, at the end of a matrix or block)
// computes copies of its last row or token and keeps only the real results, which is
// cheaper than one dot() per leftover row and token. When n is a multiple of eight
// the SIMD paths sum the lanes in registers; otherwise they hand their lanes to the
// plain loop at the end, which adds the tail and calls reduce_lanes.
//   prefetch, prefetch_lines: cache lines of weights that a later tile will read;
// one is requested into L2 per step of eight multiply-adds (see matmul_tiled).
//   w: weights of `type` (see dot_lanes: matmul_tile below calls this with the type
// as a constant).
static inline __attribute__((always_inline)) void matmul_tile_of(float *xout, const float *x, const float *packed,
                                                                  const void *w, WeightType type, int n, int d, int i0,
                                                                  int n_rows, int b0, int n_tokens,
                                                                  const char *prefetch, int prefetch_lines) {
    float acc[TILE_ROWS][TILE_TOKENS][DOT_LANES];
    size_t wr[TILE_ROWS]; // where each row starts, in weights from w (the tile's first row, row i0)
    const float *xb[TILE_TOKENS];
    for (int r = 0; r < TILE_ROWS; r++) wr[r] = (size_t)(r < n_rows ? r : n_rows - 1) * n;
    for (int b = 0; b < TILE_TOKENS; b++) xb[b] = x + (size_t)(b0 + (b < n_tokens ? b : n_tokens - 1)) * n;
    int j = 0;
#if defined(USE_AVX512)
    enum { PAIRS = TILE_TOKENS / 2 };
    int chunks = n / DOT_LANES;
    const float *pair[PAIRS];
    for (int p = 0; p < PAIRS; p++) pair[p] = packed + (size_t)(b0 / 2 + p) * chunks * 16;
    __m512 lanes[TILE_ROWS][PAIRS];
    for (int r = 0; r < TILE_ROWS; r++)
        for (int p = 0; p < PAIRS; p++) lanes[r][p] = _mm512_setzero_ps();
    for (int c = 0; c < chunks; c++, j += DOT_LANES) {
        if (c < prefetch_lines) __builtin_prefetch(prefetch + (size_t)c * 64, 0, 2);
        __m512 wv[TILE_ROWS];
        for (int r = 0; r < TILE_ROWS; r++) wv[r] = _mm512_broadcast_f32x8(lanes_load_weights(w, wr[r] + j, type));
        for (int p = 0; p < PAIRS; p++) {
            __m512 xv = _mm512_loadu_ps(pair[p] + (size_t)c * 16);
            for (int r = 0; r < TILE_ROWS; r++) lanes[r][p] = _mm512_fmadd_ps(wv[r], xv, lanes[r][p]);
        }
    }
    if (j == n) {
        // rows 0-3 of each token pair, then rows 4-5 of two token pairs, four sums at a time
        for (int p = 0; p < PAIRS; p++)
            store_sums(xout, d, i0, n_rows, b0 + 2 * p, n_tokens - 2 * p, 0,
                       reduce_four_lane_pairs(lanes[0][p], lanes[1][p], lanes[2][p], lanes[3][p]));
        for (int p = 0; p < PAIRS; p += 2)
            store_sums(xout, d, i0, n_rows, b0 + 2 * p, n_tokens - 2 * p, 4,
                       reduce_four_lane_pairs(lanes[4][p], lanes[5][p], lanes[4][p + 1], lanes[5][p + 1]));
        return;
    }
    for (int r = 0; r < TILE_ROWS; r++)
        for (int p = 0; p < PAIRS; p++) {
            float both[2 * DOT_LANES];
            _mm512_storeu_ps(both, lanes[r][p]);
            memcpy(acc[r][2 * p], both, sizeof(acc[r][2 * p]));
            memcpy(acc[r][2 * p + 1], both + DOT_LANES, sizeof(acc[r][2 * p + 1]));
        }
#elif defined(USE_SIMD)
    (void)packed;
    _Static_assert(TILE_ROWS == 4, "lanes_sum4 finishes four rows");
    Lanes lanes[TILE_ROWS][TILE_TOKENS];
    for (int r = 0; r < TILE_ROWS; r++)
        for (int b = 0; b < TILE_TOKENS; b++) lanes[r][b] = lanes_zero();
    int steps = n / DOT_LANES;
    if (prefetch_lines > steps) prefetch_lines = steps;
    // pass 0: the steps that also ask for a line of the next tile; pass 1: the rest
    // (so the main loop has no test for it)
    for (int pass = 0; pass < 2; pass++) {
        int end = (pass == 0 ? prefetch_lines : steps) * DOT_LANES;
        for (; j < end; j += DOT_LANES) {
            if (pass == 0) __builtin_prefetch(prefetch + (size_t)(j / DOT_LANES) * 64, 0, 2);
            Lanes xv[TILE_TOKENS];
            for (int b = 0; b < TILE_TOKENS; b++) xv[b] = lanes_keep(lanes_load(xb[b] + j));
            for (int r = 0; r < TILE_ROWS; r++) {
                Lanes wv = lanes_keep(lanes_load_weights(w, wr[r] + j, type));
                for (int b = 0; b < TILE_TOKENS; b++) lanes[r][b] = lanes_fma(wv, xv[b], lanes[r][b]);
            }
        }
    }
    if (j == n) { // a token's four rows are adjacent in xout
        for (int b = 0; b < n_tokens; b++) {
            float sums[TILE_ROWS], *out = xout + (size_t)(b0 + b) * d + i0;
            lanes_sum4(sums, lanes[0][b], lanes[1][b], lanes[2][b], lanes[3][b]);
            for (int r = 0; r < n_rows; r++) out[r] = sums[r];
        }
        return;
    }
    for (int r = 0; r < TILE_ROWS; r++)
        for (int b = 0; b < TILE_TOKENS; b++) lanes_store(acc[r][b], lanes[r][b]);
#else
    (void)packed;
    memset(acc, 0, sizeof(acc));
    for (; j + DOT_LANES <= n; j += DOT_LANES) {
        if (j / DOT_LANES < prefetch_lines) __builtin_prefetch(prefetch + (size_t)(j / DOT_LANES) * 64, 0, 2);
        for (int r = 0; r < TILE_ROWS; r++)
            for (int b = 0; b < TILE_TOKENS; b++)
                for (int l = 0; l < DOT_LANES; l++)
                    acc[r][b][l] = mul_add(widen(w, wr[r] + j + l, type), xb[b][j + l], acc[r][b][l]);
    }
#endif
    for (int r = 0; r < n_rows; r++)
        for (int b = 0; b < n_tokens; b++) {
            for (int jj = j, l = 0; jj < n; jj++, l++)
                acc[r][b][l] = mul_add(widen(w, wr[r] + jj, type), xb[b][jj], acc[r][b][l]);
            xout[(size_t)(b0 + b) * d + i0 + r] = reduce_lanes(acc[r][b]);
        }
}

// w: the tile's rows, from row i0 of the matrix on
static void matmul_tile(float *xout, const float *x, const float *packed, Matrix w, int n, int d, int i0, int n_rows,
                        int b0, int n_tokens, const char *prefetch, int prefetch_lines) {
    if (w.type == WEIGHT_F32)
        matmul_tile_of(xout, x, packed, w.data, WEIGHT_F32, n, d, i0, n_rows, b0, n_tokens, prefetch, prefetch_lines);
    else // widened in the tile, the type a variable (matmul_tiled widens a row tile once when it can)
        matmul_tile_of(xout, x, packed, w.data, w.type, n, d, i0, n_rows, b0, n_tokens, prefetch, prefetch_lines);
}

#ifdef USE_SIMD
// out = count weights of a 16-bit type widened, eight at a time as the kernels load them
static inline __attribute__((always_inline)) void widen_lanes(float *out, const void *w, WeightType type,
                                                               size_t count) {
    size_t i = 0;
    for (; i + DOT_LANES <= count; i += DOT_LANES) lanes_store(out + i, lanes_load_weights(w, i, type));
    for (; i < count; i++) out[i] = widen(w, i, type);
}
// out = count weights of a block type (whole blocks) widened, a block's factors once
static inline __attribute__((always_inline)) void widen_blocks(float *out, const void *w, WeightType type,
                                                                size_t count) {
    BlockShape b = block_shapes[type];
    for (size_t i = 0; i < count; i += b.weights) {
        const unsigned char *block = (const unsigned char *)w + i / b.weights * b.bytes;
        BlockFactors bf;
        block_factors(&bf, block, type);
        for (int k = 0; k < b.weights; k += 32) {
            RunFactors f = run_factors(block, k, type, &bf);
            for (int h = 0; h < 32; h += DOT_LANES)
                lanes_store(out + i + k + h, lanes_block_values(block, k + h, type, f));
        }
    }
}
#endif

// out = the first `rows` rows of w (n weights each) widened to float32, eight at a
// time as the kernels load them.
static void widen_rows(float *out, Matrix w, int n, int rows) {
    size_t count = (size_t)rows * n, i = 0;
#ifdef USE_SIMD
    switch (w.type) { // one copy per type
    case WEIGHT_BF16: widen_lanes(out, w.data, WEIGHT_BF16, count); return;
    case WEIGHT_F16: widen_lanes(out, w.data, WEIGHT_F16, count); return;
    case WEIGHT_Q8_0: widen_blocks(out, w.data, WEIGHT_Q8_0, count); return;
    case WEIGHT_Q4_0: widen_blocks(out, w.data, WEIGHT_Q4_0, count); return;
    case WEIGHT_Q4_1: widen_blocks(out, w.data, WEIGHT_Q4_1, count); return;
    case WEIGHT_Q5_0: widen_blocks(out, w.data, WEIGHT_Q5_0, count); return;
    case WEIGHT_Q5_1: widen_blocks(out, w.data, WEIGHT_Q5_1, count); return;
    case WEIGHT_Q4_K: widen_blocks(out, w.data, WEIGHT_Q4_K, count); return;
    case WEIGHT_Q5_K: widen_blocks(out, w.data, WEIGHT_Q5_K, count); return;
    case WEIGHT_Q6_K: widen_blocks(out, w.data, WEIGHT_Q6_K, count); return;
    default: break;
    }
#endif
    for (; i < count; i++) out[i] = widen(w.data, i, w.type);
}

// matmul_tokens() for a block. scratch: room for B * n floats, B rounded up to a
// multiple of TILE_TOKENS (the AVX-512 path packs the tokens there). Each thread
// takes eight row tiles at a time (dynamic scheduling, so that a core slowed by the
// host does not hold up the other) and runs each row tile against every token tile
// of the block. A row tile's weights come from memory during its first token tile,
// and the arithmetic waits for them; so while one row tile is at work, the weights
// of the next are requested into L2, a share per token tile, spread over the steps
// of the loop. A row tile of any type but float32 is widened once, into float32
// rows of the thread's own (the values widen() gives), and every token tile reads
// those: the widening (for a block, a few integer steps, a conversion and a multiply
// per weight) is done once a row tile rather than once for each of its token tiles. If that memory cannot be had, the tiles widen the
// blocks themselves (the same bits, more slowly).
static void matmul_tiled(float *xout, const float *x, Matrix w, int B, int n, int d, float *scratch) {
    int token_tiles = (B + TILE_TOKENS - 1) / TILE_TOKENS;
#pragma omp parallel
    {
        float *widened = w.type != WEIGHT_F32 ? malloc(sizeof(float) * TILE_ROWS * n) : NULL;
#ifdef USE_AVX512
        // the threads pack the token pairs together, and wait for each other at the
        // end of this loop
        int p;
#pragma omp for
        for (p = 0; p < token_pairs_of(B); p++) pack_token_pair(scratch, x, B, n, p);
#endif
        int i;
#pragma omp for schedule(dynamic, 8)
        for (i = 0; i < d; i += TILE_ROWS) {
            int rows = d - i < TILE_ROWS ? d - i : TILE_ROWS;
            int next = i + rows, next_rows = d - next < TILE_ROWS ? d - next : TILE_ROWS;
            const char *next_w = (const char *)w.data + weight_bytes(w.type, (uint64_t)next * n);
            long next_lines = next < d ? ((long)weight_bytes(w.type, (uint64_t)next_rows * n) + 63) / 64 : 0;
            Matrix tile = matrix_at(w, (size_t)i * n);
            if (widened) {
                widen_rows(widened, tile, n, rows);
                tile = f32_matrix(widened);
            }
            for (int t = 0; t < token_tiles; t++) {
                long first = next_lines * t / token_tiles, last = next_lines * (t + 1) / token_tiles;
                int b = t * TILE_TOKENS;
                matmul_tile(xout, x, scratch, tile, n, d, i, rows, b, B - b < TILE_TOKENS ? B - b : TILE_TOKENS,
                            next_w + first * 64, (int)(last - first));
            }
        }
        free(widened);
    }
}

// 4. Attention and SwiGLU across threads; argmax ---------------------------------

// A decoding step reads each head's cached keys, then its values: two short streams
// (pos x head_size floats each) that the weights streamed since the last token have
// pushed out of the caches. Streams this short end before the hardware prefetchers
// are up to speed, so the loops below ask for the lines ATTENTION_PREFETCH_BYTES
// ahead, as decode's matmul does for its rows (section 2). A hint: it changes no
// arithmetic, and never faults past the cache's end.
#define ATTENTION_PREFETCH_BYTES 4096

// Asks for the lines of the n floats at p, ATTENTION_PREFETCH_BYTES further on.
static inline void prefetch_floats_ahead(const float *p, int n) {
#ifdef USE_SIMD
    for (int i = 0; i < n; i += 16) prefetch_ahead(p + i, ATTENTION_PREFETCH_BYTES); // 16 floats: a 64-byte line
#else
    (void)p, (void)n; // the plain build leaves prefetching to the hardware
#endif
}

// attention_scores(): four keys at a time (dot_rows4: four independent chains, each
// exactly one dot()); a single chain is latency-bound, and long prompts make this
// loop hot.
static void attention_scores_fast(float *att, const float *q, const float *keys, int n, int head_size) {
    int tt = 0;
    for (; tt + 4 <= n; tt += 4) {
        prefetch_floats_ahead(keys + (size_t)tt * head_size, 4 * head_size);
        dot_rows4(att + tt, f32_matrix(keys + (size_t)tt * head_size), q, head_size, 1, 0);
    }
    for (; tt < n; tt++) att[tt] = dot(q, keys + (size_t)tt * head_size, head_size);
}

// attention_values(): four values per pass over out,
//   out = (((out + a0 v0) + a1 v1) + a2 v2) + a3 v3,
// the same additions in the same order as one value at a time, with a quarter of the
// loads and stores of out.
static void attention_values_fast(float *out, const float *att, const float *values, int n, int head_size) {
    int tt = 0;
    for (; tt + 4 <= n; tt += 4) {
        const float *v0 = values + (size_t)tt * head_size, *v1 = v0 + head_size, *v2 = v1 + head_size,
                    *v3 = v2 + head_size;
        prefetch_floats_ahead(v0, 4 * head_size);
        float a0 = att[tt], a1 = att[tt + 1], a2 = att[tt + 2], a3 = att[tt + 3];
        for (int i = 0; i < head_size; i++) out[i] = (((out[i] + a0 * v0[i]) + a1 * v1[i]) + a2 * v2[i]) + a3 * v3[i];
    }
    for (; tt < n; tt++) {
        const float *v = values + (size_t)tt * head_size;
        float a = att[tt];
        for (int i = 0; i < head_size; i++) out[i] += a * v[i];
    }
}

// attention_head()'s scores for a block of B > 1 tokens: head h's products q_b . k_t for
// all of them at once, a matrix product Q_h K_h^T (tokens x cache slots) that runs on
// the prefill tile, the cached keys of the head being the rows of a matrix (they are
// consecutive, head_size apart). Each product is dot(k_t, q_b), exactly what
// attention_scores computes for one token (the product is symmetric), into key t's slot. Token b
// needs positions first_visible .. pos0 + b; a tile of tokens computes from its first
// token's first visible position to its last token's position (one or two runs of
// slots on a sliding layer's ring: at most W + TILE_TOKENS - 1 positions, fewer than
// the ring holds), and the products outside a token's own window are never read.
static void attention_block_scores(Transformer *t, int l, int h, int B, int pos0) {
    const Config *c = &t->config;
    RunState *s = &t->state;
    int head_size = c->layer[l].head_size, group = c->n_heads / c->layer[l].n_kv_heads, q_dim = c->n_heads * head_size;
    const float *keys = s->key_cache + kv_cache_offset(c, l, h / group, 0);
    // the tile wants each token's query contiguous (and, for AVX-512, packed in pairs)
    float *q = s->q_head + (size_t)h * PREFILL_BLOCK * head_size;
    float *packed = s->q_pairs + (size_t)h * PREFILL_BLOCK * head_size;
    for (int b = 0; b < B; b++)
        memcpy(q + (size_t)b * head_size, s->q + (size_t)b * q_dim + h * head_size, head_size * sizeof(float));
#ifdef USE_AVX512
    pack_token_pairs(packed, q, B, head_size);
#endif
    // token b's scores are the row att + b * (n_heads * max_cache_positions), as attention_head reads them
    float *att = s->att + (size_t)h * c->max_cache_positions;
    int row_stride = c->n_heads * c->max_cache_positions;
    for (int b = 0; b < B; b += TILE_TOKENS) {
        int n_tokens = B - b < TILE_TOKENS ? B - b : TILE_TOKENS;
        SlotRuns runs = slot_runs(first_visible(c, l, pos0 + b), pos0 + b + n_tokens - 1, c->layer[l].cache_positions);
        for (int r = 0; r < 2; r++) {
            int j0 = runs.start[r], end = j0 + runs.n[r];
            for (int i = j0; i < end; i += TILE_ROWS)
                matmul_tile(att, q, packed, f32_matrix(keys + (size_t)i * head_size), head_size, row_stride, i,
                            end - i < TILE_ROWS ? end - i : TILE_ROWS, b, n_tokens, NULL, 0);
        }
    }
}

// attention(): whether its heads go across threads, each thread taking all tokens of
// its heads: when the work is worth a parallel region. Inspect's sums are not safe to
// share, so it runs on one thread.
//   The work is the scores' multiply-adds, in a matmul's units. In a decoding step
// each comes with a wait on memory (the keys and values come from DRAM, above), and
// with its share of the values' pass and the softmax, so that one costs several
// times a decode matmul's multiply-add: each counts eight (the measurement is in
// docs/performance.md, "DECODE_ATTENTION_WEIGHT").
#define DECODE_ATTENTION_WEIGHT 8

static int attention_across_threads(const Transformer *t, int l, int B, int pos0) {
    const Config *c = &t->config;
    int keys = pos0 + B < c->layer[l].cache_positions ? pos0 + B : c->layer[l].cache_positions; // at most a ring
    long work = (long)B * c->n_heads * keys * c->layer[l].head_size; // the scores' multiply-adds
    if (B == 1) work *= DECODE_ATTENTION_WEIGHT;
    return worth_a_parallel_region(work) && !t->state.inspect;
}

// swiglu() split across threads when a block makes it worth a region (its expf per
// hidden unit and token adds up over a prompt). Returns 0 when it is not.
static int swiglu_fast(float *hb, const float *hb2, long n) {
    if (!worth_a_parallel_region(n * 16)) return 0; // an expf costs some sixteen multiply-adds
    long i;
#pragma omp parallel for
    for (i = 0; i < n; i++) hb[i] = swiglu_unit(hb[i], hb2[i]);
    return 1;
}

// sample_argmax() in two passes that compilers vectorize. Its one loop compares
// each value with the best so far, read back through the index it just changed: a
// chain of dependent steps, a few percent of a small model's decoding step over a
// large vocabulary (docs/performance.md, "argmax_fast"). Here the first pass finds the
// largest value m, sixteen independent running maxima side by side (each, like
// the loop, replaced only by a greater value, so NaN never enters unless p[0] is
// NaN); the second finds where m first occurs, sixteen comparisons at a time.
// That is the loop's answer: the first index of the largest value (-0 and +0
// being equal for both). When p[0] is NaN, m is NaN, equal to nothing, and the
// answer is 0, as the loop's.
#define ARGMAX_LANES 16

static int argmax_fast(const float *p, int n) {
    float best[ARGMAX_LANES];
    for (int l = 0; l < ARGMAX_LANES; l++) best[l] = p[0];
    int i = 0;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int l = 0; l < ARGMAX_LANES; l++) best[l] = p[i + l] > best[l] ? p[i + l] : best[l];
    float m = best[0];
    for (int l = 1; l < ARGMAX_LANES; l++) m = best[l] > m ? best[l] : m;
    for (; i < n; i++) m = p[i] > m ? p[i] : m;
    for (i = 0; i + ARGMAX_LANES <= n; i += ARGMAX_LANES) { // the block where m first occurs
        int found = 0;
        for (int l = 0; l < ARGMAX_LANES; l++) found |= p[i + l] == m;
        if (found) break;
    }
    for (; i < n; i++)
        if (p[i] == m) return i;
    return 0; // m is NaN
}

// 5. Memory, threads and the reading order --------------------------------------

// The KV cache, in 2 MB pages where the system gives them. Every decoded token's
// attention reads the whole cache as far as the positions go, one head's run of
// keys, then its values; in 4 KB pages that is a new page every 64 cache lines, a
// TLB miss and a fresh start for the hardware prefetchers, which do not follow a
// stream into the next 4 KB page. Linux backs anonymous memory with 2 MB pages only
// where madvise(MADV_HUGEPAGE) asks (transparent_hugepage=madvise is common), and
// only in 2 MB-aligned ranges, hence the alignment and the size rounded up. The
// price is memory: a page is backed whole once any of it is written, so a short run
// backs nearly the whole cache, as llama.cpp's cache (cleared in full up front)
// always is. It is a hint: where it is not taken, nothing else changes.
#define HUGE_PAGE_BYTES ((size_t)2 << 20)

static float *alloc_floats_in_huge_pages(size_t n) {
    float *p = alloc_floats_aligned(n, HUGE_PAGE_BYTES);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, round_up(n * sizeof(float), HUGE_PAGE_BYTES), MADV_HUGEPAGE); // a hint: failure changes nothing
#endif
    return p;
}

// Pins OpenMP thread k to the k-th core this process may use (Linux), unless the
// user chose a binding (OMP_PROC_BIND), there is one thread, or there are more
// threads than cores. Unpinned, a worker that went to sleep between parallel regions
// can be woken on the core of the thread that wakes it, and wait there until the
// scheduler moves it. One thread has no workers to misplace, so it stays unpinned:
// pinned to the first core, it could not leave that core when another process is
// busy there.
static void pin_threads(void) {
#if defined(_OPENMP) && defined(__linux__)
    cpu_set_t allowed;
    if (omp_get_proc_bind() != omp_proc_bind_false || sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
    if (omp_get_max_threads() < 2 || omp_get_max_threads() > CPU_COUNT(&allowed)) return;
#pragma omp parallel
    {
        int k = omp_get_thread_num(), seen = 0;
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
            if (!CPU_ISSET(cpu, &allowed) || seen++ != k) continue;
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            sched_setaffinity(0, sizeof(one), &one); // 0: the calling thread; a hint, failure changes nothing
            break;
        }
    }
#endif
}

// Reads one byte of every page of the mapping, the threads splitting the pages. The
// first access of a process to a page costs about a microsecond even when the page
// is in the page cache (the process's page tables are cold, not the data); one read
// per page pays all of it up front.
static void touch_pages(const unsigned char *base, size_t size) {
    long n_pages = (long)((size + 4095) / 4096), i;
    unsigned sum = 0;
#pragma omp parallel for reduction(+ : sum)
    for (i = 0; i < n_pages; i++) sum += base[(size_t)i * 4096];
    volatile unsigned sink = sum; // keeps the reads
    (void)sink;
}

// Writes zeros to the run state's block-sized arrays and to the KV cache at
// positions 0 .. n_positions-1 of every layer and head (the threads splitting the
// cache's (layer, head) runs), so that the memory the run will use is mapped in
// before it is timed: the arrays are allocated lazily, and each page comes with a
// page fault when it is first written. llama.cpp clears its whole KV cache when it
// creates a context, for the same reason; here only the positions this run uses.
static void touch_run_state(Transformer *t, int n_positions) {
    const Config *c = &t->config;
    RunState *s = &t->state;
    size_t B = PREFILL_BLOCK, dim = c->dim, kv_dim = c->max_kv_dim, hidden = c->max_hidden, q_dim = c->max_q_dim;
    size_t wide = max_int(dim, q_dim), P = c->per_layer_dim;
    float *arrays[] = {s->x, s->xb, s->xb2, s->q, s->q_head, s->q_pairs, s->k, s->v, s->hb, s->hb2, s->scratch, s->att,
                       s->logits, s->pl, s->plb};
    size_t lengths[] = {B * dim, B * wide, B * dim, B * q_dim, B * q_dim, B * q_dim, B * kv_dim, B * kv_dim, B * hidden,
                        B * hidden, B * max_int(max_int(hidden, wide), P), B * c->n_heads * (size_t)c->max_cache_positions,
                        (size_t)c->vocab_size, B * c->n_layers * P, B * P}; // logits: the one row generation uses
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++)
        if (arrays[i]) memset(arrays[i], 0, lengths[i] * sizeof(float));
    // each cached head's run of positions, by (layer, kv head); a layer that shares
    // another's cache (Gemma 4), or has fewer kv heads than the widest, has fewer runs
    int max_kv_heads = 0, r;
    for (int l = 0; l < c->n_layers; l++) max_kv_heads = max_int(max_kv_heads, c->layer[l].n_kv_heads);
    int n_runs = c->n_layers * max_kv_heads;
#pragma omp parallel for
    for (r = 0; r < n_runs; r++) {
        int l = r / max_kv_heads, kvh = r % max_kv_heads;
        if (c->layer[l].kv_source != l || kvh >= c->layer[l].n_kv_heads) continue;
        int positions = n_positions < c->layer[l].cache_positions ? n_positions : c->layer[l].cache_positions; // a ring
        size_t at = kv_cache_offset(c, l, kvh, 0), bytes = (size_t)positions * c->layer[l].head_size * sizeof(float);
        memset(s->key_cache + at, 0, bytes);
        memset(s->value_cache + at, 0, bytes);
    }
}

// Before the model runs: brings the mapped weights and the run state (the KV cache
// as far as the run will use it) into memory, and starts (and pins) the threads, so
// that the clock of the first prefill times inference, not loading; left to the
// first forward pass, the pages of the mapping are faulted in one at a time and
// OpenMP starts its threads at the first parallel region. MADV_POPULATE_READ (Linux
// 5.14) maps every page in one call; where it is missing, the pages come as they are
// touched. The whole process takes as long either way (what is timed is what
// inference costs, as llama.cpp's llama-bench does with a warm-up run).
static void prepare_to_run(Transformer *t, int n_positions) {
    pin_threads();
#ifdef MADV_POPULATE_READ
    madvise(t->mapped, t->file_size, MADV_POPULATE_READ); // a hint: failure changes nothing
#endif
    touch_pages(t->mapped, t->file_size);
    touch_run_state(t, n_positions);
}

// Chooses the decode matmul's reading order (section 2) on this machine, for this
// model, by decode itself. Every order computes the same bits, so decode's first
// tokens can try them on their own work: the k-th layer decoded (forward_block
// calls read_order_layer_begins and _ends around each layer of a one-token block)
// uses the order (k + k / N) mod N of the N orders, so the orders take turns and
// which goes first rotates from one round of N layers to the next (on a busy
// machine the scheduler's time slices recur with a period of their own, and a fixed
// sequence could put the same order at the same phase each round). A layer's time,
// its matmuls and everything between them (all layers have the same shapes, and
// attention the same length within a token), is a sample of its order. After
// READ_ORDER_SAMPLES samples of each, decode keeps the order whose lower quartile
// is fastest: the speed it keeps when not interrupted, without resting on one lucky
// sample (the minimum), while samples the host's scheduler interrupted fall above
// it. An order replaces the default only when it is READ_ORDER_MARGIN faster: a
// closer result is noise.
//   The samples are decode's own reads from memory, with the rest of the forward
// pass between them, and trying costs only the slower orders' extra time: no weight
// is read for the trial alone. (The first version timed the orders at start-up, on
// passes of their own over the layers, and delayed the first token: docs/performance.md.)
// Models whose matrices fit in a large cache (READ_ORDER_MIN_BYTES) are not tried:
// decode there is not bound by streaming memory, and the choice cannot matter.
#define READ_ORDER_MIN_BYTES (8 << 20)
#define READ_ORDER_SAMPLES 16
#define READ_ORDER_MARGIN 0.03

typedef enum { TRIAL_NONE, TRIAL_FORCED, TRIAL_SMALL, TRIAL_RUNNING, TRIAL_DONE } TrialState;

typedef struct {
    TrialState state;
    double matrix_bytes;                                  // the model's, for -v when not tried
    long layers;                                          // layers tried so far
    double started;                                       // when the layer being tried began
    double seconds[N_READ_ORDERS][READ_ORDER_SAMPLES];    // each order's samples, in the order taken
    double quartile[N_READ_ORDERS];                       // each order's lower quartile, once done
} ReadOrderTrial;

static ReadOrderTrial read_order_trial; // one for the process, as read_order is

// At start-up: the order from RUN_READ_ORDER (forced >= 0), or a trial on decode's
// first tokens for a model too large for a cache.
static void start_read_order_trial(const Config *c, const TransformerWeights *w, int forced) {
    ReadOrderTrial *trial = &read_order_trial;
    memset(trial, 0, sizeof(*trial));
    trial->matrix_bytes = matrix_bytes_per_token(c, w, NULL);
    if (forced >= 0) {
        read_order = (ReadOrder)forced;
        trial->state = TRIAL_FORCED;
    } else {
        trial->state = trial->matrix_bytes < READ_ORDER_MIN_BYTES ? TRIAL_SMALL : TRIAL_RUNNING;
    }
}

static int compare_seconds(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The trial's end: each order's lower quartile, and the fastest kept if it beats the
// default by the margin.
static void end_read_order_trial(ReadOrderTrial *trial) {
    ReadOrder fastest = READ_QUARTERS_PREFETCH, chosen = READ_QUARTERS_PREFETCH;
    for (int o = 0; o < N_READ_ORDERS; o++) {
        qsort(trial->seconds[o], READ_ORDER_SAMPLES, sizeof(double), compare_seconds);
        trial->quartile[o] = trial->seconds[o][READ_ORDER_SAMPLES / 4];
        if (trial->quartile[o] < trial->quartile[fastest]) fastest = (ReadOrder)o;
    }
    if (trial->quartile[fastest] < trial->quartile[chosen] * (1.0 - READ_ORDER_MARGIN)) chosen = fastest;
    read_order = chosen;
    trial->state = TRIAL_DONE;
}

// Around each layer of a one-token block: while the trial runs, the layer uses the
// next order in turn, and its time becomes that order's sample.
static void read_order_layer_begins(void) {
    ReadOrderTrial *trial = &read_order_trial;
    if (trial->state != TRIAL_RUNNING) return;
    long k = trial->layers;
    read_order = (ReadOrder)((k + k / N_READ_ORDERS) % N_READ_ORDERS);
    trial->started = time_in_s();
}

static void read_order_layer_ends(void) {
    ReadOrderTrial *trial = &read_order_trial;
    if (trial->state != TRIAL_RUNNING) return;
    long k = trial->layers++;
    trial->seconds[read_order][k / N_READ_ORDERS] = time_in_s() - trial->started; // one sample per round
    if (trial->layers == (long)N_READ_ORDERS * READ_ORDER_SAMPLES) end_read_order_trial(trial);
    else read_order = READ_QUARTERS_PREFETCH; // the classifier, after the layers, reads in the default
}

// -v: which order decode used, and why, on stderr (at the end: the trial runs
// during decode, whose text is on stdout).
static void print_read_order(void) {
    const ReadOrderTrial *trial = &read_order_trial;
    fprintf(stderr, "run: decode read order: %s (", read_order_names[read_order]);
    if (trial->state == TRIAL_FORCED) {
        fprintf(stderr, "RUN_READ_ORDER");
    } else if (trial->state == TRIAL_SMALL) {
        fprintf(stderr, "not tried: %.1f MB of matrices fit in a cache", trial->matrix_bytes / 1e6);
    } else if (trial->state == TRIAL_RUNNING) {
        fprintf(stderr, "the default: decode ended %ld layers into the trial of %d", trial->layers,
                N_READ_ORDERS * READ_ORDER_SAMPLES);
    } else if (trial->state == TRIAL_DONE) {
        fprintf(stderr, "tried on decode's first %d layers, lower quartile ms:", N_READ_ORDERS * READ_ORDER_SAMPLES);
        for (int o = 0; o < N_READ_ORDERS; o++)
            fprintf(stderr, " %s %.3f", read_order_names[o], trial->quartile[o] * 1e3);
    } else {
        fprintf(stderr, "the default");
    }
    fprintf(stderr, ")\n");
}

// ----------------------------------------------------------------------------
// Rope: the rotation in force, pair by pair (-m rope)
//
//   attention_factor: X
//   pair omega wavelength       the columns' names
//   i omega_i wavelength_i      one line per pair i (dims 2i, 2i+1): omega_i radians a
//                               token, wavelength 2 pi / omega_i tokens; 0 and inf for
//                               a pair that does not rotate
// then, in words, which pairs the rule kept, blended or interpolated.

// Prints "label: pairs a-b" for a run of pairs that the rule treated alike.
static void print_pair_run(const char *label, int first, int last) {
    if (first == last) printf("%s: pair %d\n", label, first);
    else printf("%s: pairs %d-%d\n", label, first, last);
}

// Prints "label: layers a b c" for the layers whose rotary choice is `which`.
static void print_layers_using(const Config *c, const char *label, int which) {
    int any = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer[l].rope == which) printf("%s%d", any++ ? " " : label, l);
    if (any) printf("\n");
}

static void print_rope_setting(const Config *c, int which);

// -m rope: the first setting's pairs; with a per-layer table, the layers using it,
// the second setting's pairs and layers, and the NoPE layers (no rotation at all).
static void print_rope(const Config *c) {
    print_rope_setting(c, LAYER_ROPE_FIRST);
    if (c->layer_table_bytes == 0) return; // one setting on every layer: as version 1 prints it
    print_layers_using(c, "layers using this setting: ", LAYER_ROPE_FIRST);
    if (has_second_rope(c)) {
        printf("\nsecond setting:\n");
        print_rope_setting(c, LAYER_ROPE_SECOND);
        print_layers_using(c, "layers using the second setting: ", LAYER_ROPE_SECOND);
    }
    print_layers_using(c, "NoPE layers (not rotated): ", LAYER_NOPE);
}

static void print_rope_setting(const Config *c, int which) {
    const RopeSetting *r = &c->rope[which];
    int pairs = rope_head_size(c, which) / 2, rope_angles = rope_angles_of(c, which);
    float s = r->factor;
    printf("attention_factor: %.9g\n", rope_attention_factor(c, which));
    printf("pair omega wavelength\n");
    for (int i = 0; i < pairs; i++) {
        if (i < rope_angles)
            printf("%d %.9g %.9g\n", i, rope_frequency(c, which, i), 2.0 * M_PI / rope_frequency(c, which, i));
        else printf("%d 0 inf\n", i);
    }
    printf("rule: %s, factor %g, original length %d, theta %g, %d of %d pairs rotate\n",
           rope_scaling_names[r->scaling], s, r->original_len, r->theta, rope_angles, pairs);
    if (r->scaling == ROPE_SCALING_LONGROPE) { // per-pair factors: which set the context chose
        printf("longrope: each pair divided by its %s factor (context %d %s the original length %d)\n",
               c->seq_len > r->original_len ? "long" : "short", c->seq_len,
               c->seq_len > r->original_len ? "beyond" : "within", r->original_len);
        if (rope_angles < pairs) print_pair_run("not rotated (p-RoPE)", rope_angles, pairs - 1);
        return;
    }
    // each rotated pair: kept (omega_i), interpolated (omega_i / s) or blended (between)
    const char *labels[] = {"kept", "interpolated (divided by the factor)", "blended (between kept and interpolated)"};
    int first = 0, kind = -1;
    for (int i = 0; i <= rope_angles; i++) {
        int k = -1;
        if (i < rope_angles) {
            double ratio = (double)rope_frequency(c, which, i) / rope_base_frequency(c, which, i);
            k = fabs(ratio - 1.0) < 1e-6 ? 0 : fabs(ratio * s - 1.0) < 1e-6 ? 1 : 2;
        }
        if (k != kind) {
            if (kind >= 0) print_pair_run(labels[kind], first, i - 1);
            first = i, kind = k;
        }
    }
    if (rope_angles < pairs) print_pair_run("not rotated (p-RoPE)", rope_angles, pairs - 1);
}

// ----------------------------------------------------------------------------
// CLI, include only if not testing
#ifndef RUN_TESTING

static void usage(FILE *out) {
    fprintf(out,
            "Usage:   run CHECKPOINT [options]\n"
            "Example: run model.bin -z tokenizer.bin -n 256 -t 0.8 -p \"Once upon a time\"\n"
            "Options:\n"
            "  -p TEXT            prompt (-i is an alias); the first user turn in chat\n"
            "  -m MODE            generate (default), tokenize, ppl, inspect, chat, rope\n"
            "  -t FLOAT           temperature, >= 0 (default 1.0; 0 = greedy)\n"
            "  --top-p FLOAT      top-p (nucleus) sampling, in (0, 1] (default 0.9; 1 = off)\n"
            "  -s INT             random seed, >= 0 (default or 0: from the clock)\n"
            "  -n INT             steps to run, >= 0 (default 256; 0 or > the context: the context);\n"
            "                     in chat: tokens per reply (default 0: until an end token)\n"
            "  -z PATH            tokenizer (default: the checkpoint's own, else tokenizer.bin)\n"
            "  -f PATH            text file to score (-m ppl); texts to tokenize, separated by\n"
            "                     NUL bytes (-m tokenize: an empty line after each)\n"
            "  -y TEXT            system prompt (-m chat)\n"
            "  --template NAME    chat template (-m chat; default: the tokenizer's): llama2,\n"
            "                     llama3, chatml, qwen2.5, smollm2, gemma, gemma4 (E2B/E4B),\n"
            "                     gemma4-large (26B/31B), zephyr, mistral\n"
            "  --think            chat, gemma4 templates: thinking on; a reply's thought goes\n"
            "                     to stderr, its answer to stdout; the history keeps the answer\n"
            "  --rope-theta FLOAT     override the base wavelength theta, > 0\n"
            "  --rope-fraction FLOAT  override the p-RoPE fraction p, in [0, 1]\n"
            "  --rope-scaling RULE    none, linear, ntk, yarn or llama3: how positions past the\n"
            "                         trained length are handled (default: the file's)\n"
            "  --rope-factor FLOAT    the rule's factor s, >= 1\n"
            "  --rope-original-len N  the length the model was trained on (default: the file's)\n"
            "  -c, --context N    positions in the context (default: the file's seq_len, at most\n"
            "                     %d); run refuses one that does not fit in memory\n"
            "  --csv PATH         write inspect's numbers (-m inspect) or each token's nll\n"
            "                     (-m ppl) as CSV\n"
            "  --no-cache         chat: recompute the whole transcript every turn\n"
            "  --shift MODE       chat, when the context is full: drop the oldest turns and\n"
            "                     recompute (default) or rotate the cached keys\n"
            "  -T INT             threads (default: OMP_NUM_THREADS or all cores)\n"
            "  -v                 print the generated token ids on stderr (chat: each turn's), and\n"
            "                     the decode matmul's reading order (RUN_READ_ORDER=NAME forces one)\n"
            "  -h, --help         this help\n"
            "RUN_PLAIN=1 in the environment runs the plain loops only (for a debugger): the\n"
            "same output, slower.\n"
            "Exit codes: 0 success, 1 bad input file or runtime error, 2 bad command line.\n",
            DEFAULT_CONTEXT);
}

// Writes s with its control characters escaped (\n, \r, \t, \xNN), so that a path
// or an argument that holds a newline cannot split the one line an error is.
static void fputs_visible(const char *s, FILE *f) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) put_escaped_byte(*p, f);
}

// "run: error: MESSAGE SUFFIX" on stderr, one line whatever the message holds.
static void print_error_line(const char *message, const char *suffix) {
    fputs("run: error: ", stderr);
    fputs_visible(message, stderr);
    fprintf(stderr, "%s\n", suffix);
}

static void usage_error(const char *fmt, ...) {
    char message[2 * sizeof(error_message)]; // its arguments may include error_message
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof(message), fmt, args);
    va_end(args);
    print_error_line(message, " (run -h for usage)");
    exit(EXIT_BAD_USAGE);
}

static void runtime_error(void) {
    print_error_line(error_message, "");
    exit(EXIT_BAD_INPUT);
}

// runtime_error() for a model or tokenizer file that failed to load: when that
// file does not exist, the line also says where to get one. (Asked of the path, not
// of errno, which an earlier call may have left at ENOENT.) path: NULL for the
// checkpoint's own tokenizer section.
static void file_error(const char *path) {
    struct stat st;
    if (path && stat(path, &st) != 0 && errno == ENOENT) {
        print_error_line(error_message, " (" WHERE_TO_GET_MODELS ")");
        exit(EXIT_BAD_INPUT);
    }
    runtime_error();
}

// Every mode ends here: what it printed must have reached standard output (a full
// disk, a closed pipe, /dev/full). fflush writes what is buffered; ferror remembers
// an earlier write that failed.
static void check_stdout(void) {
    int flushed = fflush(stdout) == 0, error = errno;
    if (!flushed || ferror(stdout)) {
        fail("cannot write to standard output%s%s", flushed ? "" : ": ", flushed ? "" : strerror(error));
        runtime_error();
    }
}

// A Hugging Face model directory or a .safetensors file given as the checkpoint: run
// reads only its own format, so say how to convert it, with the command.
static void refuse_hugging_face_files(const char *path) {
    struct stat st;
    size_t n = strlen(path);
    int safetensors = n >= 12 && strcmp(path + n - 12, ".safetensors") == 0;
    char config[4096];
    snprintf(config, sizeof(config), "%s/config.json", path);
    int directory = stat(path, &st) == 0 && S_ISDIR(st.st_mode) && access(config, F_OK) == 0;
    if (!safetensors && !directory) return;
    const char *dir = path; // for a .safetensors file, the directory holding it
    char parent[4096];
    if (safetensors) {
        const char *slash = strrchr(path, '/');
        if (!slash) snprintf(parent, sizeof(parent), ".");
        else snprintf(parent, sizeof(parent), "%.*s", slash == path ? 1 : (int)(slash - path), path);
        dir = parent;
    }
    fail("%s is a Hugging Face %s, not a checkpoint run reads; convert it first: python3 export.py %s model.bin",
         path, directory ? "model directory" : "weights file", dir);
    print_error_line(error_message, "");
    exit(EXIT_BAD_INPUT);
}

// A tokenizer of the model's vocabulary size beside the checkpoint or in models/
// (tok512.bin for stories260K), to name when the one given does not fit; NULL if
// there is none.
static const char *fitting_tokenizer(const char *checkpoint_path, int vocab_size) {
    static char path[256];
    const char *slash = strrchr(checkpoint_path, '/');
    int dir_length = slash ? (int)(slash - checkpoint_path) : 1;
    const char *dirs[2] = {slash ? checkpoint_path : ".", "models"};
    int lengths[2] = {dir_length, 6};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof(path), "%.*s/tok%d.bin", lengths[k], dirs[k], vocab_size);
        Tokenizer t;
        char saved[sizeof(error_message)];
        memcpy(saved, error_message, sizeof(saved));
        int fits = access(path, R_OK) == 0 && build_tokenizer(&t, path, vocab_size) == 0;
        memcpy(error_message, saved, sizeof(saved));
        if (fits) {
            free_tokenizer(&t);
            return path;
        }
    }
    return NULL;
}

// The tokenizer: -z PATH (a TOKN file or llama2.c's tokenizer.bin), else the
// checkpoint's own section, else tokenizer.bin. A tokenizer of another size says
// which one fits, when one is at hand.
// The tokenizer file a run reads: -z's path, else the checkpoint's own section (NULL:
// no file), else tokenizer.bin in the working directory.
static const char *tokenizer_file(const char *path, const Transformer *model) {
    return path ? path : model->tokenizer.bytes > 0 ? NULL : "tokenizer.bin";
}

static int load_tokenizer(Tokenizer *t, const char *path, const Transformer *model, const char *checkpoint_path) {
    int vocab_size = model->config.vocab_size, result;
    path = tokenizer_file(path, model);
    if (!path) {
        char name[4200];
        snprintf(name, sizeof(name), "section of %s", checkpoint_path);
        const unsigned char *section = (const unsigned char *)model->mapped + model->tokenizer.offset;
        return build_tokenizer_from_memory(t, section, (size_t)model->tokenizer.bytes, vocab_size, name);
    }
    result = build_tokenizer(t, path, vocab_size);
    if (result == TOKENIZER_WRONG_SIZE) {
        const char *fits = fitting_tokenizer(checkpoint_path, vocab_size);
        size_t used = strlen(error_message);
        if (fits) snprintf(error_message + used, sizeof(error_message) - used, "; this model's tokenizer: -z %s", fits);
        errno = 0;
    }
    return result;
}

// Whether two paths name the same file (the same device and inode: links and other
// spellings of a path count). A path that does not exist names no input.
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// An output path (--csv) that is one of the run's inputs would be truncated while it
// is read (the checkpoint is mapped: its pages vanish under the forward pass).
// Refused before anything is opened for writing. tokenizer_path: the tokenizer file
// in use, NULL when it is the checkpoint's own section.
static void refuse_output_over_input(const char *flag, const char *out, const char *checkpoint_path,
                                     const char *tokenizer_path, const char *text_path) {
    const char *inputs[3][2] = {{checkpoint_path, "the checkpoint"}, {tokenizer_path, "the tokenizer"},
                                {text_path, "the text file (-f)"}};
    for (int k = 0; k < 3; k++)
        if (same_file(out, inputs[k][0]))
            usage_error("%s %s is %s: writing it would destroy an input of this run", flag, out, inputs[k][1]);
}

// Parses a whole string as a finite float or exits with a usage error. strtof sets
// ERANGE for a result too small to be normal too: a subnormal number (or one that
// rounds to 0) is still the number the user wrote; only overflow is not.
static float parse_float(const char *flag, const char *value) {
    char *end;
    errno = 0;
    float f = strtof(value, &end);
    int overflow = errno == ERANGE && fabsf(f) >= FLT_MIN;
    if (end == value || *end != '\0' || overflow || !isfinite(f))
        usage_error("%s expects a number, got '%s'", flag, value);
    return f;
}

// OMP_NUM_THREADS, as the OpenMP runtime reads it (a list for nested levels, each
// entry a positive integer), under the same bounds as -T: the first entry, 0 when it
// is not set. The runtime reads it before main and, for a value it calls invalid,
// prints its own line and goes on with its default: here such a value is refused.
static long threads_from_environment(void) {
    const char *value = getenv("OMP_NUM_THREADS");
    if (!value) return 0;
    long first = 0;
    const char *p = value;
    do {
        char *end;
        errno = 0;
        long n = strtol(p, &end, 10);
        while (*end == ' ') end++;
        if (end == p || (*end != '\0' && *end != ',') || errno == ERANGE)
            usage_error("OMP_NUM_THREADS expects an integer or a list of them, got '%s': set a number of threads "
                        "in [1, %d], or unset it", value, MAX_THREADS);
        if (n < 1 || n > MAX_THREADS)
            usage_error("OMP_NUM_THREADS must be in [1, %d], got %ld: set a number in that range, or unset it",
                        MAX_THREADS, n);
        if (p == value) first = n;
        p = *end == ',' ? end + 1 : end;
    } while (*p != '\0' || p[-1] == ',');
    return first;
}

// OMP_THREAD_LIMIT and OMP_STACKSIZE, checked as the runtime reads them: a value it
// calls invalid is refused here (it prints its own line and goes on), a stack below
// its minimum is refused too (it warns and goes on with the minimum), and a stack
// larger than the memory would stop the first parallel region with the runtime's
// "Thread creation failed" and no word of ours. The runtime reads its variables
// before main, so its own line cannot be stopped: ours comes after it, the last,
// and says what to set.
static void check_openmp_environment(void) {
    const char *limit = getenv("OMP_THREAD_LIMIT");
    if (limit) {
        char *end;
        errno = 0;
        long n = strtol(limit, &end, 10);
        while (*end == ' ') end++;
        if (end == limit || *end != '\0' || errno == ERANGE || n < 1)
            usage_error("OMP_THREAD_LIMIT expects a positive integer, got '%s': set a number of threads, or unset it",
                        limit);
    }
    const char *stack = getenv("OMP_STACKSIZE");
    if (stack) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(stack, &end, 10);
        while (*end == ' ') end++;
        int shift = 10; // no suffix: kilobytes
        const char *units = "bBkKmMgG";
        if (*end != '\0' && strchr(units, *end)) shift = 10 * (int)((strchr(units, *end) - units) / 2), end++;
        while (*end == ' ') end++;
        if (end == stack || *end != '\0' || errno == ERANGE || stack[strspn(stack, " ")] == '-' || n == 0)
            usage_error("OMP_STACKSIZE expects a size such as 512K or 4M (B, K, M or G), got '%s': set one such as "
                        "4M, or unset it", stack);
        const char *what;
        uint64_t memory = memory_limit(&what);
        if (n > (UINT64_MAX >> shift)) usage_error("OMP_STACKSIZE %s is larger than any memory: set a size such as "
                                                   "4M, or unset it", stack);
        if (memory > 0 && n > (memory >> shift))
            usage_error("OMP_STACKSIZE %s asks each thread for a stack larger than the %s of %.2f GiB: set a smaller "
                        "size such as 4M, or unset it", stack, what, gib(memory));
        uint64_t minimum = (uint64_t)PTHREAD_STACK_MIN; // the runtime's minimum thread stack
        if ((n << shift) < minimum)
            usage_error("OMP_STACKSIZE %s is below the OpenMP runtime's minimum thread stack of %lluK: set at least "
                        "%lluK, or unset it", stack, (unsigned long long)minimum >> 10,
                        (unsigned long long)minimum >> 10);
    }
}

// RUN_READ_ORDER: the decode matmul's reading order by name (for tests and
// benchmarks), instead of the trial on decode's first tokens. -1 when it is not set.
static int read_order_from_environment(void) {
    const char *value = getenv("RUN_READ_ORDER");
    if (!value || value[0] == '\0') return -1;
    for (int o = 0; o < N_READ_ORDERS; o++)
        if (strcmp(value, read_order_names[o]) == 0) return o;
    usage_error("unknown RUN_READ_ORDER '%s' (quarters-prefetch, quarters, adjacent, rows)", value);
    return -1;
}

// RUN_PLAIN=1: the plain loops of the forward pass and the sampler only, none of
// "Making it fast" (use_fast_kernels = 0), for stepping through the equations with a
// debugger. The same output bit for bit (tests/test_plain_run.py), only slower.
static int plain_from_environment(void) {
    const char *value = getenv("RUN_PLAIN");
    if (!value || value[0] == '\0' || strcmp(value, "0") == 0) return 0;
    if (strcmp(value, "1") != 0) usage_error("RUN_PLAIN expects 1 (plain loops) or 0, got '%s'", value);
    return 1;
}

// The threads to run on: -T, else OMP_NUM_THREADS, else the runtime's default (all
// cores). More threads than the cores this process may use is allowed (they share
// the cores, and run slower), but said.
static void set_threads(long threads) {
    long from_env = threads_from_environment(); // checked even where -T overrides it, or without OpenMP
    check_openmp_environment();
#ifdef _OPENMP
    const char *source = threads > 0 ? "-T" : "OMP_NUM_THREADS";
    if (threads == 0) threads = from_env;
    if (threads == 0) return;
    omp_set_num_threads((int)threads);
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && threads > CPU_COUNT(&allowed))
        fprintf(stderr, "run: warning: %s asks for %ld threads, but this process may use %d cores\n", source,
                threads, CPU_COUNT(&allowed));
#else
    (void)threads, (void)from_env; // a build without OpenMP runs on one thread
#endif
}

static long parse_int(const char *flag, const char *value, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (end == value || *end != '\0' || errno == ERANGE) usage_error("%s expects an integer, got '%s'", flag, value);
    if (v < lo || v > hi) usage_error("%s must be in [%ld, %ld], got %ld", flag, lo, hi, v);
    return v;
}

// Reads a text file whole. Text may not contain NUL bytes (they would end it early);
// its first TEXT_START_BYTES are checked before the whole is read, so that a binary
// file of many gigabytes (a checkpoint, an image) is refused at once.
#define TEXT_START_BYTES 65536
static char *read_text_file(const char *path) {
    size_t size = 0;
    char *start = malloc(TEXT_START_BYTES);
    if (!start) {
        fail("out of memory");
        return NULL;
    }
    ssize_t got = read_file_start(path, "", start, TEXT_START_BYTES, &size);
    const char *nul = got > 0 ? memchr(start, '\0', (size_t)got) : NULL;
    if (nul) fail("%s contains a NUL byte at offset %zu: not a text file", path, (size_t)(nul - start));
    free(start);
    if (got < 0 || nul) return NULL;
    char *text = read_whole_file(path, "", &size);
    if (!text) return NULL;
    if (strlen(text) != size) {
        fail("%s contains a NUL byte at offset %zu: not a text file", path, strlen(text));
        free(text);
        return NULL;
    }
    return text;
}

static const char *format_name(CheckpointFormat f, const Config *c) {
    static char v2[32];
    if (f == FORMAT_ROPE && c->version == 2 && c->type_table_bytes) return "ROPE v2 per-piece types";
    if (f == FORMAT_ROPE && c->version == 2) {
        snprintf(v2, sizeof(v2), "ROPE v2 %s", weight_type_names[c->weight_type]);
        return v2;
    }
    return f == FORMAT_ROPE ? "ROPE v1" : f == FORMAT_LLAMA2C_V1 ? "llama2.c v1" : "llama2.c legacy";
}

// The rotary flags over the file's settings: --rope-scaling (a new rule starts
// from its default parameters), --rope-factor (on a file without a rule: linear),
// --rope-original-len. Bad combinations exit with a usage error.
static void apply_rope_scaling_flags(RopeSetting *r, int scaling, float factor, int original_len) {
    if (scaling >= 0 && scaling != (int)r->scaling) {
        if (scaling != ROPE_SCALING_NONE && factor == 0 && r->factor == 1.0f)
            usage_error("--rope-scaling %s needs --rope-factor (the file has no factor)", rope_scaling_names[scaling]);
        r->scaling = (RopeScaling)scaling;
        r->yarn_beta_fast = r->yarn_beta_slow = r->attention_factor = 0.0f;
        r->llama3_low_freq_factor = r->llama3_high_freq_factor = 0.0f;
        if (scaling == ROPE_SCALING_NONE) r->factor = 1.0f;
    }
    if (factor > 0) {
        r->factor = factor;
        if (r->scaling == ROPE_SCALING_NONE) r->scaling = ROPE_SCALING_LINEAR;
    }
    if (original_len > 0) r->original_len = original_len;
    if (validate_rope_scaling(r) != 0) usage_error("%s", error_message);
}

// The first setting's rule: "none", or e.g. "yarn x8 (original length 64, attention factor 1.21)"
static const char *rope_scaling_text(const Config *c) {
    static char text[160];
    const RopeSetting *r = &c->rope[LAYER_ROPE_FIRST];
    if (r->scaling == ROPE_SCALING_NONE) return "none";
    snprintf(text, sizeof(text), "%s x%g (original length %d, attention factor %g)", rope_scaling_names[r->scaling],
             r->factor, r->original_len, rope_attention_factor(c, LAYER_ROPE_FIRST));
    return text;
}

// After the context on the start-up line: where it came from, when not simply the
// file's seq_len, e.g. " (-c; the file's 512)" or " (the file's 131072, capped: -c 131072 for all)".
// The start-up line's KV cache: its size for the context in use and, where sliding
// layers keep a ring (kv_positions_of), how many positions it holds.
static const char *kv_cache_text(const Config *c) {
    static char text[160];
    uint64_t bytes = (kv_cache_fixed_floats(c) + kv_cache_floats_per_position(c) * c->seq_len) * sizeof(float);
    int n = snprintf(text, sizeof(text), "KV cache %.1f MiB", bytes / (double)(1 << 20));
    int window = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (is_ring(c, l) && c->layer[l].window > window) window = c->layer[l].window;
    if (window > 0)
        snprintf(text + n, sizeof(text) - n, " (sliding layers: window %d, a ring of %d positions)", window,
                 kv_positions_of_window(window));
    return text;
}

static const char *context_text(int from_flag, int file_seq_len) {
    static char text[96];
    text[0] = '\0';
    if (from_flag) snprintf(text, sizeof(text), " (-c; the file's %d)", file_seq_len);
    else if (file_seq_len > DEFAULT_CONTEXT)
        snprintf(text, sizeof(text), " (the file's %d, capped: -c %d for all)", file_seq_len, file_seq_len);
    return text;
}

int main(int argc, char *argv[]) {
    // defaults
    const char *checkpoint_path = NULL, *tokenizer_path = NULL, *prompt = NULL, *mode = "generate";
    const char *text_path = NULL, *system_prompt = NULL, *csv_path = NULL, *shift = NULL, *rope_scaling = NULL;
    const char *template_name = NULL;
    float temperature = 1.0f, topp = 0.9f, rope_theta = 0.0f, rope_fraction = -1.0f, rope_factor = 0.0f;
    long seed = 0, steps = 256, threads = 0, rope_original_len = 0, context = 0;
    int verbose = 0, no_cache = 0, think = 0, steps_given = 0;

    // 1. parse the command line: CHECKPOINT, then flag/value pairs
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage(stdout);
            check_stdout();
            return EXIT_OK;
        }
        if (arg[0] != '-' || arg[1] == '\0') {
            if (checkpoint_path) usage_error("unexpected argument '%s'", arg);
            checkpoint_path = arg;
            continue;
        }
        if (strcmp(arg, "-v") == 0) { verbose = 1; continue; }
        if (strcmp(arg, "--no-cache") == 0) { no_cache = 1; continue; }
        if (strcmp(arg, "--think") == 0) { think = 1; continue; }
        static const char *with_value[] = {"-p", "-i", "-m", "-t", "--top-p", "-s", "-n", "-z", "-f", "-y",
                                           "--rope-theta", "--rope-fraction", "--csv", "-T", "--shift",
                                           "--rope-scaling", "--rope-factor", "--rope-original-len", "-c",
                                           "--context", "--template"};
        int known = 0;
        for (size_t k = 0; k < sizeof(with_value) / sizeof(with_value[0]); k++) known |= strcmp(arg, with_value[k]) == 0;
        if (!known) usage_error("unknown option '%s'", arg);
        if (i + 1 >= argc) usage_error("option %s needs a value", arg);
        const char *value = argv[++i];
        if (strcmp(arg, "-p") == 0 || strcmp(arg, "-i") == 0) prompt = value;
        else if (strcmp(arg, "-m") == 0) mode = value;
        else if (strcmp(arg, "-z") == 0) tokenizer_path = value;
        else if (strcmp(arg, "-f") == 0) text_path = value;
        else if (strcmp(arg, "-y") == 0) system_prompt = value;
        else if (strcmp(arg, "--csv") == 0) csv_path = value;
        else if (strcmp(arg, "--shift") == 0) shift = value;
        else if (strcmp(arg, "--template") == 0) template_name = value;
        else if (strcmp(arg, "--rope-scaling") == 0) rope_scaling = value;
        else if (strcmp(arg, "--rope-original-len") == 0) rope_original_len = parse_int(arg, value, 1, MAX_SEQ_LEN);
        else if (strcmp(arg, "-c") == 0 || strcmp(arg, "--context") == 0) context = parse_int(arg, value, 1, MAX_SEQ_LEN);
        else if (strcmp(arg, "--rope-factor") == 0) {
            rope_factor = parse_float(arg, value);
            if (!(rope_factor >= 1)) usage_error("--rope-factor must be >= 1 (every rule stretches positions), got %s", value);
        }
        else if (strcmp(arg, "-t") == 0) {
            temperature = parse_float(arg, value);
            if (temperature < 0) usage_error("-t must be >= 0, got %s", value);
        } else if (strcmp(arg, "--top-p") == 0) {
            topp = parse_float(arg, value);
            if (!(topp > 0 && topp <= 1)) usage_error("--top-p must be in (0, 1], got %s", value);
        } else if (strcmp(arg, "--rope-theta") == 0) {
            rope_theta = parse_float(arg, value);
            if (!(rope_theta > 0)) usage_error("--rope-theta must be > 0, got %s", value);
        } else if (strcmp(arg, "--rope-fraction") == 0) {
            rope_fraction = parse_float(arg, value);
            if (!(rope_fraction >= 0 && rope_fraction <= 1)) usage_error("--rope-fraction must be in [0, 1], got %s", value);
        } else if (strcmp(arg, "-s") == 0) seed = parse_int(arg, value, 0, UINT_MAX);
        else if (strcmp(arg, "-n") == 0) { steps = parse_int(arg, value, 0, INT_MAX); steps_given = 1; }
        else if (strcmp(arg, "-T") == 0) threads = parse_int(arg, value, 1, MAX_THREADS);
    }
    if (!checkpoint_path) usage_error("no checkpoint given");
    int is_generate = strcmp(mode, "generate") == 0, is_tokenize = strcmp(mode, "tokenize") == 0;
    int is_ppl = strcmp(mode, "ppl") == 0, is_inspect = strcmp(mode, "inspect") == 0, is_chat = strcmp(mode, "chat") == 0;
    int is_rope = strcmp(mode, "rope") == 0;
    if (!is_generate && !is_tokenize && !is_ppl && !is_inspect && !is_chat && !is_rope)
        usage_error("unknown mode '%s' (generate, tokenize, ppl, inspect, chat, rope)", mode);
    int scaling = -1; // the --rope-scaling rule, -1 when not given
    for (int k = 0; rope_scaling && k < N_FLAG_SCALINGS; k++)
        if (strcmp(rope_scaling, rope_scaling_names[k]) == 0) scaling = k;
    if (rope_scaling && scaling < 0) usage_error("unknown --rope-scaling '%s' (none, linear, ntk, yarn, llama3)", rope_scaling);
    if (scaling == ROPE_SCALING_NONE && rope_factor > 0) usage_error("--rope-factor has no effect with --rope-scaling none");
    if (is_ppl && !text_path == !prompt) usage_error("-m ppl needs exactly one of -f FILE or -p TEXT");
    if (text_path && !is_ppl && !is_tokenize) usage_error("-f is for -m ppl and -m tokenize");
    if (is_tokenize && text_path && prompt) usage_error("-m tokenize takes -f FILE or -p TEXT, not both");
    if (is_inspect && !prompt) usage_error("-m inspect needs a prompt (-p TEXT)");
    if (csv_path && !is_inspect && !is_ppl) usage_error("--csv is for -m inspect and -m ppl");
    if ((system_prompt || no_cache || shift) && !is_chat) usage_error("-y, --no-cache and --shift are for -m chat");
    if (think && !is_chat) usage_error("--think is for -m chat");
    if (template_name && !is_chat) usage_error("--template is for -m chat");
    int template_id = -1; // --template, -1 when not given
    for (int k = 1; template_name && k < N_CHAT_FORMATS; k++)
        if (strcmp(template_name, chat_formats[k].name) == 0) template_id = k;
    if (template_name && template_id < 0)
        usage_error("unknown --template '%s' (llama2, llama3, chatml, qwen2.5, smollm2, gemma, gemma4, gemma4-large, "
                    "zephyr, mistral)",
                    template_name);
    if (shift && strcmp(shift, "recompute") != 0 && strcmp(shift, "rotate") != 0)
        usage_error("unknown --shift '%s' (recompute, rotate)", shift);
    int shift_rotate = shift && strcmp(shift, "rotate") == 0;
    if (shift_rotate && no_cache) usage_error("--shift rotate moves the cache, and --no-cache keeps none");
    set_threads(threads);
    int forced_read_order = read_order_from_environment();
    if (plain_from_environment()) use_fast_kernels = 0;

    // 2. load the model; apply the rotary overrides before the RoPE tables are built
    refuse_hugging_face_files(checkpoint_path);
    Transformer transformer;
    if (load_checkpoint(&transformer, checkpoint_path) != 0) file_error(checkpoint_path);
    if (csv_path)
        refuse_output_over_input("--csv", csv_path, checkpoint_path, tokenizer_file(tokenizer_path, &transformer),
                                 text_path);
    Config *c = &transformer.config;
    RopeSetting *first = &c->rope[LAYER_ROPE_FIRST]; // the flags' setting
    float file_fraction = first->fraction;
    if (rope_theta > 0) first->theta = rope_theta;
    if (rope_fraction >= 0) first->fraction = rope_fraction;
    apply_rope_scaling_flags(first, scaling, rope_factor, (int)rope_original_len);
    // longrope's factors are one per rotated pair of the file: another fraction has no factors
    if (first->scaling == ROPE_SCALING_LONGROPE && rope_angles_of(c, LAYER_ROPE_FIRST) != first->longrope_pairs)
        usage_error("--rope-fraction %g rotates %d pairs, but this file's longrope factors are for its %d rotated "
                    "pairs (one per pair): keep its fraction %g, or export without longrope", rope_fraction,
                    rope_angles_of(c, LAYER_ROPE_FIRST), first->longrope_pairs, file_fraction);
    // the header's settings passed: a failure now is the flags' (a smaller theta, or
    // with --rope-fraction more pairs that rotate)
    if (check_rope_angles(c, LAYER_ROPE_FIRST) != 0)
        usage_error("%s: %s", rope_theta > 0 ? "--rope-theta" : "--rope-fraction", error_message);
    // the context in use: -c, else the file's seq_len up to DEFAULT_CONTEXT. It sizes
    // the KV cache, the scores and the RoPE tables; the scaling rule stays relative to
    // the trained length (rope_original_len), which the header's seq_len gave
    int file_seq_len = c->seq_len;
    c->seq_len = context > 0 ? (int)context : file_seq_len < DEFAULT_CONTEXT ? file_seq_len : DEFAULT_CONTEXT;
    if (context > 0 && check_every_rope_angles(c) != 0) usage_error("-c %ld: %s", context, error_message);
    // before anything is allocated: a context that does not fit is refused, as a bad
    // command line when -c asked for it (exit 2), else as the file's (exit 1). -m rope
    // and -m tokenize run no model: they allocate no run state and check nothing.
    int needs_run_state = !is_rope && !is_tokenize;
    if (needs_run_state && check_context_fits(c) != 0) {
        if (context > 0) usage_error("-c %ld: %s", context, error_message);
        runtime_error();
    }
    fputs("run: ", stderr);
    fputs_visible(checkpoint_path, stderr);
    fprintf(stderr,
            " (%s): dim %d, hidden %d, layers %d, heads %d/%d, vocab %d, context %d%s | rope theta %g%s, "
            "fraction %g%s (%d of %d pairs rotate), scaling %s, eps %g | %s\n",
            format_name(transformer.format, c), c->dim, c->hidden_dim, c->n_layers, c->n_heads,
            c->n_kv_heads, c->vocab_size, c->seq_len, context_text(context > 0, file_seq_len), first->theta,
            rope_theta > 0 ? " (command line)" : "", first->fraction, rope_fraction >= 0 ? " (command line)" : "",
            rope_angles_of(c, LAYER_ROPE_FIRST), head_size_of(c) / 2, rope_scaling_text(c), c->norm_eps,
            kv_cache_text(c));
    if (c->n_experts) { // a mixture of experts: what decoding reads of it
        double all, read = matrix_bytes_per_token(c, &transformer.weights, &all);
        fprintf(stderr, "run: experts: %d of %d a token in %llu of %d layers (width %d); a token reads %.4g of %.4g GB "
                "of matrices\n", c->n_experts_used, c->n_experts, (unsigned long long)c->sparse_layers, c->n_layers,
                c->expert_hidden, read / 1e9, all / 1e9);
    }
    if (needs_run_state && build_run_state(&transformer.state, c) != 0) runtime_error();
    if (is_rope) {
        print_rope(c);
        check_stdout();
        free_transformer(&transformer);
        return EXIT_OK;
    }

    // 3. the tokenizer and the sampler
    Tokenizer tokenizer;
    if (load_tokenizer(&tokenizer, tokenizer_path, &transformer, checkpoint_path) != 0)
        file_error(tokenizer_file(tokenizer_path, &transformer));
    if (seed == 0) seed = (long)time(NULL);
    Sampler sampler;
    if (build_sampler(&sampler, c->vocab_size, temperature, topp, (unsigned long long)seed) != 0) runtime_error();
    if (steps == 0 || steps > c->seq_len) steps = c->seq_len;
    // the KV cache positions to map in before the clock: generation's steps; chat
    // fills the whole context in a long session; ppl and inspect map theirs as they go
    // ("Making it fast", 5: RUN_PLAIN=1 runs none of it)
    if (!is_tokenize && use_fast_kernels) {
        prepare_to_run(&transformer, is_generate ? (int)steps : is_chat ? c->seq_len : 0);
        start_read_order_trial(c, &transformer.weights, forced_read_order);
    }

    // 4. run the mode
    int result;
    if (is_generate) {
        result = generate(&transformer, &tokenizer, &sampler, prompt ? prompt : "", (int)steps, verbose);
    } else if (is_tokenize) {
        result = text_path ? tokenize_file(&tokenizer, text_path) : tokenize(&tokenizer, prompt ? prompt : "");
    } else if (is_ppl) {
        char *text = text_path ? read_text_file(text_path) : NULL;
        result = text_path && !text ? -1 : perplexity(&transformer, &tokenizer, text ? text : prompt, csv_path);
        free(text);
    } else if (is_inspect) {
        result = inspect(&transformer, &tokenizer, prompt, csv_path);
    } else {
        // -n limits each reply; 0, or a limit the context cannot reach, means none
        int reply_limit = steps_given && steps < c->seq_len ? (int)steps : 0;
        ChatOptions opt = {.system_prompt = system_prompt, .first_user = prompt, .reply_limit = reply_limit,
                           .interactive = isatty(STDIN_FILENO), .no_cache = no_cache, .verbose = verbose, .think = think,
                           .shift = shift_rotate ? SHIFT_ROTATE : SHIFT_RECOMPUTE,
                           .template_id = template_id >= 0 ? template_id : (int)tokenizer.chat_template,
                           .template_from_flag = template_id >= 0};
        if (opt.template_id <= TEMPLATE_NONE || opt.template_id >= N_CHAT_FORMATS)
            usage_error("-m chat: the tokenizer names no chat template run knows; pass --template NAME (llama2, "
                        "llama3, chatml, qwen2.5, smollm2, gemma, gemma4, gemma4-large, zephyr, mistral)");
        result = chat(&transformer, &tokenizer, &sampler, opt);
    }
    if (result != 0) runtime_error();
    if (verbose && !is_tokenize && !use_fast_kernels) fprintf(stderr, "run: RUN_PLAIN=1: the plain loops only\n");
    else if (verbose && !is_tokenize) print_read_order();
    check_stdout();

    free_sampler(&sampler);
    free_tokenizer(&tokenizer);
    free_transformer(&transformer);
    return EXIT_OK;
}
#endif
