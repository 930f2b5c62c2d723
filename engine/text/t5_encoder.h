/* transformers' T5EncoderModel and UMT5EncoderModel, forward only: token
 * embedding, pre-norm blocks of self-attention (q/k/v/o without biases, no
 * 1/sqrt(d) scaling, the bucketed relative position bias: T5's of the first
 * block shared by all, UMT5's one table per block; nothing else differs in
 * an encoder: UMT5Config takes T5Config's keys with other defaults)
 * and a feed-forward (wi, act, wo; or gated: act(wi_0 x) * wi_1 x, wo), each
 * behind a T5LayerNorm (RMSNorm without bias), then the final norm: its
 * last_hidden_state.
 *
 * Numbers are transformers' (eager attention) in f32 on the CPU backend,
 * the padding mask added to the scores as transformers adds it. Weights
 * stay in their stored f32/f16/bf16 and are widened per panel inside the
 * GEMM (engine/text/text_weights.h), so a T5-XXL encoder runs in about its
 * bf16 checkpoint's size. transformers clamps hidden states to +-(65504 -
 * 1000) after each sub-layer only when they are float16; ditd computes in
 * f32 and never has f16 activations, so that clamp never applies here, as
 * in transformers at f32 and bf16. A backend with f16 activations is
 * refused.
 *
 * Parameter names: encoder.block.{i}.layer.0.SelfAttention.{q,k,v,o},
 * ...relative_attention_bias (block 0; UMT5: every block), ...layer.{0,1}.layer_norm,
 * ...layer.1.DenseReluDense.{wi|wi_0,wi_1,wo}, encoder.final_layer_norm,
 * and the embedding as encoder.embed_tokens.weight or shared.weight.
 *
 * What it is not: a decoder, a tokenizer, or thread-safe.
 */
#ifndef DITD_ENGINE_T5_ENCODER_H
#define DITD_ENGINE_T5_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/lora.h"
#include "engine/text/text_config.h"

typedef struct ditd_t5_encoder ditd_t5_encoder;

/* Loads a text_encoder_2/ (or any T5EncoderModel) or a Wan text_encoder/
 * (UMT5EncoderModel; config.arch tells which) folder for batches of up
 * to max_batch sequences of up to max_tokens tokens (1..4096). *out owned
 * (ditd_t5_encoder_free). Errors name the file, tensor or key. */
int ditd_t5_encoder_new(const char *dir, const char *class_hint, const ditd_backend_ops *ops,
                        int max_batch, int max_tokens, ditd_t5_encoder **out);
/* The same with the weights from `weights` (a .gguf or .safetensors file;
 * NULL: dir's own) and dir's config.json. A GGUF in llama.cpp's T5 names
 * (enc.blk.0.attn_q.weight, token_embd.weight, ...; engine/text/t5_gguf.h)
 * or transformers' reads; its quantized linears keep their GGML blocks on
 * the CPU backend (ditd_text_linear: linear_q), everything else (the
 * embedding, norms, the position bias, and wi under relu) is dequantized
 * to f32 at load. A tensor whose shape differs from the config's, or of a
 * GGML type ditd does not dequantize, is refused naming it. */
int ditd_t5_encoder_new_file(const char *dir, const char *weights, const char *class_hint,
                             const ditd_backend_ops *ops, int max_batch, int max_tokens,
                             ditd_t5_encoder **out);
/* Linears kept in GGML blocks and their bytes (0: none). */
int ditd_t5_encoder_quantized(const ditd_t5_encoder *m, size_t *bytes);
void ditd_t5_encoder_free(ditd_t5_encoder *m);

const ditd_t5_config *ditd_t5_encoder_config_of(const ditd_t5_encoder *m);
size_t ditd_t5_encoder_borrowed_bytes(const ditd_t5_encoder *m);
size_t ditd_t5_encoder_arena_bytes(const ditd_t5_encoder *m);

/* T5's relative position bucket of (key - query) position, bidirectional,
 * as transformers' _relative_position_bucket computes it (its log in
 * float32). Exposed for the tests. */
int ditd_t5_relative_bucket(int rel, int num_buckets, int max_distance);

/* last_hidden_state (B, N, D) of B sequences of N ids (B, N), host; keep
 * (B, N): attention mask (1 attend, 0 padding) or NULL. 0, DITD_EINVAL
 * (sizes), DITD_ERANGE (an id outside the vocabulary, named). */
int ditd_t5_encoder_encode(ditd_t5_encoder *m, int B, int N, const int64_t *ids,
                           const uint8_t *keep, float *h_last);
/* The same with LoRA adapters: loras[b] sequence b's set (over ditd_lora_dev
 * uploaded for this model's targets; NULL entries or loras NULL: none). */
int ditd_t5_encoder_encode_lora(ditd_t5_encoder *m, int B, int N, const int64_t *ids,
                                const uint8_t *keep, const ditd_lora_set *const *loras,
                                float *h_last);
/* The linears a LoRA adapter may target (engine/text/text_lora.h): per
 * block l "encoder.block.<l>.layer.0.SelfAttention.{q,k,v,o}" and
 * "encoder.block.<l>.layer.1.DenseReluDense.{wi | wi_0, wi_1; wo}", as
 * transformers names T5EncoderModel's modules. Borrowed, *n of them. */
const ditd_lora_target *ditd_t5_encoder_lora_targets(const ditd_t5_encoder *m, int *n);

#endif
