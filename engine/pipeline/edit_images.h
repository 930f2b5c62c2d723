/* Which input image (and mask) each output of an edit starts from: Diffusers'
 * image-list semantics, in one place for every caller (the edit route's
 * parser and batcher, the command line, the replica, and a pipeline with
 * reference images such as Kontext, which assigns its references the same
 * way).
 *
 * FluxImg2ImgPipeline (and FluxInpaintPipeline, FluxKontextPipeline) given
 * k images and asked for n outputs encodes the k images as one batch, then
 * `torch.cat([image_latents] * (n // k))`: output i edits image i % k, and n
 * must be a multiple of k (Diffusers raises a ValueError otherwise; so does
 * n < k, where the shapes no longer broadcast). A mask list is repeated the
 * same way (`mask.repeat(n // m, 1, 1, 1)`): one mask serves every image, m
 * masks give output i mask i % m. The VAE's posterior draw of image j is
 * its part of the one batched draw: elements [j C h w, (j + 1) C h w) of
 * the posterior stream (engine/pipeline/latent_image.h).
 *
 * Not here: decoding or resizing the images (server/common/image_in.c),
 * the encode itself (latent_image.c). Pure; thread-safe. */
#ifndef DITD_ENGINE_PIPELINE_EDIT_IMAGES_H
#define DITD_ENGINE_PIPELINE_EDIT_IMAGES_H

/* The most input images of one edit (OpenAI's images.edit takes up to 16). */
#define DITD_EDIT_MAX_IMAGES 16

/* 0 when n outputs can be made from k input images and m masks (m 0: no
 * mask), else DITD_EINVAL with a detail naming `n` and `image` (or `mask`):
 * 1 <= k <= DITD_EDIT_MAX_IMAGES, n a positive multiple of k, m 0, 1 (one
 * mask for every image) or k (each image's own; other counts, which
 * Diffusers would tile regardless of the images, are refused). */
int ditd_edit_images_check(int n, int k, int m);

/* The input image of output i (0 <= i < n) of k: i % k. */
int ditd_edit_image_of(int i, int k);

/* The mask of output i of m masks (m > 0): i % m. */
int ditd_edit_mask_of(int i, int m);

#endif
