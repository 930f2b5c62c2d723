/* The dimension letters used in shape comments across ditd, named once.
 *
 *   B   batch (samples in a forward; classifier-free guidance doubles it)
 *   C   latent channels (in_channels); Co = out_channels (2C with learned sigma)
 *   S   latent side: the picture is (C, S, S) for square models, (C, Hl, Wl) in general
 *   p   patch size; gh = Hl/p, gw = Wl/p the token grid
 *   N   tokens per sample = gh*gw;  N_loc tokens held by this rank
 *   D   model width = H*Dh (inner_dim)
 *   H   attention heads; H_loc heads held by this rank; Dh head dim
 *   F   feed-forward width (4D for DiT)
 *   E   timestep frequency channels (256)
 *   K   class count (num_embeds_ada_norm); class K is the null (unconditional) class
 *
 * A comment like `// (B, N_loc, H_loc, Dh)` gives a tensor's logical shape,
 * outermost first, row-major.
 */
#ifndef DITD_ENGINE_SHAPES_H
#define DITD_ENGINE_SHAPES_H
#define DITD_MAX_DIMS 4
#endif
