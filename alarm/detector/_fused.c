/* Fused per-row passes of the detector's tick (alarm/detector/fused.py says why).
 *
 * Each function is one loop over the rows doing, element by element, exactly the float
 * operations the numpy code beside it does over whole arrays, in the same order and the same
 * precision, so the two agree bit for bit (the tests check it).  Built with
 * -ffp-contract=off: a fused multiply-add would round once where numpy rounds twice.
 *
 * Arrays come in through the buffer protocol (no numpy headers at build time); each is
 * checked for its length and item size, and a mismatch is a ValueError, never a stray write.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

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

typedef struct {
    const char *name;
    Py_buffer *view;
    Py_ssize_t itemsize;
} Arg;

/* Every buffer holds n items of its size; n is the first one's length. */
static int check(Arg *args, int count, Py_ssize_t *n) {
    *n = args[0].view->len / args[0].itemsize;
    for (int i = 0; i < count; i++) {
        Py_buffer *v = args[i].view;
        if (v->len != *n * args[i].itemsize) {
            PyErr_Format(PyExc_ValueError, "%s: %zd bytes, expected %zd items of %zd", args[i].name,
                         v->len, *n, args[i].itemsize);
            return -1;
        }
    }
    return 0;
}

static void release(Py_buffer *views, int count) {
    for (int i = 0; i < count; i++)
        if (views[i].obj) PyBuffer_Release(&views[i]);
}

/* TailBank.update's per-row part: the SA of u0 and its spread, and the incidents.
 * Returns the rows ended.  Flags are 0/1 bytes (numpy bools) combined with & and |, and each
 * selection computes both sides: see the note above max_f. */
SIMD_CLONES
static Py_ssize_t tail_loop(Py_ssize_t n, const double *restrict r, const uint8_t *restrict judged,
                            const uint8_t *restrict breach, const int64_t *restrict run,
                            float *restrict u0, float *restrict spread, int64_t *restrict seen,
                            uint8_t *restrict open, float *restrict peak, int64_t *restrict quiet,
                            uint8_t *restrict anomalous, uint8_t *restrict ended) {
    const float level = 0.97f, below = (float)(0.97 - 1.0), u_step = 0.01f;
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const float x = (float)r[i];
        const uint8_t jd = judged[i] & 1;
        const float j = (float)jd;
        const float n1 = (float)narrow(seen[i]) + 1.0f;
        const float u = u0[i];
        float dev = __builtin_fabsf(x - u);
        dev = min_f(dev, 5.0f * spread[i] + 1.0f);
        float a = max_f(1.0f / n1, 1e-3f);
        a *= j;
        dev -= spread[i];
        dev *= a;
        const float sp = spread[i] + dev;
        spread[i] = sp;
        float step = min_f(50.0f / n1, 1.0f);
        step += u_step;
        step *= sp;
        const uint8_t above = x > u;
        float move = above ? level : below;
        move *= j;
        move *= step;
        u0[i] = u + move;
        seen[i] += jd;
        const uint8_t was_open = open[i] & 1;
        const uint8_t exceed = jd & above;
        const uint8_t start = exceed & (was_open ^ 1);
        const float p0 = peak[i];
        const float grown = max_f(p0, x);
        float p = exceed ? grown : p0;
        p = start ? x : p;
        peak[i] = p;
        const uint8_t now_open = was_open | start;
        open[i] = now_open;
        anomalous[i] = (anomalous[i] & 1) | (breach[i] & now_open);
        /* 0 after an exceedance, else one more judged tick: a mask, not a branch. */
        const int64_t q = (quiet[i] + jd) & -(int64_t)(exceed ^ 1);
        quiet[i] = q;
        const uint8_t e = now_open & (q >= run[i]);
        ended[i] = e;
        count += e;
    }
    return count;
}

/* tail_step(r f64, judged b, breach b, run i64, u0 f32, spread f32, seen i64, open b, peak f32,
 *           quiet i64, anomalous b, ended b (out)) -> rows ended */
static PyObject *tail_step(PyObject *self, PyObject *args) {
    enum { N = 12 };
    Py_buffer v[N];
    memset(v, 0, sizeof v);
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*w*w*w*w*w*w*", &v[0], &v[1], &v[2], &v[3], &v[4],
                          &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11]))
        return NULL;
    Arg spec[N] = {{"r", &v[0], 8},       {"judged", &v[1], 1}, {"breach", &v[2], 1},
                   {"run", &v[3], 8},     {"u0", &v[4], 4},     {"spread", &v[5], 4},
                   {"seen", &v[6], 8},    {"open", &v[7], 1},   {"peak", &v[8], 4},
                   {"quiet", &v[9], 8},   {"anomalous", &v[10], 1}, {"ended", &v[11], 1}};
    Py_ssize_t n;
    if (check(spec, N, &n) < 0) {
        release(v, N);
        return NULL;
    }
    Py_ssize_t count;
    Py_BEGIN_ALLOW_THREADS
    count = tail_loop(n, v[0].buf, v[1].buf, v[2].buf, v[3].buf, v[4].buf, v[5].buf, v[6].buf,
                      v[7].buf, v[8].buf, v[9].buf, v[10].buf, v[11].buf);
    Py_END_ALLOW_THREADS
    release(v, N);
    return PyLong_FromSsize_t(count);
}

/* SizeLevel.learn's per-row part, for one hour slot (the hour's row of each slot array). */
SIMD_CLONES
static void size_loop(Py_ssize_t n, const double *restrict x, const uint8_t *restrict written,
                      const double *restrict level, double alpha_slot, double *restrict overall,
                      int64_t *restrict count, double *restrict spread, float *restrict hour,
                      uint32_t *restrict hour_n, int64_t *restrict age) {
    const double huber = 3.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t wr = written[i] & 1;
        const double w = (double)wr;
        const int64_t k = count[i];
        const double n1 = (double)narrow(k) + 1.0;
        const double s0 = spread[i];
        const double xi = x[i];
        const double bound = huber * s0, low = -bound;
        double a = max_d(1.0 / n1, 1e-3);
        a *= w;
        double resid = min_d(max_d(xi - level[i], low), bound);
        resid = __builtin_fabs(resid);
        resid -= s0;
        resid *= a;
        double step = min_d(max_d(xi - overall[i], low), bound);
        step *= a;
        const double moved_overall = overall[i] + step;
        overall[i] = (wr & (k == 0)) ? xi : moved_overall;
        spread[i] = max_d(s0 + resid, 0.05);
        const uint32_t c = hour_n[i];
        const float h0 = hour[i];
        const double slot = (double)h0;
        const double a_slot = max_d(1.0 / ((double)c + 1.0), alpha_slot);
        double moved = min_d(max_d(xi - slot, low), bound);
        moved *= a_slot;
        moved += slot;
        moved = c == 0 ? xi : moved;
        hour[i] = wr ? (float)moved : h0;
        hour_n[i] = c + (uint32_t)(wr & (c < UINT32_MAX));
        count[i] = k + wr;
        age[i] += 1;
    }
}

/* size_learn(x f64, written b, level f64, alpha_slot, overall f64, count i64, spread f64,
 *            hour f32, hour_n u32, age i64) */
static PyObject *size_learn(PyObject *self, PyObject *args) {
    enum { N = 9 };
    Py_buffer v[N];
    memset(v, 0, sizeof v);
    double alpha_slot;
    if (!PyArg_ParseTuple(args, "y*y*y*dw*w*w*w*w*w*", &v[0], &v[1], &v[2], &alpha_slot, &v[3],
                          &v[4], &v[5], &v[6], &v[7], &v[8]))
        return NULL;
    Arg spec[N] = {{"x", &v[0], 8},      {"written", &v[1], 1}, {"level", &v[2], 8},
                   {"overall", &v[3], 8}, {"count", &v[4], 8},  {"spread", &v[5], 8},
                   {"hour", &v[6], 4},   {"hour_n", &v[7], 4},  {"age", &v[8], 8}};
    Py_ssize_t n;
    if (check(spec, N, &n) < 0) {
        release(v, N);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    size_loop(n, v[0].buf, v[1].buf, v[2].buf, alpha_slot, v[3].buf, v[4].buf, v[5].buf,
              v[6].buf, v[7].buf, v[8].buf);
    Py_END_ALLOW_THREADS
    release(v, N);
    Py_RETURN_NONE;
}

/* One horizon of BudgetBank's per-cell pass (the cells of one horizon, and the running
 * maxima over the horizons of each row). */
SIMD_CLONES
static void budget_loop(Py_ssize_t n, const double *restrict bits, const double *restrict mean,
                        const double *restrict rise_floor, const double *restrict k_floor,
                        const double *restrict allowance_floor,
                        const double *restrict tolerance_floor,
                        const double *restrict margin_seconds,
                        const double *restrict declared_allowance,
                        const double *restrict declared_tolerance,
                        const uint8_t *restrict declared, const uint8_t *restrict following,
                        double seconds, double forget, double rise, double margin,
                        double *restrict envelope, double *restrict follow_excess,
                        double *restrict excess, double *restrict last_step,
                        double *restrict allowance, double *restrict tolerance,
                        double *restrict inv_tolerance, double *restrict projected,
                        double *restrict ratio) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const double b = bits[i];
        const double env = envelope[i];
        double grown = max_d(env * forget, mean[i]);
        const double capped = max_d(env * rise, rise_floor[i]);
        grown = min_d(grown, capped);
        envelope[i] = grown;
        const double k = max_d(margin * grown, k_floor[i]);
        const double followed = follow_excess[i];
        double fe = followed + b;
        fe -= k * seconds;
        follow_excess[i] = max_d(fe, 0.0);
        double allow = max_d(allowance_floor[i], k);
        double tol = max_d(allow * margin_seconds[i], tolerance_floor[i]);
        const uint8_t dec = declared[i] & 1;
        allow = dec ? declared_allowance[i] : allow;
        tol = dec ? declared_tolerance[i] : tol;
        const double inv = 1.0 / tol;
        allowance[i] = allow;
        tolerance[i] = tol;
        inv_tolerance[i] = inv;
        const double held = excess[i];
        const double before = (following[i] & 1) ? followed : held;
        double after = before + b;
        after -= allow * seconds;
        after = max_d(after, 0.0);
        const double step = after - before;
        const double r = after * inv;
        double p = max_d(min_d(step, last_step[i]), 0.0);
        p += after;
        p *= inv;
        excess[i] = after;
        last_step[i] = step;
        /* numpy's max over the horizons: a NaN wins, else the largest. */
        projected[i] = max_d(projected[i], p);
        ratio[i] = max_d(ratio[i], r);
    }
}

/* BudgetBank._follow's envelope and allowances and BudgetBank.update's sums, for every
 * (horizon, row) of the (H, n) arrays, and the largest projected ratio and ratio over the
 * horizons of each row.  budget_step(bits f64[n], mean, rise_floor, k_floor, allowance_floor,
 * tolerance_floor, margin_seconds, declared_allowance, declared_tolerance f64[H,n], declared b,
 * following b, seconds, forget, rise, margin, envelope, follow_excess, excess, last_step
 * f64[H,n] (in place), allowance, tolerance, inv_tolerance f64[H,n], projected, ratio f64[n]
 * (out)) */
static PyObject *budget_step(PyObject *self, PyObject *args) {
    enum { N = 20 };
    Py_buffer v[N];
    memset(v, 0, sizeof v);
    double seconds, forget, rise, margin;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*y*ddddw*w*w*w*w*w*w*w*w*", &v[0], &v[1],
                          &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &seconds,
                          &forget, &rise, &margin, &v[11], &v[12], &v[13], &v[14], &v[15], &v[16],
                          &v[17], &v[18], &v[19]))
        return NULL;
    Arg cells[] = {{"mean", &v[1], 8},
                   {"rise_floor", &v[2], 8},
                   {"k_floor", &v[3], 8},
                   {"allowance_floor", &v[4], 8},
                   {"tolerance_floor", &v[5], 8},
                   {"margin_seconds", &v[6], 8},
                   {"declared_allowance", &v[7], 8},
                   {"declared_tolerance", &v[8], 8},
                   {"declared", &v[9], 1},
                   {"following", &v[10], 1},
                   {"envelope", &v[11], 8},
                   {"follow_excess", &v[12], 8},
                   {"excess", &v[13], 8},
                   {"last_step", &v[14], 8},
                   {"allowance", &v[15], 8},
                   {"tolerance", &v[16], 8},
                   {"inv_tolerance", &v[17], 8}};
    Arg rows[] = {{"bits", &v[0], 8}, {"projected", &v[18], 8}, {"ratio", &v[19], 8}};
    Py_ssize_t n, cellcount;
    if (check(rows, 3, &n) < 0 || check(cells, 17, &cellcount) < 0 ||
        (n ? cellcount % n : cellcount) != 0) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%zd cells are not whole horizons of %zd rows",
                         cellcount, n);
        release(v, N);
        return NULL;
    }
    const Py_ssize_t horizons = n ? cellcount / n : 0;
    const double *bits = v[0].buf, *mean = v[1].buf, *rise_floor = v[2].buf, *k_floor = v[3].buf,
                 *allowance_floor = v[4].buf, *tolerance_floor = v[5].buf,
                 *margin_seconds = v[6].buf, *declared_allowance = v[7].buf,
                 *declared_tolerance = v[8].buf;
    const uint8_t *declared = v[9].buf, *following = v[10].buf;
    double *envelope = v[11].buf, *follow_excess = v[12].buf, *excess = v[13].buf,
           *last_step = v[14].buf, *allowance = v[15].buf, *tolerance = v[16].buf,
           *inv_tolerance = v[17].buf, *projected = v[18].buf, *ratio = v[19].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) projected[i] = ratio[i] = -INFINITY;
    for (Py_ssize_t h = 0; h < horizons; h++) {
        const Py_ssize_t c = h * n;
        budget_loop(n, bits, mean + c, rise_floor + c, k_floor + c, allowance_floor + c,
                    tolerance_floor + c, margin_seconds + c, declared_allowance + c,
                    declared_tolerance + c, declared + c, following + c, seconds, forget, rise,
                    margin, envelope + c, follow_excess + c, excess + c, last_step + c,
                    allowance + c, tolerance + c, inv_tolerance + c, projected, ratio);
    }
    Py_END_ALLOW_THREADS
    release(v, N);
    Py_RETURN_NONE;
}

/* One profile slot of SeasonalBaseline._learn_slot, for one row. */
static inline void learn_slot(float *restrict prof, uint16_t *restrict counts, float y,
                              float slot_ticks, float memory_alpha, float below, float rise,
                              uint8_t settled) {
    const uint16_t c = *counts;
    const float n = (float)c;
    float a = max_f(1.0f / (n + 1.0f), memory_alpha);
    const float p0 = *prof;
    const float err = y - p0;
    a *= err > 0 ? 1.0f : below;
    a *= err;
    const float delta = n >= slot_ticks ? min_f(a, rise) : a;
    *prof = p0 + (settled ? delta : 0.0f);
    *counts = c + (uint16_t)(settled & (c < 65535));
}

/* SeasonalBaseline.learn's per-row part after the log-rate ``y``: the spreads, the recent
 * level and the current daily and weekly slots. */
SIMD_CLONES
static void seasonal_loop(Py_ssize_t n, const float *restrict y, const double *restrict pred_y,
                          const uint8_t *restrict ready, const uint8_t *restrict settled,
                          int64_t *restrict count, const float *restrict alpha,
                          float *restrict meanad, float *restrict mad, float *restrict recent,
                          const float *restrict rise_recent, float *restrict day,
                          uint16_t *restrict day_n, const float *restrict rise_day,
                          float day_ticks, float day_alpha, float *restrict week,
                          uint16_t *restrict week_n, const float *restrict rise_week,
                          float week_ticks, float week_alpha, float below) {
    const float meanad_to_sd = (float)1.2533, spread_min = 0.01f;
    for (Py_ssize_t i = 0; i < n; i++) {
        const float yi = y[i];
        const float n1 = (float)(count[i] + 1);
        const float resid = __builtin_fabsf(yi - (float)pred_y[i]);
        const float a = max_f(1.0f / n1, alpha[i]);
        float cap = max_f(meanad_to_sd * meanad[i], spread_min);
        cap *= 4.0f;
        cap += 1.0f;
        meanad[i] += a * (min_f(resid, cap) - meanad[i]);
        float step = max_f(0.02f, 2.0f / n1);
        const float m0 = mad[i];
        step *= max_f(m0, 0.05f);
        const float m1 = m0 + (resid > m0 ? step : -step);
        mad[i] = max_f(m1, 0.0f);
        const float delta = a * (yi - recent[i]);
        const float capped = min_f(delta, rise_recent[i]);
        recent[i] += (ready[i] & 1) ? capped : delta;
        const uint8_t s = settled[i] & 1;
        learn_slot(day + i, day_n + i, yi, day_ticks, day_alpha, below, rise_day[i], s);
        learn_slot(week + i, week_n + i, yi, week_ticks, week_alpha, below, rise_week[i], s);
        count[i] += 1;
    }
}

/* seasonal_learn(y f32, pred_y f64, ready b, settled b, count i64, alpha f32, meanad f32,
 *                mad f32, recent f32, rise_recent f32, day f32, day_n u16, rise_day f32,
 *                day_ticks, day_alpha, week f32, week_n u16, rise_week f32, week_ticks,
 *                week_alpha, below); day/day_n/week/week_n: the current slots' rows; below:
 *                the expectile's weight of a residual below the slot's level. */
static PyObject *seasonal_learn(PyObject *self, PyObject *args) {
    enum { N = 16 };
    Py_buffer v[N];
    memset(v, 0, sizeof v);
    float day_ticks, day_alpha, week_ticks, week_alpha, below;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*y*w*w*w*y*w*w*y*ffw*w*y*fff", &v[0], &v[1], &v[2],
                          &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12],
                          &day_ticks, &day_alpha, &v[13], &v[14], &v[15], &week_ticks,
                          &week_alpha, &below))
        return NULL;
    Arg spec[N] = {{"y", &v[0], 4},          {"pred_y", &v[1], 8},    {"ready", &v[2], 1},
                   {"settled", &v[3], 1},    {"count", &v[4], 8},     {"alpha", &v[5], 4},
                   {"meanad", &v[6], 4},     {"mad", &v[7], 4},       {"recent", &v[8], 4},
                   {"rise_recent", &v[9], 4}, {"day", &v[10], 4},     {"day_n", &v[11], 2},
                   {"rise_day", &v[12], 4},  {"week", &v[13], 4},     {"week_n", &v[14], 2},
                   {"rise_week", &v[15], 4}};
    Py_ssize_t n;
    if (check(spec, N, &n) < 0) {
        release(v, N);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    seasonal_loop(n, v[0].buf, v[1].buf, v[2].buf, v[3].buf, v[4].buf, v[5].buf, v[6].buf,
                  v[7].buf, v[8].buf, v[9].buf, v[10].buf, v[11].buf, v[12].buf, day_ticks,
                  day_alpha, v[13].buf, v[14].buf, v[15].buf, week_ticks, week_alpha, below);
    Py_END_ALLOW_THREADS
    release(v, N);
    Py_RETURN_NONE;
}

/* SeasonalBaseline.predict's per-row part: the seasonal level (the highest ready daily slot
 * within reach, shifted to the weekday, or the weekly hour), else the recent level; and the
 * spread.  ``day``/``day_n`` are whole (96, n) profiles; ``week``/``week_n`` the hour's row. */
#define REACH_MAX 48 /* slots on either side: half a day, the most seasonal_window means */
#define HOUR_SLOTS_MAX 8

SIMD_CLONES
static void predict_loop(Py_ssize_t n, const float *const *restrict near,
                         const uint16_t *const *restrict near_n, const int *restrict near_off,
                         int near_count, const float *const *restrict hour,
                         const uint16_t *const *restrict hour_n, int hour_count,
                         const float *restrict week, const uint16_t *restrict week_n,
                         const float *restrict recent, const float *restrict mad,
                         const float *restrict meanad, const uint8_t *restrict seasonal,
                         const int64_t *restrict reach, const float *restrict dip_max,
                         double need_d, double need_w, float mad_eps, double spread_min,
                         double *restrict pred_y, double *restrict spread) {
    const float mad_to_sd = (float)1.4826, meanad_to_sd = (float)1.2533;
    for (Py_ssize_t i = 0; i < n; i++) {
        float seas = -INFINITY;
        for (int k = 0; k < near_count; k++) {
            const uint8_t ok = ((double)near_n[k][i] >= need_d) & (reach[i] >= near_off[k]);
            const float d = ok ? near[k][i] : -INFINITY;
            seas = seas >= d ? seas : d;
        }
        /* The weekday shift (SeasonalBaseline._weekday_shift). */
        const uint8_t week_ok = (double)week_n[i] >= need_w;
        int64_t count = 0;
        float mean = 0.0f;
        for (int k = 0; k < hour_count; k++) {
            const uint8_t ready = (double)hour_n[k][i] >= need_d;
            count += ready;
            const float v = ready ? hour[k][i] : 0.0f;
            mean = k ? mean + v : v;
        }
        mean = (float)((double)mean / (double)(count > 1 ? count : 1));
        float shift = week[i] - mean;
        shift = shift <= 0.0f ? shift : 0.0f;
        shift = shift >= -dip_max[i] ? shift : -dip_max[i];
        seas += (week_ok & (count > 0)) ? shift : 0.0f;
        const float wk = week_ok ? week[i] : -INFINITY;
        seas = seas >= wk ? seas : wk;
        const uint8_t use = (seasonal[i] & 1) & (__builtin_isfinite(seas) != 0);
        pred_y[i] = (double)(use ? seas : recent[i]);
        const float m = mad[i];
        const float sp = m > mad_eps ? mad_to_sd * m : meanad_to_sd * meanad[i];
        const double spd = (double)sp;
        spread[i] = spd >= spread_min ? spd : spread_min;
    }
}

/* seasonal_predict(day f32[S,n], day_n u16[S,n], week f32, week_n u16, recent f32, mad f32,
 *                  meanad f32, seasonal b, reach i64, dip_max f32, slot, hour_first,
 *                  reach_max, slots_per_hour, need_d, need_w, mad_eps, spread_min,
 *                  pred_y f64 (out), spread f64 (out)) */
static PyObject *seasonal_predict(PyObject *self, PyObject *args) {
    enum { N = 12 };
    Py_buffer v[N];
    memset(v, 0, sizeof v);
    int slot, hour_first, reach_max, slots_per_hour;
    double need_d, need_w, spread_min;
    float mad_eps;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*iiiiddfdw*w*", &v[0], &v[1], &v[2], &v[3],
                          &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &slot, &hour_first,
                          &reach_max, &slots_per_hour, &need_d, &need_w, &mad_eps, &spread_min,
                          &v[10], &v[11]))
        return NULL;
    Arg rows[] = {{"week", &v[2], 4},    {"week_n", &v[3], 2},  {"recent", &v[4], 4},
                  {"mad", &v[5], 4},     {"meanad", &v[6], 4},  {"seasonal", &v[7], 1},
                  {"reach", &v[8], 8},   {"dip_max", &v[9], 4}, {"pred_y", &v[10], 8},
                  {"spread", &v[11], 8}};
    Arg profiles[] = {{"day", &v[0], 4}, {"day_n", &v[1], 2}};
    Py_ssize_t n, cells;
    if (check(rows, 10, &n) < 0 || check(profiles, 2, &cells) < 0) {
        release(v, N);
        return NULL;
    }
    const int day_slots = n ? (int)(cells / n) : 0;
    if ((n && cells % n) || reach_max < 0 || reach_max > REACH_MAX || slot < 0 ||
        slot >= (day_slots ? day_slots : 1) || hour_first < 0 || slots_per_hour < 0 ||
        slots_per_hour > HOUR_SLOTS_MAX || hour_first + slots_per_hour > day_slots) {
        PyErr_SetString(PyExc_ValueError, "profile shape, slot or reach out of range");
        release(v, N);
        return NULL;
    }
    /* The slots every row looks at, in numpy's order: the same for every row. */
    const float *day = v[0].buf;
    const uint16_t *day_n = v[1].buf;
    const float *near[2 * REACH_MAX + 1], *hour[HOUR_SLOTS_MAX];
    const uint16_t *near_n[2 * REACH_MAX + 1], *hour_n[HOUR_SLOTS_MAX];
    int near_off[2 * REACH_MAX + 1], near_count = 0;
    for (int off = -reach_max; off <= reach_max && n; off++) {
        const Py_ssize_t row = ((slot + off) % day_slots + day_slots) % day_slots;
        near[near_count] = day + row * n;
        near_n[near_count] = day_n + row * n;
        near_off[near_count++] = off < 0 ? -off : off;
    }
    for (int k = 0; k < slots_per_hour && n; k++) {
        hour[k] = day + (Py_ssize_t)(hour_first + k) * n;
        hour_n[k] = day_n + (Py_ssize_t)(hour_first + k) * n;
    }
    Py_BEGIN_ALLOW_THREADS
    if (n)
        predict_loop(n, near, near_n, near_off, near_count, hour, hour_n, slots_per_hour,
                     v[2].buf, v[3].buf, v[4].buf, v[5].buf, v[6].buf, v[7].buf, v[8].buf,
                     v[9].buf, need_d, need_w, mad_eps, spread_min, v[10].buf, v[11].buf);
    Py_END_ALLOW_THREADS
    release(v, N);
    Py_RETURN_NONE;
}

/* BeaconBank.update's first look: which active rows wrote a size their ring already holds
 * (exactly, or within ``tolerance`` x size), without the (RING, n) comparison matrix. */
SIMD_CLONES
static void beacon_loop(Py_ssize_t n, Py_ssize_t ring, const float *restrict ring_bytes,
                        const float *restrict size, const uint8_t *restrict active,
                        const float *restrict tolerance, int exact, uint8_t *restrict out) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = 0;
    for (Py_ssize_t k = 0; k < ring; k++) {
        const float *restrict entry = ring_bytes + k * n;
        if (exact) {
            for (Py_ssize_t i = 0; i < n; i++) out[i] |= entry[i] == size[i];
        } else {
            for (Py_ssize_t i = 0; i < n; i++)
                out[i] |= __builtin_fabsf(entry[i] - size[i]) <= tolerance[i] * size[i];
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) out[i] &= active[i] & 1;
}

/* beacon_match(ring_bytes f32[RING,n], size f32, active b, tolerance f32, exact, out b) */
static PyObject *beacon_match(PyObject *self, PyObject *args) {
    enum { N = 5 };
    Py_buffer v[N];
    memset(v, 0, sizeof v);
    int exact;
    if (!PyArg_ParseTuple(args, "y*y*y*y*pw*", &v[0], &v[1], &v[2], &v[3], &exact, &v[4]))
        return NULL;
    Arg rows[] = {{"size", &v[1], 4}, {"active", &v[2], 1}, {"tolerance", &v[3], 4},
                  {"out", &v[4], 1}};
    Arg cells[] = {{"ring_bytes", &v[0], 4}};
    Py_ssize_t n, count;
    if (check(rows, 4, &n) < 0 || check(cells, 1, &count) < 0) {
        release(v, N);
        return NULL;
    }
    if (n && count % n) {
        PyErr_SetString(PyExc_ValueError, "ring_bytes is not whole entries of the rows");
        release(v, N);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (n) beacon_loop(n, count / n, v[0].buf, v[1].buf, v[2].buf, v[3].buf, exact, v[4].buf);
    Py_END_ALLOW_THREADS
    release(v, N);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"tail_step", tail_step, METH_VARARGS, "TailBank.update's per-row pass; returns rows ended."},
    {"size_learn", size_learn, METH_VARARGS, "SizeLevel.learn's per-row pass for one hour."},
    {"budget_step", budget_step, METH_VARARGS, "BudgetBank's per-cell pass of a tick."},
    {"seasonal_predict", seasonal_predict, METH_VARARGS, "SeasonalBaseline.predict's level."},
    {"beacon_match", beacon_match, METH_VARARGS, "Rows whose size their beacon ring holds."},
    {"seasonal_learn", seasonal_learn, METH_VARARGS, "SeasonalBaseline.learn's per-row pass."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fused",
                                    "Fused per-row passes of the detector's tick.", -1, methods};

PyMODINIT_FUNC PyInit__fused(void) { return PyModule_Create(&module); }
