/* normcert: one-pass error-free extraction kernels for the float64 oracle
   (oracle/sums.py, oracle/float64_backend.py; loaded by oracle/native.py, which
   also holds the compiler flags and the self-test).
   Built with -ffp-contract=off and without -ffast-math: every + - * below is
   one IEEE binary64 operation, rounded to nearest, in the order written. */
#include <float.h>
#include <string.h>

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "normcert's native kernels need binary64 evaluated in binary64 (FLT_EVAL_METHOD == 0): no x87 excess precision"
#endif

typedef long long i64;
typedef double v4 __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) v4 ld4(const double *p) { v4 v; memcpy(&v, p, sizeof v); return v; }
static inline __attribute__((always_inline)) double hsum(v4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

/* Row r of x is x[r*rs + j*cs], j < n.  For every row, with s = sigma[r]:
   q_j = (s + v_j) - s, tau[r] = sum q_j (exact: the q_j lie on one grid),
   t[r] = fl(sum (v_j - q_j)); v_j = x_j, or x_j * x_j when SQ. */
#define EXTRACT(NAME, SQ)                                                         \
void NAME(const double *x, i64 rows, i64 n, i64 rs, i64 cs, const double *sigma,  \
          double *tau, double *t)                                                 \
{                                                                                 \
    if (cs != 1 && rs == 1) { /* rows are adjacent in memory: sweep columns */    \
        for (i64 r = 0; r < rows; r++) tau[r] = t[r] = 0.0;                       \
        for (i64 j = 0; j < n; j++) {                                             \
            const double *p = x + j * cs;                                         \
            for (i64 r = 0; r < rows; r++) {                                      \
                double v = p[r]; if (SQ) v = v * v;                               \
                double s = sigma[r];                                              \
                double q = (s + v) - s;                                           \
                tau[r] += q; t[r] += v - q;                                       \
            }                                                                     \
        }                                                                         \
        return;                                                                   \
    }                                                                             \
    for (i64 r = 0; r < rows; r++) {                                              \
        const double *p = x + r * rs;                                             \
        double s = sigma[r];                                                      \
        v4 S = {s, s, s, s}, Q0 = {0}, Q1 = {0}, R0 = {0}, R1 = {0};              \
        i64 j = 0;                                                                \
        if (cs == 1) {                                                            \
            for (; j + 8 <= n; j += 8) {                                          \
                v4 a = ld4(p + j), b = ld4(p + j + 4);                            \
                if (SQ) { a = a * a; b = b * b; }                                 \
                v4 qa = (S + a) - S, qb = (S + b) - S;                            \
                Q0 += qa; R0 += a - qa; Q1 += qb; R1 += b - qb;                   \
            }                                                                     \
        }                                                                         \
        double q = hsum(Q0) + hsum(Q1), rr = hsum(R0) + hsum(R1);                 \
        for (; j < n; j++) {                                                      \
            double v = p[j * cs]; if (SQ) v = v * v;                              \
            double a = (s + v) - s;                                               \
            q += a; rr += v - a;                                                  \
        }                                                                         \
        tau[r] = q; t[r] = rr;                                                    \
    }                                                                             \
}

EXTRACT(nc_extract, 0)
EXTRACT(nc_extract_sq, 1)

/* Row maxima and minima (NaN if the row holds one).  Lane u of the vector
   part keeps the running max / min of the x_j with j = u (mod 4), replacing it
   only by a strictly greater / smaller value; the lanes are then merged in
   order u = 0..3, then the tail.  The four lanes are held as two 16-byte
   vectors: comparisons on 32-byte vectors are split into scalar code where
   the baseline instruction set has no 32-byte registers (x86-64's SSE2). */
typedef double v2 __attribute__((vector_size(16)));
typedef long long v2i __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) v2 ld2(const double *p) { v2 v; memcpy(&v, p, sizeof v); return v; }

void nc_minmax(const double *x, i64 rows, i64 n, i64 rs, i64 cs, double *mx, double *mn)
{
    const double nan = __builtin_nan("");
    for (i64 r = 0; r < rows; r++) {
        const double *p = x + r * rs;
        double hi = -__builtin_inf(), lo = __builtin_inf();
        int bad = 0;
        i64 j = 0;
        if (cs == 1 && n >= 4) {
            v2 H0 = ld2(p), H1 = ld2(p + 2), L0 = H0, L1 = H1;
            v2i N0 = (H0 != H0), N1 = (H1 != H1);
            for (j = 4; j + 4 <= n; j += 4) {
                v2 a = ld2(p + j), b = ld2(p + j + 2);
                v2i ga = (a > H0), gb = (b > H1), la = (a < L0), lb = (b < L1);
                H0 = (v2)(((v2i)a & ga) | ((v2i)H0 & ~ga));
                H1 = (v2)(((v2i)b & gb) | ((v2i)H1 & ~gb));
                L0 = (v2)(((v2i)a & la) | ((v2i)L0 & ~la));
                L1 = (v2)(((v2i)b & lb) | ((v2i)L1 & ~lb));
                N0 |= (a != a);
                N1 |= (b != b);
            }
            const double H[4] = {H0[0], H0[1], H1[0], H1[1]}, L[4] = {L0[0], L0[1], L1[0], L1[1]};
            const int N[4] = {N0[0] != 0, N0[1] != 0, N1[0] != 0, N1[1] != 0};
            for (int u = 0; u < 4; u++) {
                hi = H[u] > hi ? H[u] : hi;
                lo = L[u] < lo ? L[u] : lo;
                bad |= N[u];
            }
        }
        for (; j < n; j++) {
            double v = p[j * cs];
            hi = v > hi ? v : hi;
            lo = v < lo ? v : lo;
            bad |= (v != v);
        }
        mx[r] = bad ? nan : hi;
        mn[r] = bad ? nan : lo;
    }
}

/* Dot products: p = fl(a b), e = a b - p exactly (Dekker's TwoProduct with
   Veltkamp's split), then the p are extracted at sigma as above:
   tau = sum q exactly, tr = fl(sum (p - q)), te = fl(sum e). */
#define SPLITTER 134217729.0
#define TWOPROD(A, B, P, E, T)                                                   \
    do {                                                                         \
        T ca = SPLITTER * (A), cb = SPLITTER * (B);                              \
        T ah = ca - (ca - (A)), bh = cb - (cb - (B));                            \
        T al = (A) - ah, bl = (B) - bh;                                          \
        P = (A) * (B);                                                           \
        E = (((ah * bh - P) + ah * bl) + al * bh) + al * bl;                     \
    } while (0)

void nc_dot(const double *a, i64 ars, i64 acs, const double *b, i64 brs, i64 bcs,
            i64 rows, i64 n, const double *sigma, double *tau, double *tr, double *te)
{
    if (acs != 1 && bcs != 1 && ars == 1 && brs == 1) {
        for (i64 r = 0; r < rows; r++) tau[r] = tr[r] = te[r] = 0.0;
        for (i64 j = 0; j < n; j++) {
            const double *pa = a + j * acs, *pb = b + j * bcs;
            for (i64 r = 0; r < rows; r++) {
                double x = pa[r], y = pb[r], p, e, s = sigma[r];
                TWOPROD(x, y, p, e, double);
                double q = (s + p) - s;
                tau[r] += q; tr[r] += p - q; te[r] += e;
            }
        }
        return;
    }
    for (i64 r = 0; r < rows; r++) {
        const double *pa = a + r * ars, *pb = b + r * brs;
        double s = sigma[r];
        v4 S = {s, s, s, s}, Q = {0}, R = {0}, E4 = {0};
        i64 j = 0;
        if (acs == 1 && bcs == 1) {
            for (; j + 4 <= n; j += 4) {
                v4 x = ld4(pa + j), y = ld4(pb + j), p, e;
                TWOPROD(x, y, p, e, v4);
                v4 q = (S + p) - S;
                Q += q; R += p - q; E4 += e;
            }
        }
        double q = hsum(Q), rr = hsum(R), ee = hsum(E4);
        for (; j < n; j++) {
            double x = pa[j * acs], y = pb[j * bcs], p, e;
            TWOPROD(x, y, p, e, double);
            double qq = (s + p) - s;
            q += qq; rr += p - qq; ee += e;
        }
        tau[r] = q; tr[r] = rr; te[r] = ee;
    }
}
