/* GPU micro-benchmark (not a test; tests/gpu/run.sh runs it): the DiT-XL/2
 * GEMMs through ditd_cuda_linear (cuBLASLt, with the model's epilogues)
 * beside plain cuBLAS (cublasGemmEx, no epilogue) on the same shapes, and
 * the flash attention forward, in TFLOP/s. Median of event-timed runs after
 * warm-up, random (never zero) inputs. Prints markdown tables. Exits 77
 * without a GPU. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_kernels.h"

#define ITERS 30
#define WARMUP 5

#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e_ = (x);                                                        \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "bench_cuda: %s: %s\n", #x, cudaGetErrorString(e_));     \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* a device buffer of n bf16 values, uniform in [-1, 1) (from f32 on the device) */
static void *rand_bf16(size_t n, unsigned seed)
{
    float *h = malloc(n * sizeof *h), *d32;
    void *d;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = (float)(seed >> 8) / 8388608.0f - 1.0f;
    }
    CK(cudaMalloc((void **)&d32, n * sizeof(float)));
    CK(cudaMalloc(&d, n * 2));
    CK(cudaMemcpy(d32, h, n * sizeof(float), cudaMemcpyHostToDevice));
    if (ditd_cuda_f32_to_bf16(d32, d, n, NULL))
        exit(1);
    CK(cudaDeviceSynchronize());
    cudaFree(d32);
    free(h);
    return d;
}

/* cuBLASLt fallbacks (kernels/cuda/gemm.cu): said on stderr, and the row
 * is marked, since its "ditd" number is then the slow kernel's. */
static int fell_back;

static void on_fallback(void *ud, int M, int N, int K, size_t ldx, size_t ldy, ditd_cuda_act act,
                        int bias, const char *why)
{
    (void)ud, (void)ldx, (void)ldy, (void)bias;
    fell_back = 1;
    fprintf(stderr, "bench_cuda: linear M %d N %d K %d (act %d) takes the fallback kernel: %s\n",
            M, N, K, (int)act, why);
}

typedef int (*run_fn)(void *ctx);

/* median ms of fn over ITERS event-timed runs */
static float time_ms(run_fn fn, void *ctx)
{
    cudaEvent_t a, b;
    float t[ITERS];
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < WARMUP; i++)
        if (fn(ctx)) {
            fprintf(stderr, "bench_cuda: a run failed\n");
            exit(1);
        }
    for (int i = 0; i < ITERS; i++) {
        CK(cudaEventRecord(a, NULL));
        fn(ctx);
        CK(cudaEventRecord(b, NULL));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[i], a, b));
    }
    CK(cudaGetLastError());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    qsort(t, ITERS, sizeof t[0], cmp_f);
    return t[ITERS / 2];
}

typedef struct gemm_ctx {
    ditd_cuda_gemm *lt;
    cublasHandle_t cb;
    void *x, *w, *b, *y;
    int M, N, K;
    ditd_cuda_act act;
} gemm_ctx;

static int run_lt(void *p)
{
    gemm_ctx *c = p;
    return ditd_cuda_linear(c->lt, c->x, (size_t)c->K, c->w, c->b, c->y, (size_t)c->N, c->M, c->N,
                            c->K, c->act, NULL);
}

static int run_cublas(void *p)
{
    gemm_ctx *c = p;
    const float alpha = 1.0f, beta = 0.0f;
    return cublasGemmEx(c->cb, CUBLAS_OP_T, CUBLAS_OP_N, c->N, c->M, c->K, &alpha, c->w,
                        CUDA_R_16BF, c->K, c->x, CUDA_R_16BF, c->K, &beta, c->y, CUDA_R_16BF,
                        c->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS;
}

typedef struct attn_ctx {
    void *qkv, *o;
    float *lse;
    int B, N, H, Dh;
} attn_ctx;

static int run_attn(void *p)
{
    attn_ctx *c = p;
    size_t hd = (size_t)c->H * c->Dh, ld = 3 * hd;
    return ditd_cuda_attention(c->qkv, ld, (char *)c->qkv + hd * 2, ld, (char *)c->qkv + 2 * hd * 2,
                               ld, c->o, hd, c->lse, c->B, c->N, c->N, c->H, c->Dh,
                               1.0f / sqrtf((float)c->Dh), NULL);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, sm_%d%d\n\n", prop.name, prop.multiProcessorCount, prop.major,
           prop.minor);

    void *ws;
    size_t ws_bytes = (size_t)32 << 20;
    CK(cudaMalloc(&ws, ws_bytes));
    gemm_ctx g = {0};
    if (ditd_cuda_gemm_new(ws, ws_bytes, &g.lt) || cublasCreate(&g.cb) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_cuda: cuBLAS init failed\n");
        return 1;
    }
    cublasSetWorkspace(g.cb, ws, ws_bytes);
    ditd_cuda_gemm_on_fallback(g.lt, on_fallback, NULL);

    const int D = 1152, F = 4 * D;
    int fallbacks = 0;
    const int tokens[3] = {256, 1024, 4096};
    printf("| GEMM (DiT-XL/2) | M | N | K | ditd linear (cuBLASLt + epilogue) TFLOP/s | "
           "plain cuBLAS (no epilogue) TFLOP/s | ratio |\n|---|---|---|---|---|---|---|\n");
    for (int ti = 0; ti < 3; ti++) {
        for (int B = 1; B <= 2; B++) {
            int M = B * tokens[ti];
            struct {
                const char *what;
                int N, K;
                ditd_cuda_act act;
            } s[4] = {{"qkv", 3 * D, D, DITD_CUDA_ACT_NONE},
                      {"attn out", D, D, DITD_CUDA_ACT_NONE},
                      {"mlp fc1 + gelu", F, D, DITD_CUDA_ACT_GELU_TANH},
                      {"mlp fc2", D, F, DITD_CUDA_ACT_NONE}};
            for (int i = 0; i < 4; i++) {
                g.M = M, g.N = s[i].N, g.K = s[i].K, g.act = s[i].act;
                g.x = rand_bf16((size_t)M * g.K, 1u + (unsigned)i);
                g.w = rand_bf16((size_t)g.N * g.K, 7u + (unsigned)i);
                g.b = rand_bf16((size_t)g.N, 13u);
                CK(cudaMalloc(&g.y, (size_t)M * g.N * 2));
                double flop = 2.0 * M * g.N * g.K;
                fell_back = 0;
                float t_lt = time_ms(run_lt, &g), t_cb = time_ms(run_cublas, &g);
                printf("| %s | %d | %d | %d | %.1f%s | %.1f | %.2f |\n", s[i].what, M, g.N, g.K,
                       flop / (t_lt * 1e9), fell_back ? " (FALLBACK kernel)" : "",
                       flop / (t_cb * 1e9), t_cb / t_lt);
                fallbacks += fell_back;
                cudaFree(g.x), cudaFree(g.w), cudaFree(g.b), cudaFree(g.y);
            }
        }
    }

    printf("\n| attention (fused qkv, LSE on) | B | N | H | Dh | ms | TFLOP/s |\n"
           "|---|---|---|---|---|---|---|\n");
    const int dhs[3] = {72, 64, 128};
    for (int di = 0; di < 3; di++) {
        for (int ti = 0; ti < 3; ti++) {
            for (int B = 1; B <= 2; B++) {
                attn_ctx a = {.B = B, .N = tokens[ti], .Dh = dhs[di]};
                a.H = dhs[di] == 72 ? 16 : 1152 / dhs[di];
                size_t hd = (size_t)a.H * a.Dh;
                a.qkv = rand_bf16((size_t)B * a.N * 3 * hd, 3u);
                CK(cudaMalloc(&a.o, (size_t)B * a.N * hd * 2));
                CK(cudaMalloc((void **)&a.lse, (size_t)B * a.H * a.N * sizeof(float)));
                float t = time_ms(run_attn, &a);
                double flop = 4.0 * B * a.H * (double)a.N * a.N * a.Dh;
                printf("| %s | %d | %d | %d | %d | %.3f | %.1f |\n",
                       dhs[di] == 72 ? "DiT-XL/2" : "other head dim", B, a.N, a.H, a.Dh, t,
                       flop / (t * 1e9));
                cudaFree(a.qkv), cudaFree(a.o), cudaFree(a.lse);
            }
        }
    }
    ditd_cuda_gemm_free(g.lt);
    cublasDestroy(g.cb);
    cudaFree(ws);
    if (fallbacks)
        printf("\nFAIL: %d DiT-XL/2 GEMM shape(s) took the fallback kernel, not cuBLASLt\n",
               fallbacks);
    return fallbacks ? 1 : 0;
}
