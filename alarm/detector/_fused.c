/* The detector's per-row loops: the one numeric definition of the tails' incidents and fit,
 * the size level, the seasonal level's prediction and learning, the budget bank's modes,
 * envelopes and sums (called by the whole tick, _whole_tick.c, through _fused.h), and of the
 * beacon and duty rules (called from rules/beacon.py and rules/duty.py).
 *
 * The loops do their float operations in the order and precision the numpy code they
 * replaced did (float32 where its profiles are float32), built with -ffp-contract=off: a
 * fused multiply-add would round once where numpy rounded twice, and every figure in
 * docs/benchmarks.md was measured on these roundings.
 *
 * Arrays come in through the buffer protocol (no numpy headers at build time); each is
 * checked for its length and item size, and a mismatch is a ValueError, never a stray write.
 */
#include "_fused.h"

/* The longest beacon ring a row may have (rules/beacon.py's RING is 32). */
#define BEACON_RING_MAX 256

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

/* Held(*arrays): a rule's own arrays, their buffers taken once for the object's life (as the
 * whole tick holds the detector's), so that a rule's tick hands over one object, not a
 * dozen buffers: taking and releasing them cost a small fleet's beacon and duty steps more
 * than their loops.  The Python side never replaces an array it handed over (saved state is
 * restored in place), and numpy refuses to resize an array whose buffer is held. */
#define HELD_MAX 16

typedef struct {
    PyObject_HEAD
    Py_ssize_t count;
    Py_buffer views[HELD_MAX];
} HeldObject;

static void Held_release(HeldObject *h) {
    release(h->views, (int)h->count);
    memset(h->views, 0, sizeof h->views);
    h->count = 0;
}

static void Held_dealloc(HeldObject *h) {
    Held_release(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static int Held_init(HeldObject *h, PyObject *args, PyObject *kwds) {
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Held: arrays only");
        return -1;
    }
    const Py_ssize_t count = PyTuple_GET_SIZE(args);
    if (count > HELD_MAX) {
        PyErr_SetString(PyExc_ValueError, "Held: too many arrays");
        return -1;
    }
    Held_release(h);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args, i), &h->views[i],
                               PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            h->count = i;
            Held_release(h);
            return -1;
        }
        h->count = i + 1;
    }
    return 0;
}

static PyTypeObject HeldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "alarm.detector._fused.Held",
    .tp_basicsize = sizeof(HeldObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A rule's arrays, held for the object's life (rules/beacon.py, duty.py, ledger.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Held_init,
    .tp_dealloc = (destructor)Held_dealloc,
};

/* The ``count`` buffers of a Held object, or NULL with a TypeError. */
static Py_buffer *held_views(PyObject *obj, Py_ssize_t count, const char *what) {
    if (!PyObject_TypeCheck(obj, &HeldType) || ((HeldObject *)obj)->count != count) {
        PyErr_Format(PyExc_TypeError, "%s: a Held of %zd arrays", what, count);
        return NULL;
    }
    return ((HeldObject *)obj)->views;
}

/* TailBank.update's per-row part: the SA of u0 and its spread, and the incidents.
 * Returns the rows ended.  Flags are 0/1 bytes (numpy bools) combined with & and |, and each
 * selection computes both sides: see the note above max_f. */
SIMD_CLONES
INTERNAL Py_ssize_t tail_loop(Py_ssize_t n, const double *restrict r, const uint8_t *restrict judged,
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

/* SizeLevel.learn's per-row part, for one hour slot (the hour's row of each slot array). */
SIMD_CLONES
INTERNAL void size_loop(Py_ssize_t n, const double *restrict x, const uint8_t *restrict written,
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

/* One horizon of BudgetBank's per-cell pass (the cells of one horizon, and the running
 * maxima over the horizons of each row): each cell's mode (BudgetBank._build_modes: a
 * declared budget, one that follows the envelope, a horizon that is off or padding), then its
 * envelope and sums.  ``learning``, ``misconfigured`` and ``derived`` are per row, the rest
 * per cell. */
SIMD_CLONES
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
                        double *restrict projected, double *restrict ratio) {
    for (Py_ssize_t i = 0; i < n; i++) {
        /* The cell's mode. */
        const uint8_t mis = misconfigured[i] & 1, lrn = learning[i] & 1;
        const uint8_t der = derived[i] & 1, fit = fitted[i] & 1;
        const uint8_t follows = der | mis;
        const uint8_t following = follows & fit & (lrn ^ 1);
        const double dallow = declared_allowance[i], dtol = declared_tolerance[i];
        const double fallow = floor_allowance[i], ftol = floor_tolerance[i];
        const uint8_t padding = !isfinite(dallow);
        const double kf = mis ? max_d(fallow, dallow) : fallow;
        const double k_floor = padding ? INFINITY : kf;
        const double settled_floor = fallow / margin; /* both sides: a blend, not a branch */
        const double rise_floor = lrn ? INFINITY : settled_floor;
        const uint8_t off = der & (fit ^ 1) & (lrn ^ 1);
        double allowance_floor = off ? INFINITY : dallow;
        allowance_floor = following ? -INFINITY : allowance_floor;
        const double followed_floor = mis ? max_d(ftol, dtol) : ftol;
        const double tolerance_floor = following ? followed_floor : dtol;
        /* A window is at most a week of ticks of 50 ms or more (rules/budget.py, config.py),
         * far below 2^31: through int32, which SSE and AVX2 convert in vectors (not int64). */
        const double margin_seconds = margin_windows * (double)narrow(window[i]) * seconds;
        const uint8_t declared = (follows ^ 1) & (padding ^ 1);
        /* Its envelope and sums. */
        const double b = bits[i];
        const double env = envelope[i];
        double grown = max_d(env * forget, mean[i]);
        const double capped = max_d(env * rise, rise_floor);
        grown = min_d(grown, capped);
        envelope[i] = grown;
        const double k = max_d(margin * grown, k_floor);
        const double followed = follow_excess[i];
        double fe = followed + b;
        fe -= k * seconds;
        follow_excess[i] = max_d(fe, 0.0);
        double allow = max_d(allowance_floor, k);
        double tol = max_d(allow * margin_seconds, tolerance_floor);
        allow = declared ? dallow : allow;
        tol = declared ? dtol : tol;
        const double inv = 1.0 / tol;
        allowance[i] = allow;
        tolerance[i] = tol;
        inv_tolerance[i] = inv;
        const double held = excess[i];
        const double before = following ? followed : held;
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
INTERNAL void seasonal_loop(Py_ssize_t n, const float *restrict y, const double *restrict pred_y,
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

/* SeasonalBaseline.predict's per-row part: the seasonal level (the highest ready daily slot
 * within reach, shifted to the weekday, or the weekly hour), else the recent level; and the
 * spread.  ``day``/``day_n`` are whole (96, n) profiles; ``week``/``week_n`` the hour's row. */

SIMD_CLONES
INTERNAL void predict_loop(Py_ssize_t n, const float *const *restrict near,
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

/* The beacon rule, its one definition (alarm/detector/rules/beacon.py holds its state and
 * settings and says what it means).  Per row that wrote at least min_bytes: the ring entries of
 * the same size (exactly, or within tolerance x size), the period as the gap to the latest
 * of them, and evidence when the ring holds the earlier beats at 2..repeats-1 periods back,
 * each within its jitter (never half a period), and the row did not write in most of the
 * ticks the beacon spans (a stream); then the tick joins the row's ring.
 *
 * beacon_row judges one row; beacon_loop first finds, a block of rows at a time, which rows
 * have an entry of exactly their size at all (most have none: a written tick's byte count
 * seldom recurs), entry by entry over the block, so that each entry's row of the ring is
 * read in order, as one stream, where a row's entries are RING streams 4n bytes apart.  At
 * 100k rows that read was most of the rule's tick (docs/benchmarks.md, "Tick cost"). */
#define BEACON_BLOCK 1024

static inline Py_ssize_t beacon_row(Py_ssize_t i, Py_ssize_t n, Py_ssize_t ring,
                                    int64_t tick_index, float size,
                                    const int64_t *restrict repeats,
                                    const float *restrict tol, int exact,
                                    const double *restrict jitter,
                                    const int64_t *restrict max_period,
                                    int64_t *restrict ring_tick, float *restrict ring_bytes,
                                    uint16_t *restrict pos, int64_t *restrict period_out,
                                    double *restrict size_out, uint8_t *restrict breach) {
    uint8_t same[BEACON_RING_MAX];
    int64_t age[BEACON_RING_MAX], gap[BEACON_RING_MAX];
    Py_ssize_t hit = 0;
    int any = 0;
    for (Py_ssize_t k = 0; k < ring; k++) {
        const float r = ring_bytes[k * n + i];
        same[k] = exact ? r == size : __builtin_fabsf(r - size) <= tol[i] * size;
        any |= same[k];
    }
    if (any) {
        const Py_ssize_t last = (pos[i] + ring - 1) % ring;
        /* The same bytes in the tick before: a steady writer (period 1), not judged. */
        const uint8_t steady = same[last] && tick_index - ring_tick[last * n + i] < 2;
        if (!steady) {
            int64_t period = INT64_MAX;
            for (Py_ssize_t k = 0; k < ring; k++) {
                age[k] = tick_index - ring_tick[k * n + i];
                gap[k] = same[k] ? age[k] : INT64_MAX;
                period = gap[k] < period ? gap[k] : period;
            }
            uint8_t ok = period >= 2 && period <= max_period[i];
            period = ok ? period : 0;
            const double jr = rint(jitter[i] * (double)period);
            const int64_t jit = (int64_t)(jr >= 1.0 ? jr : 1.0);
            const int64_t need = repeats[i];
            /* A row that wrote in most of the ticks the beacon would span (as far as the
             * ring sees) is a stream: a constant-rate stream's tick sums alias into a few
             * sizes that recur at short, regular gaps. */
            int64_t window = (need - 1) * period;
            window = window < ring ? window : ring;
            int64_t within = 0;
            for (Py_ssize_t k = 0; k < ring; k++) within += age[k] <= window;
            ok &= within <= window / 2; /* window >= 0: C's division is Python's here */
            /* Each earlier beat has its own window, never reaching half a period: one
             * write may not stand for two beats. */
            const int64_t half = period >= 1 ? (period - 1) / 2 : -1;
            for (int64_t beat = 2; beat < need && ok; beat++) {
                const int64_t reach = beat * jit < half ? beat * jit : half;
                int found = 0;
                for (Py_ssize_t k = 0; k < ring; k++) {
                    int64_t d = gap[k] - beat * period;
                    d = d < 0 ? -d : d;
                    found |= d <= reach;
                }
                ok &= found;
            }
            if (ok) {
                breach[i] = 1;
                period_out[i] = period;
                size_out[i] = (double)size;
                hit = 1;
            }
        }
    }
    return hit;
}

SIMD_CLONES
static Py_ssize_t beacon_loop(Py_ssize_t n, Py_ssize_t ring, int64_t tick_index,
                              const double *restrict b, const uint8_t *restrict enabled,
                              const int64_t *restrict repeats, const double *restrict min_bytes,
                              const float *restrict tol, int exact, const double *restrict jitter,
                              const int64_t *restrict max_period, int64_t *restrict ring_tick,
                              float *restrict ring_bytes, uint16_t *restrict pos,
                              int64_t *restrict period_out, double *restrict size_out,
                              uint8_t *restrict breach) {
    Py_ssize_t hits = 0;
    uint8_t written[BEACON_BLOCK], matched[BEACON_BLOCK];
    float size[BEACON_BLOCK];
    for (Py_ssize_t lo = 0; lo < n; lo += BEACON_BLOCK) {
        const Py_ssize_t count = n - lo < BEACON_BLOCK ? n - lo : BEACON_BLOCK;
        int any_written = 0;
        for (Py_ssize_t j = 0; j < count; j++) {
            const Py_ssize_t i = lo + j;
            period_out[i] = 0;
            breach[i] = 0;
            written[j] = (enabled[i] & 1) && b[i] >= min_bytes[i];
            any_written |= written[j];
            /* float32: byte counts are exact up to 16 MiB a tick; above that, sizes closer
             * than 1e-7 of each other match, which changes nothing. */
            size[j] = (float)b[i];
            matched[j] = !exact; /* within a tolerance: every row is judged entry by entry */
        }
        if (!any_written) continue;
        if (exact)
            for (Py_ssize_t k = 0; k < ring; k++) {
                const float *entry = ring_bytes + k * n + lo;
                for (Py_ssize_t j = 0; j < count; j++) matched[j] |= entry[j] == size[j];
            }
        for (Py_ssize_t j = 0; j < count; j++) {
            if (!written[j]) continue;
            const Py_ssize_t i = lo + j;
            /* A row with no entry of its size is no beacon this tick: it only joins the ring. */
            if (matched[j])
                hits += beacon_row(i, n, ring, tick_index, size[j], repeats, tol, exact, jitter,
                                   max_period, ring_tick, ring_bytes, pos, period_out, size_out,
                                   breach);
            const Py_ssize_t p = pos[i];
            ring_tick[p * n + i] = tick_index;
            ring_bytes[p * n + i] = size[j];
            pos[i] = (uint16_t)((p + 1) % ring);
        }
    }
    return hits;
}

/* beacon_step(tick_index, nbytes f64, exact, Held(enabled b, repeats i64, min_bytes f64,
 *             tolerance f32, jitter f64, max_period i64, ring_tick i64[RING,n],
 *             ring_bytes f32[RING,n], ring_pos u16, period i64, size f64, breach b))
 *   -> rows that breach */
static PyObject *beacon_step(PyObject *self, PyObject *args) {
    Py_buffer nb;
    memset(&nb, 0, sizeof nb);
    long long tick_index;
    int exact;
    PyObject *held;
    if (!PyArg_ParseTuple(args, "Ly*pO", &tick_index, &nb, &exact, &held)) return NULL;
    Py_buffer *v = held_views(held, 12, "beacon_step");
    if (!v) {
        PyBuffer_Release(&nb);
        return NULL;
    }
    Arg rows[] = {{"nbytes", &nb, 8},       {"enabled", &v[0], 1},   {"repeats", &v[1], 8},
                  {"min_bytes", &v[2], 8},  {"tolerance", &v[3], 4}, {"jitter", &v[4], 8},
                  {"max_period", &v[5], 8}, {"ring_pos", &v[8], 2},  {"period", &v[9], 8},
                  {"size", &v[10], 8},      {"breach", &v[11], 1}};
    Arg cells[] = {{"ring_tick", &v[6], 8}, {"ring_bytes", &v[7], 4}};
    Py_ssize_t n, count;
    if (check(rows, 11, &n) < 0 || check(cells, 2, &count) < 0) {
        PyBuffer_Release(&nb);
        return NULL;
    }
    const Py_ssize_t ring = n ? count / n : 0;
    if (n && (count % n || ring < 1 || ring > BEACON_RING_MAX)) {
        PyErr_SetString(PyExc_ValueError, "the beacon rings are not whole entries of the rows");
        PyBuffer_Release(&nb);
        return NULL;
    }
    Py_ssize_t hits = 0;
    Py_BEGIN_ALLOW_THREADS
    if (n)
        hits = beacon_loop(n, ring, (int64_t)tick_index, nb.buf, v[0].buf, v[1].buf, v[2].buf,
                           v[3].buf, exact, v[4].buf, v[5].buf, v[6].buf, v[7].buf, v[8].buf,
                           v[9].buf, v[10].buf, v[11].buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&nb);
    return PyLong_FromSsize_t(hits);
}

/* The duty rule's tick, its one definition (alarm/detector/rules/duty.py holds its state and
 * the bookkeeping of days and gaps): per row, the count of written ticks decays by ``decay``
 * and counts the tick; the run of ticks written without a pause grows or breaks; the day's
 * highest of each is kept; breach where the rule is on and either passes its threshold, clear
 * where both are below ``clear_fraction`` of theirs. */
static void duty_loop(Py_ssize_t n, const double *restrict decay, const double *restrict b,
                      const uint8_t *restrict enabled, double *restrict count,
                      double *restrict today, double *restrict run, double *restrict run_today,
                      double *restrict history, double *restrict run_history,
                      const double *restrict thr, const double *restrict run_thr, double tick,
                      double cf, uint8_t *restrict breach, uint8_t *restrict clear,
                      Py_ssize_t *breached, Py_ssize_t *not_clear) {
    Py_ssize_t nb = 0, nc = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const double written = (double)(b[i] > 0);
        count[i] = count[i] * decay[i] + written;
        today[i] = today[i] > count[i] ? today[i] : count[i];
        run[i] = (run[i] + 1.0) * written;
        run_today[i] = run_today[i] > run[i] ? run_today[i] : run[i];
        history[i] += tick;
        run_history[i] += tick;
        breach[i] = (enabled[i] & 1) & ((count[i] >= thr[i]) | (run[i] >= run_thr[i]));
        clear[i] = (count[i] < cf * thr[i]) & (run[i] < cf * run_thr[i]);
        nb += breach[i];
        nc += clear[i] ^ 1;
    }
    *breached = nb;
    *not_clear = nc;
}

/* duty_step(decay f64, nbytes f64, tick, clear_fraction, tick_index,
 *           Held(enabled b, count, today, run, run_today, history, run_history f64,
 *                threshold f64, run_threshold f64, breach b, clear b, last_tick i64))
 *   -> (rows that breach, rows not clear); every row's last tick is now ``tick_index``. */
static PyObject *duty_step(PyObject *self, PyObject *args) {
    enum { N = 2 };
    Py_buffer in[N];
    memset(in, 0, sizeof in);
    double tick, cf;
    long long tick_index;
    PyObject *held;
    if (!PyArg_ParseTuple(args, "y*y*ddLO", &in[0], &in[1], &tick, &cf, &tick_index, &held))
        return NULL;
    Py_buffer *v = held_views(held, 12, "duty_step");
    if (!v) {
        release(in, N);
        return NULL;
    }
    Arg rows[] = {{"decay", &in[0], 8},     {"nbytes", &in[1], 8},     {"enabled", &v[0], 1},
                  {"count", &v[1], 8},      {"today", &v[2], 8},       {"run", &v[3], 8},
                  {"run_today", &v[4], 8},  {"history", &v[5], 8},     {"run_history", &v[6], 8},
                  {"threshold", &v[7], 8},  {"run_threshold", &v[8], 8},
                  {"breach", &v[9], 1},     {"clear", &v[10], 1},      {"last_tick", &v[11], 8}};
    Py_ssize_t n, breached = 0, not_clear = 0;
    if (check(rows, 14, &n) < 0) {
        release(in, N);
        return NULL;
    }
    int64_t *last_tick = v[11].buf;
    Py_BEGIN_ALLOW_THREADS
    duty_loop(n, in[0].buf, in[1].buf, v[0].buf, v[1].buf, v[2].buf, v[3].buf, v[4].buf,
              v[5].buf, v[6].buf, v[7].buf, v[8].buf, tick, cf, v[9].buf, v[10].buf, &breached,
              &not_clear);
    for (Py_ssize_t i = 0; i < n; i++) last_tick[i] = (int64_t)tick_index;
    Py_END_ALLOW_THREADS
    release(in, N);
    return Py_BuildValue("(nn)", breached, not_clear);
}

/* The ledger's tick (rules/ledger.py, Ledger.add), its one definition: the tick's bits and
 * events into row ``k`` of the buffers, the run of written ticks it ends (0 where it was not
 * written) and the open block's longest run; where some row was never written (``unborn``),
 * how many of those the tick wrote.  Six numpy passes and a few index arrays a tick were a
 * fifth of a small fleet's tick.
 * ledger_add(k, bits f64[n], events f64[n], never, unborn,
 *            Held(buf_bits f64[ticks, n], buf_events f64[ticks, n], run f64[n],
 *                 block_run f64[n], first_day i64[n]))
 *   -> rows never written (first_day == never) that the tick wrote; -1 where ``unborn`` and
 *      no row is left unwritten; 0 without looking where not ``unborn``. */
static PyObject *ledger_add(PyObject *self, PyObject *args) {
    enum { N = 2 };
    Py_buffer in[N];
    memset(in, 0, sizeof in);
    Py_ssize_t k;
    long long never;
    int unborn;
    PyObject *held;
    if (!PyArg_ParseTuple(args, "ny*y*LpO", &k, &in[0], &in[1], &never, &unborn, &held))
        return NULL;
    Py_buffer *v = held_views(held, 5, "ledger_add");
    if (!v) {
        release(in, N);
        return NULL;
    }
    Arg rows[] = {{"bits", &in[0], 8},       {"events", &in[1], 8}, {"run", &v[2], 8},
                  {"block_run", &v[3], 8}, {"first_day", &v[4], 8}};
    Arg cells[] = {{"buf_bits", &v[0], 8}, {"buf_events", &v[1], 8}};
    Py_ssize_t n, count;
    if (check(rows, 5, &n) < 0 || check(cells, 2, &count) < 0) {
        release(in, N);
        return NULL;
    }
    if (k < 0 || (n && (count % n || k >= count / n)) || (!n && k != 0)) {
        PyErr_SetString(PyExc_ValueError, "ledger_add: the buffers have no row k");
        release(in, N);
        return NULL;
    }
    const double *bits = in[0].buf, *events = in[1].buf;
    double *bb = (double *)v[0].buf + k * n, *be = (double *)v[1].buf + k * n;
    double *run = v[2].buf, *block_run = v[3].buf;
    const int64_t *first_day = v[4].buf;
    Py_ssize_t left = 0, born = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        bb[i] = bits[i];
        be[i] = events[i];
        const double written = (double)(bits[i] > 0);
        run[i] = (run[i] + 1.0) * written; /* run += 1; run *= bits > 0 */
        block_run[i] = max_d(block_run[i], run[i]);
    }
    if (unborn) {
        for (Py_ssize_t i = 0; i < n; i++) {
            const int never_written = first_day[i] == (int64_t)never;
            left += never_written;
            born += never_written & (bits[i] > 0);
        }
    }
    release(in, N);
    return PyLong_FromSsize_t(unborn && !left ? -1 : born);
}

/* The ledger's buffered ticks folded into the open block (Ledger._fold_buffer), as its numpy
 * passes did: each quantity's sum over the ticks in tick order (numpy's sum along the outer
 * axis adds row after row; of a single row, pairwise), added to the block once; the largest tick; the first and last
 * written tick, the silence the first one broke and the last write.  Two dozen numpy passes
 * once a block were a tenth of a small fleet's registered rules.
 * ledger_fold(k, Held(buf_bits f64[ticks, n], buf_events f64[ticks, n], buf_start f64[ticks],
 *             block f64[3, n], block_peak f64[n], last_write f64[n], longest_gap f64[n])) */
static PyObject *ledger_fold(PyObject *self, PyObject *args) {
    Py_ssize_t k;
    PyObject *held;
    if (!PyArg_ParseTuple(args, "nO", &k, &held)) return NULL;
    Py_buffer *v = held_views(held, 7, "ledger_fold");
    if (!v) return NULL;
    Arg rows[] = {{"block_peak", &v[4], 8}, {"last_write", &v[5], 8}, {"longest_gap", &v[6], 8}};
    Arg cells[] = {{"buf_bits", &v[0], 8}, {"buf_events", &v[1], 8}};
    Py_ssize_t n, count;
    if (check(rows, 3, &n) < 0 || check(cells, 2, &count) < 0) return NULL;
    const Py_ssize_t ticks = v[2].len / 8;
    if (v[3].len != 3 * n * 8 || (n && count != ticks * n) || k < 0 || k > ticks) {
        PyErr_SetString(PyExc_ValueError, "ledger_fold: buffers, block or k out of shape");
        return NULL;
    }
    const double *bits = v[0].buf, *events = v[1].buf, *start = v[2].buf;
    double *block = v[3].buf, *peak = v[4].buf, *last_write = v[5].buf, *gap = v[6].buf;
    if (!k) Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < n; i++) {
        double sb = bits[i], se = events[i], top = bits[i];
        if (n == 1) { /* one row: the ticks are contiguous, and numpy sums them pairwise */
            sb = numpy_sum(bits, k);
            se = numpy_sum(events, k);
        }
        int64_t written = bits[i] > 0;
        Py_ssize_t first = bits[i] > 0 ? 0 : -1, last = first;
        for (Py_ssize_t j = 1; j < k; j++) {
            const double b = bits[j * n + i];
            if (n > 1) {
                sb += b;
                se += events[j * n + i];
            }
            top = max_d(top, b);
            if (b > 0) {
                written++;
                if (first < 0) first = j;
                last = j;
            }
        }
        block[i] += sb;
        block[n + i] += se;
        block[2 * n + i] += (double)written;
        peak[i] = max_d(peak[i], top);
        if (first >= 0) {
            const double broken = start[first] - last_write[i];
            gap[i] = max_d(gap[i], isfinite(broken) ? broken : 0.0);
            last_write[i] = start[last];
        } else {
            gap[i] = max_d(gap[i], 0.0);
        }
    }
    Py_RETURN_NONE;
}

/* numpy's pairwise summation (loops_utils.h.src), so that sums agree bit for bit. */
static double pairwise_sum(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double res = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        Py_ssize_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* ndarray.sum() (the identity, then the pairwise sum) and np.add.reduceat (the first item,
 * then the pairwise sum of the rest). */
INTERNAL double numpy_sum(const double *a, Py_ssize_t n) { return 0.0 + pairwise_sum(a, n); }
INTERNAL double numpy_reduceat(const double *a, Py_ssize_t n) {
    return n > 1 ? a[0] + pairwise_sum(a + 1, n - 1) : (n ? a[0] : 0.0);
}

/* TailBank.refit's sorting and summing for a batch of rows: each row's ``top`` (its
 * configured count, or as many peaks as it keeps), the threshold u (its top-th largest peak;
 * 0 where it keeps fewer than min_fit) and the mean excess over u of its top largest, summed
 * as numpy sums the batch's (rows, k) array, k the batch's largest top. */
static void fit_rows(const float *kept, Py_ssize_t cells, const int64_t *rows, Py_ssize_t b,
                     const int64_t *top_cfg, int min_fit, double *u, double *m, int64_t *top_out) {
    Py_ssize_t k_max = 1;
    for (Py_ssize_t k = 0; k < b; k++) {
        const float *row = kept + rows[k] * cells;
        int64_t have = 0;
        for (Py_ssize_t j = 0; j < cells; j++) have += isfinite(row[j]) != 0;
        const int64_t top = top_cfg[rows[k]] < have ? top_cfg[rows[k]] : have;
        top_out[k] = top;
        k_max = top > k_max ? top : k_max;
    }
    double best[4096], excess[4096];
    for (Py_ssize_t k = 0; k < b; k++) {
        const float *row = kept + rows[k] * cells;
        /* The k_max largest, largest first (-inf where the row keeps fewer). */
        Py_ssize_t have = 0;
        for (Py_ssize_t j = 0; j < cells; j++) {
            const double x = (double)row[j];
            Py_ssize_t at = have < k_max ? have : k_max;
            if (at == k_max && !(x > best[k_max - 1])) continue;
            if (at == k_max) at = k_max - 1;
            while (at > 0 && best[at - 1] < x) {
                best[at] = best[at - 1];
                at--;
            }
            best[at] = x;
            if (have < k_max) have++;
        }
        for (Py_ssize_t j = have; j < k_max; j++) best[j] = -INFINITY;
        const int64_t top = top_out[k];
        const int fit = top >= min_fit;
        const double uk = fit ? best[top >= 1 ? top - 1 : 0] : 0.0;
        for (Py_ssize_t j = 0; j < k_max; j++) excess[j] = (fit && j < top) ? best[j] - uk : 0.0;
        u[k] = uk;
        m[k] = numpy_sum(excess, k_max) / (double)(top > 1 ? top : 1);
    }
}

/* TailBank.refit (fit_rows, then TailBank._fit) for a batch of rows: each row's threshold z,
 * xi and sigma, with numpy's log and expm1 (``log_call``, ``expm1_call``: in place over
 * ``log_buf`` and ``expm1_buf``, one item a row of the bank; the batch's values first, the
 * rest neutral) so that the values are numpy's.
 * tail_refit(kept f32[rows, cells], batch i64[b], top i64[rows], min_fit, age f64[rows],
 *            rate_t f64[rows], held_seconds, z f64[rows], xi f64[rows], sigma f64[rows],
 *            log_buf f64[rows], log_call, expm1_buf f64[rows], expm1_call) */
static PyObject *tail_refit(PyObject *self, PyObject *args) {
    enum { N = 10 };
    Py_buffer v[N];
    memset(v, 0, sizeof v);
    int min_fit;
    double held_seconds;
    PyObject *log_call, *expm1_call;
    if (!PyArg_ParseTuple(args, "y*y*y*iy*y*dw*w*w*w*Ow*O", &v[0], &v[1], &v[2], &min_fit, &v[3],
                          &v[4], &held_seconds, &v[5], &v[6], &v[7], &v[8], &log_call, &v[9],
                          &expm1_call))
        return NULL;
    Arg rows_spec[] = {{"top", &v[2], 8},   {"age", &v[3], 8},   {"rate_t", &v[4], 8},
                       {"z", &v[5], 8},     {"xi", &v[6], 8},    {"sigma", &v[7], 8},
                       {"log_buf", &v[8], 8}, {"expm1_buf", &v[9], 8}};
    Arg batch_spec[] = {{"batch", &v[1], 8}};
    Py_ssize_t n, b;
    PyObject *result = NULL;
    double *u = NULL, *m = NULL;
    int64_t *top = NULL;
    if (check(rows_spec, 8, &n) < 0 || check(batch_spec, 1, &b) < 0) goto done;
    const Py_ssize_t cells = n ? v[0].len / 4 / n : 0;
    if ((n && (v[0].len / 4) % n) || cells > 4096) {
        PyErr_SetString(PyExc_ValueError, "kept: not whole rows (or too many peaks a row)");
        goto done;
    }
    const int64_t *batch = v[1].buf, *top_cfg = v[2].buf;
    for (Py_ssize_t k = 0; k < b; k++)
        if (batch[k] < 0 || batch[k] >= n) {
            PyErr_SetString(PyExc_ValueError, "batch: a row out of range");
            goto done;
        }
    u = PyMem_Malloc(sizeof(double) * (size_t)(b ? b : 1));
    m = PyMem_Malloc(sizeof(double) * (size_t)(b ? b : 1));
    top = PyMem_Malloc(sizeof(int64_t) * (size_t)(b ? b : 1));
    if (!u || !m || !top) {
        PyErr_NoMemory();
        goto done;
    }
    fit_rows(v[0].buf, cells, batch, b, top_cfg, min_fit, u, m, top);
    const double *age = v[3].buf, *rate_t = v[4].buf;
    double *z = v[5].buf, *xi = v[6].buf, *sigma = v[7].buf, *lg = v[8].buf, *em = v[9].buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        lg[i] = 1.0;
        em[i] = 0.0;
    }
    for (Py_ssize_t k = 0; k < b; k++) {
        const int64_t r = batch[k];
        const double count = (double)(top[k] > 1 ? top[k] : 1);
        const double span = max_d(min_d(age[r], held_seconds), 1.0);
        const double rate_u = (double)top[k] / span;
        const double ratio = max_d(rate_u, 1e-30) / max_d(rate_t[r], 1e-30);
        lg[k] = max_d(ratio, 1.0);
        if (top[k] >= min_fit) { /* a row too few peaks keeps its last fit (tail.py) */
            xi[r] = 1.0 / count;
            sigma[r] = max_d(m[k], 1e-3);
        }
    }
    PyObject *ok = PyObject_CallNoArgs(log_call);
    if (!ok) goto done;
    Py_DECREF(ok);
    for (Py_ssize_t k = 0; k < b; k++) {
        if (top[k] < min_fit) continue; /* not refitted: its em stays 0 */
        const double x = xi[batch[k]];
        em[k] = (fabs(x) < 1e-6 ? 1.0 : x) * lg[k];
    }
    ok = PyObject_CallNoArgs(expm1_call);
    if (!ok) goto done;
    Py_DECREF(ok);
    for (Py_ssize_t k = 0; k < b; k++) {
        const int64_t r = batch[k];
        if (top[k] < min_fit) continue;
        const double x = xi[r], s = sigma[r];
        const int small = fabs(x) < 1e-6;
        const double curved = s / (small ? 1.0 : x) * em[k];
        z[r] = u[k] + (small ? s * lg[k] : curved);
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(u);
    PyMem_Free(m);
    PyMem_Free(top);
    release(v, N);
    return result;
}

static PyMethodDef methods[] = {
    {"beacon_step", beacon_step, METH_VARARGS, "The beacon rule's tick (rules/beacon.py)."},
    {"duty_step", duty_step, METH_VARARGS, "The duty rule's tick (rules/duty.py)."},
    {"tail_refit", tail_refit, METH_VARARGS, "TailBank.refit for a batch of rows."},
    {"ledger_add", ledger_add, METH_VARARGS, "The ledger's tick (rules/ledger.py)."},
    {"ledger_fold", ledger_fold, METH_VARARGS, "The ledger's buffered ticks into its block."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fused",
                                    "Fused per-row passes of the detector's tick.", -1, methods};

PyMODINIT_FUNC PyInit__fused(void) {
    if (PyType_Ready(&TickType) < 0 || PyType_Ready(&HeldType) < 0) return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (!mod) return NULL;
    Py_INCREF(&TickType);
    if (PyModule_AddObject(mod, "Tick", (PyObject *)&TickType) < 0) {
        Py_DECREF(&TickType);
        Py_DECREF(mod);
        return NULL;
    }
    Py_INCREF(&HeldType);
    if (PyModule_AddObject(mod, "Held", (PyObject *)&HeldType) < 0) {
        Py_DECREF(&HeldType);
        Py_DECREF(mod);
        return NULL;
    }
    /* What the Python side checks at start (fused.py, API): raised with every change of a
     * function's arguments, so that a module built from older sources stops the start with
     * one line, not the first tick with an AttributeError or TypeError. */
    if (PyModule_AddIntConstant(mod, "API", 2) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
