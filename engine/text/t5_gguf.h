/* T5 encoder GGUF names (llama.cpp's) as transformers' T5EncoderModel
 * names: engine/text/t5_gguf.c. Internal to engine/text. */
#ifndef DITD_ENGINE_T5_GGUF_H
#define DITD_ENGINE_T5_GGUF_H

#include "engine/io/weights.h"

/* On a GGUF source (nothing for safetensors): refuses a file whose
 * general.architecture is not t5 / t5encoder, or that has no T5 encoder
 * block 0 in either naming (DITD_EFORMAT naming the file), then registers
 * transformers' names for the llama.cpp ones of blocks 0..num_layers-1
 * that the file holds. 0, or the alias errors. */
int ditd__t5_gguf_alias(ditd_weights *w, int num_layers);

#endif
