/* The per-position video kernels of kernels/cpu/video_kernels.h: the
 * channel RMS norm and the AvgDown3D / DupUp3D rearrangements. Plain loops
 * with OpenMP over channels or position blocks; no BLAS. */
#include "kernels/cpu/video_kernels.h"

#include <assert.h>
#include <math.h>

#define RMS_BLOCK 256 /* positions per block: the sums stay in L1 */

void ditd_cpu_rmsnorm_channels(const float *x, size_t psx, float *y, size_t psy, int C, int n,
                               const float *gamma, int silu)
{
    const double scale = sqrt((double)C);
    const int nb = (n + RMS_BLOCK - 1) / RMS_BLOCK;
    assert(C > 0 && n >= 0);
#pragma omp parallel for schedule(static) if ((size_t)C * n >= DITD_CPU_VIDEO_OMP_MIN)
    for (int blk = 0; blk < nb; blk++) {
        const int i0 = blk * RMS_BLOCK, m = n - i0 < RMS_BLOCK ? n - i0 : RMS_BLOCK;
        double ss[RMS_BLOCK];
        float inv[RMS_BLOCK];
        for (int i = 0; i < m; i++)
            ss[i] = 0.0;
        for (int c = 0; c < C; c++) {
            const float *xp = x + (size_t)c * psx + i0;
            for (int i = 0; i < m; i++)
                ss[i] += (double)xp[i] * xp[i];
        }
        for (int i = 0; i < m; i++) {
            double d = sqrt(ss[i]);
            inv[i] = (float)(1.0 / (d > 1e-12 ? d : 1e-12));
        }
        for (int c = 0; c < C; c++) {
            const float *xp = x + (size_t)c * psx + i0;
            float *yp = y + (size_t)c * psy + i0;
            const float g = (float)scale * (gamma ? gamma[c] : 1.0f);
            for (int i = 0; i < m; i++) {
                float v = xp[i] * inv[i] * g;
                yp[i] = silu ? v / (1.0f + expf(-v)) : v;
            }
        }
    }
}

void ditd_cpu_avgdown3d_frame(const float *const *xf, size_t psx, int Cin, int H, int W, int Cout,
                              int ft, int fs, float *y, size_t psy, int accumulate)
{
    const int factor = ft * fs * fs, group = Cin * factor / Cout;
    const int Ho = H / fs, Wo = W / fs;
    const float inv = 1.0f / (float)group;
    assert(H % fs == 0 && W % fs == 0 && (Cin * factor) % Cout == 0);
#pragma omp parallel for schedule(static) if ((size_t)Cin * factor * Ho * Wo >= DITD_CPU_VIDEO_OMP_MIN)
    for (int o = 0; o < Cout; o++) {
        float *yp = y + (size_t)o * psy;
        for (int h = 0; h < Ho; h++)
            for (int w = 0; w < Wo; w++) {
                float s = 0.0f;
                for (int g = 0; g < group; g++) {
                    const int j = o * group + g, c = j / factor, r = j % factor;
                    const int a = r / (fs * fs), p = (r / fs) % fs, q = r % fs;
                    if (xf[a])
                        s += xf[a][(size_t)c * psx + (size_t)(h * fs + p) * W + w * fs + q];
                }
                float v = s * inv;
                yp[(size_t)h * Wo + w] = accumulate ? yp[(size_t)h * Wo + w] + v : v;
            }
    }
}

void ditd_cpu_dupup3d_frame(const float *x, size_t psx, int Cin, int H, int W, int Cout, int ft,
                            int fs, int a, float *y, size_t psy, int accumulate)
{
    const int factor = ft * fs * fs, repeats = Cout * factor / Cin, Wo = W * fs;
    assert((Cout * factor) % Cin == 0 && a >= 0 && a < ft);
#pragma omp parallel for schedule(static) if ((size_t)Cout * H * W * fs * fs >= DITD_CPU_VIDEO_OMP_MIN)
    for (int o = 0; o < Cout; o++) {
        float *yp = y + (size_t)o * psy;
        for (int p = 0; p < fs; p++)
            for (int q = 0; q < fs; q++) {
                const int c = (o * factor + a * fs * fs + p * fs + q) / repeats;
                const float *xp = x + (size_t)c * psx;
                for (int h = 0; h < H; h++)
                    for (int w = 0; w < W; w++) {
                        float *d = yp + (size_t)(h * fs + p) * Wo + w * fs + q;
                        *d = accumulate ? *d + xp[(size_t)h * W + w] : xp[(size_t)h * W + w];
                    }
            }
    }
}
