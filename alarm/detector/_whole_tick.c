/* The detector's whole tick (fused.py, whole_tick.py); the passes it shares are in _fused.c. */
#include "_fused.h"

/* ---------------------------------------------------------------------------------------
 * The whole tick (fused.py, "Tick"): the one numeric definition of the core rules (spike,
 * budget, the aggregates' members statistic), in four calls, so that a tick of a few dozen
 * surfaces costs microseconds.  Its passes keep the order and precision of the numpy code
 * they replaced (the names in the comments below are that code's), and the transcendental
 * steps (log, exp) stay numpy's, between the calls: numpy's SIMD log and exp round
 * differently from libm's, and the figures in docs/benchmarks.md were measured on numpy's.
 *
 *   begin   columns, aggregates' sums, the averaged rates, the seasonal level; the inputs of
 *           numpy's exp (levels) and log (bytes, averaged rates)
 *   rules   the spike judgement, the budgets, the aggregates' suppression and members
 *           statistic, and every alert bank's step: the changes
 *   learn   the tails' incidents, the size level, the input of numpy's log (what the
 *           seasonal level learns)
 *   learn_end  the seasonal level
 *
 * The arrays are the detector's own (and a few buffers of the Python side), held for the
 * object's life: the Python side never replaces one while this holds it (fused.py).
 * --------------------------------------------------------------------------------------- */

enum { LEN_N, LEN_M, LEN_A, LEN_2N, LEN_3N, LEN_HN, LEN_2HN, LEN_24N, LEN_96N, LEN_168N,
       LEN_G, LEN_A1, LEN_KEPT3N, LEN_KEPTA };

/* Every array the tick reads or writes: its name in the dict the Python side passes, its item
 * size and its length. */
#define TICK_FIELDS(X)                                                                          \
    /* buffers of the Python side: the tick's columns, figures and judgement */               \
    X(COL, "col", 8, LEN_3N) X(RATE, "rate", 8, LEN_N) X(EVRATE, "events_rate", 8, LEN_N)     \
    X(CAPRATE, "capacity", 8, LEN_N) X(EXP_IN, "exp_in", 4, LEN_2N)                           \
    X(LOG_BYTES, "log_bytes", 8, LEN_N) X(LOG_RATES, "log_rates", 4, LEN_2N)                  \
    X(LEARN_Y, "learn_y", 4, LEN_N) X(RESID, "residuals", 8, LEN_3N)                          \
    X(JUDGED, "judged", 1, LEN_3N) X(THRESH, "thresholds", 8, LEN_3N)                         \
    X(OVER, "over", 8, LEN_3N) X(BREACH, "breach", 1, LEN_N) X(CLEAR, "clear", 1, LEN_N)      \
    X(SETTLED, "settled", 1, LEN_N) X(SIZE_LEVEL, "size_level", 8, LEN_N)                     \
    X(PRED_Y, "pred_y", 8, LEN_N) X(SPREAD, "spread", 8, LEN_N)                               \
    X(BASE, "baseline", 8, LEN_N) X(PTHR, "level_threshold", 8, LEN_N)                        \
    X(READY, "ready", 1, LEN_N) X(MEAN, "window_mean", 8, LEN_HN)                             \
    X(PROJ, "projected", 8, LEN_N) X(BRATIO, "budget_ratio", 8, LEN_N)                        \
    X(BBREACH, "budget_breach", 1, LEN_N) X(LEARNING, "learning", 1, LEN_N)                   \
    X(REL_PROJ, "relative.projected", 8, LEN_N) X(REL_RATIO, "relative.ratio", 8, LEN_N)      \
    X(T_JUDGED, "tail_judged", 1, LEN_3N)                                                      \
    X(T_BREACH, "tail_breach", 1, LEN_3N) X(T_ENDED, "tail_ended", 1, LEN_3N)                 \
    X(W_JUDGED, "swarm_tail_judged", 1, LEN_A) X(W_BREACH, "swarm_tail_breach", 1, LEN_A)    \
    X(W_ENDED, "swarm_tail_ended", 1, LEN_A) X(SW_BREACH, "swarm_breach", 1, LEN_A)           \
    X(ORDER, "gather_order", 8, LEN_G) X(BOUNDS, "gather_bounds", 8, LEN_A1)                  \
    X(MASK, "mask", 1, LEN_N) X(T_REFIT, "tail_refit", 8, LEN_3N)                              \
    X(W_REFIT, "swarm_tail_refit", 8, LEN_A)                                                  \
    /* the spike rule, the size level and the seasonal level */                                \
    X(RATES, "spike.rates", 8, LEN_2N) X(UNIT, "spike.unit", 8, LEN_N)                        \
    X(S_ENABLED, "spike.enabled", 1, LEN_N) X(S_FLOOR, "spike.floor", 8, LEN_N)               \
    X(ABSOLUTE, "spike.absolute", 8, LEN_N) X(LOG_HYST, "spike.log_hyst", 8, LEN_N)           \
    X(META, "meta_bits", 8, LEN_N) X(SZ_HOUR, "size.hour", 4, LEN_24N)                        \
    X(SZ_HOUR_N, "size.hour_n", 4, LEN_24N) X(SZ_OVERALL, "size.overall", 8, LEN_N)           \
    X(SZ_COUNT, "size.count", 8, LEN_N) X(SZ_SPREAD, "size.spread", 8, LEN_N)                 \
    X(SZ_AGE, "size.age", 8, LEN_N) X(BL_COUNT, "baseline.count", 8, LEN_N)                   \
    X(RECENT, "baseline.recent", 4, LEN_N) X(MAD, "baseline.mad", 4, LEN_N)                   \
    X(MEANAD, "baseline.meanad", 4, LEN_N) X(DAY, "baseline.day", 4, LEN_96N)                 \
    X(DAY_N, "baseline.day_n", 2, LEN_96N) X(WEEK, "baseline.week", 4, LEN_168N)              \
    X(WEEK_N, "baseline.week_n", 2, LEN_168N) X(BL_ENABLED, "baseline.enabled", 1, LEN_N)     \
    X(Z, "baseline.z", 8, LEN_N) X(MIN_RATIO, "baseline.min_ratio", 8, LEN_N)                 \
    X(MAX_RATIO, "baseline.max_ratio", 8, LEN_N) X(BL_FLOOR, "baseline.floor", 8, LEN_N)      \
    X(MIN_TICKS, "baseline.min_ticks", 8, LEN_N) X(SEASONAL, "baseline.seasonal", 1, LEN_N)  \
    X(DIP_MAX, "baseline.dip_max", 4, LEN_N) X(REACH, "baseline.reach", 8, LEN_N)             \
    X(ALPHA32, "baseline.alpha32", 4, LEN_N) X(RISE_RECENT, "baseline.rise_recent32", 4, LEN_N) \
    X(RISE_DAY, "baseline.rise_day", 4, LEN_N) X(RISE_WEEK, "baseline.rise_week", 4, LEN_N)   \
    X(UNIT32, "baseline.unit32", 4, LEN_N)                                                    \
    /* the spike rule's tails, (statistic, row) */                                             \
    X(T_U0, "tail.u0", 4, LEN_3N) X(T_SPREAD, "tail.spread", 4, LEN_3N)                       \
    X(T_SEEN, "tail.seen", 8, LEN_3N) X(T_AGE, "tail.age", 8, LEN_3N)                         \
    X(T_OPEN, "tail.open", 1, LEN_3N) X(T_PEAK, "tail.peak", 4, LEN_3N)                       \
    X(T_QUIET, "tail.quiet", 8, LEN_3N) X(T_ANOM, "tail.anomalous", 1, LEN_3N)                \
    X(T_Z, "tail.z", 8, LEN_3N) X(T_MINS, "tail.min_seconds", 8, LEN_3N)                      \
    X(T_RUN, "tail.run", 8, LEN_3N) X(T_TEACH, "tail.teach_max", 8, LEN_3N)                  \
    X(T_KEPT, "tail.kept", 4, LEN_KEPT3N)                                                     \
    /* the members statistic and its tail, per aggregate */                                    \
    X(SW_SUM, "swarm.sum", 8, LEN_N) X(SW_VAR, "swarm.var", 8, LEN_N)                         \
    X(SW_WRITES, "swarm.writes", 8, LEN_N) X(SW_SCORE, "swarm.score", 8, LEN_A)               \
    X(SW_JUDGED, "swarm.judged", 1, LEN_A) X(SW_ENABLED, "swarm.enabled", 1, LEN_A)           \
    X(SW_LOG_HYST, "swarm.log_hyst", 8, LEN_A) X(W_U0, "swarm.tail.u0", 4, LEN_A)             \
    X(W_SPREAD, "swarm.tail.spread", 4, LEN_A) X(W_SEEN, "swarm.tail.seen", 8, LEN_A)         \
    X(W_AGE, "swarm.tail.age", 8, LEN_A) X(W_OPEN, "swarm.tail.open", 1, LEN_A)               \
    X(W_PEAK, "swarm.tail.peak", 4, LEN_A) X(W_QUIET, "swarm.tail.quiet", 8, LEN_A)           \
    X(W_ANOM, "swarm.tail.anomalous", 1, LEN_A) X(W_Z, "swarm.tail.z", 8, LEN_A)              \
    X(W_MINS, "swarm.tail.min_seconds", 8, LEN_A) X(W_RUN, "swarm.tail.run", 8, LEN_A)        \
    X(W_SIGMA, "swarm.tail.sigma", 8, LEN_A) X(W_TEACH, "swarm.tail.teach_max", 8, LEN_A)     \
    X(W_KEPT, "swarm.tail.kept", 4, LEN_KEPTA)                                                \
    /* the capacity budgets, (horizon, row) */                                                 \
    X(B_EXCESS, "budget.excess", 8, LEN_HN) X(B_LAST, "budget.last_step", 8, LEN_HN)          \
    X(B_FOLLOW, "budget.follow_excess", 8, LEN_HN) X(B_ENV, "budget.envelope", 8, LEN_HN)     \
    X(B_SENV, "budget.settled_envelope", 8, LEN_HN)                                           \
    X(B_WBITS, "budget.window_bits", 8, LEN_2HN) X(B_AGE, "budget.age", 8, LEN_N)             \
    X(B_MISC, "budget.misconfigured", 1, LEN_N)                                               \
    X(B_DALLOW, "budget.declared_allowance", 8, LEN_HN)                                       \
    X(B_DTOL, "budget.declared_tolerance", 8, LEN_HN) X(B_WINDOW, "budget.window", 8, LEN_HN) \
    X(B_DERIVED, "budget.derived", 1, LEN_N) X(B_FALLOW, "budget.floor_allowance", 8, LEN_HN) \
    X(B_FTOL, "budget.floor_tolerance", 8, LEN_HN) X(B_ENABLED, "budget.enabled", 1, LEN_N)   \
    X(B_ALLOW, "budget.allowance", 8, LEN_HN) X(B_TOL, "budget.tolerance", 8, LEN_HN)         \
    X(B_INVTOL, "budget.inv_tolerance", 8, LEN_HN) X(B_FITTED, "budget.fitted", 1, LEN_HN)    \
    X(B_HYST, "budget.hysteresis", 8, LEN_N)                                                  \
    /* the alert banks, in the order of the changes' bank numbers */                           \
    X(A0_STATE, "spike_alerts.state", 1, LEN_N) X(A0_START, "spike_alerts.started_at", 8, LEN_N) \
    X(A0_PEND, "spike_alerts.pending_since", 8, LEN_N)                                        \
    X(A0_CLEAR, "spike_alerts.clear_since", 8, LEN_N) X(A0_HOLD, "spike_alerts.hold", 8, LEN_N) \
    X(A0_RHOLD, "spike_alerts.resolve_hold", 8, LEN_N)                                        \
    X(A1_STATE, "budget_alerts.state", 1, LEN_N)                                              \
    X(A1_START, "budget_alerts.started_at", 8, LEN_N)                                         \
    X(A1_PEND, "budget_alerts.pending_since", 8, LEN_N)                                       \
    X(A1_CLEAR, "budget_alerts.clear_since", 8, LEN_N)                                        \
    X(A1_HOLD, "budget_alerts.hold", 8, LEN_N) X(A1_RHOLD, "budget_alerts.resolve_hold", 8, LEN_N)

#define FIELD_ENUM(id, name, size, len) F_##id,
enum { TICK_FIELDS(FIELD_ENUM) F_COUNT };
#define FIELD_SPEC(id, name, size, len) {name, size, len},
static const struct {
    const char *name;
    Py_ssize_t itemsize;
    int len;
} field_spec[F_COUNT] = {TICK_FIELDS(FIELD_SPEC)};

/* The constants the Python side passes (its modules own them), by name. */
#define TICK_CONSTANTS(X)                                                                       \
    X(size_ready) X(warmup_seconds) X(learning_seconds) X(settled_window) X(envelope_margin)   \
    X(margin_windows) X(forget) X(rise) X(size_alpha_slot) X(slot_ticks_day)                   \
    X(slot_ticks_week) X(reach_max) X(slots_per_hour) X(mad_eps) X(spread_min) X(day_alpha)   \
    X(week_alpha) X(below) X(swarm_decay) X(swarm_huber) X(min_writes)       \
    X(gather) X(alpha_5m) X(alpha_30m) X(tail_days) X(tail_per_day)

#define CONST_MEMBER(name) double name;
typedef struct {
    PyObject_HEAD
    Py_buffer views[F_COUNT];
    void *p[F_COUNT];
    Py_ssize_t n, m, a, h, g;
    PyObject *numpy[4]; /* numpy's exp, log, log, log over exp_in, log_bytes, log_rates, learn_y */
    int day_slot, hour_first, week_slot, hour;
    double *gathered; /* scratch: one aggregate's members' values */
    /* Per aggregate, its first member where its members are consecutive rows in order (the
     * sum then reads them in place, as it would read them gathered), else -1. */
    Py_ssize_t *run_of;
    struct {
        TICK_CONSTANTS(CONST_MEMBER)
    } c;
} TickObject;

#define D(f) ((double *)t->p[F_##f])
#define F(f) ((float *)t->p[F_##f])
#define I64(f) ((int64_t *)t->p[F_##f])
#define B(f) ((uint8_t *)t->p[F_##f])

static void Tick_dealloc(TickObject *t) {
    for (int i = 0; i < F_COUNT; i++)
        if (t->views[i].obj) PyBuffer_Release(&t->views[i]);
    for (int k = 0; k < 4; k++) Py_CLEAR(t->numpy[k]);
    PyMem_Free(t->gathered);
    PyMem_Free(t->run_of);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* Tick(arrays: dict[str, ndarray], constants: dict[str, float], numpy: tuple of four
 *      callables (exp_in's exp, log_bytes', log_rates' and learn_y's logs, in place),
 *      n, m, a, h) */
static int Tick_init(TickObject *t, PyObject *args, PyObject *kwds) {
    PyObject *arrays, *constants, *calls;
    if (!PyArg_ParseTuple(args, "O!O!O!nnnn", &PyDict_Type, &arrays, &PyDict_Type, &constants,
                          &PyTuple_Type, &calls, &t->n, &t->m, &t->a, &t->h))
        return -1;
    if (PyTuple_GET_SIZE(calls) != 4) {
        PyErr_SetString(PyExc_ValueError, "Tick: four numpy calls");
        return -1;
    }
    for (int k = 0; k < 4; k++) {
        PyObject *f = PyTuple_GET_ITEM(calls, k);
        if (!PyCallable_Check(f)) {
            PyErr_SetString(PyExc_TypeError, "Tick: a numpy call is not callable");
            return -1;
        }
        Py_XSETREF(t->numpy[k], Py_NewRef(f));
    }
#define CONST_READ(name)                                                                       \
    {                                                                                          \
        PyObject *v = PyDict_GetItemString(constants, #name);                                  \
        if (!v) {                                                                              \
            PyErr_SetString(PyExc_KeyError, "tick constant " #name);                           \
            return -1;                                                                         \
        }                                                                                      \
        t->c.name = PyFloat_AsDouble(v);                                                       \
        if (PyErr_Occurred()) return -1;                                                       \
    }
    TICK_CONSTANTS(CONST_READ)
    if (t->c.reach_max < 0 || t->c.reach_max > REACH_MAX || t->c.slots_per_hour < 0 ||
        t->c.slots_per_hour > HOUR_SLOTS_MAX || t->c.tail_days < 1 || t->c.tail_per_day < 1) {
        PyErr_SetString(PyExc_ValueError, "reach, slots per hour or the tails' days out of range");
        return -1;
    }
    PyObject *order = PyDict_GetItemString(arrays, "gather_order");
    if (!order) {
        PyErr_SetString(PyExc_KeyError, "gather_order");
        return -1;
    }
    t->g = PyObject_Length(order);
    if (t->g < 0) return -1;
    if (t->n < 0 || t->m < 0 || t->a < 0 || t->m + t->a != t->n || t->h < 1) {
        PyErr_SetString(PyExc_ValueError, "Tick: rows or horizons out of range");
        return -1;
    }
    const Py_ssize_t n = t->n;
    const Py_ssize_t kept_row = (Py_ssize_t)(t->c.tail_days * t->c.tail_per_day);
    const Py_ssize_t lengths[] = {n,        t->m,         t->a,   2 * n,     3 * n,
                                  t->h * n, 2 * t->h * n, 24 * n, 96 * n,    168 * n,
                                  t->g,     t->a + 1,     3 * n * kept_row, t->a * kept_row};
    for (int i = 0; i < F_COUNT; i++) {
        PyObject *obj = PyDict_GetItemString(arrays, field_spec[i].name);
        if (!obj) {
            PyErr_Format(PyExc_KeyError, "tick array %s", field_spec[i].name);
            return -1;
        }
        if (t->views[i].obj) PyBuffer_Release(&t->views[i]);
        if (PyObject_GetBuffer(obj, &t->views[i], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        const Py_ssize_t want = lengths[field_spec[i].len] * field_spec[i].itemsize;
        if (t->views[i].len != want || t->views[i].itemsize != field_spec[i].itemsize) {
            PyErr_Format(PyExc_ValueError, "tick array %s: %zd bytes of %zd, expected %zd of %zd",
                         field_spec[i].name, t->views[i].len, t->views[i].itemsize, want,
                         field_spec[i].itemsize);
            return -1;
        }
        t->p[i] = t->views[i].buf;
    }
    /* Every member index in range, and the bounds in order. */
    const int64_t *ord = I64(ORDER), *bounds = I64(BOUNDS);
    for (Py_ssize_t i = 0; i < t->g; i++)
        if (ord[i] < 0 || ord[i] >= t->m) {
            PyErr_SetString(PyExc_ValueError, "gather_order: a member row out of range");
            return -1;
        }
    for (Py_ssize_t j = 0; j < t->a; j++)
        if (bounds[j] < 0 || bounds[j] > bounds[j + 1] || bounds[j + 1] > t->g) {
            PyErr_SetString(PyExc_ValueError, "gather_bounds out of order");
            return -1;
        }
    PyMem_Free(t->gathered);
    PyMem_Free(t->run_of);
    t->gathered = PyMem_Malloc(sizeof(double) * (size_t)(t->g ? t->g : 1));
    t->run_of = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(t->a ? t->a : 1));
    if (!t->gathered || !t->run_of) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < t->a; j++) {
        Py_ssize_t k = bounds[j];
        while (k < bounds[j + 1] && ord[k] == ord[bounds[j]] + (k - bounds[j])) k++;
        t->run_of[j] = k == bounds[j + 1] && k > bounds[j] ? ord[bounds[j]] : -1;
    }
    return 0;
}

/* One aggregate's sum of ``values`` over its members, as the numpy code sums it: gathered,
 * or in place where the members are a run of rows (a kind's aggregate of a fleet declared in
 * one piece: at 100k members, six gathers a tick were a tenth of it). */
static double aggregate_sum(TickObject *t, const double *values, Py_ssize_t j, int reduceat) {
    const int64_t *ord = I64(ORDER), *bounds = I64(BOUNDS);
    const Py_ssize_t lo = bounds[j], count = bounds[j + 1] - lo;
    const double *members = t->gathered;
    if (t->run_of[j] >= 0)
        members = values + t->run_of[j];
    else
        for (Py_ssize_t k = 0; k < count; k++) t->gathered[k] = values[ord[lo + k]];
    return reduceat ? numpy_reduceat(members, count) : numpy_sum(members, count);
}

/* The tick's columns (members, then aggregates' sums), its rates, the seasonal level and the
 * input of numpy's exp (SeasonalBaseline.predict).  Changes no state: ``begin_rates`` does. */
static void begin_columns(TickObject *t, const double *nbytes, const double *events,
                          const double *carried, double tick) {
    const Py_ssize_t n = t->n, m = t->m, a = t->a;
    const int day_slots = 96;
    double *b = D(COL), *e = b + n, *bits = e + n;
    const double *meta = D(META);
    for (Py_ssize_t i = 0; i < m; i++) {
        b[i] = nbytes[i];
        e[i] = events[i];
        bits[i] = 8.0 * carried[i] + meta[i] * events[i];
    }
    const int reduceat = t->c.gather != 0.0;
    for (Py_ssize_t j = 0; j < a; j++) {
        b[m + j] = aggregate_sum(t, b, j, reduceat);
        e[m + j] = aggregate_sum(t, e, j, reduceat);
        bits[m + j] = aggregate_sum(t, bits, j, reduceat);
    }
    double *rate = D(RATE), *evrate = D(EVRATE), *caprate = D(CAPRATE);
    for (Py_ssize_t i = 0; i < n; i++) {
        rate[i] = b[i] / tick;
        evrate[i] = e[i] / tick;
        caprate[i] = bits[i] / tick;
    }
    const float *day = F(DAY);
    const uint16_t *day_n = (const uint16_t *)t->p[F_DAY_N];
    const float *near[2 * REACH_MAX + 1], *hourp[HOUR_SLOTS_MAX];
    const uint16_t *near_n[2 * REACH_MAX + 1], *hour_n[HOUR_SLOTS_MAX];
    int near_off[2 * REACH_MAX + 1], near_count = 0;
    const int reach_max = (int)t->c.reach_max, per_hour = (int)t->c.slots_per_hour;
    for (int off = -reach_max; off <= reach_max; off++) {
        const Py_ssize_t row = ((t->day_slot + off) % day_slots + day_slots) % day_slots;
        near[near_count] = day + row * n;
        near_n[near_count] = day_n + row * n;
        near_off[near_count++] = off < 0 ? -off : off;
    }
    for (int k = 0; k < per_hour; k++) {
        hourp[k] = day + (Py_ssize_t)(t->hour_first + k) * n;
        hour_n[k] = day_n + (Py_ssize_t)(t->hour_first + k) * n;
    }
    double *pred_y = D(PRED_Y), *spread = D(SPREAD);
    if (n)
        predict_loop(n, near, near_n, near_off, near_count, hourp, hour_n, per_hour,
                     F(WEEK) + (Py_ssize_t)t->week_slot * n,
                     (const uint16_t *)t->p[F_WEEK_N] + (Py_ssize_t)t->week_slot * n, F(RECENT),
                     F(MAD), F(MEANAD), B(SEASONAL), I64(REACH), F(DIP_MAX), t->c.slot_ticks_day,
                     t->c.slot_ticks_week, (float)t->c.mad_eps, t->c.spread_min, pred_y, spread);
    float *exp_in = F(EXP_IN);
    const double *z = D(Z);
    for (Py_ssize_t i = 0; i < n; i++) {
        exp_in[i] = (float)pred_y[i];
        exp_in[n + i] = (float)(pred_y[i] + z[i] * spread[i]);
    }
}

/* The averaged rates learn the tick (SpikeModel.judge) and the inputs of numpy's logs. */
static void begin_rates(TickObject *t) {
    const Py_ssize_t n = t->n;
    const double *b = D(COL), *rate = D(RATE), *unit = D(UNIT);
    double *rates = D(RATES), *log_bytes = D(LOG_BYTES);
    float *log_rates = F(LOG_RATES);
    const int64_t *szage = I64(SZ_AGE);
    const double alpha[2] = {t->c.alpha_5m, t->c.alpha_30m};
    for (int k = 0; k < 2; k++) {
        double *r = rates + k * n;
        for (Py_ssize_t i = 0; i < n; i++) {
            const double moved = r[i] + alpha[k] * (rate[i] - r[i]);
            r[i] = szage[i] == 0 ? rate[i] : moved;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) log_bytes[i] = max_d(b[i], 1.0);
    for (int k = 0; k < 2; k++)
        for (Py_ssize_t i = 0; i < n; i++) {
            float y = (float)(rates[k * n + i] / unit[i]);
            y += 1.0f;
            log_rates[k * n + i] = y;
        }
}

/* The members' columns of a call (f64[m] each; capacity may be None), checked. */
typedef struct {
    Py_buffer b, e, c;
    int have_capacity;
} member_columns;

static int get_columns(TickObject *t, PyObject *nb, PyObject *ev, PyObject *cap,
                       member_columns *cols) {
    memset(cols, 0, sizeof *cols);
    if (PyObject_GetBuffer(nb, &cols->b, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(ev, &cols->e, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&cols->b);
        return -1;
    }
    cols->have_capacity = cap != Py_None;
    if (cols->have_capacity && PyObject_GetBuffer(cap, &cols->c, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&cols->b);
        PyBuffer_Release(&cols->e);
        return -1;
    }
    const Py_ssize_t want = t->m * 8;
    if (cols->b.len != want || cols->e.len != want || (cols->have_capacity && cols->c.len != want)) {
        PyErr_SetString(PyExc_ValueError, "the members' columns: f64, one item a member");
        PyBuffer_Release(&cols->b);
        PyBuffer_Release(&cols->e);
        if (cols->have_capacity) PyBuffer_Release(&cols->c);
        return -1;
    }
    return 0;
}

static void release_columns(member_columns *cols) {
    PyBuffer_Release(&cols->b);
    PyBuffer_Release(&cols->e);
    if (cols->have_capacity) PyBuffer_Release(&cols->c);
}

static int set_slots(TickObject *t, int day_slot, int hour_first, int week_slot, int hour) {
    if (day_slot < 0 || day_slot >= 96 || hour_first < 0 ||
        hour_first + (int)t->c.slots_per_hour > 96 || week_slot < 0 || week_slot >= 168 ||
        hour < 0 || hour >= 24) {
        PyErr_SetString(PyExc_ValueError, "slots out of range");
        return -1;
    }
    t->day_slot = day_slot;
    t->hour_first = hour_first;
    t->week_slot = week_slot;
    t->hour = hour;
    return 0;
}

/* begin(nbytes, events, capacity or None (f64[m] each), tick, start, day_slot, hour_first,
 *       week_slot, hour): the tick's columns, rates and seasonal level; numpy's exp and logs
 *       take exp_in, log_bytes and log_rates next. */
static PyObject *Tick_begin(TickObject *t, PyObject *args) {
    PyObject *nb, *ev, *cap;
    double tick, start;
    int day_slot, hour_first, week_slot, hour;
    if (!PyArg_ParseTuple(args, "OOOddiiii", &nb, &ev, &cap, &tick, &start, &day_slot,
                          &hour_first, &week_slot, &hour))
        return NULL;
    (void)start;
    if (set_slots(t, day_slot, hour_first, week_slot, hour) < 0) return NULL;
    member_columns cols;
    if (get_columns(t, nb, ev, cap, &cols) < 0) return NULL;
    begin_columns(t, cols.b.buf, cols.e.buf, cols.have_capacity ? cols.c.buf : cols.b.buf, tick);
    release_columns(&cols);
    begin_rates(t);
    Py_RETURN_NONE;
}

/* AlertBank.step for one bank; appends (bank, row, previous, new) to ``out``. */
static int alert_step(double now, double tick, Py_ssize_t n, const uint8_t *breached,
                      const uint8_t *clear, int8_t *state, double *started_at,
                      double *pending_since, double *clear_since, const double *hold,
                      const double *resolve_hold, int bank, PyObject *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const int8_t st = state[i];
        const uint8_t br = breached[i] & 1;
        if (!br && st == 0) continue;
        const uint8_t cl = (clear[i] & 1) & (br ^ 1);
        int8_t next = st;
        const uint8_t start = (st == 0) & br;
        if (start) {
            pending_since[i] = now - tick;
            started_at[i] = now - tick;
        }
        const uint8_t held = now - pending_since[i] >= hold[i];
        if (start) next = held ? 2 : 1;
        if (st == 1) {
            if (!br) next = 0;
            else if (held) next = 2;
        }
        uint8_t resolved = 0;
        if (st == 2) {
            double cs = clear_since[i];
            if (cl && isnan(cs)) cs = now - tick;
            if (!cl) cs = NAN;
            resolved = cl && now - cs >= resolve_hold[i];
            if (resolved) {
                cs = NAN;
                next = 0;
            }
            clear_since[i] = cs;
        }
        state[i] = next;
        if (next != st || resolved) {
            PyObject *item = Py_BuildValue("(inii)", bank, i, (int)st, resolved ? 3 : (int)next);
            if (!item || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                return -1;
            }
            Py_DECREF(item);
        }
    }
    return 0;
}

/* The capacity budgets (BudgetBank.update: the windows' means, rows that stop learning,
 * each cell's mode, then budget_loop per horizon). */
static void budgets(TickObject *t, double seconds) {
    const Py_ssize_t n = t->n, hn = t->h * n;
    const double *bits = D(COL) + 2 * n;
    double *age = D(B_AGE), *wb = D(B_WBITS), *senv = D(B_SENV), *mean = D(MEAN);
    uint8_t *learning = B(LEARNING);
    const int64_t *window = I64(B_WINDOW);
    int any_learning = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        learning[i] = age[i] < t->c.learning_seconds;
        any_learning |= learning[i];
        age[i] += seconds;
    }
    /* The windows' means, cell by cell, each horizon's cells in row order.  A cell's phase in
     * its windows needs the row's whole ticks of age and the cell's window, two 64-bit
     * divisions and a third of the float's: rows of one age and cells of one window (a fleet
     * declared at once, a kind's default horizons) share them, so they are computed again
     * only where the age or the window differs from the cell before, not once a cell. */
    for (Py_ssize_t h = 0; h < t->h; h++) {
        double last_age = NAN; /* equal to no age: the first cell computes */
        int64_t last_w = 0, off[2] = {0, 0};
        double full[2] = {0, 0}, part[2] = {0, 0}; /* settled's and so_far's divisors */
        for (Py_ssize_t i = 0; i < n; i++) {
            const Py_ssize_t c = h * n + i;
            const int64_t w = window[c];
            if (age[i] != last_age || w != last_w) {
                last_age = age[i];
                last_w = w;
                const int64_t ticks = (int64_t)nearbyint(age[i] / seconds);
                const int64_t phase = ticks % w;
                off[0] = phase;
                off[1] = (phase + w / 2) % w;
                const int64_t fl = (double)w * seconds >= t->c.settled_window ? w - w / 2 : 1;
                for (int k = 0; k < 2; k++) {
                    const int64_t held = off[k] == 0 ? w : off[k];
                    full[k] = (double)(held >= fl ? held : fl) * seconds;
                    part[k] = (double)held * seconds;
                }
            }
            /* The tick's bits join both windows, which start again after a closing one. */
            const double b0 = wb[c] + bits[i], b1 = wb[hn + c] + bits[i];
            wb[c] = off[0] == 0 ? 0.0 : b0;
            wb[hn + c] = off[1] == 0 ? 0.0 : b1;
            const double settled = max_d(max_d(-INFINITY, b0 / full[0]), b1 / full[1]);
            if (any_learning) {
                senv[c] = max_d(senv[c] * t->c.forget, settled);
                /* A learning row's mean includes the windows' first ticks. */
                mean[c] = learning[i] ? max_d(max_d(-INFINITY, b0 / part[0]), b1 / part[1])
                                      : settled;
            } else {
                mean[c] = settled;
            }
        }
    }
    /* Rows that stop learning keep the envelope of windows at least half full. */
    double *env = D(B_ENV);
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t now_learning = age[i] < t->c.learning_seconds;
        if (learning[i] && !now_learning) {
            int known = 0;
            for (Py_ssize_t h = 0; h < t->h; h++) known |= senv[h * n + i] > 0;
            if (known)
                for (Py_ssize_t h = 0; h < t->h; h++) env[h * n + i] = senv[h * n + i];
        }
        learning[i] = now_learning;
    }
    /* Each horizon's cells: their modes, envelopes and sums (budget_loop). */
    const uint8_t *misc = B(B_MISC), *derived = B(B_DERIVED), *fitted = B(B_FITTED);
    const double *dallow = D(B_DALLOW), *dtol = D(B_DTOL), *fallow = D(B_FALLOW),
                 *ftol = D(B_FTOL);
    double *proj = D(PROJ), *ratio = D(BRATIO);
    for (Py_ssize_t i = 0; i < n; i++) proj[i] = ratio[i] = -INFINITY;
    for (Py_ssize_t h = 0; h < t->h; h++) {
        const Py_ssize_t c = h * n;
        budget_loop(n, bits, mean + c, learning, misc, derived, fitted + c, dallow + c,
                    dtol + c, fallow + c, ftol + c, window + c, seconds, t->c.forget, t->c.rise,
                    t->c.envelope_margin, t->c.margin_windows, env + c, D(B_FOLLOW) + c,
                    D(B_EXCESS) + c, D(B_LAST) + c, D(B_ALLOW) + c, D(B_TOL) + c,
                    D(B_INVTOL) + c, proj, ratio);
    }
}

/* rules(now, tick) -> [(bank, row, previous, new)]: the spike judgement, the budgets, the
 * aggregates and the two alert banks (0 spike, 1 budget; the beacon and duty rules are
 * registered rules, alarm/detector/rules/). */
static PyObject *do_rules(TickObject *t, double now, double tick) {
    const Py_ssize_t n = t->n, m = t->m, a = t->a;
    const double *b = D(COL), *rate = D(RATE), *rates = D(RATES), *unit = D(UNIT);
    /* The rest of SeasonalBaseline.predict: numpy's exp is in exp_in now. */
    const float *e = F(EXP_IN);
    double *base = D(BASE), *pthr = D(PTHR);
    uint8_t *ready = B(READY);
    const double *max_ratio = D(MAX_RATIO), *min_ratio = D(MIN_RATIO), *bl_floor = D(BL_FLOOR);
    const int64_t *bl_count = I64(BL_COUNT), *min_ticks = I64(MIN_TICKS);
    const uint8_t *bl_enabled = B(BL_ENABLED);
    for (Py_ssize_t i = 0; i < n; i++) {
        const double bs = unit[i] * (double)(e[i] - 1.0f);
        double thr = unit[i] * (double)(e[n + i] - 1.0f);
        thr = min_d(thr, bs * max_ratio[i]);
        thr = max_d(thr, bs * min_ratio[i]);
        thr = max_d(thr, bl_floor[i]);
        ready[i] = bl_count[i] >= min_ticks[i];
        base[i] = bs;
        pthr[i] = (ready[i] & bl_enabled[i] & 1) ? thr : INFINITY;
    }
    /* SpikeModel.judge. */
    double *resid = D(RESID), *thresh = D(THRESH), *over = D(OVER), *size_level = D(SIZE_LEVEL);
    uint8_t *judged = B(JUDGED), *breach = B(BREACH), *clear = B(CLEAR), *settled = B(SETTLED);
    const float *sz_hour = F(SZ_HOUR) + (Py_ssize_t)t->hour * n;
    const uint32_t *sz_hour_n = (const uint32_t *)t->p[F_SZ_HOUR_N] + (Py_ssize_t)t->hour * n;
    const double *overall = D(SZ_OVERALL), *log_bytes = D(LOG_BYTES), *pred_y = D(PRED_Y);
    const float *log_rates = F(LOG_RATES);
    const double *t_age = D(T_AGE), *t_mins = D(T_MINS), *t_z = D(T_Z);
    const uint8_t *s_enabled = B(S_ENABLED);
    const double *s_floor = D(S_FLOOR), *absolute = D(ABSOLUTE), *log_hyst = D(LOG_HYST);
    const int64_t *sz_age = I64(SZ_AGE), *sz_count = I64(SZ_COUNT);
    uint8_t *tj = B(T_JUDGED), *tb = B(T_BREACH);
    for (Py_ssize_t i = 0; i < n; i++) {
        size_level[i] = sz_hour_n[i] >= (uint32_t)t->c.size_ready ? (double)sz_hour[i] : overall[i];
        resid[i] = log_bytes[i] - size_level[i];
        resid[n + i] = (double)log_rates[i] - pred_y[i];
        resid[2 * n + i] = (double)log_rates[n + i] - pred_y[i];
        judged[i] = b[i] > 0.0;
        judged[n + i] = judged[2 * n + i] = 1;
        double worst = -INFINITY;
        for (int s = 0; s < 3; s++) {
            const Py_ssize_t c = s * n + i;
            const double z = t_age[c] >= t_mins[c] ? t_z[c] : INFINITY;
            thresh[c] = (s_enabled[i] & 1) ? z : INFINITY;
            double o = resid[c] - thresh[c];
            if (s == 0 && !judged[i]) o = -INFINITY;
            over[c] = o;
            worst = max_d(worst, o);
        }
        /* The floor is on what the surface writes now: the tick or the five-minute average.
         * The thirty-minute average of a big run stays above a low floor for hours after the
         * run has ended (274 kB/s is above 128 B/s for 3.8 h), and a quiet hour after it
         * would page on a run that is over. */
        const double fast = max_d(rate[i], rates[i]);
        breach[i] = ((worst > 0) & (fast >= s_floor[i])) | (rate[i] > absolute[i]);
        clear[i] = (worst <= log_hyst[i]) & (rate[i] <= absolute[i]);
        settled[i] = (double)sz_age[i] * tick >= t->c.warmup_seconds;
        /* The spike tails' learning masks (SpikeModel.learn), from this judgement, while the
         * row's figures are at hand (nothing below changes them). */
        for (int s = 0; s < 3; s++) {
            const Py_ssize_t c = s * n + i;
            uint8_t jd = judged[c] & settled[i];
            if (s == 0) jd &= sz_count[i] >= (int64_t)t->c.size_ready;
            tj[c] = jd;
            tb[c] = jd & (resid[c] > thresh[c]);
        }
    }
    /* The budgets: the absolute horizons, and the seasonal (relative) budget's projection
     * and ratio, which Python (rules/budget.py's RelativeBank) wrote before this call where
     * it is on (0 where it is off): one budget alert per surface, whichever of them fires. */
    budgets(t, tick);
    const uint8_t *b_enabled = B(B_ENABLED);
    uint8_t *bbreach = B(BBREACH);
    double *bratio = D(BRATIO);
    const double *proj = D(PROJ), *rel_proj = D(REL_PROJ), *rel_ratio = D(REL_RATIO);
    for (Py_ssize_t i = 0; i < n; i++) {
        bbreach[i] = (b_enabled[i] & 1) & ((proj[i] > 1.0) | (rel_proj[i] > 1.0));
        bratio[i] = max_d(bratio[i], rel_ratio[i]);
    }
    /* The aggregates: what a member breached is not the aggregate's, and the members
     * statistic (MemberShift.judge). */
    if (a) {
        const int64_t *ord = I64(ORDER), *bounds = I64(BOUNDS);
        for (Py_ssize_t j = 0; j < a; j++) {
            uint8_t spike_any = 0, budget_any = 0;
            for (Py_ssize_t k = bounds[j]; k < bounds[j + 1]; k++) {
                spike_any |= breach[ord[k]];
                budget_any |= bbreach[ord[k]];
            }
            breach[m + j] &= spike_any ^ 1;
            bbreach[m + j] &= budget_any ^ 1;
        }
        const double d = t->c.swarm_decay, huber = t->c.swarm_huber;
        const double *spread = D(SZ_SPREAD);
        const int64_t *count = I64(SZ_COUNT);
        double *s = D(SW_SUM), *v = D(SW_VAR), *w = D(SW_WRITES);
        for (Py_ssize_t i = 0; i < m; i++) {
            const uint8_t known =
                judged[i] & settled[i] & (count[i] >= (int64_t)t->c.size_ready);
            double u = resid[i] / spread[i];
            u = min_d(u, huber);
            u = max_d(u, -huber);
            u *= (double)known;
            s[i] = s[i] * d + u;
            v[i] = v[i] * (d * d) + (double)known;
            w[i] = w[i] * d + (double)known;
        }
        double *score = D(SW_SCORE);
        uint8_t *sw_judged = B(SW_JUDGED), *sw_breach = B(SW_BREACH);
        const uint8_t *sw_enabled = B(SW_ENABLED);
        const double *w_age = D(W_AGE), *w_mins = D(W_MINS), *w_z = D(W_Z),
                     *w_sigma = D(W_SIGMA), *sw_hyst = D(SW_LOG_HYST);
        uint8_t *w_judged = B(W_JUDGED), *w_breach = B(W_BREACH);
        for (Py_ssize_t j = 0; j < a; j++) {
            const double total_v = aggregate_sum(t, v, j, 0);
            score[j] = total_v > 0 ? aggregate_sum(t, s, j, 0) / sqrt(total_v) : 0.0;
            sw_judged[j] = (aggregate_sum(t, w, j, 0) >= t->c.min_writes) & sw_enabled[j];
            const double z = w_age[j] >= w_mins[j] ? w_z[j] : INFINITY;
            const double thr = sw_judged[j] ? z : INFINITY;
            sw_breach[j] = score[j] > thr;
            const uint8_t sw_clear = (sw_judged[j] ^ 1) | (score[j] <= thr + sw_hyst[j] * w_sigma[j]);
            breach[m + j] |= sw_breach[j];
            clear[m + j] &= sw_clear;
            /* What MemberShift.learn gives the tail (before its day rolls). */
            w_judged[j] = sw_judged[j] & settled[m + j];
            w_breach[j] = w_judged[j] & (score[j] > z);
        }
    }

    PyObject *changes = PyList_New(0);
    if (!changes) return NULL;
    if (alert_step(now, tick, n, breach, clear, (int8_t *)t->p[F_A0_STATE], D(A0_START),
                   D(A0_PEND), D(A0_CLEAR), D(A0_HOLD), D(A0_RHOLD), 0, changes) < 0)
        goto fail;
    uint8_t *budget_clear = B(MASK);
    const double *b_hyst = D(B_HYST);
    for (Py_ssize_t i = 0; i < n; i++) budget_clear[i] = bratio[i] <= b_hyst[i];
    if (alert_step(now, tick, n, bbreach, budget_clear, (int8_t *)t->p[F_A1_STATE], D(A1_START),
                   D(A1_PEND), D(A1_CLEAR), D(A1_HOLD), D(A1_RHOLD), 1, changes) < 0)
        goto fail;
    return changes;
fail:
    Py_DECREF(changes);
    return NULL;
}

static PyObject *Tick_rules(TickObject *t, PyObject *args) {
    double now, tick;
    if (!PyArg_ParseTuple(args, "dd", &now, &tick)) return NULL;
    return do_rules(t, now, tick);
}

/* learn(now, tick) -> (spike tail rows ended, aggregates' tail rows ended): the tails'
 * incidents (the members statistic's, then the spike rule's), the size level, and the input
 * of numpy's log for the seasonal level.  The tails' days have rolled (Python) before. */
static void do_learn(TickObject *t, double tick, Py_ssize_t *spike_ended_out,
                     Py_ssize_t *swarm_ended_out) {
    const Py_ssize_t n = t->n, a = t->a;
    Py_ssize_t swarm_ended = 0, spike_ended = 0;
    if (a) {
        double *age = D(W_AGE);
        for (Py_ssize_t j = 0; j < a; j++) age[j] += tick;
        swarm_ended = tail_loop(a, D(SW_SCORE), B(W_JUDGED), B(W_BREACH), I64(W_RUN), F(W_U0),
                                F(W_SPREAD), I64(W_SEEN), B(W_OPEN), F(W_PEAK), I64(W_QUIET),
                                B(W_ANOM), B(W_ENDED));
    }
    {
        double *age = D(T_AGE);
        for (Py_ssize_t c = 0; c < 3 * n; c++) age[c] += tick;
        spike_ended = tail_loop(3 * n, D(RESID), B(T_JUDGED), B(T_BREACH), I64(T_RUN), F(T_U0),
                                F(T_SPREAD), I64(T_SEEN), B(T_OPEN), F(T_PEAK), I64(T_QUIET),
                                B(T_ANOM), B(T_ENDED));
    }
    /* SizeLevel.learn on what was not a spike; the written mask in a scratch buffer. */
    const double *b = D(COL);
    const uint8_t *breach = B(BREACH);
    uint8_t *written = B(MASK);
    for (Py_ssize_t i = 0; i < n; i++) written[i] = (b[i] > 0.0) & (breach[i] ^ 1);
    size_loop(n, D(LOG_BYTES), written, D(SIZE_LEVEL), t->c.size_alpha_slot, D(SZ_OVERALL),
              I64(SZ_COUNT), D(SZ_SPREAD), F(SZ_HOUR) + (Py_ssize_t)t->hour * n,
              (uint32_t *)t->p[F_SZ_HOUR_N] + (Py_ssize_t)t->hour * n, I64(SZ_AGE));
    /* SeasonalBaseline.learn's input: the slower rate where calm, else the level. */
    const double *rates = D(RATES), *base = D(BASE), *pthr = D(PTHR);
    const float *unit32 = F(UNIT32);
    float *y = F(LEARN_Y);
    for (Py_ssize_t i = 0; i < n; i++) {
        const double r = breach[i] ? base[i] : rates[n + i];
        float v = (float)min_d(r, pthr[i]);
        v /= unit32[i];
        v += 1.0f;
        y[i] = v;
    }
    *spike_ended_out = spike_ended;
    *swarm_ended_out = swarm_ended;
}

static PyObject *Tick_learn(TickObject *t, PyObject *args) {
    double now, tick;
    if (!PyArg_ParseTuple(args, "dd", &now, &tick)) return NULL;
    (void)now;
    Py_ssize_t spike_ended, swarm_ended;
    do_learn(t, tick, &spike_ended, &swarm_ended);
    return Py_BuildValue("(nn)", spike_ended, swarm_ended);
}

/* learn_end(): the seasonal level learns numpy's log of learn_y (seasonal_loop). */
static void do_learn_end(TickObject *t) {
    const Py_ssize_t n = t->n;
    if (n)
        seasonal_loop(n, F(LEARN_Y), D(PRED_Y), B(READY), B(SETTLED), I64(BL_COUNT), F(ALPHA32),
                      F(MEANAD), F(MAD), F(RECENT), F(RISE_RECENT),
                      F(DAY) + (Py_ssize_t)t->day_slot * n,
                      (uint16_t *)t->p[F_DAY_N] + (Py_ssize_t)t->day_slot * n, F(RISE_DAY),
                      (float)t->c.slot_ticks_day, (float)t->c.day_alpha,
                      F(WEEK) + (Py_ssize_t)t->week_slot * n,
                      (uint16_t *)t->p[F_WEEK_N] + (Py_ssize_t)t->week_slot * n, F(RISE_WEEK),
                      (float)t->c.slot_ticks_week, (float)t->c.week_alpha, (float)t->c.below);
}

static PyObject *Tick_learn_end(TickObject *t, PyObject *Py_UNUSED(ignored)) {
    do_learn_end(t);
    Py_RETURN_NONE;
}

/* TailBank.end_incidents for the rows a tail's incidents ended on (its ``ended`` mask); the
 * rows whose kept peaks changed go to ``refit`` (in row order, as np.flatnonzero gives them
 * there).  Returns how many. */
static Py_ssize_t keep_ended(Py_ssize_t rows, const uint8_t *ended, const float *peak,
                             const double *z, const double *teach, uint8_t *anomalous,
                             uint8_t *open, float *kept, int block, int days, int per_day,
                             int64_t *refit) {
    Py_ssize_t count = 0;
    for (Py_ssize_t r = 0; r < rows; r++)
        if ((ended[r] & 1) &&
            keep_peak(r, peak, z, teach, anomalous, open, kept, block, days, per_day))
            refit[count++] = r;
    return count;
}

/* Calls numpy's ufunc ``k`` of the tick (exp or a log over its buffer, in place). */
static int call_numpy(TickObject *t, int k) {
    PyObject *r = PyObject_CallNoArgs(t->numpy[k]);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

/* The learning half of a tick after its rules: the tails' incidents and what they keep, the
 * size level, numpy's log, the seasonal level.  Returns (spike tail rows to refit, the
 * aggregates' tail rows to refit) through ``refits``; -1 on error. */
static int finish_tick(TickObject *t, double tick, int spike_block, int swarm_block,
                       Py_ssize_t refits[2]) {
    Py_ssize_t spike_ended, swarm_ended;
    do_learn(t, tick, &spike_ended, &swarm_ended);
    if (call_numpy(t, 3) < 0) return -1;
    do_learn_end(t);
    const int days = (int)t->c.tail_days, per_day = (int)t->c.tail_per_day;
    refits[0] = refits[1] = 0;
    if (spike_ended)
        refits[0] = keep_ended(3 * t->n, B(T_ENDED), F(T_PEAK), D(T_Z), D(T_TEACH), B(T_ANOM),
                               B(T_OPEN), F(T_KEPT), spike_block, days, per_day, I64(T_REFIT));
    if (swarm_ended)
        refits[1] = keep_ended(t->a, B(W_ENDED), F(W_PEAK), D(W_Z), D(W_TEACH), B(W_ANOM),
                               B(W_OPEN), F(W_KEPT), swarm_block, days, per_day, I64(W_REFIT));
    return 0;
}

/* finish(tick, spike_block, swarm_block) -> (spike refits, aggregates' refits): the learning
 * half of a tick whose rules Python has seen (a tick with alert changes); the blocks are the
 * tails' current day blocks (TailBank: today % DAYS). */
static PyObject *Tick_finish(TickObject *t, PyObject *args) {
    double tick;
    int spike_block, swarm_block;
    if (!PyArg_ParseTuple(args, "dii", &tick, &spike_block, &swarm_block)) return NULL;
    if (spike_block < 0 || spike_block >= (int)t->c.tail_days || swarm_block < 0 ||
        swarm_block >= (int)t->c.tail_days) {
        PyErr_SetString(PyExc_ValueError, "finish: a day block out of range");
        return NULL;
    }
    Py_ssize_t refits[2];
    if (finish_tick(t, tick, spike_block, swarm_block, refits) < 0) return NULL;
    return Py_BuildValue("(nn)", refits[0], refits[1]);
}

/* Python's float floor division and modulo (Objects/floatobject.c, float_divmod), so slots
 * and days are the ones int(x // y) and x % y give there. */
static void py_divmod(double vx, double wx, double *floordiv, double *mod_out) {
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod) {
        if ((wx < 0) != (mod < 0)) {
            mod += wx;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, wx);
    }
    double fd;
    if (div) {
        fd = floor(div);
        if (div - fd > 0.5) fd += 1.0;
    } else {
        fd = copysign(0.0, vx / wx);
    }
    *floordiv = fd;
    *mod_out = mod;
}

static double py_floordiv(double x, double y) {
    double q, r;
    py_divmod(x, y, &q, &r);
    return q;
}

static double py_mod(double x, double y) {
    double q, r;
    py_divmod(x, y, &q, &r);
    return r;
}

/* step(nbytes, events, capacity or None, now, tick, roll_day, roll_day_spike, spike_block,
 *      swarm_block) -> a whole ordinary tick in one call:
 *   0                   not an ordinary tick: nothing was changed, the phases run in Python
 *                       (an alert not at rest, a tick on a day the tails have not rolled to,
 *                       a level past float32's exp);
 *   None                done;
 *   (spike refits, aggregates' refits)  done, and those tails' rows are to be refitted;
 *   [changes]           its rules changed alerts: Python builds them, then calls finish.
 * An ordinary tick is on the day the tails last rolled to (roll_day: now's; roll_day_spike:
 * start + tick's), with every alert bank at rest. */
static PyObject *Tick_step(TickObject *t, PyObject *args) {
    PyObject *nb, *ev, *cap;
    double now, tick;
    long long roll_day, roll_day_spike;
    int spike_block, swarm_block;
    if (!PyArg_ParseTuple(args, "OOOddLLii", &nb, &ev, &cap, &now, &tick, &roll_day,
                          &roll_day_spike, &spike_block, &swarm_block))
        return NULL;
    const Py_ssize_t n = t->n;
    const double start = now - tick;
    if (spike_block < 0 || spike_block >= (int)t->c.tail_days || swarm_block < 0 ||
        swarm_block >= (int)t->c.tail_days)
        return PyLong_FromLong(0);
    if (py_floordiv(now, 86400.0) != (double)roll_day ||
        py_floordiv(start + tick, 86400.0) != (double)roll_day_spike)
        return PyLong_FromLong(0);
    for (int k = 0; k < 2; k++) {
        const int8_t *state = (const int8_t *)t->p[k == 0 ? F_A0_STATE : F_A1_STATE];
        for (Py_ssize_t i = 0; i < n; i++)
            if (state[i]) return PyLong_FromLong(0);
    }
    const double in_day = py_mod(start, 86400.0);
    const int day_slot = (int)py_floordiv(in_day, 900.0);
    const int week_slot = (int)py_floordiv(py_mod(start + 3 * 86400.0, 7 * 86400.0), 3600.0);
    const int hour = (int)py_floordiv(in_day, 3600.0);
    if (set_slots(t, day_slot, (week_slot % 24) * (int)t->c.slots_per_hour, week_slot, hour) < 0)
        return NULL;
    member_columns cols;
    if (get_columns(t, nb, ev, cap, &cols) < 0) return NULL;
    begin_columns(t, cols.b.buf, cols.e.buf, cols.have_capacity ? cols.c.buf : cols.b.buf, tick);
    release_columns(&cols);
    /* float32's exp overflows past 88.72: numpy then warns, and the Python phases run with
     * that warning silenced.  Nothing stateful has happened yet. */
    const float *exp_in = F(EXP_IN);
    for (Py_ssize_t i = 0; i < 2 * n; i++)
        if (!(exp_in[i] <= 88.0f)) return PyLong_FromLong(0);
    begin_rates(t);
    for (int k = 0; k < 3; k++)
        if (call_numpy(t, k) < 0) return NULL;
    PyObject *changes = do_rules(t, now, tick);
    if (!changes || PyList_GET_SIZE(changes)) return changes;
    Py_DECREF(changes);
    Py_ssize_t refits[2];
    if (finish_tick(t, tick, spike_block, swarm_block, refits) < 0) return NULL;
    if (refits[0] || refits[1]) return Py_BuildValue("(nn)", refits[0], refits[1]);
    Py_RETURN_NONE;
}

static PyMethodDef tick_methods[] = {
    {"begin", (PyCFunction)Tick_begin, METH_VARARGS, "Columns, rates, the seasonal level."},
    {"rules", (PyCFunction)Tick_rules, METH_VARARGS, "Judgement, rules and alert steps."},
    {"learn", (PyCFunction)Tick_learn, METH_VARARGS, "Tails, size level, seasonal input."},
    {"learn_end", (PyCFunction)Tick_learn_end, METH_NOARGS, "The seasonal level learns."},
    {"finish", (PyCFunction)Tick_finish, METH_VARARGS, "The learning half of a tick."},
    {"step", (PyCFunction)Tick_step, METH_VARARGS, "An ordinary tick in one call."},
    {NULL, NULL, 0, NULL},
};

INTERNAL PyTypeObject TickType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "alarm.detector._fused.Tick",
    .tp_basicsize = sizeof(TickObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The detector's whole tick over the detector's own arrays (fused.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tick_init,
    .tp_dealloc = (destructor)Tick_dealloc,
    .tp_methods = tick_methods,
};

