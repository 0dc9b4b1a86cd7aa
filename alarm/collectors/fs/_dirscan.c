/* Native directory listing for the fs source's scans (alarm/collectors/fs/dirscan.py).
 *
 * list_dir(fd, dir_id, max_entries) reads the directory open on `fd` with getdents64(2)
 * (continuing where the last call on that descriptor stopped) and looks at each entry with
 * fstatat(fd, name, AT_SYMLINK_NOFOLLOW) -- what os.scandir + DirEntry.stat(follow_symlinks=
 * False) does, without a DirEntry and a stat_result per entry.  It reads whole getdents
 * buffers until it holds at least `max_entries` entries or the directory is done, and returns
 *
 *     (names, keys, dev, ino, mode, nlink, size, blocks, mtime_ns, ctime_ns, err, idents,
 *      done)
 *
 * names: a list of bytes ("." and ".." left out); keys: the names-map key of each entry,
 * table.key64((dir_id, name)) with the interpreter's own hash of the name (so Python and C
 * agree in every process, salted or not) and its tuple and int hashing done here (pair_hash,
 * checked against hash() at import by dirscan.py); idents: table.key64((dev, ino)), the
 * inode map's key (0 where err); the other columns: bytes of int64 (ino: uint64),
 * one item per entry; err: 0, or the errno of the entry's fstatat (its other columns 0);
 * done: the directory has no more entries.  The system calls run without the GIL.
 *
 * probe(table, keys) -> bytes of int64: the slot of each key (uint64) in the open-addressing
 * table (table.py U64Map.keys, a power of two long; 0 is EMPTY) or -1, probing linearly.
 * place(table, vals, gens, keys, new_vals, new_gens): each key (none in the table yet) into
 * the first EMPTY slot of its probe, with its value (int64) and generation (int32).  The
 * caller makes room first.
 *
 * stat_names(fd, dir_id, names) looks at the given names (bytes) in the directory open on
 * `fd` the same way, and returns the same tuple (done true).
 *
 * ledger_rows(target, dev, ino, size, counted, mtime, names) sets, in the dict `target`,
 * "f:<dev>:<ino>" -> "[size,counted,mtime]" (or "[size,counted,mtime,names]" when names > 1)
 * for each item of the int64 columns given as buffers: ledger.py's ledger_value, in bulk.
 *
 * inotify_events(data) and fanotify_events(data) split what one read of a notification
 * descriptor returned into the tuples inotify.py's and fanotify.py's parse() make (and the
 * same count of malformed fanotify records; a descriptor a fanotify event carries is closed,
 * as parse() does): a few struct unpacks and slices per event were 0.6 us (inotify) and
 * 2 us (fanotify) of the reader thread's time per event.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BUF_BYTES (64 * 1024)

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

typedef struct {
    int64_t dev, mode, nlink, size, blocks, mtime, ctime, err;
    uint64_t ino;
    const char *name;
    size_t len;
} row;

typedef struct {
    char *data;
    size_t len, cap;
} growbuf;

static int gb_put(growbuf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n) cap *= 2;
        char *d = realloc(b->data, cap);
        if (d == NULL) return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static uint64_t key64(Py_hash_t h) {
    uint64_t k = (uint64_t)h;
    return k > 1 ? k : k + 2; /* never EMPTY (0) or DELETED (1): table.py */
}

/* hash((a, b)) of two ints, or of an int and an object whose hash is `b`, as the
 * interpreter computes it (Objects/tupleobject.c tuplehash, xxHash-based since 3.8; an int's
 * hash is its value modulo 2**61 - 1, Objects/longobject.c), without making the ints and the
 * tuple: those objects were most of the work per entry beyond the system calls.  dirscan.py
 * checks at import that this agrees with hash() and lists without the extension if not. */
#define XXPRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define XXPRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define XXPRIME_5 ((Py_uhash_t)2870177450012600261ULL)
#define XXROTATE(x) (((x) << 31) | ((x) >> 33))

static Py_uhash_t hash_i64(int64_t v) {
    uint64_t a = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    Py_hash_t h = (Py_hash_t)(a % _PyHASH_MODULUS);
    if (v < 0) h = -h;
    return (Py_uhash_t)(h == -1 ? -2 : h);
}

static Py_uhash_t hash_u64(uint64_t v) { return (Py_uhash_t)(v % _PyHASH_MODULUS); }

static Py_hash_t pair_hash(Py_uhash_t a, Py_uhash_t b) {
    Py_uhash_t acc = XXPRIME_5;
    acc += a * XXPRIME_2;
    acc = XXROTATE(acc);
    acc *= XXPRIME_1;
    acc += b * XXPRIME_2;
    acc = XXROTATE(acc);
    acc *= XXPRIME_1;
    acc += (Py_uhash_t)2 ^ (XXPRIME_5 ^ 3527539UL);
    return acc == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

/* fstatat of one entry into its row (no GIL needed). */
static void look(int fd, row *r) {
    struct stat st;
    if (fstatat(fd, r->name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        r->err = errno;
        return;
    }
    r->dev = (int64_t)st.st_dev;
    r->ino = (uint64_t)st.st_ino;
    r->mode = st.st_mode;
    r->nlink = (int64_t)st.st_nlink;
    r->size = (int64_t)st.st_size;
    r->blocks = (int64_t)st.st_blocks;
    r->mtime = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    r->ctime = (int64_t)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec;
}

/* Rows (with the GIL) into the columns: each name's map key, its inode's, its lstat.  `name`
 * is the row's name object when the caller has one (stat_names), else NULL (made here and
 * appended to `names`). */
static int add_row(const row *r, PyObject *given, long long did, PyObject *names,
                   growbuf *cols) {
    PyObject *name = given;
    if (name == NULL) {
        name = PyBytes_FromStringAndSize(r->name, (Py_ssize_t)r->len);
        if (name == NULL) return -1;
        int bad = PyList_Append(names, name);
        Py_DECREF(name);
        if (bad < 0) return -1;
    }
    Py_hash_t hn = PyObject_Hash(name); /* cached in the bytes object for later lookups */
    if (hn == -1) return -1;
    uint64_t k = key64(pair_hash(hash_i64(did), (Py_uhash_t)hn)), ident = 0;
    if (!r->err) ident = key64(pair_hash(hash_i64(r->dev), hash_u64(r->ino)));
    if (gb_put(&cols[0], &k, 8) || gb_put(&cols[1], &r->dev, 8) || gb_put(&cols[2], &r->ino, 8) ||
        gb_put(&cols[3], &r->mode, 8) || gb_put(&cols[4], &r->nlink, 8) ||
        gb_put(&cols[5], &r->size, 8) || gb_put(&cols[6], &r->blocks, 8) ||
        gb_put(&cols[7], &r->mtime, 8) || gb_put(&cols[8], &r->ctime, 8) ||
        gb_put(&cols[9], &r->err, 8) || gb_put(&cols[10], &ident, 8)) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* (names, 11 columns, done) */
static PyObject *listing(PyObject *names, growbuf *cols, int done) {
    PyObject *result = PyTuple_New(13);
    if (result == NULL) return NULL;
    Py_INCREF(names);
    PyTuple_SET_ITEM(result, 0, names);
    for (int c = 0; c < 11; c++) {
        PyObject *b = PyBytes_FromStringAndSize(cols[c].data ? cols[c].data : "", cols[c].len);
        if (b == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyTuple_SET_ITEM(result, 1 + c, b);
    }
    PyTuple_SET_ITEM(result, 12, PyBool_FromLong(done));
    return result;
}

static PyObject *list_dir(PyObject *self, PyObject *args) {
    int fd;
    long long dir_id;
    Py_ssize_t max_entries;
    if (!PyArg_ParseTuple(args, "iLn", &fd, &dir_id, &max_entries)) return NULL;
    PyObject *names = PyList_New(0);
    char *buf = malloc(BUF_BYTES);
    row *rows = malloc(sizeof(row) * (BUF_BYTES / 20 + 1));
    growbuf cols[11] = {{0}};
    PyObject *result = NULL;
    int done = 0;
    Py_ssize_t total = 0;
    if (names == NULL || buf == NULL || rows == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    while (total < max_entries && !done) {
        long got;
        size_t n = 0;
        int err = 0;
        Py_BEGIN_ALLOW_THREADS
        got = syscall(SYS_getdents64, fd, buf, BUF_BYTES);
        if (got < 0) {
            err = errno;
        } else {
            for (long off = 0; off < got;) {
                struct linux_dirent64 *e = (struct linux_dirent64 *)(buf + off);
                off += e->d_reclen;
                const char *nm = e->d_name;
                if (nm[0] == '.' && (nm[1] == 0 || (nm[1] == '.' && nm[2] == 0))) continue;
                row *r = &rows[n++];
                memset(r, 0, sizeof(*r));
                r->name = nm;
                r->len = strlen(nm);
                look(fd, r);
            }
        }
        Py_END_ALLOW_THREADS
        if (got < 0) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            goto out;
        }
        if (got == 0) done = 1;
        for (size_t i = 0; i < n; i++)
            if (add_row(&rows[i], NULL, dir_id, names, cols) < 0) goto out;
        total += (Py_ssize_t)n;
    }
    result = listing(names, cols, done);
out:
    for (int c = 0; c < 11; c++) free(cols[c].data);
    free(buf);
    free(rows);
    Py_XDECREF(names);
    return result;
}

static PyObject *stat_names(PyObject *self, PyObject *args) {
    int fd;
    long long dir_id;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "iLO!", &fd, &dir_id, &PyList_Type, &names)) return NULL;
    names = PySequence_List(names); /* our own list: its items stay while the GIL is off */
    if (names == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(names);
    row *rows = PyMem_Calloc(n ? n : 1, sizeof(row));
    growbuf cols[11] = {{0}};
    PyObject *result = NULL;
    if (rows == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *nm = PyList_GET_ITEM(names, i);
        if (!PyBytes_Check(nm) || (Py_ssize_t)strlen(PyBytes_AS_STRING(nm)) != PyBytes_GET_SIZE(nm)) {
            PyErr_SetString(PyExc_ValueError, "stat_names: a name is not bytes without NUL");
            goto out;
        }
        rows[i].name = PyBytes_AS_STRING(nm);
        rows[i].len = (size_t)PyBytes_GET_SIZE(nm);
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) look(fd, &rows[i]);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        if (add_row(&rows[i], PyList_GET_ITEM(names, i), dir_id, names, cols) < 0) goto out;
    result = listing(names, cols, 1);
out:
    for (int c = 0; c < 11; c++) free(cols[c].data);
    PyMem_Free(rows);
    Py_DECREF(names);
    return result;
}

static int column(PyObject *obj, Py_buffer *view, Py_ssize_t *n, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) return -1;
    if (view->len % 8 != 0 || (*n >= 0 && view->len / 8 != *n)) {
        PyErr_Format(PyExc_ValueError, "ledger_rows: %s is not a column of the same length", what);
        PyBuffer_Release(view);
        return -1;
    }
    *n = view->len / 8;
    return 0;
}

/* A str of ASCII bytes: copied straight in, where PyUnicode_FromStringAndSize decodes UTF-8
 * first (a ledger row is two of these, made for every file a baseline finds). */
static PyObject *ascii(const char *s, int n) {
    PyObject *u = PyUnicode_New(n, 127);
    if (u != NULL) memcpy(PyUnicode_DATA(u), s, (size_t)n);
    return u;
}

static PyObject *ledger_rows(PyObject *self, PyObject *args) {
    PyObject *target, *objs[6];
    if (!PyArg_ParseTuple(args, "O!OOOOOO", &PyDict_Type, &target, &objs[0], &objs[1], &objs[2],
                          &objs[3], &objs[4], &objs[5]))
        return NULL;
    static const char *what[6] = {"dev", "ino", "size", "counted", "mtime", "names"};
    Py_buffer views[6];
    int got = 0;
    Py_ssize_t n = -1;
    PyObject *ret = NULL;
    for (; got < 6; got++)
        if (column(objs[got], &views[got], &n, what[got]) < 0) goto out;
    const int64_t *dev = views[0].buf, *size = views[2].buf, *counted = views[3].buf,
                  *mtime = views[4].buf, *nm = views[5].buf;
    const uint64_t *ino = views[1].buf;
    char kb[64], vb[128];
    for (Py_ssize_t i = 0; i < n; i++) {
        int kl = snprintf(kb, sizeof kb, "f:%lld:%llu", (long long)dev[i], (unsigned long long)ino[i]);
        int vl = nm[i] > 1 ? snprintf(vb, sizeof vb, "[%lld,%lld,%lld,%lld]", (long long)size[i],
                                      (long long)counted[i], (long long)mtime[i], (long long)nm[i])
                           : snprintf(vb, sizeof vb, "[%lld,%lld,%lld]", (long long)size[i],
                                      (long long)counted[i], (long long)mtime[i]);
        PyObject *k = ascii(kb, kl);
        PyObject *v = ascii(vb, vl);
        int bad = k == NULL || v == NULL || PyDict_SetItem(target, k, v) < 0;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (bad) goto out;
    }
    ret = Py_NewRef(Py_None);
out:
    for (int c = 0; c < got; c++) PyBuffer_Release(&views[c]);
    return ret;
}

static PyObject *probe(PyObject *self, PyObject *args) {
    Py_buffer table, keys;
    if (!PyArg_ParseTuple(args, "y*y*", &table, &keys)) return NULL;
    PyObject *ret = NULL;
    Py_ssize_t cap = table.len / 8, n = keys.len / 8;
    if (cap == 0 || (cap & (cap - 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "probe: the table is not a power of two long");
        goto out;
    }
    ret = PyBytes_FromStringAndSize(NULL, n * 8);
    if (ret == NULL) goto out;
    const uint64_t *t = table.buf, *k = keys.buf, mask = (uint64_t)cap - 1;
    int64_t *found = (int64_t *)PyBytes_AS_STRING(ret);
    Py_BEGIN_ALLOW_THREADS /* the tables are the step thread's own (state.py) */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t at = k[i] & mask;
        found[i] = -1;
        for (Py_ssize_t step = 0; step < cap; step++, at = (at + 1) & mask) {
            if (t[at] == k[i]) {
                found[i] = (int64_t)at;
                break;
            }
            if (t[at] == 0) break;
        }
    }
    Py_END_ALLOW_THREADS
out:
    PyBuffer_Release(&table);
    PyBuffer_Release(&keys);
    return ret;
}

static PyObject *place(PyObject *self, PyObject *args) {
    Py_buffer table, vals, gens, keys, nv, ng;
    if (!PyArg_ParseTuple(args, "w*w*w*y*y*y*", &table, &vals, &gens, &keys, &nv, &ng)) return NULL;
    PyObject *ret = NULL;
    Py_ssize_t cap = table.len / 8, n = keys.len / 8;
    if (cap == 0 || (cap & (cap - 1)) != 0 || vals.len != cap * 8 || gens.len != cap * 4 ||
        nv.len != n * 8 || ng.len != n * 4) {
        PyErr_SetString(PyExc_ValueError, "place: columns of the wrong size");
        goto out;
    }
    uint64_t *t = table.buf, mask = (uint64_t)cap - 1;
    int64_t *v = vals.buf;
    int32_t *g = gens.buf;
    const uint64_t *k = keys.buf;
    const int64_t *add = nv.buf;
    const int32_t *addg = ng.buf;
    int full = 0;
    Py_BEGIN_ALLOW_THREADS /* the tables are the step thread's own (state.py) */
    for (Py_ssize_t i = 0; i < n && !full; i++) {
        uint64_t at = k[i] & mask;
        Py_ssize_t step = 0;
        while (t[at] != 0 && step++ < cap) at = (at + 1) & mask;
        if (t[at] != 0) {
            full = 1;
            break;
        }
        t[at] = k[i];
        v[at] = add[i];
        g[at] = addg[i];
    }
    Py_END_ALLOW_THREADS
    if (full) {
        PyErr_SetString(PyExc_ValueError, "place: the table is full");
        goto out;
    }
    ret = Py_NewRef(Py_None);
out:
    PyBuffer_Release(&table);
    PyBuffer_Release(&vals);
    PyBuffer_Release(&gens);
    PyBuffer_Release(&keys);
    PyBuffer_Release(&nv);
    PyBuffer_Release(&ng);
    return ret;
}

static PyObject *keys_of(PyObject *self, PyObject *args) {
    long long did, dev;
    unsigned long long ino;
    PyObject *name;
    if (!PyArg_ParseTuple(args, "LO!LK", &did, &PyBytes_Type, &name, &dev, &ino)) return NULL;
    Py_hash_t hn = PyObject_Hash(name);
    if (hn == -1) return NULL;
    return Py_BuildValue("KK", (unsigned long long)key64(pair_hash(hash_i64(did), (Py_uhash_t)hn)),
                         (unsigned long long)key64(pair_hash(hash_i64(dev), hash_u64(ino))));
}


static PyObject *inotify_events(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    PyObject *out = PyList_New(0);
    const unsigned char *d = data.buf;
    Py_ssize_t off = 0, end = data.len;
    while (out != NULL && off + 16 <= end) {
        int32_t wd;
        uint32_t mask, cookie, len;
        memcpy(&wd, d + off, 4);
        memcpy(&mask, d + off + 4, 4);
        memcpy(&cookie, d + off + 8, 4);
        memcpy(&len, d + off + 12, 4);
        off += 16;
        /* data[off:off + len].rstrip(b"\0"): a slice past the end is cut short */
        Py_ssize_t avail = end - off < 0 ? 0 : end - off;
        Py_ssize_t n = (Py_ssize_t)len < avail ? (Py_ssize_t)len : avail;
        while (n > 0 && d[off + n - 1] == 0) n--;
        off += len;
        PyObject *ev = Py_BuildValue("(iIIy#)", wd, mask, cookie, (const char *)d + off - len, n);
        if (ev == NULL || PyList_Append(out, ev) < 0) Py_CLEAR(out);
        Py_XDECREF(ev);
    }
    PyBuffer_Release(&data);
    return out;
}

/* (dir key, name) of a DFID_NAME-type info record at `rec` of `length` bytes (fanotify.py
 * _info_record): the key is fsid + struct file_handle, the name what follows up to a NUL. */
static int info_record(const unsigned char *d, Py_ssize_t rec, Py_ssize_t length,
                       Py_ssize_t end, PyObject **key, PyObject **name) {
    Py_ssize_t body = rec + 4;
    if (body + 16 > end) return -2;
    uint32_t nbytes;
    memcpy(&nbytes, d + body + 8, 4);
    Py_ssize_t key_end = body + 16 + (Py_ssize_t)nbytes;
    Py_ssize_t stop = rec + length;
    Py_ssize_t kend = key_end < end ? key_end : end;
    Py_XDECREF(*key);
    Py_XDECREF(*name);
    *name = NULL;
    *key = PyBytes_FromStringAndSize((const char *)d + body, kend - body);
    if (*key == NULL) return -1;
    Py_ssize_t n = 0, start = key_end;
    if (start < stop) {
        const unsigned char *nul = memchr(d + start, 0, (size_t)(stop - start));
        n = nul ? (Py_ssize_t)(nul - (d + start)) : stop - start;
    }
    *name = PyBytes_FromStringAndSize(start < stop ? (const char *)d + start : "", n);
    return *name == NULL ? -1 : 0;
}

static PyObject *fanotify_events(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    PyObject *out = PyList_New(0), *ret = NULL;
    const unsigned char *d = data.buf;
    Py_ssize_t off = 0, end = data.len;
    long bad = 0;
    PyObject *empty = PyBytes_FromStringAndSize("", 0);
    if (out == NULL || empty == NULL) goto done;
    while (off + 24 <= end) {
        uint32_t event_len;
        uint8_t vers;
        uint16_t meta_len;
        uint64_t mask;
        int32_t fd, pid;
        memcpy(&event_len, d + off, 4);
        vers = d[off + 4];
        memcpy(&meta_len, d + off + 6, 2);
        memcpy(&mask, d + off + 8, 8);
        memcpy(&fd, d + off + 16, 4);
        memcpy(&pid, d + off + 20, 4);
        if (event_len < 24 || off + (Py_ssize_t)event_len > end || vers != 3) {
            bad++;
            break;
        }
        if (fd >= 0) close(fd); /* not in FID mode: a descriptor we must not leak */
        PyObject *key = NULL, *name = NULL, *new_key = NULL, *new_name = NULL;
        Py_ssize_t rec = off + meta_len, stop = off + event_len;
        int failed = 0;
        while (rec + 4 <= stop) {
            uint8_t info_type = d[rec];
            uint16_t length;
            memcpy(&length, d + rec + 2, 2);
            if (length < 4 || rec + length > stop) {
                bad++;
                break;
            }
            int r = 0;
            if (info_type == 2 || info_type == 10) /* DFID_NAME, OLD_DFID_NAME */
                r = info_record(d, rec, length, end, &key, &name);
            else if (info_type == 12) /* NEW_DFID_NAME */
                r = info_record(d, rec, length, end, &new_key, &new_name);
            if (r == -2) { /* too short to hold a handle: what struct.unpack refuses */
                PyErr_SetString(PyExc_ValueError, "fanotify info record too short");
                r = -1;
            }
            if (r < 0) {
                failed = 1;
                break;
            }
            rec += length;
        }
        PyObject *ev = NULL;
        if (!failed)
            ev = Py_BuildValue("(KiOOOO)", (unsigned long long)mask, pid, key ? key : empty,
                               name ? name : empty, new_key ? new_key : empty,
                               new_name ? new_name : empty);
        Py_XDECREF(key);
        Py_XDECREF(name);
        Py_XDECREF(new_key);
        Py_XDECREF(new_name);
        if (ev == NULL || PyList_Append(out, ev) < 0) {
            Py_XDECREF(ev);
            goto done;
        }
        Py_DECREF(ev);
        off += event_len;
    }
    ret = Py_BuildValue("(Ol)", out, bad);
done:
    Py_XDECREF(out);
    Py_XDECREF(empty);
    PyBuffer_Release(&data);
    return ret;
}

static PyMethodDef methods[] = {
    {"keys_of", keys_of, METH_VARARGS,
     "keys_of(dir_id, name, dev, ino) -> (names-map key, inode-map key), as list_dir makes them"},
    {"list_dir", list_dir, METH_VARARGS,
     "list_dir(fd, dir_id, max_entries) -> (names, keys, dev, ino, mode, nlink, size, blocks, "
     "mtime_ns, ctime_ns, err, idents, done)"},
    {"stat_names", stat_names, METH_VARARGS,
     "stat_names(fd, dir_id, names) -> list_dir's tuple for the given names in the directory"},
    {"probe", probe, METH_VARARGS, "probe(table, keys) -> slots (int64 bytes, -1: absent)"},
    {"place", place, METH_VARARGS, "place(table, vals, gens, keys, new_vals, new_gens)"},
    {"inotify_events", inotify_events, METH_VARARGS,
     "inotify_events(data) -> [(wd, mask, cookie, name)], as inotify.parse"},
    {"fanotify_events", fanotify_events, METH_VARARGS,
     "fanotify_events(data) -> ([(mask, pid, key, name, new_key, new_name)], malformed)"},
    {"ledger_rows", ledger_rows, METH_VARARGS,
     "ledger_rows(target, dev, ino, size, counted, mtime, names): ledger rows into target"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "alarm.collectors.fs._dirscan",
                                    "Native directory listing for the fs source (dirscan.py).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__dirscan(void) { return PyModule_Create(&module); }
