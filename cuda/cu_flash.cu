// cu_flash.cu — causal self-attention on the tensor cores (bf16 precision
// only), flash-attention-2 style: bf16 operands through mma.sync m16n8k16
// with fp32 accumulation, online softmax in fp32 (exp2 with the scale and
// log2(e) folded in), the row logsumexp saved; the backward recomputes P
// from it. Nothing of size (T,T) is stored. No atomics: every output
// element is written by one thread, in a fixed order (run-to-run
// reproducible).
//
// Layout as cu_attn.cu: qkv (B,T,3C) with q | k | v, head h at columns h*HS;
// out, dout (B,T,C); lse, dsum (B,NH,T). HS in {16, 32, 64, 128}.
//
// Thread maps (128 threads = 4 warps per block, one block per
// (64-row tile, b*NH+h)):
//   forward   block = 64 query rows, warp w = rows 16w..16w+15; key/value
//             tiles of 64 rows stream through shared memory (cp.async, two
//             stages); S = Q K^T (16 x 64 per warp) in registers, online
//             softmax, P (bf16, C fragment reused as A fragment) @ V.
//   dK,dV     block = 64 key rows, warp w = keys 16w..; query tiles i >= j
//             stream (Q, dO, lse, D); S^T = K Q^T, dP^T = V dO^T,
//             dV += P^T dO, dK += dS^T Q.
//   dQ        block = 64 query rows; key tiles j <= i stream (K, V);
//             S = Q K^T, dP = dO V^T, dQ += dS K.
//   The heaviest tiles are launched first (causal: later query tiles,
//   earlier key tiles).
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane/4, t = lane%4):
//   A 16x16: a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
//   B 16x8:  b0 (k 2t..2t+1, n g) b1 (k 2t+8.., n g)
//   C 16x8:  c0,c1 (g, 2t..2t+1) c2,c3 (g+8, 2t..2t+1)
//   so the C fragments of two adjacent n8 tiles, packed to bf16 pairs, are
//   the A fragment of the next product (k = those 16 columns).
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "cu_layers.cuh"

#define S_LOG2E 1.4426950408889634f
#define S_LN2 0.6931471805599453f

namespace {

constexpr int BR = 64;       // rows of every tile
constexpr int NT = 128;      // threads per block
constexpr int NB = BR / 8;   // n8 tiles across a 64-wide S tile

__device__ __forceinline__ void d_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void d_ldsm4(uint32_t r[4], const cu_bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void d_ldsm4t(uint32_t r[4], const cu_bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void d_cp16(cu_bf16 *s, const cu_bf16 *g, bool valid)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void d_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void d_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint32_t d_pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

// 64 rows x HS columns from global (row stride ld elements, rows r0.. of
// T; rows >= T are zero-filled) into shared memory with row stride HS + 8
// (16 bytes of padding: the 8 row addresses of an ldmatrix hit 8 different
// 16-byte bank groups).
template <int HS> __device__ __forceinline__ void d_tile(cu_bf16 *sm, const cu_bf16 *g, size_t ld, int r0, int T)
{
    constexpr int CPR = HS / 8, SP = HS + 8;
    for (int e = threadIdx.x; e < BR * CPR; e += NT) {
        const int r = e / CPR, cc = e % CPR, row = r0 + r;
        const bool v = row < T;
        d_cp16(sm + r * SP + cc * 8, g + (size_t)(v ? row : 0) * ld + cc * 8, v);
    }
}

// A fragments of this warp's 16 rows of a 64-row shared tile
template <int HS> __device__ __forceinline__ void d_afrag(uint32_t f[HS / 16][4], const cu_bf16 *sm, int warp, int lane)
{
    constexpr int SP = HS + 8;
#pragma unroll
    for (int kc = 0; kc < HS / 16; kc++)
        d_ldsm4(f[kc], sm + (warp * 16 + (lane & 15)) * SP + kc * 16 + (lane >> 4) * 8);
}

// s (16 x 64) = A (16 x HS, fragments) @ M^T, M a 64 x HS shared tile
// (rows = the n index): B[k=d][n=row] = M[row][d], non-transposed ldmatrix
template <int HS>
__device__ __forceinline__ void d_abt(float s[NB][4], const uint32_t a[HS / 16][4], const cu_bf16 *sm, int lane)
{
    constexpr int SP = HS + 8;
#pragma unroll
    for (int n = 0; n < NB; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int np = 0; np < NB / 2; np++)
#pragma unroll
        for (int kc = 0; kc < HS / 16; kc++) {
            uint32_t r[4];
            d_ldsm4(r, sm + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * SP + kc * 16 + ((lane >> 3) & 1) * 8);
            d_mma(s[2 * np], a[kc], r[0], r[1]);
            d_mma(s[2 * np + 1], a[kc], r[2], r[3]);
        }
}

// acc (16 x HS) += P (16 x 64, C fragments) @ M, M a 64 x HS shared tile
// (rows = the k index): B[k=row][n=d] = M[row][d], transposed ldmatrix
template <int HS>
__device__ __forceinline__ void d_pm(float acc[HS / 8][4], const float p[NB][4], const cu_bf16 *sm, int lane)
{
    constexpr int SP = HS + 8;
#pragma unroll
    for (int kc = 0; kc < NB / 2; kc++) {
        const uint32_t a[4] = { d_pack(p[2 * kc][0], p[2 * kc][1]), d_pack(p[2 * kc][2], p[2 * kc][3]),
                                d_pack(p[2 * kc + 1][0], p[2 * kc + 1][1]),
                                d_pack(p[2 * kc + 1][2], p[2 * kc + 1][3]) };
#pragma unroll
        for (int dp = 0; dp < HS / 16; dp++) {
            uint32_t r[4];
            d_ldsm4t(r, sm + (kc * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * SP + dp * 16 + (lane >> 4) * 8);
            d_mma(acc[2 * dp], a, r[0], r[1]);
            d_mma(acc[2 * dp + 1], a, r[2], r[3]);
        }
    }
}

// this thread's rows (r0 = tile row + g, r0 + 8) of a 16 x HS accumulator,
// times mul0 / mul1, -> bf16
template <int HS>
__device__ __forceinline__ void d_store(cu_bf16 *base, size_t ld, int r0, int T, const float acc[HS / 8][4],
                                        float mul0, float mul1, int lane)
{
    const int t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = r0 + 8 * h;
        if (row >= T)
            continue;
        const float mul = h ? mul1 : mul0;
        cu_bf16 *o = base + (size_t)row * ld + 2 * t;
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            *(uint32_t *)(o + n * 8) = d_pack(acc[n][2 * h] * mul, acc[n][2 * h + 1] * mul);
    }
}

// The block's column sums of M (1 or 2) 64 x HS accumulators (accm, times mulm) into
// outm[0..HS): each thread adds its two rows (rows from T on are not stored and not added),
// the warp's 8 row groups g are added by a reduce-scatter over lanes (each xor step sends
// half of the values still held and keeps the other half: 7 * NV / 8 shuffles for NV
// values instead of 3 NV), and the 4 warps' sums are added in warp order. A fixed order:
// the same bits every run. The sums are of the fp32 products (d_store rounds them to bf16
// as it stores). cs: 4 * M * HS floats of shared memory; every thread calls, once.
template <int HS, int M>
__device__ __forceinline__ void d_colsum(float *out0, float *out1, const float (&acc0)[HS / 8][4],
                                         const float (&acc1)[HS / 8][4], float mul0, float mul1, int r0, int T,
                                         float (*cs)[M * HS], int warp, int lane)
{
    constexpr int NV = M * HS / 4; // values per thread: (m, n, e), column n * 8 + 2t + e
    const int t = lane & 3, g = lane >> 2;
    const bool ok0 = r0 < T, ok1 = r0 + 8 < T;
    float v[NV];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float(&a)[HS / 8][4] = m ? acc1 : acc0;
                v[(m * (HS / 8) + n) * 2 + e] = (ok0 ? a[n][e] : 0.0f) + (ok1 ? a[n][2 + e] : 0.0f);
            }
    if constexpr (NV >= 8) {
        // step `mask` (16, 8, 4: a bit of g) keeps the upper half where the lane has that bit
        auto step = [&](auto half, int mask) {
            const bool up = (lane & mask) != 0;
#pragma unroll
            for (int i = 0; i < decltype(half)::value; i++) {
                const float send = up ? v[i] : v[i + decltype(half)::value];
                const float keep = up ? v[i + decltype(half)::value] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
            }
        };
        step(std::integral_constant<int, NV / 2>{}, 16);
        step(std::integral_constant<int, NV / 4>{}, 8);
        step(std::integral_constant<int, NV / 8>{}, 4);
        // lane (g, t) holds values g * NV / 8 + k, k < NV / 8
#pragma unroll
        for (int k = 0; k < NV / 8; k++) {
            const int i = g * (NV / 8) + k, mn = i >> 1, m = mn / (HS / 8), n = mn % (HS / 8);
            cs[warp][m * HS + n * 8 + 2 * t + (i & 1)] = v[k];
        }
    } else {
#pragma unroll
        for (int i = 0; i < NV; i++) {
            v[i] += __shfl_xor_sync(0xffffffffu, v[i], 16);
            v[i] += __shfl_xor_sync(0xffffffffu, v[i], 8);
            v[i] += __shfl_xor_sync(0xffffffffu, v[i], 4);
            const int mn = i >> 1, m = mn / (HS / 8), n = mn % (HS / 8);
            if (g == 0)
                cs[warp][m * HS + n * 8 + 2 * t + (i & 1)] = v[i];
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < M * HS; c += NT) {
        const float sum = cs[0][c] + cs[1][c] + cs[2][c] + cs[3][c];
        if (c < HS)
            out0[c] = sum * mul0;
        else
            out1[c - HS] = sum * mul1;
    }
}

template <int HS>
__global__ void __launch_bounds__(NT, HS <= 64 ? 4 : 1)
    k_fa_fwd(cu_bf16 *out, float *lse, const cu_bf16 *qkv, int T, int C, int NH, float sl2)
{
    constexpr int SP = HS + 8, TILE = BR * SP;
    extern __shared__ __align__(16) unsigned char s_raw[];
    cu_bf16 *Qs = (cu_bf16 *)s_raw, *Ks = Qs + TILE, *Vs = Ks + 2 * TILE;
    const int nqt = (T + BR - 1) / BR, qt = nqt - 1 - (int)blockIdx.x;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int i0 = qt * BR, r0 = i0 + warp * 16 + g; // this thread's rows r0, r0 + 8
    const size_t C3 = 3 * (size_t)C;
    const cu_bf16 *qb = qkv + (size_t)b * T * C3 + (size_t)h * HS, *kb = qb + C, *vb = qb + 2 * C;

    d_tile<HS>(Qs, qb, C3, i0, T);
    d_tile<HS>(Ks, kb, C3, 0, T);
    d_tile<HS>(Vs, vb, C3, 0, T);
    d_commit();
    uint32_t qf[HS / 16][4];
    float o[HS / 8][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        const int st = kt & 1;
        __syncthreads(); // stage st ^ 1 is no longer read
        if (kt < qt) {
            d_tile<HS>(Ks + (st ^ 1) * TILE, kb, C3, (kt + 1) * BR, T);
            d_tile<HS>(Vs + (st ^ 1) * TILE, vb, C3, (kt + 1) * BR, T);
        }
        d_commit();
        d_wait<1>();
        __syncthreads();
        d_afrag<HS>(qf, Qs, warp, lane); // every tile (registers: 4 blocks per SM)
        float s[NB][4];
        d_abt<HS>(s, qf, Ks + st * TILE, lane);
        float mx[2] = { -INFINITY, -INFINITY };
        auto scaled = [&](auto masked) { // the causal mask only on the diagonal tile
#pragma unroll
            for (int n = 0; n < NB; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = r0 + (e >> 1) * 8, col = kt * BR + n * 8 + 2 * t + (e & 1);
                    float v = s[n][e] * sl2;
                    if (decltype(masked)::value && col > row)
                        v = -INFINITY;
                    s[n][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
        };
        if (kt == qt)
            scaled(std::true_type{});
        else
            scaled(std::false_type{});
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
            mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
            const float mn = fmaxf(m[hh], mx[hh]), corr = cl_exp2(m[hh] - mn);
            m[hh] = mn;
            l[hh] *= corr;
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                o[n][2 * hh] *= corr;
                o[n][2 * hh + 1] *= corr;
            }
        }
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = cl_exp2(s[n][e] - m[e >> 1]);
                s[n][e] = p;
                l[e >> 1] += p;
            }
        d_pm<HS>(o, s, Vs + st * TILE, lane);
    }
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 1);
        l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 2);
    }
    d_store<HS>(out + (size_t)b * T * C + (size_t)h * HS, (size_t)C, r0, T, o, 1.0f / l[0], 1.0f / l[1], lane);
    if (t == 0)
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
            if (r0 + 8 * hh < T)
                lse[(size_t)bh * T + r0 + 8 * hh] = (m[hh] + log2f(l[hh])) * S_LN2;
}

template <int HS>
__global__ void __launch_bounds__(NT, HS <= 64 ? 3 : 1)
    k_fa_bwd_kv(cu_bf16 *dqkv, float *part, const cu_bf16 *dout, const float *lse, const float *dsum,
                const cu_bf16 *qkv, int T, int C, int NH, float sl2, float scale)
{
    constexpr int SP = HS + 8, TILE = BR * SP;
    extern __shared__ __align__(16) unsigned char s_raw[];
    cu_bf16 *Ks = (cu_bf16 *)s_raw, *Vs = Ks + TILE, *Qs = Vs + TILE, *Ds = Qs + 2 * TILE;
    float *Ls = (float *)(Ds + 2 * TILE), *Dd = Ls + 2 * BR; // [2][BR] each
    const int nt = (T + BR - 1) / BR, kt = (int)blockIdx.x;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int j0 = kt * BR, r0 = j0 + warp * 16 + g; // this thread's key rows r0, r0 + 8
    const size_t C3 = 3 * (size_t)C;
    const cu_bf16 *qb = qkv + (size_t)b * T * C3 + (size_t)h * HS, *kb = qb + C, *vb = qb + 2 * C;
    const cu_bf16 *db = dout + (size_t)b * T * C + (size_t)h * HS;
    const float *lb = lse + (size_t)bh * T, *sb = dsum + (size_t)bh * T;

    d_tile<HS>(Ks, kb, C3, j0, T);
    d_tile<HS>(Vs, vb, C3, j0, T);
    d_tile<HS>(Qs, qb, C3, j0, T);
    d_tile<HS>(Ds, db, (size_t)C, j0, T);
    d_commit();
    if (threadIdx.x < BR) {
        const int i = j0 + threadIdx.x;
        Ls[threadIdx.x] = i < T ? lb[i] * S_LOG2E : 0.0f;
        Dd[threadIdx.x] = i < T ? sb[i] : 0.0f;
    }
    uint32_t kf[HS / 16][4], vf[HS / 16][4];
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
    for (int qt = kt; qt < nt; qt++) {
        const int st = (qt - kt) & 1;
        __syncthreads();
        if (qt + 1 < nt) {
            d_tile<HS>(Qs + (st ^ 1) * TILE, qb, C3, (qt + 1) * BR, T);
            d_tile<HS>(Ds + (st ^ 1) * TILE, db, (size_t)C, (qt + 1) * BR, T);
            if (threadIdx.x < BR) {
                const int i = (qt + 1) * BR + threadIdx.x;
                Ls[(st ^ 1) * BR + threadIdx.x] = i < T ? lb[i] * S_LOG2E : 0.0f;
                Dd[(st ^ 1) * BR + threadIdx.x] = i < T ? sb[i] : 0.0f;
            }
        }
        d_commit();
        d_wait<1>();
        __syncthreads();
        float s[NB][4], dp[NB][4];
        d_afrag<HS>(kf, Ks, warp, lane); // every tile (not kept across tiles: registers)
        d_abt<HS>(s, kf, Qs + st * TILE, lane);  // S^T: keys x queries
        d_afrag<HS>(vf, Vs, warp, lane);
        d_abt<HS>(dp, vf, Ds + st * TILE, lane); // dP^T
        const float *L = Ls + st * BR, *D = Dd + st * BR;
        // the causal mask and the tensor's end only on the diagonal tile and a partial last one
        auto probs = [&](auto masked) {
#pragma unroll
            for (int n = 0; n < NB; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = r0 + (e >> 1) * 8, ci = n * 8 + 2 * t + (e & 1), i = qt * BR + ci;
                    const bool in = !decltype(masked)::value || (i < T && j <= i);
                    const float p = in ? cl_exp2(s[n][e] * sl2 - L[ci]) : 0.0f;
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - D[ci]);
                }
        };
        if (qt == kt || (qt + 1) * BR > T)
            probs(std::true_type{});
        else
            probs(std::false_type{});
        d_pm<HS>(dv, s, Ds + st * TILE, lane);
        d_pm<HS>(dk, dp, Qs + st * TILE, lane);
    }
    cu_bf16 *ob = dqkv + (size_t)b * T * C3 + (size_t)h * HS;
    d_store<HS>(ob + C, C3, r0, T, dk, scale, scale, lane);
    d_store<HS>(ob + 2 * C, C3, r0, T, dv, 1.0f, 1.0f, lane);
    if (part) { // the bias gradient's partial row (b, kt): its k and v columns of head h
        __shared__ float cs[4][2 * HS];
        float *pr = part + ((size_t)b * nt + kt) * C3 + (size_t)h * HS;
        d_colsum<HS, 2>(pr + C, pr + 2 * C, dk, dv, scale, 1.0f, r0, T, cs, warp, lane);
    }
}

template <int HS>
__global__ void __launch_bounds__(NT, HS <= 64 ? 4 : 1)
    k_fa_bwd_q(cu_bf16 *dqkv, float *part, const cu_bf16 *dout, const float *lse, const float *dsum,
               const cu_bf16 *qkv, int T, int C, int NH, float sl2, float scale)
{
    constexpr int SP = HS + 8, TILE = BR * SP;
    extern __shared__ __align__(16) unsigned char s_raw[];
    cu_bf16 *Qs = (cu_bf16 *)s_raw, *Ds = Qs + TILE, *Ks = Ds + TILE, *Vs = Ks + 2 * TILE;
    const int nqt = (T + BR - 1) / BR, qt = nqt - 1 - (int)blockIdx.x;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int i0 = qt * BR, r0 = i0 + warp * 16 + g;
    const size_t C3 = 3 * (size_t)C;
    const cu_bf16 *qb = qkv + (size_t)b * T * C3 + (size_t)h * HS, *kb = qb + C, *vb = qb + 2 * C;
    const cu_bf16 *db = dout + (size_t)b * T * C + (size_t)h * HS;

    d_tile<HS>(Qs, qb, C3, i0, T);
    d_tile<HS>(Ds, db, (size_t)C, i0, T);
    d_tile<HS>(Ks, kb, C3, 0, T);
    d_tile<HS>(Vs, vb, C3, 0, T);
    d_commit();
    float L[2], D[2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int i = r0 + 8 * hh;
        L[hh] = i < T ? lse[(size_t)bh * T + i] * S_LOG2E : 0.0f;
        D[hh] = i < T ? dsum[(size_t)bh * T + i] : 0.0f;
    }
    uint32_t qf[HS / 16][4], df[HS / 16][4];
    float dq[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        const int st = kt & 1;
        __syncthreads();
        if (kt < qt) {
            d_tile<HS>(Ks + (st ^ 1) * TILE, kb, C3, (kt + 1) * BR, T);
            d_tile<HS>(Vs + (st ^ 1) * TILE, vb, C3, (kt + 1) * BR, T);
        }
        d_commit();
        d_wait<1>();
        __syncthreads();
        float s[NB][4], dp[NB][4];
        d_afrag<HS>(qf, Qs, warp, lane); // every tile, as in k_fa_bwd_kv
        d_abt<HS>(s, qf, Ks + st * TILE, lane);
        d_afrag<HS>(df, Ds, warp, lane);
        d_abt<HS>(dp, df, Vs + st * TILE, lane);
        auto probs = [&](auto masked) { // the causal mask only on the diagonal tile
#pragma unroll
            for (int n = 0; n < NB; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = r0 + (e >> 1) * 8, j = kt * BR + n * 8 + 2 * t + (e & 1);
                    const float p = (!decltype(masked)::value || j <= i) ? cl_exp2(s[n][e] * sl2 - L[e >> 1]) : 0.0f;
                    dp[n][e] = p * (dp[n][e] - D[e >> 1]);
                }
        };
        if (kt == qt)
            probs(std::true_type{});
        else
            probs(std::false_type{});
        d_pm<HS>(dq, dp, Ks + st * TILE, lane);
    }
    d_store<HS>(dqkv + (size_t)b * T * C3 + (size_t)h * HS, C3, r0, T, dq, scale, scale, lane);
    if (part) { // the bias gradient's partial row (b, qt): its q columns of head h
        __shared__ float cs[4][HS];
        d_colsum<HS, 1>(part + ((size_t)b * nqt + qt) * C3 + (size_t)h * HS, NULL, dq, dq, scale, 0.0f, r0, T, cs,
                        warp, lane);
    }
}

// D = rowsum(dout * out) per (b, h, i): one warp per 32 / (HS/8) rows, 16-byte loads
template <int HS> __global__ void k_fa_dsum(float *dsum, const cu_bf16 *dout, const cu_bf16 *out, int B, int T, int C, int NH)
{
    constexpr int LPR = HS / 8; // lanes per row
    const size_t n = (size_t)B * NH * T;
    const size_t k = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / LPR;
    const int sub = threadIdx.x % LPR;
    float s = 0.0f;
    if (k < n) {
        const size_t bh = k / T;
        const int i = (int)(k % T), b = (int)(bh / NH), h = (int)(bh % NH);
        const size_t o = ((size_t)b * T + i) * C + (size_t)h * HS + sub * 8;
        const uint4 x = *(const uint4 *)(dout + o), y = *(const uint4 *)(out + o);
        const __nv_bfloat162 *xa = (const __nv_bfloat162 *)&x, *ya = (const __nv_bfloat162 *)&y;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 a = __bfloat1622float2(xa[e]), c = __bfloat1622float2(ya[e]);
            s += a.x * c.x + a.y * c.y;
        }
    }
#pragma unroll
    for (int off = LPR / 2; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    if (k < n && sub == 0)
        dsum[k] = s;
}

template <int HS> size_t s_smem_fwd() { return (size_t)5 * BR * (HS + 8) * sizeof(cu_bf16); }
template <int HS> size_t s_smem_kv() { return (size_t)6 * BR * (HS + 8) * sizeof(cu_bf16) + 4 * BR * sizeof(float); }
template <int HS> size_t s_smem_q() { return (size_t)6 * BR * (HS + 8) * sizeof(cu_bf16); }

// raise the dynamic shared-memory limit once per kernel and device (above 48 KB)
template <class K> cudaError_t s_optin(K kernel, size_t bytes, cl_optin *state)
{
    return cl_smem_optin((const void *)kernel, bytes, state);
}

template <int HS> cudaError_t s_fa_fwd(cu_bf16 *out, float *lse, const cu_bf16 *qkv, int B, int T, int C, int NH,
                                       cudaStream_t st)
{
    static cl_optin optin;
    const size_t sm = s_smem_fwd<HS>();
    cudaError_t e = s_optin(k_fa_fwd<HS>, sm, &optin);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)((T + BR - 1) / BR), (unsigned)(B * NH));
    k_fa_fwd<HS><<<grid, NT, sm, st>>>(out, lse, qkv, T, C, NH, S_LOG2E / sqrtf((float)HS));
    return cudaGetLastError();
}

// part non-NULL: the blocks leave the column sums of their dqkv tiles in part (a row of 3C
// per (b, tile of BR rows)) for cl_colpart_sum
template <int HS>
cudaError_t s_fa_bwd(cu_bf16 *dqkv, float *part, float *dsum, const cu_bf16 *dout, const cu_bf16 *out,
                     const float *lse, const cu_bf16 *qkv, int B, int T, int C, int NH, cudaStream_t st)
{
    static cl_optin optin_kv, optin_q;
    const float scale = 1.0f / sqrtf((float)HS), sl2 = scale * S_LOG2E;
    const size_t rows = (size_t)B * NH * T, threads = rows * (HS / 8);
    k_fa_dsum<HS><<<(unsigned)((threads + 255) / 256), 256, 0, st>>>(dsum, dout, out, B, T, C, NH);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    const size_t smkv = s_smem_kv<HS>(), smq = s_smem_q<HS>();
    if ((e = s_optin(k_fa_bwd_kv<HS>, smkv, &optin_kv)) != cudaSuccess ||
        (e = s_optin(k_fa_bwd_q<HS>, smq, &optin_q)) != cudaSuccess)
        return e;
    dim3 grid((unsigned)((T + BR - 1) / BR), (unsigned)(B * NH));
    k_fa_bwd_kv<HS><<<grid, NT, smkv, st>>>(dqkv, part, dout, lse, dsum, qkv, T, C, NH, sl2, scale);
    if ((e = cudaGetLastError()) != cudaSuccess)
        return e;
    k_fa_bwd_q<HS><<<grid, NT, smq, st>>>(dqkv, part, dout, lse, dsum, qkv, T, C, NH, sl2, scale);
    return cudaGetLastError();
}

} // namespace

cudaError_t cl_flash_forward(cu_bf16 *out, float *lse, const cu_bf16 *qkv, int B, int T, int C, int NH,
                             cudaStream_t st)
{
    switch (C / NH) {
    case 16: return s_fa_fwd<16>(out, lse, qkv, B, T, C, NH, st);
    case 32: return s_fa_fwd<32>(out, lse, qkv, B, T, C, NH, st);
    case 64: return s_fa_fwd<64>(out, lse, qkv, B, T, C, NH, st);
    case 128: return s_fa_fwd<128>(out, lse, qkv, B, T, C, NH, st);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t cl_flash_backward(cu_bf16 *dqkv, float *dsum, const cu_bf16 *dout, const cu_bf16 *out, const float *lse,
                              const cu_bf16 *qkv, int B, int T, int C, int NH, cudaStream_t st, float *const *dbias,
                              float *part)
{
    const int nt = (T + BR - 1) / BR;
    const bool sums = dbias && (dbias[0] || dbias[1] || dbias[2]);
    float *p = sums && part && (size_t)B * nt <= CL_COLPART_BLOCKS ? part : NULL;
    cudaError_t e;
    switch (C / NH) {
    case 16: e = s_fa_bwd<16>(dqkv, p, dsum, dout, out, lse, qkv, B, T, C, NH, st); break;
    case 32: e = s_fa_bwd<32>(dqkv, p, dsum, dout, out, lse, qkv, B, T, C, NH, st); break;
    case 64: e = s_fa_bwd<64>(dqkv, p, dsum, dout, out, lse, qkv, B, T, C, NH, st); break;
    case 128: e = s_fa_bwd<128>(dqkv, p, dsum, dout, out, lse, qkv, B, T, C, NH, st); break;
    default: return cudaErrorInvalidValue;
    }
    if (e != cudaSuccess || !sums)
        return e;
    if (p) // every (row tile, column) of part written once by the two kernels
        return cl_colpart_sum(dbias, 3, C, p, B * nt, st);
    return cl_qkv_bias_backward<cu_bf16>(dbias, dqkv, B * T, C, part, st);
}
