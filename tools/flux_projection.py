#!/usr/bin/env python3
"""FLUX.1-dev at 1024x1024 on 1, 2, 4, 8 GPUs: a PROJECTION (arithmetic, not a measurement) of
the time of a 28-step image per parallel layout, and the memory per rank (weights and
activations, bf16) per layout. Prints markdown tables for docs/flux.md.

Everything is computed from the model's shapes:
  - FLOPs per block (2 per multiply-add; GEMMs and the attention's two products), the same
    count as bench/bench_flux.c: 24 S D^2 + 4 S^2 D for both block kinds (F = 4D), S = N + L;
  - per-rank FLOPs under ditd's plan (engine/models/flux/flux.h: image tokens split over the cp
    ranks, the 512 text tokens replicated on every cp rank; tp splits heads and MLP columns),
    and beside it the even split (text split too, as Diffusers' Flux _cp_plan does);
  - the logical bytes per collective (engine/parallel/comm.h's conventions; the formulas are
    bench_flux.c's, which its measured bytes matched on the CPU);
  - time = FLOPs / (fraction x peak) + sum over collectives (bytes / bandwidth + latency),
    no overlap of communication with compute (an upper bound for ring p2p, which overlaps);
  - memory: the transformer's parameters by the FluxTransformer2DModel shapes (checked against
    Diffusers instantiated on the meta device when torch is there), the encoders' and the VAE's
    from their configs on the meta device; activations by ditd's planned buffers
    (engine/models/flux/flux.c carve_acts, engine/parallel/cp_attention.c carve_all).

    /root/ditd-venv/bin/python tools/flux_projection.py [--fraction 0.5] [--peak 989e12]
        [--bw 450e9] [--bw-eff 0.7] [--latency 15e-6]
"""
import argparse

# FLUX.1-dev (black-forest-labs/FLUX.1-dev transformer/config.json) at 1024x1024, batch 1
D, H, DH, F = 3072, 24, 128, 4 * 3072
N_DOUBLE, N_SINGLE, STEPS = 19, 38, 28
N_IMG, L_TXT = (1024 // 16) ** 2, 512  # 64 x 64 packed tokens, max_sequence_length 512
DT, DP, CIN = 4096, 768, 64


def block_flops_per_rank(R, U, T, split_text):
    """FLOPs one rank computes in one block (both kinds: 24 S D^2 + 4 S^2 D in all).
    Rank 0 (ring rank 0 also attends the text queries to the text keys: the critical path)."""
    N, L = N_IMG, L_TXT
    S = N + L
    if split_text:  # Diffusers' plan: every token split, heads split by tp
        P = R * U
        return (24 * S * D * D / P + 4 * S * S * D / P) / T
    n = N / (R * U)
    lin = 24 * (n + L) * D * D / T
    # image queries: the ring chunk's N/R tokens for H/(TU) heads against all S keys;
    # text queries: against this ring chunk, and on ring rank 0 against the text keys
    att = 4 * D / (T * U) * ((N / R) * S + L * (N / R) + L * L)
    return lin + att


def block_bytes(R, U, T, es, p2p=False):
    """Per rank, per block (one joint attention), {collective: (bytes, calls)}; bench_flux.c's
    analytic_block."""
    N, L = N_IMG, L_TXT
    Hl, n = H / T, N / (R * U)
    out = {}
    if U > 1:
        out["ulysses all-to-all"] = (4 * n * Hl * DH * (U - 1) / U * es, 2)
        out["ulysses all-gather"] = (L * (Hl / U) * DH * (U - 1) * es, 1)
    if R > 1:
        kv = 2 * (N / R) * (Hl / U) * DH * (R - 1) * es
        out["ring send/recv" if p2p else "ring all-gather K,V"] = (kv, R - 1 if p2p else 1)
        out["ring all-gather text partials"] = ((L * (Hl / U) * DH * es + (Hl / U) * L * 4) * (R - 1), 2)
    return out


def tp_bytes(T, R, U, es, single):
    n = N_IMG / (R * U)
    if T == 1:
        return {}
    return {"tp all-reduce": ((1 if single else 2) * (n + L_TXT) * D * es * 2 * (T - 1) / T,
                              2 if single else 4)}


def step_cost(R, U, T, args, split_text=False, p2p=False):
    """(compute s, comm s, comm bytes) of one forward on the critical rank."""
    es = 2
    fl = (N_DOUBLE + N_SINGLE) * block_flops_per_rank(R, U, T, split_text)
    fl += 2 * L_TXT * DT * D / (1 if split_text else 1)  # context_embedder, every rank
    comp = fl / (args.fraction * args.peak)
    comm, nbytes = 0.0, 0.0
    for kind, count in (("double", N_DOUBLE), ("single", N_SINGLE)):
        colls = dict(block_bytes(R, U, T, es, p2p))
        colls.update(tp_bytes(T, R, U, es, kind == "single"))
        for b, calls in colls.values():
            nbytes += count * b
            comm += count * (b / (args.bw * args.bw_eff) + calls * args.latency)
    if R * U > 1:  # proj_out tokens gathered
        b = N_IMG / (R * U) * CIN * es * (R * U - 1)
        nbytes += b
        comm += b / (args.bw * args.bw_eff) + args.latency
    return comp, comm, nbytes


def layouts(P):
    if P == 1:
        return [("1 GPU", 1, 1, 1, False)]
    out = [(f"ulysses {P}", 1, P, 1, False), (f"ring {P} (allgather)", P, 1, 1, False),
           (f"ring {P} (p2p)", P, 1, 1, True)]
    if P >= 4:
        out.append((f"usp ulysses {P // 2} x ring 2", 2, P // 2, 1, False))
    if P == 8:
        out.append(("usp ulysses 2 x ring 4", 4, 2, 1, False))
    out.append((f"tp {P}", 1, 1, P, False))
    return out


# xDiT's published FLUX.1-dev 1024px 28-step latencies on H100 (seconds: PyTorch, torch.compile),
# https://github.com/xdit-project/xDiT/blob/main/docs/performance/flux.md
# (their ring attention passes K/V blocks peer to peer: beside ditd's p2p rows)
XDIT = {"1 GPU": (6.71, 4.30), "ulysses 2": (4.38, 2.68), "ring 2 (p2p)": (5.31, 2.60),
        "usp ulysses 2 x ring 2": (5.19, 1.80), "ulysses 4": (4.24, 1.63),
        "ring 4 (p2p)": (5.11, 1.98)}


def flux_params():
    """FluxTransformer2DModel (guidance_embeds) parameter count from its shapes."""
    emb = (CIN * D + D) + (DT * D + D)
    emb += 2 * (256 * D + D + D * D + D)  # timestep_embedder, guidance_embedder
    emb += DP * D + D + D * D + D  # text_embedder
    out = D * 2 * D + 2 * D + D * CIN + CIN  # norm_out.linear, proj_out
    dbl_mod = 2 * (D * 6 * D + 6 * D)
    dbl_split = 6 * (D * D + D) + 2 * (D * D + D) + 2 * (D * F + F + F * D + D)
    dbl_norm = 4 * DH
    sgl_mod = D * 3 * D + 3 * D
    sgl_split = 3 * (D * D + D) + (D * F + F) + ((D + F) * D + D)
    sgl_norm = 2 * DH
    replicated = emb + out + N_DOUBLE * (dbl_mod + dbl_norm) + N_SINGLE * (sgl_mod + sgl_norm)
    split = N_DOUBLE * dbl_split + N_SINGLE * sgl_split
    return replicated, split


def meta_counts():
    """Parameter counts of Diffusers/transformers models built on the meta device (no weights
    downloaded): FLUX.1-dev's transformer, T5-XXL encoder, CLIP-L text, the 16-channel VAE."""
    try:
        import torch
        from diffusers import AutoencoderKL, FluxTransformer2DModel
        from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel
    except ImportError:
        return None
    cnt = lambda m: sum(p.numel() for p in m.parameters())
    with torch.device("meta"):
        flux = cnt(FluxTransformer2DModel(guidance_embeds=True))
        # google/t5-v1_1-xxl (FLUX.1-dev text_encoder_2/config.json)
        t5 = cnt(T5EncoderModel(T5Config(d_model=4096, d_ff=10240, d_kv=64, num_heads=64,
                                         num_layers=24, vocab_size=32128,
                                         feed_forward_proj="gated-gelu",
                                         tie_word_embeddings=False)))
        # openai/clip-vit-large-patch14 text tower (text_encoder/config.json)
        clip = cnt(CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072,
                                                num_hidden_layers=12, num_attention_heads=12,
                                                vocab_size=49408, max_position_embeddings=77,
                                                projection_dim=768)))
        # FLUX.1-dev vae/config.json
        vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16,
                            block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                            down_block_types=("DownEncoderBlock2D",) * 4,
                            up_block_types=("UpDecoderBlock2D",) * 4,
                            use_quant_conv=False, use_post_quant_conv=False)
        vae_all, vae_dec = cnt(vae), cnt(vae.decoder)
    return flux, t5, clip, vae_all, vae_dec


def act_elems(R, U, T, p2p=False):
    """ditd's planned activations of one rank, elements (bf16) and fp32 elements, batch 1:
    engine/models/flux/flux.c carve_acts + engine/parallel/cp_attention.c carve_all."""
    N, L = N_IMG, L_TXT
    nl, A, Fl = N / (R * U), D / T, F / T
    hu, nr = H / T / U, N / R
    huD = hu * DH
    e = 2 * nl * D + 2 * L * D + nl * 3 * A + L * 3 * A + nl * (A + Fl) + L * (A + Fl)
    e += L * DT + DP + 256 + 3 * D + 12 * D + N * DH + N * CIN + N * CIN
    f32 = 0.0
    if R * U > 1:
        e += N * D + nl * CIN + N * CIN
        if U > 1:
            e += max(nl * 3 * A, nr * huD) + max(3 * nr * huD, nl * A) + 2 * nr * huD
        if R > 1 and not p2p:
            e += N * 2 * huD
        else:
            e += nr * 2 * huD * (2 if R > 1 else 1)
    e += nr * huD  # o_blk
    f32 += 2 * hu * nr  # lse_acc, lse_blk
    e += R * L * huD + L * huD + (L * A if U > 1 else 0)  # p_o, p_blk, p_gath
    f32 += R * hu * L + hu * L
    return e, f32


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fraction", type=float, default=0.5,
                    help="achieved share of the dense bf16 peak (default 0.5)")
    ap.add_argument("--peak", type=float, default=989e12,
                    help="dense bf16 FLOP/s per GPU (H100 SXM / H200: 989 TFLOP/s)")
    ap.add_argument("--bw", type=float, default=450e9,
                    help="NVLink bytes/s per GPU per direction (H100/H200 SXM NVLink 4: 450 GB/s)")
    ap.add_argument("--bw-eff", type=float, default=0.7, help="achieved share of --bw")
    ap.add_argument("--latency", type=float, default=15e-6, help="seconds per collective call")
    args = ap.parse_args()

    S = N_IMG + L_TXT
    blk = 24 * S * D * D + 4 * S * S * D
    step = (N_DOUBLE + N_SINGLE) * blk + 2 * L_TXT * DT * D
    print(f"FLUX.1-dev 1024x1024: {N_IMG} image + {L_TXT} text tokens, {N_DOUBLE} double + "
          f"{N_SINGLE} single blocks; per block 24 S D^2 + 4 S^2 D = {blk / 1e12:.3f} TFLOP; "
          f"per step {step / 1e12:.1f} TFLOP; {STEPS} steps {STEPS * step / 1e15:.2f} PFLOP")
    print(f"assumed: {args.fraction:.0%} of {args.peak / 1e12:.0f} TFLOP/s dense bf16 = "
          f"{args.fraction * args.peak / 1e12:.0f} TFLOP/s per GPU; NVLink {args.bw / 1e9:.0f} GB/s "
          f"x {args.bw_eff:.0%}; {args.latency * 1e6:.0f} us per collective; no overlap\n")

    print("| GPUs | layout | TFLOP/step per GPU (ditd plan) | comm MB/step per GPU | compute s/step "
          "| comm s/step | projected s per image (28 steps) | same, text split (Diffusers plan) "
          "| xDiT H100 PyTorch s | xDiT H100 torch.compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for P in (1, 2, 4, 8):
        for name, R, U, T, p2p in layouts(P):
            comp, comm, nb = step_cost(R, U, T, args, False, p2p)
            comp_s, comm_s, _ = step_cost(R, U, T, args, True, p2p)
            fl = comp * args.fraction * args.peak
            x = XDIT.get(name)
            xs = f"{x[0]:.2f} | {x[1]:.2f}" if x else "- | -"
            print(f"| {P} | {name} | {fl / 1e12:.1f} | {nb / 1e6:.0f} | {comp:.3f} | {comm:.4f} "
                  f"| {STEPS * (comp + comm):.2f} | {STEPS * (comp_s + comm_s):.2f} | {xs} |")
    print("\n(dp: P replicas, one image each: per image as 1 GPU, P images at once)")

    rep, split = flux_params()
    meta = meta_counts()
    total = rep + split
    print(f"\ntransformer parameters from the shapes: {total / 1e9:.3f} B ({split / 1e9:.3f} B split "
          f"by tp, {rep / 1e9:.3f} B replicated: embeddings, adaLN modulations, norms, output)")
    if meta:
        flux, t5, clip, vae, vae_dec = meta
        print(f"Diffusers on the meta device: transformer {flux / 1e9:.3f} B, T5-XXL encoder "
              f"{t5 / 1e9:.3f} B, CLIP-L text {clip / 1e6:.1f} M, VAE {vae / 1e6:.1f} M "
              f"(decoder {vae_dec / 1e6:.1f} M)")
    else:
        t5, clip, vae = 4.762e9, 123.1e6, 83.8e6
        print("(torch/diffusers not found: encoder and VAE counts are the stated constants)")
    GB = 1e9
    print(f"\nbf16 (2 bytes). Encoders and VAE on a rank that runs them: T5-XXL {2 * t5 / GB:.2f} GB, "
          f"CLIP-L {2 * clip / GB:.2f} GB, VAE {2 * vae / GB:.2f} GB\n")
    chk = [(act_elems(1, 1, 1)[0] + act_elems(1, 1, 1)[1]) * 4 / 1e6,
           (act_elems(1, 2, 1)[0] + act_elems(1, 2, 1)[1]) * 4 / 1e6,
           (act_elems(2, 1, 1)[0] + act_elems(2, 1, 1)[1]) * 4 / 1e6]
    print("check against the arenas bench_flux plans on the CPU (f32): the formula gives "
          f"{chk[0]:.1f} / {chk[1]:.1f} / {chk[2]:.1f} MB for one rank / ulysses 2 / ring 2; "
          "bench_flux printed 642.8 / 669.1 / 524.5 MB (arena alignment aside)\n")
    print("| ranks | layout | transformer weights GB/rank | activations GB/rank (ditd plan) "
          "| transformer total GB/rank | + T5, CLIP, VAE on the rank GB |")
    print("|---|---|---|---|---|---|")
    enc = 2 * (t5 + clip + vae) / GB
    for P in (1, 2, 4, 8):
        rows = [("dp (replicas)", 1, 1, 1, False)] if P > 1 else [("one rank", 1, 1, 1, False)]
        if P > 1:
            rows += [(f"ulysses {P}", 1, P, 1, False), (f"ring {P} allgather", P, 1, 1, False),
                     (f"ring {P} p2p", P, 1, 1, True), (f"tp {P}", 1, 1, P, False)]
        if P >= 4:
            rows.append((f"ulysses {P // 2} x ring 2 p2p", 2, P // 2, 1, True))
        for name, R, U, T, p2p in rows:
            w = 2 * (rep + split / T) / GB
            e, f32 = act_elems(R, U, T, p2p)
            a = (2 * e + 4 * f32) / GB
            print(f"| {P} | {name} | {w:.2f} | {a:.2f} | {w + a:.2f} | {w + a + enc:.2f} |")


if __name__ == "__main__":
    main()
