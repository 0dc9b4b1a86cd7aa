/* What the detector's native passes (_fused.c) and its whole tick (_whole_tick.c) share: the
 * selections every loop uses, the loops the whole tick calls, numpy's sums.  _fused.c says
 * why each loop is written as it is. */
#ifndef CAPALARM_FUSED_H
#define CAPALARM_FUSED_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Shared between the two files of the extension, never exported from it. */
#if defined(__GNUC__)
#define INTERNAL __attribute__((visibility("hidden")))
#else
#define INTERNAL
#endif

/* numpy's maximum/minimum on numbers (±inf included).  numpy's NaN rule (a NaN operand is the
 * result) is not kept: no NaN reaches these loops (every input is a finite count, rate or
 * level, or ±inf as a bound, and no step makes inf - inf or 0 * inf), and the test for it
 * compiled to two branches per selection, mispredicted row after row (a third of the ticks
 * are idle, a few percent exceed u0): they cost three times the loops' arithmetic.  Plain
 * comparisons compile to blends; every selection below computes both sides. */
static inline float max_f(float a, float b) { return a >= b ? a : b; }
static inline float min_f(float a, float b) { return a <= b ? a : b; }
static inline double max_d(double a, double b) { return a >= b ? a : b; }
static inline double min_d(double a, double b) { return a <= b ? a : b; }
/* A count as a float through int32: SSE has no vector int64 -> float conversion, and a scalar
 * one per row keeps the whole loop scalar.  Counts are ticks (2^31 of them is 68 years at
 * one a second); a larger one is taken as 2^31 - 1. */
static inline int32_t narrow(int64_t k) { return k > INT32_MAX ? INT32_MAX : (int32_t)k; }

/* Each loop is a separate function over restrict pointers (the arrays never alias), built
 * twice where the compiler can: for AVX2 and for the baseline, chosen at load by the CPU. */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SIMD_CLONES
#endif

#define REACH_MAX 48 /* slots on either side: half a day, the most seasonal_window means */
#define HOUR_SLOTS_MAX 8

INTERNAL Py_ssize_t tail_loop(Py_ssize_t n, const double *restrict r,
                              const uint8_t *restrict judged, const uint8_t *restrict breach,
                              const int64_t *restrict run, float *restrict u0,
                              float *restrict spread, int64_t *restrict seen,
                              uint8_t *restrict open, float *restrict peak,
                              int64_t *restrict quiet, uint8_t *restrict anomalous,
                              uint8_t *restrict ended);
INTERNAL void size_loop(Py_ssize_t n, const double *restrict x, const uint8_t *restrict written,
                        const double *restrict level, double alpha_slot, double *restrict overall,
                        int64_t *restrict count, double *restrict spread, float *restrict hour,
                        uint32_t *restrict hour_n, int64_t *restrict age);
INTERNAL void budget_loop(Py_ssize_t n, const double *restrict bits, const double *restrict mean,
                          const uint8_t *restrict learning, const uint8_t *restrict misconfigured,
                          const uint8_t *restrict derived, const uint8_t *restrict fitted,
                          const double *restrict declared_allowance,
                          const double *restrict declared_tolerance,
                          const double *restrict floor_allowance,
                          const double *restrict floor_tolerance, const int64_t *restrict window,
                          double seconds, double forget, double rise, double margin,
                          double margin_windows, double *restrict envelope,
                          double *restrict follow_excess, double *restrict excess,
                          double *restrict last_step, double *restrict allowance,
                          double *restrict tolerance, double *restrict inv_tolerance,
                          double *restrict projected, double *restrict ratio);
INTERNAL void seasonal_loop(Py_ssize_t n, const float *restrict y, const double *restrict pred_y,
                            const uint8_t *restrict ready, const uint8_t *restrict settled,
                            int64_t *restrict count, const float *restrict alpha,
                            float *restrict meanad, float *restrict mad, float *restrict recent,
                            const float *restrict rise_recent, float *restrict day,
                            uint16_t *restrict day_n, const float *restrict rise_day,
                            float day_ticks, float day_alpha, float *restrict week,
                            uint16_t *restrict week_n, const float *restrict rise_week,
                            float week_ticks, float week_alpha, float below);
INTERNAL void predict_loop(Py_ssize_t n, const float *const *restrict near,
                           const uint16_t *const *restrict near_n, const int *restrict near_off,
                           int near_count, const float *const *restrict hour,
                           const uint16_t *const *restrict hour_n, int hour_count,
                           const float *restrict week, const uint16_t *restrict week_n,
                           const float *restrict recent, const float *restrict mad,
                           const float *restrict meanad, const uint8_t *restrict seasonal,
                           const int64_t *restrict reach, const float *restrict dip_max,
                           double need_d, double need_w, float mad_eps, double spread_min,
                           double *restrict pred_y, double *restrict spread);

/* ndarray.sum() and np.add.reduceat over a contiguous run, as numpy sums (pairwise). */
INTERNAL double numpy_sum(const double *a, Py_ssize_t n);
INTERNAL double numpy_reduceat(const double *a, Py_ssize_t n);

/* TailBank.end_incidents for one row whose incident ended: its peak (an anomaly's at most
 * teach_max above the threshold it crossed) replaces the smallest kept peak of today's block
 * where it is larger, and the incident is closed.  Returns whether the kept peaks changed. */
static inline int keep_peak(int64_t r, const float *peak, const double *z, const double *teach,
                            uint8_t *anomalous, uint8_t *open, float *kept, int block, int days,
                            int per_day) {
    const double cap = z[r] + teach[r];
    const double p = (anomalous[r] & 1) ? min_d((double)peak[r], cap) : (double)peak[r];
    float *cells = kept + ((Py_ssize_t)r * days + block) * per_day;
    int slot = 0;
    for (int j = 1; j < per_day; j++)
        if (cells[j] < cells[slot]) slot = j;
    const int better = p > (double)cells[slot];
    if (better) cells[slot] = (float)p;
    open[r] = 0;
    anomalous[r] = 0;
    return better;
}

/* The whole tick's type (_whole_tick.c), added to the module by _fused.c. */
extern INTERNAL PyTypeObject TickType;

#endif
