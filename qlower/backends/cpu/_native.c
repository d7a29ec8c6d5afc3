/* Fused integer kernels of the qlower CPU backend (loaded by native.py with ctypes).
 *
 * Every function reproduces, element by element, the arithmetic of
 * qlower/ir/requant.py (TOSA 1.0 apply_scale_32) and of the reference interpreter:
 *   v = x + offset            (offset: folded bias/zero-point terms of a GEMM; the sum must fit int32)
 *   v = v - in_zp
 *   REQUIRE -h <= v < h, h = min(2**(s-1), 2**31)   (in range for the shift, and an int32)
 *   y = (v * m + rnd) >> s    (int64, rnd = 2**(s-1), +-2**30 for DOUBLE_ROUND with s > 31)
 *   y = clamp(clamp(y + out_zp, lo1, hi1), lo2, hi2)   (rescale's [qmin, qmax], then a fused clamp)
 * Products are formed in uint64 so that they wrap like NumPy's int64 instead of being undefined.
 * Violations are reported as flag bits; the caller raises the reference's error.
 * Threads: OpenMP, sharing the runtime (libgomp.so.1) already loaded by torch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* Work below which a kernel runs on the calling thread alone (OpenMP's if clause), in values (elementwise
 * kernels) or a small multiple of it in multiply-adds: splitting ~50 us of work saves little on an idle
 * machine, and on a loaded one every parallel region waits until all its threads have been scheduled. */
#define PAR_MIN 65536

#define FLAG_INT32 1   /* an int32 result (accumulator or sum) is out of range */
#define FLAG_SCALE 2   /* a rescale input is outside [-h, h), h = min(2**(s-1), 2**31) */

/* channel params: 7 arrays of C int64 each: offset, in_zp, mult, shift, h = min(2**(shift-1), 2**31)
 * (the REQUIRE bound), rnd_pos, rnd_neg (the rounding constants for v >= 0 and v < 0) */
/* scalars: out_zp, lo1, hi1, lo2, hi2, check_int32 */

/* The int8 stores of these kernels may alias anything (char types), so every pointer is
 * `restrict`, every parameter is read into a local before the loops, and loop bodies are
 * branch-free (flags are or-ed bit masks): this is what lets the compiler vectorize them. */
static inline int64_t apply_scale(int64_t v, int64_t m, int64_t s, int64_t half, int64_t rp, int64_t rn,
                                  int64_t *flags) {
    *flags |= ((int64_t)(v < -half) | (int64_t)(v >= half)) << 1;
    const uint64_t t = (uint64_t)v * (uint64_t)m + (uint64_t)(v >= 0 ? rp : rn);
    return ((int64_t)t) >> s;
}

typedef struct { int64_t zp, lo1, hi1, lo2, hi2; } out_params;

static inline out_params load_out(const int64_t *sc) {
    out_params o = {sc[0], sc[1], sc[2], sc[3], sc[4]};
    return o;
}

static inline int64_t clamp2(int64_t y, out_params o) {
    y += o.zp;
    y = y < o.lo1 ? o.lo1 : y;
    y = y > o.hi1 ? o.hi1 : y;
    y = y < o.lo2 ? o.lo2 : y;
    y = y > o.hi2 ? o.hi2 : y;
    return y;
}

static inline int64_t int32_flag(int64_t v) {
    return (int64_t)(v < INT32_MIN) | (int64_t)(v > INT32_MAX);
}

/* One row of C channels: the body every rescaling kernel shares. */
#define RESCALE_ROW(TIN, TOUT)                                                                   \
static inline int64_t rescale_row_##TIN##_##TOUT(                                                \
        const TIN *restrict x, TOUT *restrict y, int64_t C, const int64_t *restrict off,         \
        const int64_t *restrict zp, const int64_t *restrict mu, const int64_t *restrict sh,      \
        const int64_t *restrict hf, const int64_t *restrict rp, const int64_t *restrict rn,      \
        int64_t check, out_params o) {                                                           \
    int64_t f = 0;                                                                               \
    for (int64_t c = 0; c < C; c++) {                                                            \
        const int64_t v = (int64_t)x[c] + off[c];                                                \
        f |= int32_flag(v) & check;                                                              \
        y[c] = (TOUT)clamp2(apply_scale(v - zp[c], mu[c], sh[c], hf[c], rp[c], rn[c], &f), o);   \
    }                                                                                            \
    return f;                                                                                    \
}

/* x holds n values; channel parameters repeat with period C (the caller may tile them, e.g. to
 * 256 lanes, so that the vector loop is long whatever the channel count); n % C values at the
 * end use the first n % C parameters, so C must be a multiple of the true channel count. */
#define DEFINE_RESCALE(NAME, TIN, TOUT, ROW)                                                     \
int64_t NAME(const TIN *restrict x, int64_t n, int64_t C, const int64_t *restrict ch,            \
             const int64_t *restrict sc, TOUT *restrict y) {                                     \
    const int64_t check = sc[5] ? 1 : 0;                                                         \
    const out_params o = load_out(sc);                                                           \
    int64_t flags = 0;                                                                           \
    if (C == 1) {                                                                                \
        const int64_t off = ch[0], z = ch[1], m = ch[2], s = ch[3], h = ch[4], p = ch[5];        \
        const int64_t q = ch[6];                                                                 \
        const int64_t block = 4096, nblocks = (n + block - 1) / block;                           \
        _Pragma("omp parallel for reduction(|:flags) schedule(static) if(n >= PAR_MIN)")              \
        for (int64_t b = 0; b < nblocks; b++) {                                                  \
            const int64_t i0 = b * block, i1 = i0 + block < n ? i0 + block : n;                  \
            int64_t f = 0;                                                                       \
            for (int64_t i = i0; i < i1; i++) {                                                  \
                const int64_t v = (int64_t)x[i] + off;                                           \
                f |= int32_flag(v) & check;                                                      \
                y[i] = (TOUT)clamp2(apply_scale(v - z, m, s, h, p, q, &f), o);                   \
            }                                                                                    \
            flags |= f;                                                                          \
        }                                                                                        \
    } else {                                                                                     \
        const int64_t *off = ch, *zp = ch + C, *mu = ch + 2 * C, *sh = ch + 3 * C;               \
        const int64_t *hf = ch + 4 * C, *rp = ch + 5 * C, *rn = ch + 6 * C;                      \
        const int64_t rows = n / C, tail = n % C;                                                \
        _Pragma("omp parallel for reduction(|:flags) schedule(static) if(n >= PAR_MIN)")              \
        for (int64_t r = 0; r <= rows; r++) {                                                    \
            const int64_t len = r < rows ? C : tail;                                             \
            flags |= ROW(x + r * C, y + r * C, len, off, zp, mu, sh, hf, rp, rn, check, o);         \
        }                                                                                        \
    }                                                                                            \
    return flags;                                                                                \
}

typedef int8_t i8;
typedef int16_t i16;
typedef int32_t i32;

RESCALE_ROW(i32, i8)
RESCALE_ROW(i32, i16)
RESCALE_ROW(i32, i32)
RESCALE_ROW(i16, i8)
RESCALE_ROW(i16, i16)
RESCALE_ROW(i16, i32)
RESCALE_ROW(i8, i8)
RESCALE_ROW(i8, i16)
RESCALE_ROW(i8, i32)

/* rescale_row_i32_i8 (the requantization of every GEMM and depthwise accumulator), 8 channels per
 * AVX-512 vector: the same int64 operations lane by lane (the product wraps like the uint64 one, vpmullq),
 * the flags or-ed as masks; the last C % 8 channels take the scalar row. */
#if defined(__AVX512F__) && defined(__AVX512DQ__)
static inline int64_t rescale_row_fast_i32_i8(
        const i32 *restrict x, i8 *restrict y, int64_t C, const int64_t *restrict off,
        const int64_t *restrict zp, const int64_t *restrict mu, const int64_t *restrict sh,
        const int64_t *restrict hf, const int64_t *restrict rp, const int64_t *restrict rn,
        int64_t check, out_params o) {
    const __m512i zero = _mm512_setzero_si512(), ozp = _mm512_set1_epi64(o.zp);
    const __m512i lo1 = _mm512_set1_epi64(o.lo1), hi1 = _mm512_set1_epi64(o.hi1);
    const __m512i lo2 = _mm512_set1_epi64(o.lo2), hi2 = _mm512_set1_epi64(o.hi2);
    const __m512i imin = _mm512_set1_epi64(INT32_MIN), imax = _mm512_set1_epi64(INT32_MAX);
    const __mmask8 check_mask = check ? 0xFF : 0;
    __mmask8 bad32 = 0, bad_scale = 0;
    int64_t c = 0;
    for (; c + 8 <= C; c += 8) {
        const __m512i v = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i *)(x + c))),
                                           _mm512_loadu_si512(off + c));
        bad32 |= (_mm512_cmplt_epi64_mask(v, imin) | _mm512_cmpgt_epi64_mask(v, imax)) & check_mask;
        const __m512i u = _mm512_sub_epi64(v, _mm512_loadu_si512(zp + c)), h = _mm512_loadu_si512(hf + c);
        bad_scale |= _mm512_cmplt_epi64_mask(u, _mm512_sub_epi64(zero, h)) | _mm512_cmpge_epi64_mask(u, h);
        const __m512i rnd = _mm512_mask_blend_epi64(_mm512_cmplt_epi64_mask(u, zero), _mm512_loadu_si512(rp + c),
                                                    _mm512_loadu_si512(rn + c));
        __m512i t = _mm512_add_epi64(_mm512_mullo_epi64(u, _mm512_loadu_si512(mu + c)), rnd);
        t = _mm512_add_epi64(_mm512_srav_epi64(t, _mm512_loadu_si512(sh + c)), ozp);
        t = _mm512_min_epi64(_mm512_max_epi64(t, lo1), hi1);
        t = _mm512_min_epi64(_mm512_max_epi64(t, lo2), hi2);
        _mm_storel_epi64((__m128i *)(y + c), _mm512_cvtepi64_epi8(t));
    }
    int64_t f = (int64_t)(bad32 != 0) | ((int64_t)(bad_scale != 0) << 1);
    if (c < C)
        f |= rescale_row_i32_i8(x + c, y + c, C - c, off + c, zp + c, mu + c, sh + c, hf + c, rp + c, rn + c,
                                check, o);
    return f;
}
#else
#define rescale_row_fast_i32_i8 rescale_row_i32_i8
#endif

DEFINE_RESCALE(qlw_rescale_i32_i8, i32, i8, rescale_row_fast_i32_i8)
DEFINE_RESCALE(qlw_rescale_i32_i16, i32, i16, rescale_row_i32_i16)
DEFINE_RESCALE(qlw_rescale_i32_i32, i32, i32, rescale_row_i32_i32)
DEFINE_RESCALE(qlw_rescale_i16_i8, i16, i8, rescale_row_i16_i8)
DEFINE_RESCALE(qlw_rescale_i16_i16, i16, i16, rescale_row_i16_i16)
DEFINE_RESCALE(qlw_rescale_i16_i32, i16, i32, rescale_row_i16_i32)
DEFINE_RESCALE(qlw_rescale_i8_i8, i8, i8, rescale_row_i8_i8)
DEFINE_RESCALE(qlw_rescale_i8_i16, i8, i16, rescale_row_i8_i16)
DEFINE_RESCALE(qlw_rescale_i8_i32, i8, i32, rescale_row_i8_i32)

/* Quantized elementwise add/sub of two int8 tensors of the same shape:
 *   ra = rescale_a(a), rb = rescale_b(b)     (each to int32, clamped to its [qmin, qmax])
 *   s  = ra + rb (or ra - rb), must fit int32
 *   y  = clamp(rescale_o(s))                 (the output rescale, then a fused clamp)
 * p: a: zp, m, s, half, rp, rn, out_zp, lo, hi (0..8); b: the same (9..17); 18: subtract;
 *    out: in_zp, m, s, half, rp, rn (19..24); 25..30: scalars as DEFINE_RESCALE's sc[0..5]
 *    (load_rescale(p + 19) also reads 25..27 into out_zp/lo/hi, which qadd_block ignores) */
typedef struct { int64_t zp, m, s, half, rp, rn, out_zp, lo, hi; } rescale_params;

static inline rescale_params load_rescale(const int64_t *p) {
    rescale_params r = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]};
    return r;
}

static inline int64_t qadd_block(const int8_t *restrict a, const int8_t *restrict b, int8_t *restrict y,
                                 int64_t n, rescale_params pa, rescale_params pb, int64_t sub,
                                 rescale_params po, out_params o) {
    int64_t f = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t ra = apply_scale((int64_t)a[i] - pa.zp, pa.m, pa.s, pa.half, pa.rp, pa.rn, &f) + pa.out_zp;
        ra = ra < pa.lo ? pa.lo : ra;
        ra = ra > pa.hi ? pa.hi : ra;
        int64_t rb = apply_scale((int64_t)b[i] - pb.zp, pb.m, pb.s, pb.half, pb.rp, pb.rn, &f) + pb.out_zp;
        rb = rb < pb.lo ? pb.lo : rb;
        rb = rb > pb.hi ? pb.hi : rb;
        const int64_t s = ra + (rb ^ -sub) + sub;  /* ra - rb when sub == 1, ra + rb when 0 */
        f |= int32_flag(s);
        y[i] = (int8_t)clamp2(apply_scale(s - po.zp, po.m, po.s, po.half, po.rp, po.rn, &f), o);
    }
    return f;
}

int64_t qlw_qadd_i8(const int8_t *restrict a, const int8_t *restrict b, int64_t n, const int64_t *restrict p,
                    int8_t *restrict y) {
    const rescale_params pa = load_rescale(p), pb = load_rescale(p + 9), po = load_rescale(p + 19);
    const int64_t sub = p[18] ? 1 : 0;
    const out_params o = load_out(p + 25);
    const int64_t block = 4096, nblocks = (n + block - 1) / block;
    int64_t flags = 0;
    _Pragma("omp parallel for reduction(|:flags) schedule(static) if(n >= PAR_MIN)")
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const int64_t i0 = blk * block, len = i0 + block < n ? block : n - i0;
        flags |= qadd_block(a + i0, b + i0, y + i0, len, pa, pb, sub, po, o);
    }
    return flags;
}

/* Depthwise convolution, NHWC int8 input (channel multiplier 1), centered weights (w - w_zp).
 * g: N, H, W, C, KH, KW, SH, SW, DH, DW, PT, PL, OH, OW, x_zp (g[15] is not read).
 * w: [KH*KW][C] int32; ch: the 7 rescale parameter arrays (DEFINE_RESCALE), C entries each (only the
 * offsets are read when requant == 0).
 * Each output pixel is computed 32 channels at a time by dw_pairs_32 (AVX-512BW builds, w16 given), the
 * rest DW_BLOCK channels at a time (dw_taps_*), the accumulators in registers across the taps: every
 * in-image tap adds (x - x_zp) * w in int32; taps in the padding contribute 0 (skipped, or read from a row
 * of x_zp codes), as the input zero point does in the reference's padded convolution. Each output is the
 * exact int32 sum of at most KH*KW products: the caller proves max|x - x_zp| * sum|w| <= 2**31 - 1 for
 * every channel (so every partial sum fits). Then, per output channel:
 *   requant != 0: y (int8) = rescale(sum + offset) with ch/sc as in DEFINE_RESCALE
 *   requant == 0: y (int32) = sum + offset[c], checked to fit int32.
 * Threads split the output rows (N*OH). */
#define DW_BLOCK 64   /* channels per output pixel whose accumulators stay in registers: 4 x 16 lanes */

typedef int8_t v16i8 __attribute__((vector_size(16)));
typedef int32_t v16i32 __attribute__((vector_size(64)));

/* 16 int8 codes sign-extended to int32 lanes (GCC 12 scalarizes __builtin_convertvector here: the
 * x86 conversions are spelled out). */
#if defined(__AVX512F__)
static inline v16i32 load16_i8(const int8_t *p) {
    return (v16i32)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}
#elif defined(__AVX2__)
static inline v16i32 load16_i8(const int8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    v16i32 v;
    const __m256i lo = _mm256_cvtepi8_epi32(b), hi = _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8));
    memcpy(&v, &lo, 32);
    memcpy((char *)&v + 32, &hi, 32);
    return v;
}
#else
static inline v16i32 load16_i8(const int8_t *p) {
    v16i8 b;
    memcpy(&b, p, 16);
    return __builtin_convertvector(b, v16i32);
}
#endif

static inline v16i32 load16_i32(const int32_t *p) {
    v16i32 v;
    memcpy(&v, p, 64);
    return v;
}

/* The int32 sums of one output pixel's channels [c0, c0 + len) into acc: the taps ky in [ky0, ky1),
 * kx in [kx0, kx1) (the in-image ones), 16 channels per vector, NV vectors (len == 16 * NV) or, for
 * NV == 0, any len with a scalar loop. */
#define DW_TAPS(NAME, NV)                                                                              \
static inline void NAME(const int8_t *restrict x, const int32_t *restrict w, int32_t *restrict acc,     \
                        int64_t len, int64_t C, int64_t W, int64_t iy0, int64_t ix0, int64_t ky0,      \
                        int64_t ky1, int64_t kx0, int64_t kx1, int64_t KW, int64_t DH, int64_t DW,     \
                        int32_t zx) {                                                                  \
    if (NV == 0) {                                                                                     \
        for (int64_t j = 0; j < len; j++) acc[j] = 0;                                                  \
        for (int64_t ky = ky0; ky < ky1; ky++)                                                         \
            for (int64_t kx = kx0; kx < kx1; kx++) {                                                   \
                const int8_t *restrict xs = x + ((iy0 + ky * DH) * W + ix0 + kx * DW) * C;             \
                const int32_t *restrict wt = w + (ky * KW + kx) * C;                                   \
                for (int64_t j = 0; j < len; j++) acc[j] += ((int32_t)xs[j] - zx) * wt[j];             \
            }                                                                                          \
        return;                                                                                        \
    }                                                                                                  \
    v16i32 a[NV ? NV : 1];                                                                             \
    for (int v = 0; v < NV; v++) a[v] = (v16i32){0};                                                   \
    for (int64_t ky = ky0; ky < ky1; ky++)                                                             \
        for (int64_t kx = kx0; kx < kx1; kx++) {                                                       \
            const int8_t *restrict xs = x + ((iy0 + ky * DH) * W + ix0 + kx * DW) * C;                 \
            const int32_t *restrict wt = w + (ky * KW + kx) * C;                                       \
            for (int v = 0; v < NV; v++)                                                               \
                a[v] += (load16_i8(xs + 16 * v) - zx) * load16_i32(wt + 16 * v);                       \
        }                                                                                              \
    for (int v = 0; v < NV; v++) memcpy(acc + 16 * v, &a[v], 64);                                      \
}
DW_TAPS(dw_taps_4, 4)
DW_TAPS(dw_taps_1, 1)
DW_TAPS(dw_taps_any, 0)

/* The accumulators plus their offsets as int32 (requant == 0), checked to fit. */
static inline int64_t dw_store_i32(const int32_t *restrict acc, int32_t *restrict y, int64_t len,
                                   const int64_t *restrict off) {
    int64_t f = 0;
    for (int64_t j = 0; j < len; j++) {
        const int64_t v = (int64_t)acc[j] + off[j];
        f |= int32_flag(v);
        y[j] = (int32_t)v;
    }
    return f;
}

/* 32 channels [c0, c0 + 32) of one output pixel with AVX-512BW's vpmaddwd: the taps taken in pairs (a, b),
 * their codes sign-extended to int16 and centered (|x - x_zp| <= 255), interleaved channel by channel
 * (unpacklo/hi within each 128-bit lane) and multiplied with the weights packed the same way (w16: for each
 * pair, 32 int16 of the low halves then 32 of the high halves, see conv.py); vpmaddwd adds the pair's two
 * products in int32 (each at most 255 * 32767 in magnitude: exact), and the pair sums are added in int32
 * (exact by the caller's bound on every partial sum). tp[t]: the input pixel of tap t, or a row of x_zp
 * codes for taps in the padding (they contribute 0); an odd tap count is padded with a zero-weight tap. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define DW_PAIRS 1
static inline void dw_pairs_32(const int8_t *const *restrict tp, int64_t c0, const int16_t *restrict w16,
                               int64_t P, __m512i zx16, int32_t *restrict acc) {
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    for (int64_t p = 0; p < P; p++) {
        const __m512i a = _mm512_sub_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(tp[2 * p] + c0))),
                                           zx16);
        const __m512i b = _mm512_sub_epi16(
            _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(tp[2 * p + 1] + c0))), zx16);
        lo = _mm512_add_epi32(lo, _mm512_madd_epi16(_mm512_unpacklo_epi16(a, b), _mm512_loadu_si512(w16 + p * 64)));
        hi = _mm512_add_epi32(hi, _mm512_madd_epi16(_mm512_unpackhi_epi16(a, b),
                                                    _mm512_loadu_si512(w16 + p * 64 + 32)));
    }
    /* lo's lane 4l + j holds channel 8l + j, hi's channel 8l + 4 + j (l < 4, j < 4): back to channel order */
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    _mm512_storeu_si512(acc, _mm512_permutex2var_epi32(lo, first, hi));
    _mm512_storeu_si512(acc + 16, _mm512_permutex2var_epi32(lo, second, hi));
}
#else
#define DW_PAIRS 0
#endif

int64_t qlw_dwconv_has_pairs(void) { return DW_PAIRS; }

/* w16: NULL, or the weights of the first C / 32 * 32 channels for dw_pairs_32: [C / 32][P][2][32] int16,
 * P = ceil(KH*KW / 2) (used only when qlw_dwconv_has_pairs()). */
int64_t qlw_dwconv_i8(const int8_t *restrict x, const int64_t *restrict g, const int32_t *restrict w,
                      const int16_t *restrict w16, const int64_t *restrict ch, const int64_t *restrict sc,
                      void *restrict y, int64_t requant) {
    const int64_t N = g[0], H = g[1], W = g[2], C = g[3], KH = g[4], KW = g[5], SH = g[6], SW = g[7];
    const int64_t DH = g[8], DW = g[9], PT = g[10], PL = g[11], OH = g[12], OW = g[13];
    const int32_t zx = (int32_t)g[14];
    const int64_t *restrict off = ch, *restrict zp = ch + C, *restrict mu = ch + 2 * C;
    const int64_t *restrict sh = ch + 3 * C, *restrict hf = ch + 4 * C, *restrict rp = ch + 5 * C;
    const int64_t *restrict rn = ch + 6 * C;
    const out_params op = load_out(sc);
    const int64_t T = KH * KW, P = (T + 1) / 2;
#if DW_PAIRS
    const int64_t C32 = w16 != NULL ? C / 32 * 32 : 0;
#endif
    int64_t flags = 0;
    _Pragma("omp parallel reduction(|:flags) if(N * OH * OW * C * T >= 8 * PAR_MIN)")
    {
        int8_t *zrow = (int8_t *)malloc((size_t)C);
        const int8_t **tp = (const int8_t **)malloc(sizeof(int8_t *) * (size_t)(2 * P));
        int64_t f = 0;
        for (int64_t c = 0; c < C; c++) zrow[c] = (int8_t)zx;
        _Pragma("omp for schedule(static)")
        for (int64_t row = 0; row < N * OH; row++) {
            const int64_t n = row / OH, oh = row % OH;
            const int8_t *restrict xn = x + n * H * W * C;
            int32_t acc[DW_BLOCK];
            const int64_t iy0 = oh * SH - PT;
            int64_t ky0 = 0, ky1 = KH;   /* the kernel rows inside the image: 0 <= iy0 + ky * DH < H */
            while (ky0 < KH && iy0 + ky0 * DH < 0) ky0++;
            while (ky1 > ky0 && iy0 + (ky1 - 1) * DH >= H) ky1--;
            for (int64_t ow = 0; ow < OW; ow++) {
                const int64_t o = (row * OW + ow) * C, ix0 = ow * SW - PL;
                int64_t kx0 = 0, kx1 = KW;
                while (kx0 < KW && ix0 + kx0 * DW < 0) kx0++;
                while (kx1 > kx0 && ix0 + (kx1 - 1) * DW >= W) kx1--;
                int64_t c0 = 0;
#if DW_PAIRS
                if (C32) {
                    for (int64_t ky = 0; ky < KH; ky++)
                        for (int64_t kx = 0; kx < KW; kx++) {
                            const int in = ky >= ky0 && ky < ky1 && kx >= kx0 && kx < kx1;
                            tp[ky * KW + kx] = in ? xn + ((iy0 + ky * DH) * W + ix0 + kx * DW) * C : zrow;
                        }
                    if (T % 2) tp[T] = zrow;
                    const __m512i zx16 = _mm512_set1_epi16((int16_t)zx);
                    for (; c0 < C32; c0 += 32) {
                        dw_pairs_32(tp, c0, w16 + c0 / 32 * P * 64, P, zx16, acc);
                        if (requant)
                            f |= rescale_row_fast_i32_i8(acc, (int8_t *)y + o + c0, 32, off + c0, zp + c0, mu + c0,
                                                         sh + c0, hf + c0, rp + c0, rn + c0, 1, op);
                        else
                            f |= dw_store_i32(acc, (int32_t *)y + o + c0, 32, off + c0);
                    }
                }
#endif
                for (; c0 < C; c0 += DW_BLOCK) {
                    const int64_t len = C - c0 < DW_BLOCK ? C - c0 : DW_BLOCK;
                    if (len == DW_BLOCK) {
                        dw_taps_4(xn + c0, w + c0, acc, len, C, W, iy0, ix0, ky0, ky1, kx0, kx1, KW, DH, DW, zx);
                    } else {
                        int64_t done = 0;
                        for (; done + 16 <= len; done += 16)
                            dw_taps_1(xn + c0 + done, w + c0 + done, acc + done, 16, C, W, iy0, ix0, ky0, ky1, kx0,
                                      kx1, KW, DH, DW, zx);
                        if (done < len)
                            dw_taps_any(xn + c0 + done, w + c0 + done, acc + done, len - done, C, W, iy0, ix0,
                                        ky0, ky1, kx0, kx1, KW, DH, DW, zx);
                    }
                    if (requant)
                        f |= rescale_row_fast_i32_i8(acc, (int8_t *)y + o + c0, len, off + c0, zp + c0, mu + c0,
                                                     sh + c0, hf + c0, rp + c0, rn + c0, 1, op);
                    else
                        f |= dw_store_i32(acc, (int32_t *)y + o + c0, len, off + c0);
                }
            }
        }
        free(zrow);
        free(tp);
        flags |= f;
    }
    return flags;
}

/* n bytes from s to d (or the byte z when s is NULL); AVX-512BW builds copy 64 bytes per masked move, so
 * that the few bytes of a small-channel row (a 3-channel stem: 9) cost no library call */
static inline void copy_bytes(int8_t *restrict d, const int8_t *restrict s, int8_t z, int64_t n) {
#if defined(__AVX512BW__)
    const __m512i fill = _mm512_set1_epi8(z);
    for (int64_t i = 0; i < n; i += 64) {
        const __mmask64 m = n - i >= 64 ? ~0ull : (1ull << (n - i)) - 1;
        _mm512_mask_storeu_epi8(d + i, m, s ? _mm512_maskz_loadu_epi8(m, s + i) : fill);
    }
#else
    if (s) memcpy(d, s, (size_t)n);
    else memset(d, z, (size_t)n);
#endif
}

/* im2col of an NHWC int8 tensor for a KHxKW convolution: cols[(n, oh, ow), (ky, kx, c)],
 * taps outside the input hold the input zero point. g as in qlw_dwconv_i8, and g[15]: the row stride of
 * cols when it is above K = KH*KW*C (the AMX GEMM's K rounded up to 4), the columns past K then 0. With
 * DW == 1 the taps of one kernel row are KW*C contiguous input bytes: one copy, the padding filled around it. */
void qlw_im2col_i8(const int8_t *restrict x, const int64_t *restrict g, int8_t *restrict cols) {
    const int64_t N = g[0], H = g[1], W = g[2], C = g[3], KH = g[4], KW = g[5], SH = g[6], SW = g[7];
    const int64_t DH = g[8], DW = g[9], PT = g[10], PL = g[11], OH = g[12], OW = g[13];
    const int8_t zx = (int8_t)g[14];
    const int64_t K = KH * KW * C, ld = g[15] > K ? g[15] : K;
    _Pragma("omp parallel for schedule(static) if(N * OH * OW * K >= 4 * PAR_MIN)")
    for (int64_t row = 0; row < N * OH; row++) {
        const int64_t n = row / OH, oh = row % OH;
        for (int64_t ow = 0; ow < OW; ow++) {
            int8_t *restrict dst = cols + (row * OW + ow) * ld;
            if (ld > K) copy_bytes(dst + K, NULL, 0, ld - K);
            for (int64_t ky = 0; ky < KH; ky++) {
                const int64_t iy = oh * SH - PT + ky * DH;
                int8_t *restrict d = dst + ky * KW * C;
                const int64_t ix0 = ow * SW - PL;
                if (iy < 0 || iy >= H) {
                    copy_bytes(d, NULL, zx, KW * C);
                } else if (DW == 1) {
                    const int64_t k0 = ix0 < 0 ? -ix0 : 0, k1 = W - ix0 < KW ? W - ix0 : KW;
                    if (k1 <= k0) {
                        copy_bytes(d, NULL, zx, KW * C);
                        continue;
                    }
                    if (k0 > 0) copy_bytes(d, NULL, zx, k0 * C);
                    copy_bytes(d + k0 * C, x + ((n * H + iy) * W + ix0 + k0) * C, zx, (k1 - k0) * C);
                    if (k1 < KW) copy_bytes(d + k1 * C, NULL, zx, (KW - k1) * C);
                } else {
                    for (int64_t kx = 0; kx < KW; kx++) {
                        const int64_t ix = ix0 + kx * DW;
                        if (ix < 0 || ix >= W) memset(d + kx * C, zx, (size_t)C);
                        else memcpy(d + kx * C, x + ((n * H + iy) * W + ix) * C, (size_t)C);
                    }
                }
            }
        }
    }
}

/* Max pooling of an NHWC int8 tensor: y[n, oh, ow, c] = the maximum of the window's taps inside the image,
 * or -128 when none is; padding taps hold -128 (the reference pads with the dtype's minimum), which never
 * raises a maximum, so skipping them is the same. g: N, H, W, C, KH, KW, SH, SW, PT, PL, OH, OW.
 * Threads split the output rows. */
void qlw_maxpool_i8(const int8_t *restrict x, const int64_t *restrict g, int8_t *restrict y) {
    const int64_t N = g[0], H = g[1], W = g[2], C = g[3], KH = g[4], KW = g[5], SH = g[6], SW = g[7];
    const int64_t PT = g[8], PL = g[9], OH = g[10], OW = g[11];
    _Pragma("omp parallel for schedule(static) if(N * OH * OW * C * KH * KW >= 4 * PAR_MIN)")
    for (int64_t row = 0; row < N * OH; row++) {
        const int64_t n = row / OH, oh = row % OH;
        const int64_t iy0 = oh * SH - PT, ky0 = iy0 < 0 ? -iy0 : 0, ky1 = H - iy0 < KH ? H - iy0 : KH;
        for (int64_t ow = 0; ow < OW; ow++) {
            int8_t *restrict d = y + (row * OW + ow) * C;
            const int64_t ix0 = ow * SW - PL, kx0 = ix0 < 0 ? -ix0 : 0, kx1 = W - ix0 < KW ? W - ix0 : KW;
            for (int64_t c = 0; c < C; c++) d[c] = INT8_MIN;
            for (int64_t ky = ky0; ky < ky1; ky++)
                for (int64_t kx = kx0; kx < kx1; kx++) {
                    const int8_t *restrict s = x + ((n * H + iy0 + ky) * W + ix0 + kx) * C;
                    for (int64_t c = 0; c < C; c++) d[c] = s[c] > d[c] ? s[c] : d[c];
                }
        }
    }
}

/* Per-tensor float32 -> int8 quantization, the reference's float32 operations in its order:
 * r = round_half_even(x * inv) + zp, clamped to [qmin, qmax], with the default rounding mode
 * (nearbyintf) and no contraction (-std=c99 turns GCC's fp-contract off). p: inv, zp, qmin, qmax.
 * Returns 1 when some r is NaN (the caller raises), else 0. */
int64_t qlw_quantize_f32_i8(const float *restrict x, int64_t n, const float *restrict p, int8_t *restrict y) {
    const float inv = p[0], zp = p[1], lo = p[2], hi = p[3];
    const int64_t block = 16384, nblocks = (n + block - 1) / block;
    int64_t nan = 0;
    _Pragma("omp parallel for reduction(|:nan) schedule(static) if(n >= PAR_MIN)")
    for (int64_t b = 0; b < nblocks; b++) {
        const int64_t i0 = b * block, i1 = i0 + block < n ? i0 + block : n;
        int64_t f = 0;
        for (int64_t i = i0; i < i1; i++) {
            float r = nearbyintf(x[i] * inv) + zp;
            f |= (int64_t)(r != r);
            r = r < lo ? lo : r;
            r = r > hi ? hi : r;
            y[i] = (int8_t)(r == r ? r : 0.0f);
        }
        nan |= f;
    }
    return nan;
}

/* dst = src over n float32s, by bit pattern; returns 1 when every value is finite, 0 when one is NaN or
 * +-infinity (all exponent bits set). One pass: a runtime's input buffer is filled and checked while the
 * data streams through, instead of a copy and a second read. Single-threaded (a few hundred KB). */
int64_t qlw_copy_finite_f32(uint32_t *restrict dst, const uint32_t *restrict src, int64_t n) {
    uint32_t top = 0;   /* the largest exponent field: all ones only for NaN and infinity (vectorizes as a max) */
    for (int64_t i = 0; i < n; i++) {
        const uint32_t v = src[i], e = v & 0x7f800000u;
        dst[i] = v;
        top = e > top ? e : top;
    }
    return top != 0x7f800000u;
}

/* NCHW -> NHWC of an int8 tensor (a model's input after its quantize): y[n, p, c] = x[n, c, p] over the
 * P = H * W pixels. Three channels (images) go 64 pixels at a time through two byte permutes per 64 output
 * bytes (AVX-512 VBMI); anything else, and the last P % 64 pixels, element by element. */
void qlw_nchw_to_nhwc_i8(const int8_t *restrict x, int64_t N, int64_t C, int64_t P, int8_t *restrict y) {
    _Pragma("omp parallel for schedule(static) if(N * C * P >= 4 * PAR_MIN)")
    for (int64_t n = 0; n < N; n++) {
        const int8_t *restrict xn = x + n * C * P;
        int8_t *restrict yn = y + n * C * P;
        int64_t p0 = 0;
#if defined(__AVX512VBMI__)
        if (C == 3) {
            /* output byte b of the 192 of 64 pixels: pixel b / 3, channel b % 3; vector k holds b in
             * [64k, 64k + 64); a = permute of channels 0 and 1 (bytes 64.. index channel 1), then channel 2 */
            int8_t i01[3][64], i2[3][64];
            __mmask64 m2[3] = {0, 0, 0};
            for (int k = 0; k < 3; k++)
                for (int j = 0; j < 64; j++) {
                    const int b = 64 * k + j, px = b / 3, c = b % 3;
                    i01[k][j] = (int8_t)(c == 1 ? 64 + px : px);
                    i2[k][j] = (int8_t)px;
                    if (c == 2) m2[k] |= 1ull << j;
                }
            for (; p0 + 64 <= P; p0 += 64) {
                const __m512i c0 = _mm512_loadu_si512(xn + p0), c1 = _mm512_loadu_si512(xn + P + p0);
                const __m512i c2 = _mm512_loadu_si512(xn + 2 * P + p0);
                for (int k = 0; k < 3; k++) {
                    __m512i v = _mm512_permutex2var_epi8(c0, _mm512_loadu_si512(i01[k]), c1);
                    v = _mm512_mask_permutexvar_epi8(v, m2[k], _mm512_loadu_si512(i2[k]), c2);
                    _mm512_storeu_si512(yn + 3 * p0 + 64 * k, v);
                }
            }
        }
#endif
        for (int64_t p = p0; p < P; p++)
            for (int64_t c = 0; c < C; c++) yn[p * C + c] = xn[c * P + p];
    }
}

/* A binary int8 function given by its table: y[i] = t[(a[i] + 128) * 256 + (b[i] + 128)].
 * The table (65536 codes, built from the reference's ops by fusion.py) holds the whole chain; it is followed
 * by 3 more bytes (lut.py), so that AVX-512 builds can gather 16 entries at a time as dwords at byte offsets
 * (the low byte of each is the entry). */
void qlw_lut2_i8(const int8_t *restrict a, const int8_t *restrict b, int64_t n, const int8_t *restrict t,
                 int8_t *restrict y) {
    const int64_t block = 16384, nblocks = (n + block - 1) / block;
    _Pragma("omp parallel for schedule(static) if(n >= PAR_MIN)")
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const int64_t i0 = blk * block, i1 = i0 + block < n ? i0 + block : n;
        int64_t i = i0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
        const __m512i bias = _mm512_set1_epi32(128);
        for (; i + 16 <= i1; i += 16) {
            const __m512i ia = _mm512_add_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(a + i))), bias);
            const __m512i ib = _mm512_add_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + i))), bias);
            const __m512i v = _mm512_i32gather_epi32(_mm512_or_si512(_mm512_slli_epi32(ia, 8), ib), (const void *)t, 1);
            _mm_storeu_si128((__m128i *)(y + i), _mm512_cvtepi32_epi8(v));
        }
#endif
        for (; i < i1; i++)
            y[i] = t[(((int64_t)a[i] + 128) << 8) | ((int64_t)b[i] + 128)];
    }
}

/* int8 GEMM with the requantization fused, on AVX-512 VNNI (vpdpbusd: unsigned x signed bytes, 4-term
 * int32 dot products, wrapping adds). x: M rows of K int8 codes (row stride K); w: the weights packed as
 * [NP/16][KP/4][16][4] int8 (NP, KP: N, K rounded up to 16 and 4, zero-filled); ch: per 16 channels, off (the
 * GEMM's folded offsets, minus 128 * the weight column sums, see below), mult, shift, rnd_pos, rnd_neg (rq16);
 * sc: out_zp, lo1, hi1, lo2, hi2. y: M x N int8.
 * The kernel reads x + 128 (an unsigned byte), so a dot product is sum (x + 128) * w = sum x * w +
 * 128 * colsum(w), and off carries -128 * colsum(w). Exact when the caller proves (gemm.py, conv.py):
 * K * 255 * 128 < 2**31 (every true dot product, and so the wrapped int32 sum, is exact), |acc| < 2**31 for
 * acc = dot + off (the true accumulator, bias included; wrapping int32 adds then give it exactly), and
 * every shift >= 32 (apply_scale_32's REQUIRE then holds for any int32), in_zp = 0. Then per channel:
 * y = clamp(clamp(((acc * mult + rnd) >> shift) + out_zp, lo1, hi1), lo2, hi2), rnd by acc's sign, as
 * DEFINE_RESCALE computes. qlw_has_qgemm() says whether this build has it (an AVX-512 VNNI CPU). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

static inline __m512i load_x4(const int8_t *p, int64_t k, int64_t K) {
    int32_t word;
    if (k + 4 <= K) {
        memcpy(&word, p + k, 4);
    } else {
        uint8_t b[4] = {0x80, 0x80, 0x80, 0x80};   /* x = 0 after the flip below; the weights there are 0 */
        for (int64_t i = 0; k + i < K; i++) b[i] = (uint8_t)p[k + i];
        memcpy(&word, b, 4);
    }
    return _mm512_set1_epi32(word ^ (int32_t)0x80808080);   /* x + 128 as unsigned bytes */
}

/* The requantization parameters of 16 channels (one weight vector), loaded once per tile and used for its
 * rows; ch holds, per 16-channel group, 9 rows of 8 int64 (qgemm.py): the 16 offsets as int32, then mult,
 * shift, rnd_pos and rnd_neg of the even channels and of the odd channels (as the 64-bit lanes of a vector of
 * 16 int32 hold them). */
typedef struct { __m512i off, me, mo, se, so, rpe, rpo, rne, rno; } rq16;

static inline rq16 load_rq16(const int64_t *restrict ch, int64_t group) {
    const int64_t *p = ch + group * 72;
    rq16 q = {_mm512_loadu_si512(p), _mm512_loadu_si512(p + 8), _mm512_loadu_si512(p + 16),
              _mm512_loadu_si512(p + 24), _mm512_loadu_si512(p + 32), _mm512_loadu_si512(p + 40),
              _mm512_loadu_si512(p + 48), _mm512_loadu_si512(p + 56), _mm512_loadu_si512(p + 64)};
    return q;
}

/* 16 accumulators to int8 in 32-bit lanes: v = acc + off wraps in int32 to the true accumulator (which fits
 * int32: the caller's proof); the products v * mult (vpmuldq, |v|, mult < 2**31) and the rounding terms in
 * 64 bits for the even and the odd lanes; after the arithmetic shift (>= 32) |y| < 2**30 fits int32 again, so
 * the zero point and the clamps (int8 bounds) are int32 operations. The same integers as DEFINE_RESCALE's. */
static inline void requant_store16(__m512i acc, const rq16 *q, const out_params o, int8_t *restrict y,
                                   int64_t left) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i v = _mm512_add_epi32(acc, q->off), vo = _mm512_srli_epi64(v, 32);
    const __mmask8 neg_e = _mm512_cmplt_epi64_mask(_mm512_slli_epi64(v, 32), zero);
    const __mmask8 neg_o = _mm512_cmplt_epi64_mask(v, zero);
    __m512i te = _mm512_add_epi64(_mm512_mul_epi32(v, q->me), _mm512_mask_blend_epi64(neg_e, q->rpe, q->rne));
    __m512i to = _mm512_add_epi64(_mm512_mul_epi32(vo, q->mo), _mm512_mask_blend_epi64(neg_o, q->rpo, q->rno));
    te = _mm512_srav_epi64(te, q->se);
    to = _mm512_srav_epi64(to, q->so);
    __m512i t = _mm512_mask_blend_epi32(0xAAAA, te, _mm512_slli_epi64(to, 32));
    t = _mm512_add_epi32(t, _mm512_set1_epi32((int32_t)o.zp));
    t = _mm512_min_epi32(_mm512_max_epi32(t, _mm512_set1_epi32((int32_t)o.lo1)), _mm512_set1_epi32((int32_t)o.hi1));
    t = _mm512_min_epi32(_mm512_max_epi32(t, _mm512_set1_epi32((int32_t)o.lo2)), _mm512_set1_epi32((int32_t)o.hi2));
    if (left > 0)
        _mm512_mask_cvtepi32_storeu_epi8(y, (__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1), t);
}

int64_t qlw_has_qgemm(void) { return 1; }

/* The fast requantization (fastrq.py proves when it is exact): 16 int32 accumulators acc (the exact raw sums)
 * to clamped int32 codes with two vpmuldq. Per 64-bit lane, V = acc * m + R in wrapping int64, where
 * R = off * m + 2**(s-1) + out_zp * 2**s folds the offset (v = acc + off is the true accumulator, which fits
 * int32), SINGLE_ROUND's rounding term and the zero point; |V| < 2**63, so the wrapped sum is V, and
 * V >> s = ((v * m + 2**(s-1)) >> s) + out_zp exactly. 32 <= s: an even lane shifts by s (the result is in its
 * low dword), an odd lane by s - 32 (the result's low 32 bits are then its high dword); one blend takes both,
 * |result| < 2**31. Then one clamp to [lo, hi], the composition of the rescale's and a fused clamp's.
 * q: per 16 lanes, 6 rows of 8 int64: m of the even lanes, m of the odd lanes, R even, R odd, s even, s - 32 odd. */
static inline __m512i fast_requant16(__m512i acc, const int64_t *restrict q, __m512i lo, __m512i hi) {
    const __m512i odd = _mm512_shuffle_epi32(acc, _MM_PERM_CDAB);   /* odd dwords to the low halves */
    const __m512i te = _mm512_srav_epi64(_mm512_add_epi64(_mm512_mul_epi32(acc, _mm512_loadu_si512(q)),
                                                          _mm512_loadu_si512(q + 16)), _mm512_loadu_si512(q + 32));
    const __m512i to = _mm512_srav_epi64(_mm512_add_epi64(_mm512_mul_epi32(odd, _mm512_loadu_si512(q + 8)),
                                                          _mm512_loadu_si512(q + 24)), _mm512_loadu_si512(q + 40));
    return _mm512_min_epi32(_mm512_max_epi32(_mm512_mask_blend_epi32(0xAAAA, te, to), lo), hi);
}

/* 64 int8-range int32 codes (4 vectors of 16 channels) to 64 bytes in channel order: the saturating packs
 * are exact on int8 values; per 128-bit lane l they give t0..t3's elements 4l..4l+3, which vpermd puts back */
static inline __m512i pack64(__m512i t0, __m512i t1, __m512i t2, __m512i t3) {
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(idx, _mm512_packs_epi16(_mm512_packs_epi32(t0, t1), _mm512_packs_epi32(t2, t3)));
}

/* One tile: R rows (R <= 4) x V vectors of 16 channels (V <= 4); R == V == 4 is the hot case, with every
 * bound a constant so that the 16 accumulators stay in registers. */
#define QGEMM_TILE(NAME, RMAX, VMAX)                                                                  \
static inline void NAME(const int8_t *restrict x, int64_t K, int64_t KP, const int8_t *restrict wb,   \
                        int64_t R, int64_t V, __m512i acc[4][4]) {                                    \
    const int64_t rows = RMAX ? RMAX : R, vecs = VMAX ? VMAX : V;                                     \
    for (int64_t r = 0; r < 4; r++)                                                                   \
        for (int64_t v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_si512();                           \
    for (int64_t k = 0; k < KP; k += 4) {                                                             \
        __m512i wv[4];                                                                                \
        for (int64_t v = 0; v < vecs; v++) wv[v] = _mm512_loadu_si512(wb + (v * KP + k) * 16);        \
        for (int64_t r = 0; r < rows; r++) {                                                          \
            const __m512i xv = load_x4(x + r * K, k, K);                                              \
            for (int64_t v = 0; v < vecs; v++) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], xv, wv[v]); \
        }                                                                                             \
    }                                                                                                 \
}
QGEMM_TILE(qgemm_tile_4x4, 4, 4)
QGEMM_TILE(qgemm_tile_4x3, 4, 3)
QGEMM_TILE(qgemm_tile_4x2, 4, 2)
QGEMM_TILE(qgemm_tile_4x1, 4, 1)
QGEMM_TILE(qgemm_tile_any, 0, 0)

void qlw_qgemm_i8(const int8_t *restrict x, int64_t M, int64_t K, int64_t N, const int8_t *restrict w,
                  const int64_t *restrict ch, const int64_t *restrict sc, int8_t *restrict y) {
    const int64_t NP = (N + 15) / 16 * 16, KP = (K + 3) / 4 * 4, nb = (NP / 16 + 3) / 4, mb = (M + 3) / 4;
    const out_params o = load_out(sc);
    const int64_t fast = sc[5];   /* 1: ch holds fast_requant16 parameters, lo/hi in sc[3], sc[4] */
    const __m512i flo = _mm512_set1_epi32((int32_t)o.lo2), fhi = _mm512_set1_epi32((int32_t)o.hi2);
    _Pragma("omp parallel for collapse(2) schedule(static) if(M * NP * KP >= 32 * PAR_MIN)")
    for (int64_t bn = 0; bn < nb; bn++) {
        for (int64_t bm = 0; bm < mb; bm++) {
            const int64_t m0 = bm * 4, rows = M - m0 < 4 ? M - m0 : 4;
            const int64_t v0 = bn * 4, vecs = NP / 16 - v0 < 4 ? NP / 16 - v0 : 4;
            const int8_t *restrict wb = w + v0 * KP * 16;
            __m512i acc[4][4];
            const int8_t *restrict xb = x + m0 * K;
            if (rows == 4 && vecs == 4) qgemm_tile_4x4(xb, K, KP, wb, 4, 4, acc);
            else if (rows == 4 && vecs == 3) qgemm_tile_4x3(xb, K, KP, wb, 4, 3, acc);
            else if (rows == 4 && vecs == 2) qgemm_tile_4x2(xb, K, KP, wb, 4, 2, acc);
            else if (rows == 4 && vecs == 1) qgemm_tile_4x1(xb, K, KP, wb, 4, 1, acc);
            else qgemm_tile_any(xb, K, KP, wb, rows, vecs, acc);
            for (int64_t v = 0; v < vecs; v++) {
                const int64_t c = (v0 + v) * 16;
                const __mmask16 keep = (__mmask16)(N - c >= 16 ? 0xFFFF : (1u << (N - c)) - 1);
                if (fast) {
                    if (vecs == 4) break;   /* below: whole rows of 64 channels */
                    for (int64_t r = 0; r < rows; r++)
                        _mm512_mask_cvtepi32_storeu_epi8(y + (m0 + r) * N + c, keep,
                                                         fast_requant16(acc[r][v], ch + (v0 + v) * 48, flo, fhi));
                } else {
                    const rq16 q = load_rq16(ch, v0 + v);
                    for (int64_t r = 0; r < rows; r++)
                        requant_store16(acc[r][v], &q, o, y + (m0 + r) * N + c, N - c);
                }
            }
            if (fast && vecs == 4) {
                const int64_t c = v0 * 16, left = N - c;
                const int64_t *q = ch + v0 * 48;
                for (int64_t r = 0; r < rows; r++) {
                    const __m512i codes = pack64(fast_requant16(acc[r][0], q, flo, fhi),
                                                 fast_requant16(acc[r][1], q + 48, flo, fhi),
                                                 fast_requant16(acc[r][2], q + 96, flo, fhi),
                                                 fast_requant16(acc[r][3], q + 144, flo, fhi));
                    if (left >= 64) _mm512_storeu_si512(y + (m0 + r) * N + c, codes);
                    else _mm512_mask_storeu_epi8(y + (m0 + r) * N + c, (__mmask64)((1ull << left) - 1), codes);
                }
            }
        }
    }
}

/* Depthwise convolution with the fast requantization, on AVX-512 VNNI + VBMI (conv.py decides when it applies):
 * NHWC int8 x, C channels, g as in qlw_dwconv_i8. Each output pixel takes its taps in pairs (a, b) from tp (the
 * input pixel, or a row of x_zp codes for taps in the padding; an odd count gets a zero-weight tap), 32
 * channels at a time: the int8 codes sign-extended to int16 (not centered: the x_zp * sum(w) term is folded
 * into the requantization's offset), interleaved channel by channel within each 128-bit lane
 * (vpunpck{l,h}wd) and multiplied-added with vpdpwssd against w16 (pair_weights' layout, ceil(C / 32)
 * blocks, zero weights past C). Every product and sum is exact in wrapping int32: the raw sum sum x * w is
 * bounded by 128 * sum|w| <= 2**31 - 1 (the caller's proof). The two accumulators hold channels
 * 8l + j (lo) and 8l + 4 + j (hi), l, j < 4: rq holds the fast requantization's parameters in that lane
 * order (2 groups of 16 lanes per block of 32 channels), and one vpermt2b puts the 32 codes back in channel
 * order. sc: lo, hi (the output clamp). Threads split the output rows. */
#if defined(__AVX512VBMI__)
static inline __m512i dw_fast_load(const int8_t *p, __mmask32 m, int tail) {
    return _mm512_cvtepi8_epi16(tail ? _mm256_maskz_loadu_epi8(m, p) : _mm256_loadu_si256((const __m256i *)p));
}

/* count output pixels of one block of 32 channels [c0, c0 + 32): pixel i's tap t at tp[t] + i * step + c0 */
static inline void dw_fast_run(const int8_t *const *restrict tp, int64_t step, int64_t count, int64_t c0,
                               const int16_t *restrict wb, int64_t P, const int64_t *restrict rq, __m512i lo,
                               __m512i hi, __m512i order, int8_t *restrict out, int64_t ostep, __mmask32 m,
                               int tail) {
    for (int64_t i = 0; i < count; i++) {
        const int64_t d = i * step + c0;
        __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
        for (int64_t p = 0; p < P; p++) {
            const __m512i a = dw_fast_load(tp[2 * p] + d, m, tail), b = dw_fast_load(tp[2 * p + 1] + d, m, tail);
            a0 = _mm512_dpwssd_epi32(a0, _mm512_unpacklo_epi16(a, b), _mm512_loadu_si512(wb + p * 64));
            a1 = _mm512_dpwssd_epi32(a1, _mm512_unpackhi_epi16(a, b), _mm512_loadu_si512(wb + p * 64 + 32));
        }
        const __m512i codes = _mm512_permutex2var_epi8(fast_requant16(a0, rq, lo, hi), order,
                                                       fast_requant16(a1, rq + 48, lo, hi));
        int8_t *o = out + i * ostep;
        if (tail) _mm256_mask_storeu_epi8(o, m, _mm512_castsi512_si256(codes));
        else _mm256_storeu_si256((__m256i *)o, _mm512_castsi512_si256(codes));
    }
}

/* count pixels (step apart in x, ostep in y) of every channel block; taps as dw_fast_run's */
static inline void dw_fast_pixels(const int8_t *const *restrict tp, int64_t step, int64_t count, int64_t C,
                                  const int16_t *restrict w16, int64_t P, const int64_t *restrict rq, __m512i lo,
                                  __m512i hi, __m512i order, int8_t *restrict out, int64_t ostep) {
    const int64_t full = C / 32;
    for (int64_t b = 0; b < full; b++)
        dw_fast_run(tp, step, count, b * 32, w16 + b * P * 64, P, rq + b * 96, lo, hi, order, out + b * 32, ostep,
                    0, 0);
    if (C % 32)
        dw_fast_run(tp, step, count, full * 32, w16 + full * P * 64, P, rq + full * 96, lo, hi, order,
                    out + full * 32, ostep, (__mmask32)((1ull << (C % 32)) - 1), 1);
}

int64_t qlw_has_dwconv_fast(void) { return 1; }

void qlw_dwconv_fast_i8(const int8_t *restrict x, const int64_t *restrict g, const int16_t *restrict w16,
                        const int64_t *restrict rq, const int64_t *restrict sc, int8_t *restrict y) {
    const int64_t N = g[0], H = g[1], W = g[2], C = g[3], KH = g[4], KW = g[5], SH = g[6], SW = g[7];
    const int64_t DH = g[8], DW = g[9], PT = g[10], PL = g[11], OH = g[12], OW = g[13];
    const int8_t zx = (int8_t)g[14];
    const int64_t T = KH * KW, P = (T + 1) / 2, NB = (C + 31) / 32;
    const __m512i lo = _mm512_set1_epi32((int32_t)sc[0]), hi = _mm512_set1_epi32((int32_t)sc[1]);
    /* output byte i of a block: channel i, in lo's dword 4 * (i / 8) + i % 8 when i % 8 < 4, else in hi's
     * dword 4 * (i / 8) + i % 8 - 4 (vpermt2b indexes hi's bytes from 64) */
    int8_t idx[64] = {0};
    for (int i = 0; i < 32; i++)
        idx[i] = (int8_t)(i % 8 < 4 ? 4 * (4 * (i / 8) + i % 8) : 64 + 4 * (4 * (i / 8) + i % 8 - 4));
    const __m512i order = _mm512_loadu_si512(idx);
    /* the output columns whose taps are all inside the image horizontally: ow in [ow0, ow1) */
    int64_t ow0 = 0, ow1 = OW;
    while (ow0 < OW && ow0 * SW - PL < 0) ow0++;
    while (ow1 > ow0 && (ow1 - 1) * SW - PL + (KW - 1) * DW >= W) ow1--;
    _Pragma("omp parallel if(N * OH * OW * C * T >= 8 * PAR_MIN)")
    {
        int8_t *zrow = (int8_t *)malloc((size_t)(NB * 32));
        const int8_t **tp = (const int8_t **)malloc(sizeof(int8_t *) * (size_t)(2 * P));
        memset(zrow, zx, (size_t)(NB * 32));
        _Pragma("omp for schedule(static)")
        for (int64_t row = 0; row < N * OH; row++) {
            const int64_t n = row / OH, oh = row % OH;
            const int8_t *restrict xn = x + n * H * W * C;
            const int64_t iy0 = oh * SH - PT;
            int64_t ky0 = 0, ky1 = KH;
            while (ky0 < KH && iy0 + ky0 * DH < 0) ky0++;
            while (ky1 > ky0 && iy0 + (ky1 - 1) * DH >= H) ky1--;
            const int inside = ky0 == 0 && ky1 == KH;
            int8_t *restrict yrow = y + row * OW * C;
            for (int64_t ow = 0; ow < OW; ow++) {
                if (inside && ow == ow0 && ow1 > ow0) {   /* the interior run: fixed tap offsets, one pixel apart */
                    for (int64_t t = 0; t < T; t++)
                        tp[t] = xn + ((iy0 + (t / KW) * DH) * W + ow0 * SW - PL + (t % KW) * DW) * C;
                    if (T % 2) tp[T] = tp[0];   /* its weight is 0 */
                    dw_fast_pixels(tp, SW * C, ow1 - ow0, C, w16, P, rq, lo, hi, order, yrow + ow0 * C, C);
                    ow = ow1 - 1;
                    continue;
                }
                const int64_t ix0 = ow * SW - PL;
                for (int64_t t = 0; t < T; t++) {
                    const int64_t ky = t / KW, kx = t % KW, iy = iy0 + ky * DH, ix = ix0 + kx * DW;
                    tp[t] = ky >= ky0 && ky < ky1 && ix >= 0 && ix < W ? xn + (iy * W + ix) * C : zrow;
                }
                if (T % 2) tp[T] = zrow;
                dw_fast_pixels(tp, 0, 1, C, w16, P, rq, lo, hi, order, yrow + ow * C, C);
            }
        }
        free(tp);
        free(zrow);
    }
}
#else
int64_t qlw_has_dwconv_fast(void) { return 0; }

void qlw_dwconv_fast_i8(const int8_t *x, const int64_t *g, const int16_t *w16, const int64_t *rq, const int64_t *sc,
                        int8_t *y) {
    (void)x; (void)g; (void)w16; (void)rq; (void)sc; (void)y;
}
#endif

/* The same GEMM + fast requantization on AMX tiles (tdpbssd: int8 x int8, 64-term int32 dot products per
 * step, no +128 shift), for K % 4 == 0: qgemm.py packs the weights once ([NP/16][K/4][16][4], which is the
 * B tile layout: 16 rows of 4 k-values x 16 columns) and ch holds fast_requant16's parameters for the exact
 * raw sums sum x * w (|sum| <= K * 128 * 128 < 2**31: exact in the wrapping int32 tiles). Blocks of 16 rows
 * x 64 columns: four accumulator tiles, K in steps of 64 bytes (a last step of K % 64), stored to a buffer
 * and requantized row by row. The process asks Linux for the tile state once (qlw_amx_init); without it
 * qlw_has_amx() is 0 and qgemm.py keeps to the VNNI kernel. */
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
long syscall(long number, ...);

typedef struct __attribute__((packed)) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static int amx_state = -1;

int64_t qlw_amx_init(void) {
    if (amx_state < 0) amx_state = syscall(158 /* arch_prctl */, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                           18 /* XFEATURE_XTILEDATA */) == 0;
    return amx_state;
}

static void amx_config(tile_config *c, int64_t R, int64_t KT) {
    memset(c, 0, sizeof *c);
    c->palette = 1;
    for (int t = 0; t < 4; t++) { c->rows[t] = (uint8_t)R; c->colsb[t] = 64; }   /* accumulators */
    c->rows[4] = (uint8_t)R; c->colsb[4] = 64;                                    /* x, 64 k */
    c->rows[6] = 16; c->colsb[6] = 64;                                            /* w, 64 k */
    if (KT) {
        c->rows[5] = (uint8_t)R; c->colsb[5] = (uint16_t)KT;                      /* x, the last K % 64 */
        c->rows[7] = (uint8_t)(KT / 4); c->colsb[7] = 64;                         /* w, the last K % 64 */
    }
}

#define AMX_STEP(V, A, B, KOFF)                                                                        \
    if (vecs > V) { _tile_loadd(B, w + ((v0 + V) * K + (KOFF)) * 16, 64); _tile_dpbssd(V, A, B); }

void qlw_qgemm_amx_i8(const int8_t *restrict x, int64_t M, int64_t K, int64_t N, const int8_t *restrict w,
                      const int64_t *restrict ch, const int64_t *restrict sc, int8_t *restrict y) {
    const int64_t NP = (N + 15) / 16 * 16, nb = (NP / 16 + 3) / 4, mb = (M + 15) / 16;
    const int64_t KT = K % 64, KF = K - KT;
    const __m512i lo = _mm512_set1_epi32((int32_t)sc[3]), hi = _mm512_set1_epi32((int32_t)sc[4]);
    _Pragma("omp parallel if(M * NP * K >= 32 * PAR_MIN)")
    {
        tile_config full, tail;
        amx_config(&full, 16, KT);
        amx_config(&tail, M % 16, KT);
        int32_t buf[16][64] __attribute__((aligned(64)));
        int configured = 0;   /* 1: full rows, 2: the last M % 16 */
        _Pragma("omp for collapse(2) schedule(static)")
        for (int64_t bn = 0; bn < nb; bn++) {
            for (int64_t bm = 0; bm < mb; bm++) {
                const int64_t r0 = bm * 16, R = M - r0 < 16 ? M - r0 : 16;
                const int64_t v0 = bn * 4, vecs = NP / 16 - v0 < 4 ? NP / 16 - v0 : 4;
                const int want = R == 16 ? 1 : 2;
                if (configured != want) { _tile_loadconfig(want == 1 ? &full : &tail); configured = want; }
                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                const int8_t *restrict xb = x + r0 * K;
                for (int64_t k0 = 0; k0 < KF; k0 += 64) {
                    _tile_loadd(4, xb + k0, K);
                    AMX_STEP(0, 4, 6, k0) AMX_STEP(1, 4, 6, k0) AMX_STEP(2, 4, 6, k0) AMX_STEP(3, 4, 6, k0)
                }
                if (KT) {
                    _tile_loadd(5, xb + KF, K);
                    AMX_STEP(0, 5, 7, KF) AMX_STEP(1, 5, 7, KF) AMX_STEP(2, 5, 7, KF) AMX_STEP(3, 5, 7, KF)
                }
                _tile_stored(0, &buf[0][0], 256); _tile_stored(1, &buf[0][16], 256);
                _tile_stored(2, &buf[0][32], 256); _tile_stored(3, &buf[0][48], 256);
                const int64_t c = v0 * 16, left = N - c;
                const int64_t *q = ch + v0 * 48;
                for (int64_t r = 0; r < R; r++) {
                    int8_t *restrict out = y + (r0 + r) * N + c;
                    if (vecs == 4) {
                        const __m512i codes = pack64(fast_requant16(_mm512_load_si512(&buf[r][0]), q, lo, hi),
                                                     fast_requant16(_mm512_load_si512(&buf[r][16]), q + 48, lo, hi),
                                                     fast_requant16(_mm512_load_si512(&buf[r][32]), q + 96, lo, hi),
                                                     fast_requant16(_mm512_load_si512(&buf[r][48]), q + 144, lo, hi));
                        if (left >= 64) _mm512_storeu_si512(out, codes);
                        else _mm512_mask_storeu_epi8(out, (__mmask64)((1ull << left) - 1), codes);
                    } else {
                        for (int64_t v = 0; v < vecs; v++) {
                            const __mmask16 keep = (__mmask16)(left - 16 * v >= 16 ? 0xFFFF : (1u << (left - 16 * v)) - 1);
                            _mm512_mask_cvtepi32_storeu_epi8(out + 16 * v, keep,
                                fast_requant16(_mm512_load_si512(&buf[r][16 * v]), q + 48 * v, lo, hi));
                        }
                    }
                }
            }
        }
        _tile_release();
    }
}
#else
int64_t qlw_amx_init(void) { return 0; }

void qlw_qgemm_amx_i8(const int8_t *x, int64_t M, int64_t K, int64_t N, const int8_t *w, const int64_t *ch,
                      const int64_t *sc, int8_t *y) {
    (void)x; (void)M; (void)K; (void)N; (void)w; (void)ch; (void)sc; (void)y;
}
#endif
#else
int64_t qlw_has_qgemm(void) { return 0; }
int64_t qlw_has_dwconv_fast(void) { return 0; }
int64_t qlw_amx_init(void) { return 0; }

void qlw_qgemm_amx_i8(const int8_t *x, int64_t M, int64_t K, int64_t N, const int8_t *w, const int64_t *ch,
                      const int64_t *sc, int8_t *y) {
    (void)x; (void)M; (void)K; (void)N; (void)w; (void)ch; (void)sc; (void)y;
}

void qlw_dwconv_fast_i8(const int8_t *x, const int64_t *g, const int16_t *w16, const int64_t *rq, const int64_t *sc,
                        int8_t *y) {
    (void)x; (void)g; (void)w16; (void)rq; (void)sc; (void)y;
}

void qlw_qgemm_i8(const int8_t *x, int64_t M, int64_t K, int64_t N, const int8_t *w, const int64_t *ch,
                  const int64_t *sc, int8_t *y) {
    (void)x; (void)M; (void)K; (void)N; (void)w; (void)ch; (void)sc; (void)y;
}
#endif
