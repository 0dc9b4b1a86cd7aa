/* One-pass native reader of write-event JSON lines (alarm/backtest.py, parse_events).
 *
 * The definition is the Python reader's: each line is read by json.loads (after the chunk is
 * decoded as UTF-8 with replacement and split by str.splitlines), and the event is
 *
 *     float(obj["ts"]), str(obj["surface"]), int(obj.get("bytes", 0)),
 *     int(obj.get("events", 1)), obj.get("kind") (None or str), obj.get("contributor") or ""
 *
 * with an implausible time or count a parse error (alarm/backtest.py, _plausible).  This file
 * reads a JSON object of any key order, with any JSON whitespace, unknown keys skipped
 * (their values validated as json.loads would: nested objects and arrays, strings with
 * escapes, numbers, true/false/null/NaN/Infinity), duplicate keys last-wins as a dict keeps
 * them — as far as it can read the line with certainty.  Any other line is handed back, that
 * line alone, to the Python reader (the `fallback` callable), in its place in the chunk:
 *
 *   - a byte json.loads or str.splitlines reads otherwise: a control byte (other than a tab
 *     between tokens), bytes that are not UTF-8 (Python replaces them), U+0085, U+2028 and
 *     U+2029 (str.splitlines splits the line there), any non-ASCII byte outside a string;
 *   - anything json.loads would reject (an invalid escape, a trailing comma, a bare word...);
 *   - an escape in a key (it may spell a known one), in a surface, kind or contributor (the
 *     Python reader unescapes them), nesting deeper than MAX_DEPTH;
 *   - a known key of another type than this file reads (a string time stamp, a float count,
 *     "surface": null, which str() reads as "None"), a missing ts or surface, a time stamp
 *     longer than MAX_NUM characters.
 *
 * So the result is the Python reader's, line for line (tests/test_eventscan.py).
 *
 * scan_events(data, fallback) -> (lines, errors, handed_back, subjects, subject, ts, nbytes,
 * events)
 *   fallback(line: bytes, with its newline) -> (rows, errors): the Python reader's rows
 *   (ts, kind, surface, contributor, nbytes, events) of that line, plausible ones only;
 *   subjects: [(kind or None, surface, contributor)] in order of first appearance among the
 *   plausible lines; the columns as bytes of int64 / float64, one item per plausible line.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NUM 64   /* characters of a time stamp read here (longer: handed back) */
#define MAX_DEPTH 64 /* nesting of an unknown key's value read here (json.loads reads ~1000) */

static const double MAX_TS = 1e11;              /* alarm/backtest.py MAX_TS */
static const uint64_t MAX_COUNT = 1ULL << 62; /* alarm/backtest.py MAX_COUNT */

typedef struct {
    const char *s;
    Py_ssize_t n;
} span;

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

static inline int is_hex(unsigned char c) {
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

/* JSON whitespace within one line: \n ends the line and a \r inside it splits the line for
 * str.splitlines (handed back); a trailing \r is cut before. */
static inline void ws(const char **p, const char *e) {
    while (*p < e && (**p == ' ' || **p == '\t')) (*p)++;
}

static inline int lit(const char **p, const char *e, const char *text, Py_ssize_t n) {
    if (e - *p < n || memcmp(*p, text, (size_t)n) != 0) return 0;
    *p += n;
    return 1;
}

/* The length of the UTF-8 sequence at q as Python's strict decoder reads it, 0 if it is not
 * one or is a character str.splitlines splits at (U+0085, U+2028, U+2029). */
static Py_ssize_t utf8_char(const unsigned char *q, const unsigned char *end) {
    const unsigned char c = q[0];
    const Py_ssize_t left = end - q;
#define CONT(i) (left > (i) && (q[i] & 0xC0) == 0x80)
    if (c >= 0xC2 && c <= 0xDF) {
        if (!CONT(1) || (c == 0xC2 && q[1] == 0x85)) return 0;
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (!CONT(1) || !CONT(2)) return 0;
        if (c == 0xE0 && q[1] < 0xA0) return 0;  /* overlong */
        if (c == 0xED && q[1] > 0x9F) return 0;  /* a surrogate */
        if (c == 0xE2 && q[1] == 0x80 && (q[2] == 0xA8 || q[2] == 0xA9)) return 0;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (!CONT(1) || !CONT(2) || !CONT(3)) return 0;
        if (c == 0xF0 && q[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && q[1] > 0x8F) return 0; /* past U+10FFFF */
        return 4;
    }
#undef CONT
    return 0;
}

/* A JSON string at *p: 1 and the span inside its quotes (*escaped: it holds an escape); 0 if
 * json.loads would reject it or the line must be handed back (see the top of the file). */
static int string(const char **p, const char *e, span *out, int *escaped) {
    const unsigned char *q = (const unsigned char *)*p, *end = (const unsigned char *)e;
    if (q >= end || *q != '"') return 0;
    const unsigned char *s = ++q;
    int esc = 0;
    for (;;) {
        while (q < end && *q >= 0x20 && *q < 0x80 && *q != '"' && *q != '\\') q++;
        if (q >= end || *q < 0x20) return 0;
        if (*q == '"') break;
        if (*q == '\\') {
            if (end - q < 2) return 0;
            const unsigned char c = q[1];
            if (c == 'u') {
                if (end - q < 6 || !is_hex(q[2]) || !is_hex(q[3]) || !is_hex(q[4]) ||
                    !is_hex(q[5]))
                    return 0;
                q += 6;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                       c == 'r' || c == 't') {
                q += 2;
            } else {
                return 0;
            }
            esc = 1;
            continue;
        }
        const Py_ssize_t k = utf8_char(q, end);
        if (!k) return 0;
        q += k;
    }
    out->s = (const char *)s;
    out->n = (const char *)q - (const char *)s;
    *escaped = esc;
    *p = (const char *)q + 1;
    return 1;
}

/* A JSON number at *p as json's scanner matches it (the byte after it is the caller's to
 * judge): 1, its span, *integer when it has neither fraction nor exponent (json.loads gives
 * an int); 0 if none starts there. */
static int number(const char **p, const char *e, span *out, int *integer) {
    const char *q = *p;
    if (q < e && *q == '-') q++;
    if (q >= e || !is_digit(*q)) return 0;
    if (*q == '0')
        q++;
    else
        while (q < e && is_digit(*q)) q++;
    int whole = 1;
    if (e - q >= 2 && *q == '.' && is_digit(q[1])) {
        q += 2;
        while (q < e && is_digit(*q)) q++;
        whole = 0;
    }
    if (q < e && (*q == 'e' || *q == 'E')) {
        const char *r = q + 1;
        if (r < e && (*r == '-' || *r == '+')) r++;
        if (r < e && is_digit(*r)) {
            while (r < e && is_digit(*r)) r++;
            q = r;
            whole = 0;
        }
    }
    out->s = *p;
    out->n = q - *p;
    *integer = whole;
    *p = q;
    return 1;
}

/* Any JSON value at *p, as json.loads would accept it: 1 past it, 0 otherwise. */
static int skip_value(const char **p, const char *e, int depth) {
    if (*p >= e) return 0;
    span sp;
    int flag;
    switch (**p) {
    case '"':
        return string(p, e, &sp, &flag);
    case '{':
    case '[': {
        const char close = **p == '{' ? '}' : ']';
        if (depth >= MAX_DEPTH) return 0;
        (*p)++;
        ws(p, e);
        if (*p < e && **p == close) {
            (*p)++;
            return 1;
        }
        for (;;) {
            if (close == '}') {
                if (!string(p, e, &sp, &flag)) return 0;
                ws(p, e);
                if (!lit(p, e, ":", 1)) return 0;
                ws(p, e);
            }
            if (!skip_value(p, e, depth + 1)) return 0;
            ws(p, e);
            if (*p >= e) return 0;
            if (**p == close) {
                (*p)++;
                return 1;
            }
            if (**p != ',') return 0;
            (*p)++;
            ws(p, e);
        }
    }
    case 't':
        return lit(p, e, "true", 4);
    case 'f':
        return lit(p, e, "false", 5);
    case 'n':
        return lit(p, e, "null", 4);
    case 'N':
        return lit(p, e, "NaN", 3);
    case 'I':
        return lit(p, e, "Infinity", 8);
    case '-':
        if (lit(p, e, "-Infinity", 9)) return 1;
        return number(p, e, &sp, &flag);
    default:
        return number(p, e, &sp, &flag);
    }
}

/* What the last of a known key's occurrences held (json.loads keeps the last). */
enum { ABSENT = 0, GOT, NUL, OTHER };

typedef struct {
    span ts, surface, nbytes, events, kind, contributor;
    int ts_integer;
    int st_ts, st_surface, st_bytes, st_events, st_kind, st_contributor;
} fields;

enum { K_UNKNOWN, K_TS, K_SURFACE, K_BYTES, K_EVENTS, K_KIND, K_CONTRIBUTOR };

static int key_of(span k) {
    switch (k.n) {
    case 2:
        return memcmp(k.s, "ts", 2) == 0 ? K_TS : K_UNKNOWN;
    case 4:
        return memcmp(k.s, "kind", 4) == 0 ? K_KIND : K_UNKNOWN;
    case 5:
        return memcmp(k.s, "bytes", 5) == 0 ? K_BYTES : K_UNKNOWN;
    case 6:
        return memcmp(k.s, "events", 6) == 0 ? K_EVENTS : K_UNKNOWN;
    case 7:
        return memcmp(k.s, "surface", 7) == 0 ? K_SURFACE : K_UNKNOWN;
    case 11:
        return memcmp(k.s, "contributor", 11) == 0 ? K_CONTRIBUTOR : K_UNKNOWN;
    default:
        return K_UNKNOWN;
    }
}

/* A value this file reads for a number field (an int for counts); OTHER for any other
 * valid value, -1 for none. */
static int number_field(const char **p, const char *e, span *out, int *integer, int counts) {
    const char *q = *p;
    if (number(&q, e, out, integer) && (!counts || *integer)) {
        *p = q;
        return GOT;
    }
    return skip_value(p, e, 1) ? OTHER : -1;
}

/* A string field without escapes; NUL for null where `nullable` (kind, contributor: the same
 * as absent), OTHER for any other valid value, -1 for none. */
static int string_field(const char **p, const char *e, span *out, int nullable) {
    int escaped;
    if (*p < e && **p == '"') {
        if (!string(p, e, out, &escaped)) return -1;
        return escaped ? OTHER : GOT;
    }
    if (nullable && lit(p, e, "null", 4)) return NUL;
    return skip_value(p, e, 1) ? OTHER : -1;
}

/* One line [s, e) without its newline and the \r before it: 1 read into f, 0 blank, -1 to
 * hand back. */
static int read_line(const char *s, const char *e, fields *f) {
    const char *p = s;
    memset(f, 0, sizeof *f);
    ws(&p, e);
    if (p == e) return 0;
    if (*p != '{') return -1;
    p++;
    ws(&p, e);
    if (p < e && *p == '}') {
        p++;
    } else {
        for (;;) {
            span key;
            int escaped, st = -1;
            if (!string(&p, e, &key, &escaped) || escaped) return -1;
            ws(&p, e);
            if (!lit(&p, e, ":", 1)) return -1;
            ws(&p, e);
            switch (key_of(key)) {
            case K_TS:
                st = f->st_ts = number_field(&p, e, &f->ts, &f->ts_integer, 0);
                break;
            case K_BYTES: {
                int integer;
                st = f->st_bytes = number_field(&p, e, &f->nbytes, &integer, 1);
                break;
            }
            case K_EVENTS: {
                int integer;
                st = f->st_events = number_field(&p, e, &f->events, &integer, 1);
                break;
            }
            case K_SURFACE:
                st = f->st_surface = string_field(&p, e, &f->surface, 0);
                break;
            case K_KIND:
                st = f->st_kind = string_field(&p, e, &f->kind, 1);
                break;
            case K_CONTRIBUTOR:
                st = f->st_contributor = string_field(&p, e, &f->contributor, 1);
                break;
            default:
                st = skip_value(&p, e, 1) ? ABSENT : -1;
            }
            if (st < 0) return -1;
            ws(&p, e);
            if (p >= e) return -1;
            if (*p == '}') {
                p++;
                break;
            }
            if (*p != ',') return -1;
            p++;
            ws(&p, e);
        }
    }
    ws(&p, e);
    if (p != e) return -1;
    if (f->st_ts != GOT || f->st_surface != GOT || f->st_bytes == OTHER ||
        f->st_events == OTHER || f->st_kind == OTHER || f->st_contributor == OTHER ||
        f->ts.n >= MAX_NUM)
        return -1;
    return 1;
}

/* A count as int() reads a JSON integer, or MAX_COUNT + 1 where implausible (negative, or
 * past MAX_COUNT). */
static uint64_t count_value(span d) {
    Py_ssize_t i = 0;
    int negative = 0;
    if (d.n && d.s[0] == '-') {
        negative = 1;
        i = 1;
    }
    if (d.n - i > 19) return MAX_COUNT + 1;
    uint64_t v = 0;
    for (; i < d.n; i++) v = v * 10 + (uint64_t)(d.s[i] - '0');
    if (negative && v) return MAX_COUNT + 1; /* -0 is 0 */
    return v > MAX_COUNT ? MAX_COUNT + 1 : v;
}

/* Distinct subjects: open addressing over (kind present, kind, surface, contributor), each
 * as UTF-8 (surrogates as Python's "surrogatepass" writes them). */
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

static void key_hash(subject_key *k) {
    k->hash = mix(mix(mix((uint64_t)k->has_kind, k->kind.s, k->kind.n), k->surface.s,
                      k->surface.n),
                  k->contributor.s, k->contributor.n);
}

static int same_span(span a, span b) {
    return a.n == b.n && (a.n == 0 || memcmp(a.s, b.s, (size_t)a.n) == 0);
}

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

/* The plausible rows: subject index and columns. */
typedef struct {
    Py_ssize_t rows, cap;
    int64_t *subject, *nbytes, *events;
    double *ts;
} columns;

static int add_row(columns *c, subjects *t, const subject_key *key, double ts, int64_t nbytes,
                   int64_t events) {
    if (c->rows == c->cap) {
        Py_ssize_t cap = c->cap ? c->cap * 2 : 4096;
        int64_t *a = PyMem_Realloc(c->subject, sizeof(int64_t) * (size_t)cap);
        if (!a) return -1;
        c->subject = a;
        int64_t *b = PyMem_Realloc(c->nbytes, sizeof(int64_t) * (size_t)cap);
        if (!b) return -1;
        c->nbytes = b;
        int64_t *d = PyMem_Realloc(c->events, sizeof(int64_t) * (size_t)cap);
        if (!d) return -1;
        c->events = d;
        double *f = PyMem_Realloc(c->ts, sizeof(double) * (size_t)cap);
        if (!f) return -1;
        c->ts = f;
        c->cap = cap;
    }
    const Py_ssize_t id = subject_index(t, key);
    if (id < 0) return -1;
    c->subject[c->rows] = id;
    c->ts[c->rows] = ts;
    c->nbytes[c->rows] = nbytes;
    c->events[c->rows] = events;
    c->rows++;
    return 0;
}

/* A str of a fallback row as UTF-8 bytes kept alive in `keep` (the subject table points into
 * them); 0 on error. */
static int utf8_span(PyObject *text, PyObject *keep, span *out) {
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "scan_events: fallback rows hold str names");
        return 0;
    }
    PyObject *b = PyUnicode_AsEncodedString(text, "utf-8", "surrogatepass");
    if (!b) return 0;
    const int ok = PyList_Append(keep, b) == 0;
    Py_DECREF(b);
    if (!ok) return 0;
    out->s = PyBytes_AS_STRING(b);
    out->n = PyBytes_GET_SIZE(b);
    return 1;
}

/* The Python reader's rows of one handed-back line into the table; -1 on error. */
static int fallback_line(PyObject *fallback, const char *s, Py_ssize_t n, PyObject *keep,
                         columns *c, subjects *t, Py_ssize_t *errors) {
    PyObject *got = PyObject_CallFunction(fallback, "y#", s, n);
    if (!got) return -1;
    PyObject *rows;
    Py_ssize_t errs;
    int result = -1;
    if (!PyArg_ParseTuple(got, "O!n;scan_events: fallback returns (rows, errors)", &PyList_Type,
                          &rows, &errs))
        goto out;
    *errors += errs;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        double ts;
        PyObject *kind, *surface, *contributor;
        long long nbytes, events;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(rows, i),
                              "dOOOLL;scan_events: a fallback row is (ts, kind, surface, "
                              "contributor, nbytes, events)",
                              &ts, &kind, &surface, &contributor, &nbytes, &events))
            goto out;
        subject_key key = {{NULL, 0}, {NULL, 0}, {NULL, 0}, kind != Py_None, 0};
        if ((key.has_kind && !utf8_span(kind, keep, &key.kind)) ||
            !utf8_span(surface, keep, &key.surface) ||
            !utf8_span(contributor, keep, &key.contributor))
            goto out;
        key_hash(&key);
        if (add_row(c, t, &key, ts, (int64_t)nbytes, (int64_t)events) < 0) {
            PyErr_NoMemory();
            goto out;
        }
    }
    result = 0;
out:
    Py_DECREF(got);
    return result;
}

static PyObject *decode(span s) { return PyUnicode_DecodeUTF8(s.s, s.n, "surrogatepass"); }

static PyObject *scan_events(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *fallback;
    if (!PyArg_ParseTuple(args, "y*O:scan_events", &view, &fallback)) return NULL;
    const char *data = view.buf, *end = data + view.len;
    Py_ssize_t lines = 0, errors = 0, handed_back = 0;
    columns cols = {0};
    subjects table = {0};
    PyObject *result = NULL;
    PyObject *keep = PyList_New(0);
    if (!keep) goto done;
    for (const char *s = data; s < end;) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        const char *next = nl ? nl + 1 : end;
        lines++;
        if (e > s && e[-1] == '\r') e--;
        fields f;
        const int got = read_line(s, e, &f);
        if (got == 0) { /* blank */
            s = next;
            continue;
        }
        if (got < 0) {
            handed_back++;
            if (fallback_line(fallback, s, next - s, keep, &cols, &table, &errors) < 0)
                goto done;
            s = next;
            continue;
        }
        s = next;
        char num[MAX_NUM];
        memcpy(num, f.ts.s, (size_t)f.ts.n);
        num[f.ts.n] = 0;
        /* float() itself (correctly rounded, whatever the C locale); an int is never -0.0. */
        double when = PyOS_string_to_double(num, NULL, NULL);
        if (when == -1.0 && PyErr_Occurred()) goto done;
        if (f.ts_integer && when == 0.0) when = 0.0;
        const uint64_t bytes = f.st_bytes == GOT ? count_value(f.nbytes) : 0;
        const uint64_t count = f.st_events == GOT ? count_value(f.events) : 1;
        if (!(when >= 0.0 && when < MAX_TS && bytes <= MAX_COUNT && count <= MAX_COUNT)) {
            errors++;
            continue;
        }
        subject_key key = {{NULL, 0}, f.surface, {NULL, 0}, f.st_kind == GOT, 0};
        if (key.has_kind) key.kind = f.kind;
        if (f.st_contributor == GOT) key.contributor = f.contributor;
        key_hash(&key);
        if (add_row(&cols, &table, &key, when, (int64_t)bytes, (int64_t)count) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    PyObject *subs = PyList_New(table.n);
    if (!subs) goto done;
    for (Py_ssize_t i = 0; i < table.n; i++) {
        const subject_key *k = &table.keys[i];
        PyObject *item = Py_BuildValue("(NNN)", k->has_kind ? decode(k->kind) : Py_NewRef(Py_None),
                                       decode(k->surface), decode(k->contributor));
        if (!item) {
            Py_DECREF(subs);
            goto done;
        }
        PyList_SET_ITEM(subs, i, item);
    }
    /* y# of NULL is None: an empty column is b"". */
    static const char nothing[1] = {0};
#define COLUMN(p) ((p) ? (const char *)(p) : nothing)
    const Py_ssize_t rows = cols.rows;
    result = Py_BuildValue("(nnnNy#y#y#y#)", lines, errors, handed_back, subs,
                           COLUMN(cols.subject), rows * 8, COLUMN(cols.ts), rows * 8,
                           COLUMN(cols.nbytes), rows * 8, COLUMN(cols.events), rows * 8);
#undef COLUMN
done:
    Py_XDECREF(keep);
    PyMem_Free(cols.subject);
    PyMem_Free(cols.nbytes);
    PyMem_Free(cols.events);
    PyMem_Free(cols.ts);
    PyMem_Free(table.keys);
    PyMem_Free(table.slots);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_events", scan_events, METH_VARARGS,
     "scan_events(data, fallback) -> (lines, errors, handed_back, subjects, subject, ts, "
     "nbytes, events); fallback(line) -> (rows, errors) reads the lines handed back"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "alarm._eventscan",
                                    "Native reader of write-event JSON lines (backtest.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__eventscan(void) { return PyModule_Create(&module); }
