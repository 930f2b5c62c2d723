/* Prompt text cleaning as Diffusers' pipelines do it in Python: html.unescape
 * (Python 3.11's html module: HTML5's named references, numeric references
 * with html's replacements) and WanPipeline's prompt_clean (basic_clean +
 * whitespace_clean, pipelines/wan/pipeline_wan.py): html.unescape twice,
 * strip (str.isspace), every run of Unicode White_Space (\s of the `regex`
 * module the pipeline imports as re) to one space, strip.
 *
 * basic_clean also calls ftfy.fix_text when ftfy is installed; ditd does not
 * repair mojibake, so ditd equals Diffusers run without ftfy, and with it on
 * every prompt ftfy leaves unchanged (docs/text.md).
 *
 * What it is not: a tokenizer. No engine state: thread-safe.
 */
#ifndef DITD_ENGINE_TEXT_PROMPT_CLEAN_H
#define DITD_ENGINE_TEXT_PROMPT_CLEAN_H

#include <stddef.h>

/* Python's html.unescape of len bytes of UTF-8 (NUL bytes are text): named
 * references (HTML5's, the longest prefix when none matches whole), decimal
 * and hex references with html's replacements. Appends to a malloc'd,
 * NUL-terminated *out of *out_len bytes (owned). 0, DITD_EINVAL (invalid
 * UTF-8, naming the byte offset), DITD_ENOMEM. */
int ditd_html_unescape(const char *text, size_t len, char **out, size_t *out_len);

/* WanPipeline's prompt_clean without ftfy (see above). *out owned, as
 * ditd_html_unescape. */
int ditd_wan_prompt_clean(const char *text, size_t len, char **out, size_t *out_len);

#endif
