/* One-pass native reader of write-event JSON lines (alarm/backtest.py, parse_events).
 *
 * The regex there (_EVENT_LINE) is the definition of the fast layout: the one capalarm and
 * its benchmarks write, {"ts": N, "surface": "...", "bytes": N[, "events": N][, "kind":
 * "..."][, "contributor": "..."]}.  This file reads that layout and nothing else, and hands
 * the whole chunk back (None) at the first line it cannot read with certainty: a line of
 * another layout, a backslash in a string (json.loads unescapes those), a byte outside
 * printable ASCII (str.splitlines and the UTF-8 decoding decide those), a number too long for
 * its buffer.  Python then reads the chunk as before, so the fast path only ever agrees with
 * the slow one.
 *
 * scan_events(data) -> None, or (lines, errors, subjects, subject, ts, nbytes, events):
 *   subjects: [(kind or None, surface, contributor)] in order of first appearance among the
 *   plausible lines; the columns as bytes of int64 / float64, one item per plausible line.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NUM 64 /* characters of a time stamp (Python's float reads longer: hand back) */

static const double MAX_TS = 1e11;              /* alarm/backtest.py MAX_TS */
static const uint64_t MAX_COUNT = 1ULL << 62; /* alarm/backtest.py MAX_COUNT */

typedef struct {
    const char *s;
    Py_ssize_t n;
} span;

/* A literal at *p (advancing past it), else 0. */
static inline int lit(const char **p, const char *e, const char *text, Py_ssize_t n) {
    if (e - *p < n || memcmp(*p, text, (size_t)n) != 0) return 0;
    *p += n;
    return 1;
}

static inline void opt_space(const char **p, const char *e) {
    if (*p < e && **p == ' ') (*p)++;
}

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

/* "..." without a backslash; the span inside the quotes. */
static int string(const char **p, const char *e, span *out) {
    if (*p >= e || **p != '"') return 0;
    const char *s = *p + 1, *q = s;
    while (q < e && *q != '"') {
        if (*q == '\\') return 0;
        q++;
    }
    if (q >= e) return 0;
    out->s = s;
    out->n = q - s;
    *p = q + 1;
    return 1;
}

/* \d+ */
static int digits(const char **p, const char *e, span *out) {
    const char *q = *p;
    while (q < e && is_digit(*q)) q++;
    if (q == *p) return 0;
    out->s = *p;
    out->n = q - *p;
    *p = q;
    return 1;
}

/* -?\d+(\.\d+)?([eE][-+]?\d+)? as the regex reads it. */
static int number(const char **p, const char *e, span *out) {
    const char *q = *p;
    span d;
    if (q < e && *q == '-') q++;
    if (!digits(&q, e, &d)) return 0;
    if (q < e && *q == '.' && q + 1 < e && is_digit(q[1])) {
        q++;
        digits(&q, e, &d);
    }
    if (q < e && (*q == 'e' || *q == 'E')) {
        const char *r = q + 1;
        if (r < e && (*r == '-' || *r == '+')) r++;
        if (r < e && is_digit(*r)) {
            digits(&r, e, &d);
            q = r;
        }
    }
    out->s = *p;
    out->n = q - *p;
    *p = q;
    return 1;
}

/* A count as int() reads it, or MAX_COUNT + 1 past MAX_COUNT (implausible either way). */
static uint64_t count_value(span d) {
    Py_ssize_t i = 0;
    while (i < d.n - 1 && d.s[i] == '0') i++;
    if (d.n - i > 19) return MAX_COUNT + 1;
    uint64_t v = 0;
    for (; i < d.n; i++) v = v * 10 + (uint64_t)(d.s[i] - '0');
    return v > MAX_COUNT ? MAX_COUNT + 1 : v;
}

/* One line [s, e) (without its newline and the \r before it).  1: read into the fields;
 * 0: not the layout. */
static int read_line(const char *s, const char *e, span *ts, span *surface, span *nbytes,
                     span *events, span *kind, span *contributor, int *has_events,
                     int *has_kind, int *has_contributor) {
    const char *p = s;
    *has_events = *has_kind = *has_contributor = 0;
    if (!lit(&p, e, "{\"ts\":", 6)) return 0;
    opt_space(&p, e);
    if (!number(&p, e, ts)) return 0;
    if (!lit(&p, e, ",", 1)) return 0;
    opt_space(&p, e);
    if (!lit(&p, e, "\"surface\":", 10)) return 0;
    opt_space(&p, e);
    if (!string(&p, e, surface)) return 0;
    if (!lit(&p, e, ",", 1)) return 0;
    opt_space(&p, e);
    if (!lit(&p, e, "\"bytes\":", 8)) return 0;
    opt_space(&p, e);
    if (!digits(&p, e, nbytes)) return 0;
    /* The optional fields in their order; a field whose name matches must parse (the regex
     * has no other way on). */
    static const struct {
        const char *name;
        Py_ssize_t n;
        int is_string;
    } optional[3] = {{"\"events\":", 9, 0}, {"\"kind\":", 7, 1}, {"\"contributor\":", 14, 1}};
    span *value[3] = {events, kind, contributor};
    int *present[3] = {has_events, has_kind, has_contributor};
    for (int k = 0; k < 3; k++) {
        const char *q = p;
        if (!lit(&q, e, ",", 1)) break;
        opt_space(&q, e);
        if (!lit(&q, e, optional[k].name, optional[k].n)) continue;
        opt_space(&q, e);
        if (!(optional[k].is_string ? string(&q, e, value[k]) : digits(&q, e, value[k])))
            return 0;
        *present[k] = 1;
        p = q;
    }
    return lit(&p, e, "}", 1) && p == e;
}

/* Distinct subjects: open addressing over (kind present, kind, surface, contributor). */
typedef struct {
    span kind, surface, contributor;
    int has_kind;
    uint64_t hash;
} subject_key;

typedef struct {
    subject_key *keys;
    Py_ssize_t n, cap;
    Py_ssize_t *slots;
    Py_ssize_t mask;
} subjects;

static uint64_t mix(uint64_t h, const char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return (h ^ (uint64_t)n) * 0x9E3779B97F4A7C15ULL;
}

static int same_span(span a, span b) { return a.n == b.n && memcmp(a.s, b.s, (size_t)a.n) == 0; }

static int subjects_grow(subjects *t) {
    Py_ssize_t cap = t->cap ? t->cap * 2 : 64;
    subject_key *keys = PyMem_Realloc(t->keys, sizeof(subject_key) * (size_t)cap);
    if (!keys) return -1;
    t->keys = keys;
    t->cap = cap;
    Py_ssize_t slots = 2 * cap;
    Py_ssize_t *table = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)slots);
    if (!table) return -1;
    for (Py_ssize_t i = 0; i < slots; i++) table[i] = -1;
    PyMem_Free(t->slots);
    t->slots = table;
    t->mask = slots - 1;
    for (Py_ssize_t id = 0; id < t->n; id++) {
        Py_ssize_t i = (Py_ssize_t)(t->keys[id].hash & (uint64_t)t->mask);
        while (t->slots[i] >= 0) i = (i + 1) & t->mask;
        t->slots[i] = id;
    }
    return 0;
}

/* The subject's index, added if new; -1 if out of memory. */
static Py_ssize_t subject_index(subjects *t, const subject_key *k) {
    if (t->n == t->cap && subjects_grow(t) < 0) return -1;
    Py_ssize_t i = (Py_ssize_t)(k->hash & (uint64_t)t->mask);
    for (;;) {
        Py_ssize_t id = t->slots[i];
        if (id < 0) break;
        const subject_key *o = &t->keys[id];
        if (o->hash == k->hash && o->has_kind == k->has_kind && same_span(o->kind, k->kind) &&
            same_span(o->surface, k->surface) && same_span(o->contributor, k->contributor))
            return id;
        i = (i + 1) & t->mask;
    }
    t->keys[t->n] = *k;
    t->slots[i] = t->n;
    return t->n++;
}

static PyObject *ascii(span s) { return PyUnicode_DecodeASCII(s.s, s.n, "strict"); }

static PyObject *scan_events(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    const char *data = view.buf, *end = data + view.len;
    Py_ssize_t lines = 0, errors = 0, rows = 0, cap = 0;
    int64_t *subject = NULL, *nbytes = NULL, *events = NULL;
    double *ts = NULL;
    subjects table = {0};
    PyObject *result = NULL;
    int fallback = 0;
    for (const char *s = data; s < end;) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        const char *next = nl ? nl + 1 : end;
        lines++;
        if (e > s && e[-1] == '\r') e--;
        /* Printable ASCII only: control bytes split lines for str.splitlines, and the rest
         * is UTF-8 that Python decodes. */
        for (const char *q = s; q < e && !fallback; q++)
            if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e) fallback = 1;
        if (fallback) break;
        if (e == s) {
            if (e != (nl ? nl : end)) { /* a lone \r: splitlines reads it otherwise */
                fallback = 1;
                break;
            }
            s = next;
            continue; /* a blank line */
        }
        span t, surface, b, ev = {0}, kind = {0}, contributor = {0};
        int has_events, has_kind, has_contributor;
        if (!read_line(s, e, &t, &surface, &b, &ev, &kind, &contributor, &has_events, &has_kind,
                       &has_contributor) ||
            t.n >= MAX_NUM) {
            fallback = 1;
            break;
        }
        char num[MAX_NUM];
        memcpy(num, t.s, (size_t)t.n);
        num[t.n] = 0;
        const double when = strtod(num, NULL);
        const uint64_t bytes = count_value(b);
        const uint64_t count = has_events ? count_value(ev) : 1;
        s = next;
        if (!(when >= 0.0 && when < MAX_TS && bytes <= MAX_COUNT && count <= MAX_COUNT)) {
            errors++;
            continue;
        }
        if (rows == cap) {
            cap = cap ? cap * 2 : 4096;
            int64_t *a = PyMem_Realloc(subject, sizeof(int64_t) * (size_t)cap);
            if (a) subject = a;
            int64_t *c = a ? PyMem_Realloc(nbytes, sizeof(int64_t) * (size_t)cap) : NULL;
            if (c) nbytes = c;
            int64_t *d = c ? PyMem_Realloc(events, sizeof(int64_t) * (size_t)cap) : NULL;
            if (d) events = d;
            double *f = d ? PyMem_Realloc(ts, sizeof(double) * (size_t)cap) : NULL;
            if (!f) {
                PyErr_NoMemory();
                goto done;
            }
            ts = f;
        }
        subject_key key = {kind, surface, contributor, has_kind && kind.n > 0, 0};
        if (!key.has_kind) key.kind.n = 0;
        key.hash = mix(mix(mix(key.has_kind, key.kind.s, key.kind.n), surface.s, surface.n),
                       contributor.s, contributor.n);
        const Py_ssize_t id = subject_index(&table, &key);
        if (id < 0) {
            PyErr_NoMemory();
            goto done;
        }
        subject[rows] = id;
        ts[rows] = when;
        nbytes[rows] = (int64_t)bytes;
        events[rows] = (int64_t)count;
        rows++;
    }
    if (fallback) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *subs = PyList_New(table.n);
    if (!subs) goto done;
    for (Py_ssize_t i = 0; i < table.n; i++) {
        const subject_key *k = &table.keys[i];
        PyObject *item = Py_BuildValue("(NNN)", k->has_kind ? ascii(k->kind) : Py_NewRef(Py_None),
                                       ascii(k->surface), ascii(k->contributor));
        if (!item) {
            Py_DECREF(subs);
            goto done;
        }
        PyList_SET_ITEM(subs, i, item);
    }
    /* y# of NULL is None: an empty column is b"". */
    static const char nothing[1] = {0};
#define COLUMN(p) ((p) ? (const char *)(p) : nothing)
    result = Py_BuildValue("(nnNy#y#y#y#)", lines, errors, subs, COLUMN(subject), rows * 8,
                           COLUMN(ts), rows * 8, COLUMN(nbytes), rows * 8, COLUMN(events),
                           rows * 8);
#undef COLUMN
done:
    PyMem_Free(subject);
    PyMem_Free(nbytes);
    PyMem_Free(events);
    PyMem_Free(ts);
    PyMem_Free(table.keys);
    PyMem_Free(table.slots);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_events", scan_events, METH_VARARGS,
     "scan_events(data) -> None (read it in Python) or (lines, errors, subjects, subject, ts, "
     "nbytes, events)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "alarm._eventscan",
                                    "Native reader of write-event JSON lines (backtest.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__eventscan(void) { return PyModule_Create(&module); }
