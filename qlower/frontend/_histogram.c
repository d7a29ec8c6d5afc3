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

#define QH_LANES 8 /* candidates summed side by side: each one's sum stays in order, the chains overlap */

/* Per candidate c < m (m <= QH_LANES): the squared error of quantizing evenly spaced points (first + k * step,
   k < npoints) with weights, at scale s[c], zero z[c] and codes [qmin, qmax], from prefix sums p0, p1, p2
   (npoints + 1 each) of w, w p, w p^2, into out[c] (observers.py's _squared_errors, the same arithmetic code
   by code). `next` holds QH_LANES * (qmax - qmin + 1) slots. */
static void candidate_errors(const double *p0, const double *p1, const double *p2, int64_t npoints, double first,
                             double step, const double *s, const double *z, int64_t m, int64_t qmin, int64_t qmax,
                             int64_t *next, double *out)
{
    const int64_t codes = qmax - qmin + 1;
    double sc[QH_LANES], zc[QH_LANES], err[QH_LANES];
    for (int64_t c = 0; c < QH_LANES; c++) { /* lanes past m repeat the first candidate, unused */
        sc[c] = s[c < m ? c : 0];
        zc[c] = z[c < m ? c : 0];
        err[c] = 0.0;
    }
    /* the first point of each code but the first; dividing by a power of two is multiplying by its inverse,
       exactly (the same real number rounded once), and much cheaper */
    int e;
    const double inverse = frexp(step, &e) == 0.5 ? 1.0 / step : 0.0;
    if (inverse != 0.0 && isfinite(inverse))
        for (int64_t j = 0; j + 1 < codes; j++)
            for (int64_t c = 0; c < QH_LANES; c++) {
                double k = ceil(((((double)(qmin + j + 1) - zc[c]) - 0.5) * sc[c] - first) * inverse);
                next[j * QH_LANES + c] = k < 0 ? 0 : (k > (double)npoints ? npoints : (int64_t)k);
            }
    else
        for (int64_t j = 0; j + 1 < codes; j++)
            for (int64_t c = 0; c < QH_LANES; c++) {
                double k = ceil(((((double)(qmin + j + 1) - zc[c]) - 0.5) * sc[c] - first) / step);
                next[j * QH_LANES + c] = k < 0 ? 0 : (k > (double)npoints ? npoints : (int64_t)k);
            }
    for (int64_t c = 0; c < QH_LANES; c++)
        next[(codes - 1) * QH_LANES + c] = npoints;
    double a0[QH_LANES], a1[QH_LANES], a2[QH_LANES]; /* the sums at the code's first point, read once */
    for (int64_t c = 0; c < QH_LANES; c++)
        a0[c] = p0[0], a1[c] = p1[0], a2[c] = p2[0];
    for (int64_t j = 0; j < codes; j++)
        for (int64_t c = 0; c < QH_LANES; c++) {
            const int64_t n = next[j * QH_LANES + c];
            const double b0 = p0[n], b1 = p1[n], b2 = p2[n], r = ((double)(qmin + j) - zc[c]) * sc[c];
            err[c] += (b2 - a2[c]) - 2 * r * (b1 - a1[c]) + r * r * (b0 - a0[c]);
            a0[c] = b0, a1[c] = b1, a2[c] = b2;
        }
    for (int64_t c = 0; c < m; c++)
        out[c] = err[c];
}

static int64_t *lanes_next(int64_t qmin, int64_t qmax)
{
    return malloc((size_t)(QH_LANES * (qmax - qmin + 1)) * sizeof(int64_t));
}

/* candidate_errors for every candidate c < ncand, into out[c]. Returns -1 when memory ran out. */
int64_t qh_squared_errors(const double *p0, const double *p1, const double *p2, int64_t npoints, double first,
                          double step, const double *scale, const double *zero, int64_t ncand, int64_t qmin,
                          int64_t qmax, double *out)
{
    int64_t *next = lanes_next(qmin, qmax);
    if (!next)
        return -1;
    for (int64_t c = 0; c < ncand; c += QH_LANES)
        candidate_errors(p0, p1, p2, npoints, first, step, scale + c, zero + c,
                         ncand - c < QH_LANES ? ncand - c : QH_LANES, qmin, qmax, next, out + c);
    free(next);
    return 0;
}

/* torch.argmin: the first NaN, else the first of the least. */
static int64_t argmin(const double *v, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n && v[best] == v[best]; i++)
        if (v[i] != v[i] || v[i] < v[best])
            best = i;
    return best;
}

/* Python's min over (error, row, col) in the order tried: a later one wins only when strictly less (a NaN
   error never wins, and a first NaN is never beaten, as tuple comparison goes). */
static int64_t first_least(const double *err, const int64_t *rc, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        const double e = err[i], b = err[best];
        if (e != b ? e < b : (rc[2 * i] != rc[2 * best] ? rc[2 * i] < rc[2 * best] : rc[2 * i + 1] < rc[2 * best + 1]))
            best = i;
    }
    return best;
}

typedef struct {
    const double *p0, *p1, *p2; /* prefix sums of the points' w, w p, w p^2 */
    int64_t npoints, qmin, qmax;
    double first, step;
    int64_t *next;             /* QH_LANES * (qmax - qmin + 1) */
} point_sums_t;

static void errors(const point_sums_t *ps, const double *scale, const double *zero, int64_t n, double *out)
{
    for (int64_t c = 0; c < n; c += QH_LANES)
        candidate_errors(ps->p0, ps->p1, ps->p2, ps->npoints, ps->first, ps->step, scale + c, zero + c,
                         n - c < QH_LANES ? n - c : QH_LANES, ps->qmin, ps->qmax, ps->next, out + c);
}

/* observers.py _mse_search's search(rows, cols): the clips (lows[r], highs[c]) not tried yet, row-major,
   appended to err[*count..] and rc (row, col pairs); scale and zero: scratch for as many. */
static void try_clips(const point_sums_t *ps, const double *lows, const double *highs, int64_t nh, double eps,
                      const int64_t *rows, int64_t nr, const int64_t *cols, int64_t nc, unsigned char *tried,
                      double *scale, double *zero, double *err, int64_t *rc, int64_t *count)
{
    const double codes = (double)(ps->qmax - ps->qmin), qmin = (double)ps->qmin, qmax = (double)ps->qmax;
    int64_t n = 0, *at = rc + 2 * *count;
    for (int64_t i = 0; i < nr; i++)
        for (int64_t j = 0; j < nc; j++) {
            const int64_t r = rows[i], c = cols[j];
            if (tried[r * nh + c])
                continue;
            tried[r * nh + c] = 1;
            const double a = lows[r], s = (highs[c] - a) / codes;
            const double z = qmin - nearbyint(a / (s < 1e-30 ? 1e-30 : s));
            zero[n] = z < qmin ? qmin : (z > qmax ? qmax : z);
            scale[n] = s < eps ? eps : s;
            at[2 * n] = r;
            at[2 * n + 1] = c;
            n++;
        }
    errors(ps, scale, zero, n, err + *count);
    *count += n;
}

/* observers.py _mse_search's around(n, centre): every coarse-th index and the last (centre < 0), else the
   indices within coarse - 1 of centre. Returns how many, in out. */
static int64_t around(int64_t n, int64_t centre, int64_t coarse, int64_t *out)
{
    int64_t k = 0;
    if (centre < 0) {
        for (int64_t i = 0; i < n; i += coarse)
            out[k++] = i;
        if ((n - 1) % coarse)
            out[k++] = n - 1;
        return k;
    }
    for (int64_t i = centre - coarse + 1 < 0 ? 0 : centre - coarse + 1; i < n && i < centre + coarse; i++)
        out[k++] = i;
    return k;
}

/* observers.py MSEObserver's clip search over the histogram counts[0..nbins) (bins of `width` from `left`),
   its values standing as `subbins` evenly spaced points per bin: _mse_search over _centres with
   qh_squared_errors, the same arithmetic step by step. Asymmetric (nl > 0): out = {r, c}, the clip
   (lows[r], highs[c]) of least error, coarse then refined; symmetric (nl == 0): out = {0, c}, the clip
   +-highs[c] of least error, zero point 0; *least = that error. Needs qmax - qmin + 1 < nbins * subbins.
   Returns 0, or -1 when memory ran out. */
int64_t qh_mse_search(const double *counts, int64_t nbins, double left, double width, int64_t subbins,
                      const double *lows, int64_t nl, const double *highs, int64_t nh, int64_t qmin, int64_t qmax,
                      double eps, int64_t coarse, int64_t *out, double *least)
{
    const int64_t npoints = nbins * subbins, ncand = (nl > 0 ? nl : 1) * nh;
    double *p = malloc((size_t)(3 * (npoints + 1) + 3 * ncand) * sizeof(double));
    int64_t *ints = malloc((size_t)(QH_LANES * (qmax - qmin + 1) + 2 * ncand + nl + nh) * sizeof(int64_t));
    unsigned char *tried = calloc((size_t)ncand, 1);
    int64_t status = -1;
    if (!p || !ints || !tried)
        goto done;
    double *p0 = p, *p1 = p + npoints + 1, *p2 = p + 2 * (npoints + 1);
    double *err = p + 3 * (npoints + 1), *scale = err + ncand, *zero = scale + ncand;
    int64_t *next = ints, *rc = ints + QH_LANES * (qmax - qmin + 1), *rows = rc + 2 * ncand, *cols = rows + nl;
    /* observers.py _centres and _PointSums: the points left + (j + (k + 0.5) / subbins) * width, weights
       counts[j] / subbins, and the running sums of w, w p and w p^2 in order (torch.cumsum's) */
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, x0 = 0.0, x1 = 0.0;
    p0[0] = p1[0] = p2[0] = 0.0;
    for (int64_t j = 0; j < nbins; j++) {
        const double w = counts[j] / (double)subbins;
        for (int64_t k = 0; k < subbins; k++) {
            const double x = left + ((double)j + ((double)k + 0.5) / (double)subbins) * width;
            const int64_t i = j * subbins + k;
            p0[i + 1] = s0 += w;
            p1[i + 1] = s1 += w * x;
            p2[i + 1] = s2 += w * (x * x);
            x0 = i == 0 ? x : x0;
            x1 = i == 1 ? x : x1;
        }
    }
    const point_sums_t ps = {p0, p1, p2, npoints, qmin, qmax, x0, x1 - x0, next};
    if (nl == 0) {
        const double half = (double)(qmax - qmin) / 2;
        for (int64_t c = 0; c < nh; c++) {
            const double s = highs[c] / half;
            scale[c] = s < eps ? eps : s;
            zero[c] = 0.0;
        }
        errors(&ps, scale, zero, nh, err);
        out[0] = 0;
        out[1] = argmin(err, nh);
        *least = err[out[1]];
        status = 0;
        goto done;
    }
    int64_t count = 0;
    for (int64_t round = 0; round < 2; round++) { /* every coarse-th clip, then those around the best */
        const int64_t best = round ? first_least(err, rc, count) : -1;
        const int64_t nr = around(nl, round ? rc[2 * best] : -1, coarse, rows);
        const int64_t nc = around(nh, round ? rc[2 * best + 1] : -1, coarse, cols);
        try_clips(&ps, lows, highs, nh, eps, rows, nr, cols, nc, tried, scale, zero, err, rc, &count);
    }
    const int64_t best = first_least(err, rc, count);
    out[0] = rc[2 * best];
    out[1] = rc[2 * best + 1];
    *least = err[best];
    status = 0;
done:
    free(p);
    free(ints);
    free(tried);
    return status;
}
