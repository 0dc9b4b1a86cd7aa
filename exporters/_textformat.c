/* The series lines of one column family of the Prometheus text format (exporters/textformat.py).
 *
 * At 100,000 surfaces a scrape is 2.8 million series; written one f-string and one
 * floatToGoString call at a time that is most of a 10-second scrape timeout.  This writes
 *
 *     series(prefix: bytes, texts: list[str] | None, values: list) -> bytes
 *
 * = for each i: prefix, texts[i] in UTF-8 (a label set's text, made and escaped in Python;
 * nothing when texts is None), " ", value i as prometheus_client's floatToGoString writes it,
 * "\n".  Values are formatted by repr's own routine (PyOS_double_to_string 'r'), then Go's
 * exponent rule for positive values whose repr has more than six digits before the dot.
 * textformat.py checks before each render that this agrees with the installed
 * prometheus_client on a set of probe values, and writes in Python where it does not.
 *
 *     block(name: bytes, labels: list[bytes] | None, values: float64 buffer,
 *           old: bytes | None, offsets: int64 buffer | None, changed: int64 buffer | None)
 *         -> (text: bytes, starts: bytes)
 *
 * = the lines of one block of a family (name, labels[i], " ", value i, "\n"), and where each
 * starts (n + 1 native int64).  With old (the block as last written) and its starts, only the
 * lines listed in changed (ascending) are written again; the runs between them are copied.
 * The scrape cache (textformat.ScrapeCache) keeps blocks between scrapes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <string.h>

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
} Out;

static int grow(Out *o, Py_ssize_t extra) {
    if (o->len + extra <= o->cap) return 0;
    Py_ssize_t cap = o->cap ? o->cap : 1 << 16;
    while (cap < o->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *b = PyMem_Realloc(o->buf, (size_t)cap);
    if (!b) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = b;
    o->cap = cap;
    return 0;
}

static int put(Out *o, const char *s, Py_ssize_t n) {
    if (grow(o, n) < 0) return -1;
    memcpy(o->buf + o->len, s, (size_t)n);
    o->len += n;
    return 0;
}

/* floatToGoString(d) into out (at least 32 bytes); its length, or -1 with an exception. */
static Py_ssize_t go_float(double d, char *out) {
    if (isnan(d)) {
        memcpy(out, "NaN", 3);
        return 3;
    }
    if (isinf(d)) {
        memcpy(out, d > 0 ? "+Inf" : "-Inf", 4);
        return 4;
    }
    char *s = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!s) return -1;
    Py_ssize_t n = (Py_ssize_t)strlen(s);
    const char *dot = strchr(s, '.');
    Py_ssize_t at = dot ? dot - s : -1;
    if (n > 31) { /* repr of a double is at most 24 characters */
        PyMem_Free(s);
        PyErr_SetString(PyExc_ValueError, "float repr longer than expected");
        return -1;
    }
    if (d > 0 && at > 6) {
        /* mantissa = s[0] "." s[1:dot] s[dot+1:], stripped of trailing '0' and '.' */
        char m[40];
        Py_ssize_t k = 0;
        m[k++] = s[0];
        m[k++] = '.';
        for (Py_ssize_t i = 1; i < at; i++) m[k++] = s[i];
        for (Py_ssize_t i = at + 1; i < n; i++) m[k++] = s[i];
        while (k > 0 && (m[k - 1] == '0' || m[k - 1] == '.')) k--;
        memcpy(out, m, (size_t)k);
        k += snprintf(out + k, 12, "e+%02d", (int)(at - 1));
        PyMem_Free(s);
        return k;
    }
    memcpy(out, s, (size_t)n);
    PyMem_Free(s);
    return n;
}

static PyObject *series(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer prefix;
    PyObject *texts, *values;
    if (!PyArg_ParseTuple(args, "y*OO", &prefix, &texts, &values)) return NULL;
    PyObject *result = NULL;
    Out o = {NULL, 0, 0};
    if (!PyList_Check(values) || (texts != Py_None && !PyList_Check(texts))) {
        PyErr_SetString(PyExc_TypeError, "values: a list; texts: a list or None");
        goto done;
    }
    const Py_ssize_t n = PyList_GET_SIZE(values);
    if (texts != Py_None && PyList_GET_SIZE(texts) != n) {
        PyErr_SetString(PyExc_ValueError, "texts and values differ in length");
        goto done;
    }
    /* Zero and one are most of a scrape's values: formatted once. */
    char zero[32], one[32], text[32];
    Py_ssize_t zero_n = go_float(0.0, zero), one_n = go_float(1.0, one);
    if (zero_n < 0 || one_n < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (put(&o, prefix.buf, prefix.len) < 0) goto done;
        if (texts != Py_None) {
            PyObject *t = PyList_GET_ITEM(texts, i);
            if (!PyUnicode_Check(t)) {
                PyErr_SetString(PyExc_TypeError, "texts: not a str");
                goto done;
            }
            Py_ssize_t tn;
            const char *ts = PyUnicode_AsUTF8AndSize(t, &tn);
            if (!ts || put(&o, ts, tn) < 0) goto done;
        }
        PyObject *v = PyList_GET_ITEM(values, i);
        double d = PyFloat_Check(v) ? PyFloat_AS_DOUBLE(v) : PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) goto done;
        const char *vs;
        Py_ssize_t vn;
        if (d == 0.0 && !signbit(d)) {
            vs = zero, vn = zero_n;
        } else if (d == 1.0) {
            vs = one, vn = one_n;
        } else {
            vn = go_float(d, text);
            if (vn < 0) goto done;
            vs = text;
        }
        if (grow(&o, vn + 2) < 0) goto done;
        o.buf[o.len++] = ' ';
        memcpy(o.buf + o.len, vs, (size_t)vn);
        o.len += vn;
        o.buf[o.len++] = '\n';
    }
    result = PyBytes_FromStringAndSize(o.buf ? o.buf : "", o.len);
done:
    PyMem_Free(o.buf);
    PyBuffer_Release(&prefix);
    return result;
}

/* Line i of a block: name, labels[i] (nothing when labels is None), " ", value i, "\n". */
static int put_line(Out *o, const char *name, Py_ssize_t name_n, PyObject *labels, Py_ssize_t i,
                    double d) {
    if (put(o, name, name_n) < 0) return -1;
    if (labels != Py_None) {
        PyObject *t = PyList_GET_ITEM(labels, i);
        if (!PyBytes_Check(t)) {
            PyErr_SetString(PyExc_TypeError, "labels: not bytes");
            return -1;
        }
        if (put(o, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t)) < 0) return -1;
    }
    char text[32];
    Py_ssize_t vn;
    if (d == 0.0 && !signbit(d)) { /* most values of a quiet fleet */
        memcpy(text, "0.0", 3);
        vn = 3;
    } else if (d == 1.0) {
        memcpy(text, "1.0", 3);
        vn = 3;
    } else {
        vn = go_float(d, text);
    }
    if (vn < 0 || grow(o, vn + 2) < 0) return -1;
    o->buf[o->len++] = ' ';
    memcpy(o->buf + o->len, text, (size_t)vn);
    o->len += vn;
    o->buf[o->len++] = '\n';
    return 0;
}

static PyObject *block(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer name, vb, ob = {0}, cb = {0};
    PyObject *labels, *values, *old, *offsets, *changed;
    if (!PyArg_ParseTuple(args, "y*OOOOO", &name, &labels, &values, &old, &offsets, &changed))
        return NULL;
    PyObject *result = NULL;
    long long *noff = NULL;
    Out o = {NULL, 0, 0};
    int have_v = 0, have_o = 0, have_c = 0;
    if (PyObject_GetBuffer(values, &vb, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_v = 1;
    const Py_ssize_t n = vb.len / 8;
    if (vb.len % 8 || (labels != Py_None && (!PyList_Check(labels) || PyList_GET_SIZE(labels) != n))) {
        PyErr_SetString(PyExc_ValueError, "values: float64; labels: a list of as many, or None");
        goto done;
    }
    const double *v = (const double *)vb.buf;
    const char *prev = NULL;
    const long long *off = NULL, *ch = NULL;
    Py_ssize_t m = 0;
    if (old != Py_None) {
        if (!PyBytes_Check(old)) {
            PyErr_SetString(PyExc_TypeError, "old: bytes or None");
            goto done;
        }
        if (PyObject_GetBuffer(offsets, &ob, PyBUF_C_CONTIGUOUS) < 0) goto done;
        have_o = 1;
        if (PyObject_GetBuffer(changed, &cb, PyBUF_C_CONTIGUOUS) < 0) goto done;
        have_c = 1;
        if (ob.len != (n + 1) * 8 || cb.len % 8) {
            PyErr_SetString(PyExc_ValueError, "offsets: n + 1 int64; changed: int64");
            goto done;
        }
        prev = PyBytes_AS_STRING(old);
        off = (const long long *)ob.buf;
        ch = (const long long *)cb.buf;
        m = cb.len / 8;
        if (n && (off[0] != 0 || off[n] != PyBytes_GET_SIZE(old))) {
            PyErr_SetString(PyExc_ValueError, "offsets do not span old");
            goto done;
        }
    }
    noff = PyMem_Malloc((size_t)(n + 1) * sizeof(long long));
    if (!noff) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t ci = 0;
    for (Py_ssize_t i = 0; i < n;) {
        if (prev == NULL || (ci < m && ch[ci] == i)) {
            noff[i] = o.len;
            if (put_line(&o, name.buf, name.len, labels, i, v[i]) < 0) goto done;
            i++;
            if (prev != NULL) ci++;
            continue;
        }
        if (ci < m && (ch[ci] < i || ch[ci] >= n)) {
            PyErr_SetString(PyExc_ValueError, "changed: not ascending indices of the block");
            goto done;
        }
        Py_ssize_t j = ci < m ? (Py_ssize_t)ch[ci] : n; /* the run [i, j) is copied */
        long long a = off[i], b = off[j];
        if (a < 0 || b < a || b > PyBytes_GET_SIZE(old)) {
            PyErr_SetString(PyExc_ValueError, "offsets are not ascending");
            goto done;
        }
        long long shift = (long long)o.len - a;
        if (put(&o, prev + a, (Py_ssize_t)(b - a)) < 0) goto done;
        for (Py_ssize_t k = i; k < j; k++) noff[k] = off[k] + shift;
        i = j;
    }
    if (ci < m) {
        PyErr_SetString(PyExc_ValueError, "changed: not ascending indices of the block");
        goto done;
    }
    noff[n] = o.len;
    PyObject *text = PyBytes_FromStringAndSize(o.buf ? o.buf : "", o.len);
    PyObject *starts = text ? PyBytes_FromStringAndSize((const char *)noff,
                                                        (Py_ssize_t)(n + 1) * 8)
                            : NULL;
    if (text && starts) result = PyTuple_Pack(2, text, starts);
    Py_XDECREF(text);
    Py_XDECREF(starts);
done:
    PyMem_Free(o.buf);
    PyMem_Free(noff);
    if (have_v) PyBuffer_Release(&vb);
    if (have_o) PyBuffer_Release(&ob);
    if (have_c) PyBuffer_Release(&cb);
    PyBuffer_Release(&name);
    return result;
}

static PyMethodDef methods[] = {
    {"series", series, METH_VARARGS, "The series lines of one column family, as bytes."},
    {"block", block, METH_VARARGS, "A block of series lines, only the changed ones written."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "exporters._textformat",
                                    "Prometheus text format series lines.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__textformat(void) { return PyModule_Create(&module); }
