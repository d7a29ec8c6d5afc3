/* Calibration histograms of qlower's activation observers (qlower/frontend/histogram.py loads this
   with ctypes; every function here has a torch twin there, and tests check that they agree).

   A running histogram is (exponent e, origin o, counts[nbins]): counts[j] is how many values v had
   floor(v / 2^e) == o + j. The bins are a fixed power-of-two grid anchored at 0, so widening the range
   merges whole bins (2^k old bins into one new one) and never splits a count: the histogram after any
   sequence of batches is exactly the histogram of all their values on the final grid, and that grid
   is a function of the final extremes alone (qh_exponent). Non-finite values are skipped. */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QH_EMPTY INT64_MIN
#define QH_TABLES 4      /* interleaved count tables: runs of equal values (a ReLU's zeros) don't serialize */
#define QH_BLOCK 256
#define QH_CHUNK (1 << 30) /* values per flush of the 32-bit tables */

/* The smallest e >= (exponent of max|v|) - 24 with floor(hi / 2^e) - floor(lo / 2^e) + 1 <= nbins.
   The floor keeps bins no finer than half a float32 step of the largest value (finer ones would be
   empty), so bin indices stay below 2^26 in magnitude. Non-decreasing as [lo, hi] widens. */
int64_t qh_exponent(double lo, double hi, int64_t nbins)
{
    double m = fmax(fabs(lo), fabs(hi));
    int64_t e = (m >= FLT_MIN ? ilogb(m) : -126) - 24;
    if (hi > lo) {
        int64_t below = ilogb((hi - lo) / (double)nbins) - 1; /* certainly too fine: needs >= 2 nbins - 1 bins */
        if (below > e)
            e = below;
    }
    while (floor(ldexp(hi, (int)-e)) - floor(ldexp(lo, (int)-e)) + 1.0 > (double)nbins)
        e++;
    return e;
}

static int64_t floor_shift(int64_t g, int64_t s) /* floor(g / 2^s) */
{
    if (s >= 62)
        return g < 0 ? -1 : 0;
    return g >= 0 ? g >> s : -((-g - 1) >> s) - 1;
}

/* counts moved from grid (e0, o0) to the coarser or equal grid (e1, o1) that holds all of them. */
static int rebin(double *counts, int64_t nbins, int64_t e0, int64_t o0, int64_t e1, int64_t o1)
{
    double *moved = calloc((size_t)nbins, sizeof(double));
    if (!moved)
        return -1;
    for (int64_t j = 0; j < nbins; j++)
        if (counts[j] != 0.0)
            moved[floor_shift(o0 + j, e1 - e0) - o1] += counts[j];
    memcpy(counts, moved, (size_t)nbins * sizeof(double));
    free(moved);
    return 0;
}

static int accumulate(const float *x, int64_t n, double *counts, int64_t nbins, int64_t e, int64_t origin,
                      int all_finite)
{
    uint32_t *tables = calloc((size_t)(QH_TABLES * nbins), sizeof(uint32_t));
    if (!tables)
        return -1;
    const double inv = ldexp(1.0, (int)-e);
    const int32_t origin32 = (int32_t)origin; /* |origin| < 2^26 (qh_exponent) */
    int32_t idx[QH_BLOCK];
    for (int64_t start = 0; start < n; start += QH_CHUNK) {
        int64_t stop = n - start < QH_CHUNK ? n : start + QH_CHUNK;
        for (int64_t i = start; i < stop; i += QH_BLOCK) {
            int64_t m = stop - i < QH_BLOCK ? stop - i : QH_BLOCK;
            if (all_finite) {
                for (int64_t k = 0; k < m; k++)
                    idx[k] = (int32_t)floor((double)x[i + k] * inv) - origin32;
                int64_t k = 0;
                for (; k + QH_TABLES <= m; k += QH_TABLES)
                    for (int t = 0; t < QH_TABLES; t++)
                        tables[t * nbins + idx[k + t]]++;
                for (; k < m; k++)
                    tables[idx[k]]++;
            } else {
                for (int64_t k = 0; k < m; k++) {
                    float v = x[i + k];
                    if (fabsf(v) <= FLT_MAX)
                        tables[(int64_t)floor((double)v * inv) - origin]++;
                }
            }
        }
        for (int64_t j = 0; j < nbins; j++) {
            uint32_t c = 0;
            for (int t = 0; t < QH_TABLES; t++) {
                c += tables[t * nbins + j];
                tables[t * nbins + j] = 0;
            }
            counts[j] += (double)c;
        }
    }
    free(tables);
    return 0;
}

static float ordered_float(int32_t k) /* the inverse of the order-preserving map in qh_observe */
{
    int32_t b = k ^ ((k >> 31) & 0x7fffffff);
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* One batch x[0..n) into the running histogram (counts[nbins]; state = {exponent, origin}, exponent
   QH_EMPTY before any finite value; range = {min, max} of the finite values seen). Returns how many
   values of x were finite, or -1 when memory ran out (histogram.py raises MemoryError). */
int64_t qh_observe(const float *x, int64_t n, double *counts, int64_t nbins, int64_t *state, float *range)
{
    /* extremes over the float bits mapped to integers in the floats' order (vectorizes without fast-math) */
    int32_t klo = INT32_MAX, khi = INT32_MIN;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t b;
        memcpy(&b, x + i, sizeof b);
        bad += (b & 0x7f800000) == 0x7f800000; /* inf or nan */
        const int32_t k = b ^ ((b >> 31) & 0x7fffffff);
        klo = k < klo ? k : klo;
        khi = k > khi ? k : khi;
    }
    float lo = ordered_float(klo), hi = ordered_float(khi);
    if (bad) { /* rare: again, over the finite values only */
        lo = INFINITY, hi = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            if (fabsf(v) <= FLT_MAX) {
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
        }
    }
    if (bad == n)
        return 0;
    if (state[0] != QH_EMPTY) {
        lo = range[0] < lo ? range[0] : lo;
        hi = range[1] > hi ? range[1] : hi;
    }
    int64_t e = qh_exponent(lo, hi, nbins);
    int64_t origin = (int64_t)floor(ldexp((double)lo, (int)-e));
    if (state[0] == QH_EMPTY)
        memset(counts, 0, (size_t)nbins * sizeof(double));
    else if ((e != state[0] || origin != state[1]) && rebin(counts, nbins, state[0], state[1], e, origin))
        return -1;
    state[0] = e;
    state[1] = origin;
    range[0] = lo;
    range[1] = hi;
    return accumulate(x, n, counts, nbins, e, origin, bad == 0) ? -1 : n - bad;
}

/* torchao HistogramObserver._compute_quantization_error: the L2 error of quantizing hist[0..nb) (bins of
   `width`, values spread evenly in each) to dst_nbins levels spanning bins [first, last]. */
static double l2_error(const double *hist, int64_t nb, double width, int64_t dst_nbins, int64_t first, int64_t last)
{
    const double dst_width = width * (double)(last - first + 1) / (double)dst_nbins;
    if (dst_width == 0.0)
        return 0.0;
    const double half = dst_width / 2, half3 = half * half * half, full = (half3 + half3) / 3;
    double norm = 0.0;
    for (int64_t i = 0; i < nb; i++) {
        if (hist[i] == 0.0)
            continue;
        const double begin = (double)(i - first) * width, end = begin + width;
        double db = floor(begin / dst_width), de = floor(end / dst_width);
        db = db < 0 ? 0 : (db > dst_nbins - 1 ? dst_nbins - 1 : db);
        de = de < 0 ? 0 : (de > dst_nbins - 1 ? dst_nbins - 1 : de);
        const double density = hist[i] / width;
        const double d0 = begin - (db + 0.5) * dst_width, d1 = end - (de * dst_width + half);
        norm += density * ((half3 - d0 * d0 * d0) / 3 + (de - db - 1) * full + (d1 * d1 * d1 + half3) / 3);
    }
    return norm;
}

/* torchao HistogramObserver._non_linear_param_search on hist[0..nb): out = {start bin, end bin}
   ({-1, -1} when memory ran out). */
void qh_l2_search(const double *hist, int64_t nb, double width, int64_t dst_nbins, int64_t *out)
{
    double *csum = malloc((size_t)nb * sizeof(double));
    out[0] = out[1] = -1;
    if (!csum)
        return;
    double total = 0.0;
    for (int64_t i = 0; i < nb; i++)
        csum[i] = total += hist[i];
    const double step = 1e-5;
    double alpha = 0.0, beta = 1.0, norm_min = INFINITY;
    int64_t start = 0, end = nb - 1;
    while (alpha < beta) {
        const double next_alpha = alpha + step, next_beta = beta - step;
        int64_t l = start, r = end;
        while (l < end && csum[l] < next_alpha * total)
            l++;
        while (r > start && csum[r] > next_beta * total)
            r--;
        int64_t next_start = start, next_end = end;
        if (l - start > end - r) {
            next_start = l;
            alpha = next_alpha;
        } else {
            next_end = r;
            beta = next_beta;
        }
        if (next_start == start && next_end == end)
            continue;
        const double norm = l2_error(hist, nb, width, dst_nbins, next_start, next_end);
        if (norm > norm_min)
            break;
        norm_min = norm;
        start = next_start;
        end = next_end;
    }
    free(csum);
    out[0] = start;
    out[1] = end;
}

/* Per candidate c: the squared error of quantizing evenly spaced points (first + k * step, k < npoints)
   with weights, at scale[c], zero[c] and codes [qmin, qmax], from prefix sums p0, p1, p2 (npoints + 1
   each) of w, w p, w p^2 (observers.py's _squared_errors, the same arithmetic code by code). */
void qh_squared_errors(const double *p0, const double *p1, const double *p2, int64_t npoints, double first, double step,
                       const double *scale, const double *zero, int64_t ncand, int64_t qmin, int64_t qmax, double *out)
{
    for (int64_t c = 0; c < ncand; c++) {
        const double s = scale[c], z = zero[c];
        double err = 0.0;
        int64_t prev = 0;
        for (int64_t q = qmin; q <= qmax; q++) {
            int64_t next = npoints;
            if (q < qmax) {
                double k = ceil(((((double)(q + 1) - z) - 0.5) * s - first) / step);
                next = k < 0 ? 0 : (k > (double)npoints ? npoints : (int64_t)k);
            }
            const double r = ((double)q - z) * s;
            err += (p2[next] - p2[prev]) - 2 * r * (p1[next] - p1[prev]) + r * r * (p0[next] - p0[prev]);
            prev = next;
        }
        out[c] = err;
    }
}
