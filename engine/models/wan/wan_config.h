/* The typed configuration of a Diffusers WanTransformer3DModel (Wan 2.1 and
 * 2.2), read once from transformer/config.json. JSON stops here: the model
 * sees only this struct.
 *
 * Every key of WanTransformer3DModel.__init__ (Diffusers 0.42) is read, with
 * its defaults (Wan 2.1 T2V 14B's sizes): patch_size, num_attention_heads,
 * attention_head_dim, in_channels, out_channels, text_dim, freq_dim,
 * ffn_dim, num_layers, cross_attn_norm, qk_norm, eps, image_dim,
 * added_kv_proj_dim, rope_max_seq_len, pos_embed_seq_len.
 *
 * Supported: patch_size (1, p, p) (every Wan checkpoint: (1, 2, 2));
 * out_channels of any count (null or 0: in_channels, as Diffusers), so
 * Wan 2.2 I2V-A14B's 36 input channels work; qk_norm any string or null:
 * Diffusers 0.42 ignores the value and always normalizes q and k with an
 * RMSNorm over the whole inner dim ("rms_norm_across_heads"), and so does
 * ditd; Wan 2.1 I2V / FLF2V's image branch: image_dim with
 * added_kv_proj_dim = the inner dim (the image embedder's output is what
 * add_k_proj reads), and pos_embed_seq_len (FLF2V: two images' tokens).
 * Refused, naming the key and the value: a temporal patch other than 1 or
 * a non-square spatial patch; image_dim and added_kv_proj_dim not both set,
 * or added_kv_proj_dim other than the inner dim; pos_embed_seq_len without
 * image_dim or odd; sizes out of range; attention_head_dim odd, under 6 or
 * over the attention kernels' limit.
 *
 * What it is not: no weights, no request sizes (the loader's,
 * engine/models/wan/wan.h).
 */
#ifndef DITD_ENGINE_WAN_CONFIG_H
#define DITD_ENGINE_WAN_CONFIG_H

#include <stddef.h>

/* CLIP ViT-H/14's tokens at 224 x 224 (16 x 16 patches + the class token):
 * what WanImageToVideoPipeline's image encoder gives Wan 2.1 I2V. */
#define DITD_WAN_CLIP_TOKENS 257
/* WanAttnProcessor takes the text as the last 512 tokens of the
 * cross-attention context when there is an image branch (it splits at
 * shape[1] - 512): such a model runs at this text length only. */
#define DITD_WAN_IMAGE_TEXT_LEN 512

typedef struct ditd_wan_config {
    int patch_t, patch_h, patch_w; /* patch_size (1, p, p) */
    int num_heads;                 /* H = num_attention_heads */
    int head_dim;                  /* Dh = attention_head_dim */
    int in_channels;               /* C */
    int out_channels;              /* Co */
    int text_dim;                  /* Dt: the UMT5 sequence embedding's width */
    int freq_dim;                  /* sinusoidal features of the timestep */
    int ffn_dim;                   /* F */
    int num_layers;
    int cross_attn_norm;           /* norm2: an affine LayerNorm before cross-attention */
    float eps;                     /* every LayerNorm and RMSNorm of the blocks */
    int rope_max_seq_len;          /* positions per RoPE axis (frames, rows, columns) */
    int image_dim;                 /* Di of the CLIP image embeddings; 0: no image branch */
    int added_kv_proj_dim;         /* attn2.add_k_proj / add_v_proj input (= D); 0: none */
    int pos_embed_seq_len;         /* the image embedder's pos_embed tokens (FLF2V); 0: none */
    /* derived */
    int inner_dim;                 /* D = H * Dh */
    int rope_t, rope_h, rope_w;    /* WanRotaryPosEmbed's split of Dh: h = w = 2 (Dh / 6) */
    int image_len;                 /* image tokens the model takes: pos_embed_seq_len, else
                                    * DITD_WAN_CLIP_TOKENS; 0 without an image branch */
} ditd_wan_config;

/* Reads and checks transformer/config.json. Errors name the file, key and
 * value. */
int ditd_wan_config_load(const char *path, ditd_wan_config *out);

/* The same over text in memory; `name` stands for the path in messages. */
int ditd_wan_config_parse(const char *text, size_t len, const char *name, ditd_wan_config *out);

#endif
