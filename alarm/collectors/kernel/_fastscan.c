/* One-pass native scanner for fence lines: a chunk of kernel log in, flows out.
 *
 * alarm/fastscan.py's regex is the definition of what a fence line is.  This file reads the
 * layout the kernel and rsyslog actually write, in one pass per line with no allocation, and
 * aggregates while it reads: per (tick, flow identity) the bytes (first LEN=) and packets.  A
 * line it cannot read with certainty -- any line holding a configured prefix that does not
 * fit the strict layout, holds a non-ASCII byte, or whose stamp or addresses are not plainly
 * valid -- is handed back whole, and Python scans it with the regex.  So the fast path only
 * ever agrees with the regex, and the regex decides everything unusual.
 *
 * Where the regex has a choice (lazy or greedy runs) the fast path takes the regex's first
 * choice and hands the line back if that choice fails, since the regex would then go on to
 * try others.  For the optional fields (PROTO=, DPT=, the socket owner) it mirrors the
 * regex's choice exactly, because there a failure means "absent", not "malformed".
 *
 * Flow identities are kept as indexes into per-field tables of distinct values (destination
 * canonicalised as ipaddress prints it, prefix stripped as str.strip() does), so Python
 * classifies and names each distinct value once, with numpy over the identity columns.
 *
 * The same scanner serves the file source live (``live``): there the reference is
 * formats.py's per-line parsers and parse_fence, and every line whose header it cannot read
 * with certainty is handed back too, so that the line parser counts parse errors as before.
 *
 * scan_flows(data, fmt, prefixes, year, tick, boot_wall, live, require_trusted) -- see
 * build_result for the result.
 *   fmt: 0 syslog (RFC 3164 and RFC 3339 stamps), 1 kmsg, 2 dmesg, 3 journalctl -o json,
 *   4 auto (per line, live only)
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* memmem, memrchr */
#include <Python.h>

#include <arpa/inet.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PREFIXES 64
#define MAX_FAST_LINE 4096 /* longer lines go to the regex (its bounded runs need counting) */

/* FMT_AUTO decides per line as file.py's kernel_line_parser("auto") does (live only). */
enum { FMT_SYSLOG = 0, FMT_KMSG = 1, FMT_DMESG = 2, FMT_JOURNAL = 3, FMT_AUTO = 4 };
enum { LINE_SKIP = 0, LINE_ROW = 1, LINE_FALLBACK = 2 };
/* A record header: read; not one (or not read with certainty); or certainly not a kernel
 * record and no error either (another program's syslog line, a journal entry without
 * MESSAGE, a blank journal line). */
enum { HDR_OK = 0, HDR_BAD = -1, HDR_OTHER = 1 };

static inline int is_space(unsigned char c) /* re.ASCII \s */
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static inline int is_word(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* Length of the run of digits at s (stops at e). */
static inline Py_ssize_t digits(const char *s, const char *e)
{
    const char *p = s;
    while (p < e && is_digit((unsigned char)*p))
        p++;
    return p - s;
}

/* Length of the run of non-space characters at s. */
static inline Py_ssize_t nonspace(const char *s, const char *e)
{
    const char *p = s;
    while (p < e && !is_space((unsigned char)*p))
        p++;
    return p - s;
}

static inline int has_high_byte(const char *s, const char *e)
{
    uint64_t acc = 0;
    for (; e - s >= 8; s += 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        acc |= w;
    }
    for (; s < e; s++)
        acc |= (unsigned char)*s;
    return (acc & 0x8080808080808080ULL) != 0;
}

static inline int has(const char *s, const char *e, const char *lit, Py_ssize_t n)
{
    return e - s >= n && memcmp(s, lit, (size_t)n) == 0;
}

static uint64_t parse_u64(const char *s, Py_ssize_t n)
{
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        v = v * 10 + (uint64_t)(s[i] - '0');
    return v;
}

/* Python's float floor division (Objects/floatobject.c, float_divmod), so tick indexes are
 * the ones int(ts // tick) gives. */
static double py_floordiv(double vx, double wx)
{
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod) {
        if ((wx < 0) != (mod < 0))
            div -= 1.0;
    }
    double floordiv;
    if (div) {
        floordiv = floor(div);
        if (div - floordiv > 0.5)
            floordiv += 1.0;
    }
    else {
        floordiv = copysign(0.0, vx / wx);
    }
    return floordiv;
}

/* ---- hash tables ------------------------------------------------------------------------ */

static inline uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    /* Eight bytes at a time with a multiply-xorshift mix: keys are tens of bytes. */
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 29);
}

/* Interned byte strings: an arena and open addressing.  Used for each field's distinct
 * values and for flow identities (fixed-size keys of field indexes). */
typedef struct {
    char *arena;
    size_t len, cap;
    size_t *off;
    uint32_t *klen;
    uint64_t *hash;
    int32_t *value; /* per entry: caller's data (the canonical index for raw destinations) */
    size_t n, ncap;
    int32_t *slots; /* -1 empty */
    size_t mask;
} strtab;

static int32_t *new_slots(size_t n)
{
    int32_t *s = malloc(n * sizeof(int32_t));
    if (s)
        memset(s, 0xff, n * sizeof(int32_t));
    return s;
}

/* The first empty slot on h's probe sequence. */
static inline size_t free_slot(const int32_t *slots, size_t mask, uint64_t h)
{
    size_t i = (size_t)h & mask;
    while (slots[i] >= 0)
        i = (i + 1) & mask;
    return i;
}

/* Replace *slots by 2 * cap slots indexing entries 0..n-1 by their hashes; -1 if out of
 * memory (the old index is kept). */
static int reindex(int32_t **slots, size_t *mask, size_t cap, const uint64_t *hashes, size_t n)
{
    int32_t *fresh = new_slots(2 * cap);
    if (!fresh)
        return -1;
    free(*slots);
    *slots = fresh;
    *mask = 2 * cap - 1;
    for (size_t k = 0; k < n; k++)
        fresh[free_slot(fresh, *mask, hashes[k])] = (int32_t)k;
    return 0;
}

static int grow(void **p, size_t elem, size_t cap)
{
    void *q = realloc(*p, elem * cap);
    if (!q)
        return -1;
    *p = q;
    return 0;
}

static void strtab_free(strtab *t)
{
    free(t->arena);
    free(t->off);
    free(t->klen);
    free(t->hash);
    free(t->value);
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static int strtab_init(strtab *t, size_t entries)
{
    memset(t, 0, sizeof(*t));
    t->cap = entries * 16;
    t->ncap = entries;
    t->arena = malloc(t->cap);
    t->off = malloc(t->ncap * sizeof(size_t));
    t->klen = malloc(t->ncap * sizeof(uint32_t));
    t->hash = malloc(t->ncap * sizeof(uint64_t));
    t->value = malloc(t->ncap * sizeof(int32_t));
    t->mask = 2 * t->ncap - 1;
    t->slots = new_slots(t->mask + 1);
    if (!t->arena || !t->off || !t->klen || !t->hash || !t->value || !t->slots) {
        strtab_free(t);
        return -1;
    }
    return 0;
}

/* The entry of key[0:n] (hash h), or -1; *slot is where it would go. */
static inline int32_t strtab_find(const strtab *t, const char *key, size_t n, uint64_t h,
                                  size_t *slot)
{
    size_t i = (size_t)h & t->mask;
    for (;;) {
        int32_t id = t->slots[i];
        if (id < 0)
            break;
        if (t->hash[id] == h && t->klen[id] == n && memcmp(t->arena + t->off[id], key, n) == 0)
            return id;
        i = (i + 1) & t->mask;
    }
    *slot = i;
    return -1;
}

/* Add key[0:n] (known absent; slot from strtab_find); its index, or -1 if out of memory. */
static int32_t strtab_add(strtab *t, const char *key, size_t n, uint64_t h, size_t slot,
                          int32_t value)
{
    if (t->n == t->ncap) {
        size_t cap = t->ncap * 2;
        if (grow((void **)&t->off, sizeof(size_t), cap) ||
            grow((void **)&t->klen, sizeof(uint32_t), cap) ||
            grow((void **)&t->hash, sizeof(uint64_t), cap) ||
            grow((void **)&t->value, sizeof(int32_t), cap))
            return -1;
        t->ncap = cap;
        if (reindex(&t->slots, &t->mask, cap, t->hash, t->n))
            return -1;
        slot = free_slot(t->slots, t->mask, h);
    }
    while (t->len + n > t->cap) {
        if (grow((void **)&t->arena, 1, t->cap * 2))
            return -1;
        t->cap *= 2;
    }
    int32_t id = (int32_t)t->n++;
    memcpy(t->arena + t->len, key, n);
    t->off[id] = t->len;
    t->klen[id] = (uint32_t)n;
    t->hash[id] = h;
    t->value[id] = value;
    t->len += n;
    t->slots[slot] = id;
    return id;
}

/* Index of key[0:n], added if new; -1 if out of memory. */
static int32_t intern(strtab *t, const char *key, size_t n)
{
    uint64_t h = hash_bytes((const unsigned char *)key, n);
    size_t slot;
    int32_t id = strtab_find(t, key, n, h, &slot);
    return id >= 0 ? id : strtab_add(t, key, n, h, slot, 0);
}

/* Cells: (tick, identity) -> bytes, packets. */
typedef struct {
    int64_t *tick;
    int32_t *id;
    uint64_t *hash;
    int64_t *bytes;
    int64_t *packets;
    size_t n, cap;
    int32_t *slots;
    size_t mask;
} celltab;

static void celltab_free(celltab *t)
{
    free(t->tick);
    free(t->id);
    free(t->hash);
    free(t->bytes);
    free(t->packets);
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static int celltab_init(celltab *t)
{
    memset(t, 0, sizeof(*t));
    t->cap = 4096;
    t->tick = malloc(t->cap * sizeof(int64_t));
    t->id = malloc(t->cap * sizeof(int32_t));
    t->hash = malloc(t->cap * sizeof(uint64_t));
    t->bytes = malloc(t->cap * sizeof(int64_t));
    t->packets = malloc(t->cap * sizeof(int64_t));
    t->mask = 2 * t->cap - 1;
    t->slots = new_slots(t->mask + 1);
    if (!t->tick || !t->id || !t->hash || !t->bytes || !t->packets || !t->slots) {
        celltab_free(t);
        return -1;
    }
    return 0;
}

static inline uint64_t cell_hash(int64_t tick, int32_t id)
{
    uint64_t h = (uint64_t)tick * 0x9E3779B97F4A7C15ULL ^ ((uint64_t)(uint32_t)id * 0xC2B2AE3D27D4EB4FULL);
    return h ^ (h >> 29);
}

static int add_cell(celltab *t, int64_t tick, int32_t id, int64_t nbytes)
{
    uint64_t h = cell_hash(tick, id);
    size_t i = (size_t)h & t->mask;
    for (;;) {
        int32_t c = t->slots[i];
        if (c < 0)
            break;
        if (t->tick[c] == tick && t->id[c] == id) {
            t->bytes[c] += nbytes;
            t->packets[c] += 1;
            return 0;
        }
        i = (i + 1) & t->mask;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap * 2;
        if (grow((void **)&t->tick, sizeof(int64_t), cap) ||
            grow((void **)&t->id, sizeof(int32_t), cap) ||
            grow((void **)&t->hash, sizeof(uint64_t), cap) ||
            grow((void **)&t->bytes, sizeof(int64_t), cap) ||
            grow((void **)&t->packets, sizeof(int64_t), cap))
            return -1;
        t->cap = cap;
        if (reindex(&t->slots, &t->mask, cap, t->hash, t->n))
            return -1;
        i = free_slot(t->slots, t->mask, h);
    }
    int32_t c = (int32_t)t->n++;
    t->tick[c] = tick;
    t->id[c] = id;
    t->hash[c] = h;
    t->bytes[c] = nbytes;
    t->packets[c] = 1;
    t->slots[i] = c;
    return 0;
}

/* A flow identity: field indexes, so identities hash and compare as fixed-size keys. */
typedef struct {
    int32_t dst, out, prefix, proto;
    int64_t dpt, uid; /* -1: absent */
} identity;

/* A field's last value and index: prefix, interface and protocol repeat line after line. */
typedef struct {
    char text[64];
    Py_ssize_t len;
    int32_t index;
} last_value;

/* ---- one line ----------------------------------------------------------------------------- */

typedef struct {
    int fmt;
    int n_prefixes;
    const char *prefix[MAX_PREFIXES];
    Py_ssize_t prefix_len[MAX_PREFIXES];
    long year;
    double tick;
    double boot_wall;
    /* live: the file source's per-line semantics (formats.py's parsers, then parse_fence):
     * every line whose header is not read with certainty is handed back, whether or not it
     * holds a prefix (the line parser decides whether it is a parse error), and so is every
     * prefix line holding a CR (the per-line parsers strip a trailing one, the bulk regex
     * does not). */
    int live;
    int require_trusted; /* kmsg and journal lines not provably the kernel's are forged */
    double max_ts;       /* newest record time among the headers read (0.0: none) */
    char last_src[72]; /* last source address found valid: one host sends most records */
    Py_ssize_t last_src_len;
    /* last syslog stamp, its time and tick index: a stamp covers a second of lines (RFC
     * 3164) or a run of lines written in the same microsecond burst (RFC 3339) */
    char last_stamp[40];
    Py_ssize_t last_stamp_len;
    int64_t last_stamp_tick;
    double last_stamp_ts;
    strtab dst_raw;   /* destination as written -> value: index in dsts (-1: invalid) */
    strtab dsts;      /* canonical destinations, as ipaddress prints them */
    uint64_t *dst_words; /* per canonical destination: IP version, high and low 64 bits */
    size_t n_dst_words;
    strtab outs, prefixes, protos;
    strtab ids;       /* identity keys */
    celltab cells;
    last_value last_out, last_prefix, last_proto;
    int64_t forged;
} scanner;

static const char MONTHS[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
static const int DAYS_BEFORE[13] = {0, 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};

static int tick_index(double ts, double tick, int64_t *out)
{
    double q = py_floordiv(ts, tick);
    if (!(q > -9.0e18 && q < 9.0e18))
        return -1;
    *out = (int64_t)q;
    return 0;
}

static int cached_stamp(const scanner *sc, const char *s, Py_ssize_t n, int64_t *out, double *ts)
{
    if (n != sc->last_stamp_len || memcmp(s, sc->last_stamp, (size_t)n) != 0)
        return 0;
    *out = sc->last_stamp_tick;
    *ts = sc->last_stamp_ts;
    return 1;
}

static void cache_stamp(scanner *sc, const char *s, Py_ssize_t n, int64_t tick, double ts)
{
    memcpy(sc->last_stamp, s, (size_t)n);
    sc->last_stamp_len = n;
    sc->last_stamp_tick = tick;
    sc->last_stamp_ts = ts;
}

/* alarm.kernel_formats.civil_to_epoch, then int(ts // tick).  -1: not plainly valid. */
static int rfc3164_tick(scanner *sc, const char *s, Py_ssize_t n, int64_t *out, double *ts)
{
    if (cached_stamp(sc, s, n, out, ts))
        return 0;
    int month = 0;
    for (int m = 0; m < 12; m++)
        if (memcmp(s, MONTHS + 3 * m, 3) == 0)
            month = m + 1;
    if (!month)
        return -1;
    /* "Mmm dd HH:MM:SS" or "Mmm d HH:MM:SS"; day may be space-padded */
    const char *d = s + 4;
    long day = n == 15 ? (d[0] == ' ' ? 0 : (d[0] - '0') * 10) + (d[1] - '0') : d[0] - '0';
    const char *hms = s + n - 8;
    long hh = (hms[0] - '0') * 10 + (hms[1] - '0');
    long mm = (hms[3] - '0') * 10 + (hms[4] - '0');
    long ss = (hms[6] - '0') * 10 + (hms[7] - '0');
    if (!(day >= 1 && day <= 31 && hh < 24 && mm < 60 && ss < 61))
        return -1;
    long long y = sc->year - 1;
    long long days = 365 * y + y / 4 - y / 100 + y / 400 - 719162;
    days += DAYS_BEFORE[month] + day - 1;
    long year = sc->year;
    if (month > 2 && (year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)))
        days += 1;
    long long secs = days * 86400 + hh * 3600 + mm * 60 + ss;
    *ts = (double)secs;
    if (tick_index(*ts, sc->tick, out))
        return -1;
    cache_stamp(sc, s, n, *out, *ts);
    return 0;
}

static inline int two(const char *p) { return (p[0] - '0') * 10 + (p[1] - '0'); }

static int leap(long y) { return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0); }

/* Length of an RFC 3339 stamp as formats._SYSLOG_3339_RE reads it at s
 * (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?, followed by a space), or 0.
 * Followed by a space, the regex has one way to match: no backtracking to mirror. */
static Py_ssize_t rfc3339_shape(const char *s, const char *e)
{
    static const char layout[] = "dddd-dd-ddTdd:dd:dd";
    if (e - s < 20)
        return 0;
    for (int i = 0; i < 19; i++)
        if (layout[i] == 'd' ? !is_digit((unsigned char)s[i]) : s[i] != layout[i])
            return 0;
    const char *p = s + 19;
    if (*p == '.') {
        Py_ssize_t d = digits(p + 1, e);
        if (d < 1 || d > 9)
            return 0;
        p += 1 + d;
    }
    if (p < e && *p == 'Z')
        p++;
    else if (p < e && (*p == '+' || *p == '-')) {
        const char *q = p + 1;
        if (e - q < 4 || !is_digit((unsigned char)q[0]) || !is_digit((unsigned char)q[1]))
            return 0;
        q += 2;
        if (*q == ':')
            q++;
        if (e - q < 2 || !is_digit((unsigned char)q[0]) || !is_digit((unsigned char)q[1]))
            return 0;
        p = q + 2;
    }
    return p < e && *p == ' ' ? p - s : 0;
}

/* formats.rfc3339_time (datetime.fromisoformat(...).timestamp(), Python 3.11), then
 * int(ts // tick), for stamps that are plainly valid; -1 for the rest, which Python decides
 * (fromisoformat refuses Feb 30, second 60 and offsets of 24 h, accepts offset minutes of 60;
 * none of that is repeated here).  timestamp() divides whole microseconds by 10**6 as
 * Python divides ints, which below 2**53 is one correctly rounded double division. */
static int rfc3339_tick(scanner *sc, const char *s, Py_ssize_t n, int64_t *out, double *ts)
{
    static const int DIM[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (cached_stamp(sc, s, n, out, ts))
        return 0;
    long year = (long)parse_u64(s, 4);
    int month = two(s + 5), day = two(s + 8), hh = two(s + 11), mm = two(s + 14),
        ss = two(s + 17);
    /* 1900..2200: whole microseconds since 1970 stay below 2**53 */
    if (year < 1900 || year > 2200 || month < 1 || month > 12 || day < 1 ||
        day > DIM[month] + (month == 2 && leap(year)) || hh > 23 || mm > 59 || ss > 59)
        return -1;
    const char *p = s + 19;
    const char *end = s + n;
    long long frac = 0; /* microseconds: fromisoformat keeps the first six digits */
    if (p < end && *p == '.') {
        Py_ssize_t d = digits(p + 1, end);
        for (Py_ssize_t i = 0; i < 6; i++)
            frac = frac * 10 + (i < d ? p[1 + i] - '0' : 0);
        p += 1 + d;
    }
    long long offset = 0;
    if (p < end && (*p == '+' || *p == '-')) {
        int oh = two(p + 1);
        int om = two(p[3] == ':' ? p + 4 : p + 3);
        if (oh > 23 || om > 59)
            return -1;
        offset = (*p == '-' ? -1 : 1) * (long long)(oh * 3600 + om * 60);
    }
    long long y = year - 1;
    long long days = 365 * y + y / 4 - y / 100 + y / 400 - 719162;
    days += DAYS_BEFORE[month] + day - 1;
    if (month > 2 && leap(year))
        days += 1;
    long long us = ((days * 86400 + hh * 3600 + mm * 60 + ss) - offset) * 1000000 + frac;
    *ts = (double)us / 1e6;
    if (tick_index(*ts, sc->tick, out))
        return -1;
    if (n <= (Py_ssize_t)sizeof(sc->last_stamp))
        cache_stamp(sc, s, n, *out, *ts);
    return 0;
}

static int valid_ip(const char *s, Py_ssize_t n)
{
    char buf[72];
    unsigned char addr[16];
    /* A NUL would end inet_pton's string early: "10.0.0.1\0x" is not an address. */
    if (n <= 0 || n > 64 || memchr(s, 0, (size_t)n))
        return 0;
    memcpy(buf, s, (size_t)n);
    buf[n] = 0;
    /* ipaddress tries IPv4 first; an IPv4 text has no ':' and an IPv6 text has one.  Where
     * inet_pton accepts, ipaddress does too (no leading zeros in IPv4 for either); a scope
     * id ("%eth0") or anything else inet_pton refuses goes to the regex path. */
    return inet_pton(memchr(buf, ':', (size_t)n) ? AF_INET6 : AF_INET, buf, addr) == 1;
}

/* s[0:n] as ipaddress's ``compressed`` prints it, into out (>= 46 bytes); its length, or -1
 * if it is not plainly valid or is IPv4-mapped (Python versions print those differently:
 * the regex path decides). */
static int canonical_ip(const char *s, Py_ssize_t n, char *out, uint64_t words[3])
{
    char buf[72];
    unsigned char a[16];
    if (n <= 0 || n > 64 || memchr(s, 0, (size_t)n))
        return -1; /* a NUL would end inet_pton's string early */
    memcpy(buf, s, (size_t)n);
    buf[n] = 0;
    if (!memchr(buf, ':', (size_t)n)) {
        if (inet_pton(AF_INET, buf, a) != 1)
            return -1;
        words[0] = 4;
        words[1] = 0;
        words[2] = (uint64_t)a[0] << 24 | (uint64_t)a[1] << 16 | (uint64_t)a[2] << 8 | a[3];
        return snprintf(out, 46, "%u.%u.%u.%u", a[0], a[1], a[2], a[3]);
    }
    if (inet_pton(AF_INET6, buf, a) != 1)
        return -1;
    unsigned w[8];
    for (int i = 0; i < 8; i++)
        w[i] = (unsigned)a[2 * i] << 8 | a[2 * i + 1];
    words[0] = 6;
    words[1] = words[2] = 0;
    for (int i = 0; i < 8; i++)
        words[1 + i / 4] = words[1 + i / 4] << 16 | w[i];
    if (!w[0] && !w[1] && !w[2] && !w[3] && !w[4] && w[5] == 0xffff)
        return -1; /* Python 3.13 prints IPv4-mapped addresses as ::ffff:1.2.3.4 */
    /* ipaddress._compress_hextets: the first longest run of two or more zero hextets. */
    int best = -1, best_len = 0, run = -1, run_len = 0;
    for (int i = 0; i < 8; i++) {
        if (w[i] == 0) {
            if (run < 0)
                run = i;
            if (++run_len > best_len) {
                best = run;
                best_len = run_len;
            }
        }
        else {
            run = -1;
            run_len = 0;
        }
    }
    if (best_len < 2)
        best = -1;
    int len = 0;
    for (int i = 0; i < 8; i++) {
        if (i == best) {
            len += sprintf(out + len, i == 0 ? "::" : ":");
            i += best_len - 1;
            continue;
        }
        len += sprintf(out + len, "%x", w[i]);
        if (i < 7)
            out[len++] = ':';
    }
    out[len] = 0;
    return len;
}

/* Does the line hold any configured prefix anywhere?  If not, the regex cannot match it. */
static int holds_prefix(const scanner *sc, const char *s, const char *e)
{
    for (int i = 0; i < sc->n_prefixes; i++)
        if (memmem(s, (size_t)(e - s), sc->prefix[i], (size_t)sc->prefix_len[i]))
            return 1;
    return 0;
}

/* End of "[ *\d{1,12}\.\d{1,9}\]" at s, or NULL; the number's span in *num. */
static const char *uptime_bracket(const char *s, const char *e, const char **num, Py_ssize_t *num_len)
{
    if (s >= e || *s != '[')
        return NULL;
    const char *p = s + 1;
    while (p < e && *p == ' ')
        p++;
    const char *start = p;
    Py_ssize_t a = digits(p, e);
    if (a < 1 || a > 12)
        return NULL;
    p += a;
    if (p >= e || *p != '.')
        return NULL;
    p++;
    Py_ssize_t b = digits(p, e);
    if (b < 1 || b > 9)
        return NULL;
    p += b;
    if (p >= e || *p != ']')
        return NULL;
    *num = start;
    *num_len = p - start;
    return p + 1;
}

typedef struct {
    int64_t tick;
    double ts;
    int trusted;    /* provably the kernel's: kmsg facility 0, journal _TRANSPORT=kernel */
    int verifiable; /* the format can prove it (kmsg, journal) */
    const char *msg; /* where the prefix must start */
    const char *msg_end;
} header;

/* "Mmm dd HH:MM:SS" as formats._SYSLOG_3164_RE reads it at s ([A-Z][a-z]{2} [ \d]?\d
 * \d\d:\d\d:\d\d): its length, 15 or 14, or 0.  The day's two layouts exclude each other, so
 * the regex's backtracking has nothing else to find. */
static Py_ssize_t rfc3164_shape(const char *s, const char *e)
{
    if (e - s < 14 || !(s[0] >= 'A' && s[0] <= 'Z') || !(s[1] >= 'a' && s[1] <= 'z') ||
        !(s[2] >= 'a' && s[2] <= 'z') || s[3] != ' ')
        return 0;
    Py_ssize_t n;
    if (e - s >= 15 && (s[4] == ' ' || is_digit((unsigned char)s[4])) &&
        is_digit((unsigned char)s[5]))
        n = 15;
    else if (is_digit((unsigned char)s[4]))
        n = 14;
    else
        return 0;
    const char *t = s + n - 9; /* " HH:MM:SS" */
    if (t[0] != ' ' || !is_digit((unsigned char)t[1]) || !is_digit((unsigned char)t[2]) ||
        t[3] != ':' || !is_digit((unsigned char)t[4]) || !is_digit((unsigned char)t[5]) ||
        t[6] != ':' || !is_digit((unsigned char)t[7]) || !is_digit((unsigned char)t[8]))
        return 0;
    return n;
}

/* A syslog line, as formats.parse_syslog_line reads it: RFC 3164 or RFC 3339 stamp, host,
 * tag.  Another tag than "kernel:" is HDR_OTHER (parse_syslog_line returns None before it
 * looks at the stamp). */
static int syslog_header(scanner *sc, const char *s, const char *e, header *h)
{
    int rfc3164 = 1;
    Py_ssize_t n = rfc3164_shape(s, e);
    if (!n) {
        rfc3164 = 0;
        n = rfc3339_shape(s, e);
        if (!n)
            return HDR_BAD;
    }
    /* (\S+) (\S+) ? */
    const char *p = s + n;
    if (p >= e || *p != ' ')
        return HDR_BAD;
    p++;
    Py_ssize_t host = nonspace(p, e);
    if (host < 1)
        return HDR_BAD;
    p += host;
    if (p >= e || *p != ' ')
        return HDR_BAD;
    p++;
    Py_ssize_t tag = nonspace(p, e);
    if (tag < 1)
        return HDR_BAD;
    if (tag != 7 || memcmp(p, "kernel:", 7) != 0)
        return HDR_OTHER;
    p += 7;
    /* " ?" -- any other whitespace after the tag is left to the regex */
    if (p < e) {
        if (*p != ' ')
            return HDR_BAD;
        p++;
    }
    if (rfc3164 ? rfc3164_tick(sc, s, n, &h->tick, &h->ts) : rfc3339_tick(sc, s, n, &h->tick, &h->ts))
        return HDR_BAD;
    const char *num;
    Py_ssize_t num_len;
    const char *q = uptime_bracket(p, e, &num, &num_len);
    if (q) {
        p = q;
        if (p < e && *p == ' ')
            p++;
    }
    h->msg = p;
    return HDR_OK;
}

/* PRI,SEQ,USEC,FLAGS[,...]; (formats._KMSG_RE; clocks of more than 15 digits to Python) */
static int kmsg_header(scanner *sc, const char *s, const char *e, header *h)
{
    Py_ssize_t a = digits(s, e);
    if (a < 1 || a > 10 || s + a >= e || s[a] != ',')
        return HDR_BAD;
    uint64_t pri = parse_u64(s, a);
    const char *p = s + a + 1;
    Py_ssize_t b = digits(p, e);
    if (b < 1 || b > 20 || p + b >= e || p[b] != ',')
        return HDR_BAD;
    p += b + 1;
    Py_ssize_t c = digits(p, e);
    if (c < 1 || c > 15 || p + c >= e || p[c] != ',')
        return HDR_BAD; /* > 15 digits: int -> float may round; the regex path decides */
    uint64_t usec = parse_u64(p, c);
    p += c + 1;
    const char *semi = memchr(p, ';', (size_t)(e - p));
    if (!semi)
        return HDR_BAD;
    h->ts = sc->boot_wall + (double)usec / 1e6;
    if (tick_index(h->ts, sc->tick, &h->tick))
        return HDR_BAD;
    h->verifiable = 1;
    h->trusted = (pri >> 3) == 0;
    h->msg = semi + 1;
    return HDR_OK;
}

/* (?:<\d{1,10}>|)\[ *(\d{1,12}\.\d{1,9})\] ?(?:\[ *[TC]\d{1,10}\] |); the time is
 * boot_wall + the uptime, as file.py's dmesg parser puts it on the wall clock (0.0 in
 * backtests). */
static int dmesg_header(scanner *sc, const char *s, const char *e, header *h)
{
    const char *p = s;
    if (p < e && *p == '<') {
        Py_ssize_t a = digits(p + 1, e);
        if (a < 1 || a > 10 || p + 1 + a >= e || p[1 + a] != '>')
            return HDR_BAD;
        p += a + 2;
    }
    const char *num;
    Py_ssize_t num_len;
    p = uptime_bracket(p, e, &num, &num_len);
    if (!p)
        return HDR_BAD;
    char buf[32];
    memcpy(buf, num, (size_t)num_len);
    buf[num_len] = 0;
    h->ts = strtod(buf, NULL) + sc->boot_wall;
    if (tick_index(h->ts, sc->tick, &h->tick))
        return HDR_BAD;
    if (p < e && *p == ' ')
        p++;
    if (p < e && *p == '[') {
        const char *q = p + 1;
        while (q < e && *q == ' ')
            q++;
        if (q < e && (*q == 'T' || *q == 'C')) {
            Py_ssize_t a = digits(q + 1, e);
            if (a >= 1 && a <= 10 && q + 1 + a + 1 < e && q[1 + a] == ']' && q[2 + a] == ' ')
                p = q + a + 3;
        }
    }
    h->msg = p;
    return HDR_OK;
}

static inline const char *json_ws(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t'))
        p++;
    return p;
}

/* The end of the JSON string whose opening quote is at p (the closing quote), or NULL for
 * one with an escape: json.loads unescapes, and the message must be the bytes as they are.
 * NULL too for a tab inside it: whitespace between tokens, but a control character that
 * json.loads refuses in a string (the entry is a parse error; it was read as traffic). */
static inline const char *json_string_end(const char *p, const char *e)
{
    for (const char *q = p + 1; q < e; q++) {
        if (*q == '"')
            return q;
        if (*q == '\\' || *q == '\t')
            return NULL;
    }
    return NULL;
}

/* One ``journalctl -o json`` line as fastscan._scan_journal reads it (str.splitlines, then
 * json.loads and formats.parse_journal_json).  Read here: an object whose values are
 * strings without escapes or null, each of MESSAGE, __REALTIME_TIMESTAMP, _TRANSPORT and
 * SYSLOG_FACILITY at most once, a timestamp below 2**53 microseconds.  Everything else (numbers,
 * arrays such as a non-UTF-8 MESSAGE, escapes, duplicate keys, any byte outside printable
 * ASCII and tab, a tab inside a string, which str.splitlines or json.loads treat specially)
 * is HDR_BAD. */
static int journal_header(scanner *sc, const char *s, const char *e, header *h)
{
    for (const char *q = s; q < e; q++) {
        unsigned char c = (unsigned char)*q;
        if ((c < 0x20 && c != '\t') || c >= 0x7f)
            return HDR_BAD; /* 0x7f too: rare, and one rule is easier to trust */
    }
    const char *p = json_ws(s, e);
    if (p == e)
        return HDR_OTHER; /* a blank line */
    if (*p != '{')
        return HDR_BAD;
    p = json_ws(p + 1, e);
    const char *msg = NULL, *msg_end = NULL, *rt = NULL, *rt_end = NULL;
    const char *tr = NULL, *tr_end = NULL, *fac = NULL, *fac_end = NULL;
    int seen_msg = 0, seen_rt = 0, seen_tr = 0, seen_fac = 0;
    if (p < e && *p == '}')
        p++;
    else {
        for (;;) {
            if (p >= e || *p != '"')
                return HDR_BAD;
            const char *ke = json_string_end(p, e);
            if (!ke)
                return HDR_BAD;
            const char *key = p + 1;
            size_t klen = (size_t)(ke - key);
            p = json_ws(ke + 1, e);
            if (p >= e || *p != ':')
                return HDR_BAD;
            p = json_ws(p + 1, e);
            const char *v = NULL, *ve = NULL; /* NULL: null */
            if (p < e && *p == '"') {
                ve = json_string_end(p, e);
                if (!ve)
                    return HDR_BAD;
                v = p + 1;
                p = ve + 1;
            }
            else if (e - p >= 4 && memcmp(p, "null", 4) == 0)
                p += 4;
            else
                return HDR_BAD;
            const char **vs = NULL, **vend = NULL;
            int *seen = NULL;
            if (klen == 7 && memcmp(key, "MESSAGE", 7) == 0)
                vs = &msg, vend = &msg_end, seen = &seen_msg;
            else if (klen == 20 && memcmp(key, "__REALTIME_TIMESTAMP", 20) == 0)
                vs = &rt, vend = &rt_end, seen = &seen_rt;
            else if (klen == 10 && memcmp(key, "_TRANSPORT", 10) == 0)
                vs = &tr, vend = &tr_end, seen = &seen_tr;
            else if (klen == 15 && memcmp(key, "SYSLOG_FACILITY", 15) == 0)
                vs = &fac, vend = &fac_end, seen = &seen_fac;
            if (seen) {
                if ((*seen)++)
                    return HDR_BAD; /* json.loads keeps the last: left to it */
                *vs = v;
                *vend = ve;
            }
            p = json_ws(p, e);
            if (p < e && *p == ',') {
                p = json_ws(p + 1, e);
                continue;
            }
            if (p < e && *p == '}') {
                p++;
                break;
            }
            return HDR_BAD;
        }
    }
    if (json_ws(p, e) != e)
        return HDR_BAD;
    if (!msg)
        return HDR_OTHER; /* no MESSAGE, or null: parse_journal_json returns None */
    Py_ssize_t n = rt ? rt_end - rt : 0;
    if (n < 1 || n > 16 || digits(rt, rt_end) != n)
        return HDR_BAD;
    uint64_t usec = parse_u64(rt, n);
    if (usec >= (1ULL << 53))
        return HDR_BAD; /* int / 1e6 rounds the int first from here: left to Python */
    h->ts = (double)usec / 1e6;
    if (tick_index(h->ts, sc->tick, &h->tick))
        return HDR_BAD;
    int facility0 = 0; /* int(SYSLOG_FACILITY) == 0, for a string of ASCII digits */
    if (fac) {
        Py_ssize_t f = fac_end - fac;
        if (f > 18)
            return HDR_BAD; /* int() refuses past 4300 digits: left to Python */
        facility0 = f >= 1 && digits(fac, fac_end) == f;
        for (const char *q = fac; q < fac_end; q++)
            facility0 &= *q == '0';
    }
    h->verifiable = 1;
    h->trusted = tr && tr_end - tr == 6 && memcmp(tr, "kernel", 6) == 0 && facility0;
    h->msg = msg;
    h->msg_end = msg_end;
    return HDR_OK;
}

/* The record header of one line, in the scanner's format. */
static int read_header(scanner *sc, const char *s, const char *e, header *h)
{
    h->trusted = 0;
    h->verifiable = 0;
    h->msg_end = e;
    int fmt = sc->fmt;
    if (fmt == FMT_AUTO) {
        /* file.py's auto parser: a digit with "," in the first 12 characters is kmsg, "[" or
         * "<" dmesg, anything else syslog.  Characters are bytes only while they are ASCII. */
        if (s == e)
            return HDR_BAD; /* "" counts as dmesg there: a parse error */
        const char *lim = e - s > 12 ? s + 12 : e;
        if ((unsigned char)*s >= 0x80 || (is_digit((unsigned char)*s) && has_high_byte(s, lim)))
            return HDR_BAD;
        if (is_digit((unsigned char)*s) && memchr(s, ',', (size_t)(lim - s)))
            fmt = FMT_KMSG;
        else if (*s == '[' || *s == '<')
            fmt = FMT_DMESG;
        else
            fmt = FMT_SYSLOG;
    }
    int r;
    switch (fmt) {
    case FMT_SYSLOG:
        r = syslog_header(sc, s, e, h);
        break;
    case FMT_KMSG:
        r = kmsg_header(sc, s, e, h);
        break;
    case FMT_DMESG:
        r = dmesg_header(sc, s, e, h);
        break;
    default:
        r = journal_header(sc, s, e, h);
    }
    if (r == HDR_OK && h->ts > sc->max_ts)
        sc->max_ts = h->ts;
    return r;
}

/* After a field: the kernel's trailing space, or the end of the line.  Returns the position
 * after it, or NULL. */
static inline const char *eol(const char *p, const char *e)
{
    if (p == e)
        return p;
    return *p == ' ' ? p + 1 : NULL;
}

static int32_t field_index(strtab *t, last_value *last, const char *s, Py_ssize_t n)
{
    if (n == last->len && memcmp(s, last->text, (size_t)n) == 0)
        return last->index;
    int32_t i = intern(t, s, (size_t)n);
    if (i >= 0 && n <= (Py_ssize_t)sizeof(last->text)) {
        memcpy(last->text, s, (size_t)n);
        last->len = n;
        last->index = i;
    }
    return i;
}

static int scan_line(scanner *sc, const char *s, const char *le)
{
    header h;
    int hr = read_header(sc, s, le, &h);
    if (hr == HDR_OTHER)
        return LINE_SKIP;
    if (hr == HDR_BAD) {
        /* Live, the line parser decides whether it is a parse error; a journal line that is
         * not an entry is one whatever it holds. */
        if (sc->live || sc->fmt == FMT_JOURNAL)
            return LINE_FALLBACK;
        goto slow;
    }
    /* From here on e is the end of the message (a journal line's MESSAGE ends earlier). */
    const char *e = h.msg_end;
    const char *m = h.msg;
    if (e - m > MAX_FAST_LINE || (sc->live && memchr(s, '\r', (size_t)(le - s))))
        goto slow;
    /* The longest prefix the message starts with. */
    Py_ssize_t best = -1;
    for (int i = 0; i < sc->n_prefixes; i++)
        if (sc->prefix_len[i] > best && has(m, e, sc->prefix[i], sc->prefix_len[i]))
            best = sc->prefix_len[i];
    if (best < 0)
        goto slow;
    /* ({pfx}[^\n]*?)IN=\S* OUT=(\S*) -- the first IN= after the prefix */
    const char *in = memmem(m + best, (size_t)(e - m - best), "IN=", 3);
    if (!in)
        goto slow;
    const char *p = in + 3;
    p += nonspace(p, e);
    if (!has(p, e, " OUT=", 5))
        goto slow;
    p += 5;
    const char *out = p;
    Py_ssize_t out_len = nonspace(p, e);
    p += out_len;
    if (p >= e || *p != ' ')
        goto slow;
    p++;
    /* (?:|[^\n]{0,400}? )SRC= -- the first SRC= at p or after a space, within 401 chars */
    const char *r = p;
    const char *src = NULL;
    for (const char *q = r; q + 4 <= e && q - r <= 401; q++) {
        if (memcmp(q, "SRC=", 4) == 0 && (q == r || q[-1] == ' ')) {
            src = q;
            break;
        }
    }
    if (!src)
        goto slow;
    p = src + 4;
    Py_ssize_t src_len = nonspace(p, e);
    if (src_len < 1 || src_len > 64)
        goto slow;
    const char *src_text = p;
    p += src_len;
    if (!has(p, e, " DST=", 5))
        goto slow;
    p += 5;
    const char *dst = p;
    Py_ssize_t dst_len = nonspace(p, e);
    if (dst_len < 1 || dst_len > 64)
        goto slow;
    p += dst_len;
    if (!has(p, e, " LEN=", 5))
        goto slow;
    p += 5;
    Py_ssize_t len_digits = digits(p, e);
    if (len_digits < 1 || len_digits > 10)
        goto slow;
    int64_t length = (int64_t)parse_u64(p, len_digits);
    p = eol(p + len_digits, e);
    if (!p)
        goto slow;
    /* From here every field is optional: a mismatch means "absent", as in the regex. */
    const char *proto = NULL, *dpt = NULL;
    Py_ssize_t proto_len = 0, dpt_len = 0;
    const char *q = memmem(p, (size_t)(e - p), "PROTO=", 6);
    if (q) {
        /* NET_SKIP's catch-all: at most 40 "P"s before PROTO=, runs between them <= 1100
         * (the other two alternatives end at the same place and are shorter). */
        int ps = 0;
        Py_ssize_t longest = 0;
        for (const char *c = p;;) {
            const char *np = memchr(c, 'P', (size_t)(q - c));
            const char *stop = np ? np : q;
            if (stop - c > longest)
                longest = stop - c;
            if (!np)
                break;
            ps++;
            c = np + 1;
        }
        if (ps <= 40 && longest <= 1100) {
            const char *v = q + 6;
            Py_ssize_t n = nonspace(v, e);
            const char *after = n >= 1 && n <= 16 ? eol(v + n, e) : NULL;
            if (after) {
                proto = v;
                proto_len = n;
                p = after;
                /* (?:SPT=\d{1,5} DPT=(\d{1,5}){eol}|) */
                if (has(p, e, "SPT=", 4)) {
                    Py_ssize_t a = digits(p + 4, e);
                    const char *d = p + 4 + a;
                    if (a >= 1 && a <= 5 && has(d, e, " DPT=", 5)) {
                        Py_ssize_t b = digits(d + 5, e);
                        const char *after2 = b >= 1 && b <= 5 ? eol(d + 5 + b, e) : NULL;
                        if (after2) {
                            dpt = d + 5;
                            dpt_len = b;
                            p = after2;
                        }
                    }
                }
            }
        }
    }
    /* [^\n]*UID=(\d{1,10}) GID=\d{1,10}(?!\S) -- the last UID= from p that fits */
    const char *uid = NULL;
    Py_ssize_t uid_len = 0;
    for (const char *u = e; u > p;) {
        u = memrchr(p, 'U', (size_t)(u - p));
        if (!u)
            break;
        if (!has(u, e, "UID=", 4))
            continue;
        Py_ssize_t a = digits(u + 4, e);
        const char *g = u + 4 + a;
        if (a < 1 || a > 10 || !has(g, e, " GID=", 5))
            continue;
        Py_ssize_t b = digits(g + 5, e);
        const char *after = g + 5 + b;
        if (b < 1 || b > 10 || (after < e && !is_space((unsigned char)*after)))
            continue;
        uid = u + 4;
        uid_len = a;
        break;
    }
    /* Only plain ASCII lines with a valid source take the fast path: the regex reads
     * decoded text (a non-ASCII byte changes what \S counts) and refuses bad addresses. */
    if (has_high_byte(s, e))
        goto slow;
    if (src_len != sc->last_src_len || memcmp(src_text, sc->last_src, (size_t)src_len) != 0) {
        if (!valid_ip(src_text, src_len))
            goto slow;
        memcpy(sc->last_src, src_text, (size_t)src_len);
        sc->last_src_len = src_len;
    }

    /* The destination: canonicalised once per distinct text. */
    uint64_t hd = hash_bytes((const unsigned char *)dst, (size_t)dst_len);
    size_t slot;
    int32_t raw = strtab_find(&sc->dst_raw, dst, (size_t)dst_len, hd, &slot);
    int32_t dst_index;
    if (raw >= 0) {
        dst_index = sc->dst_raw.value[raw];
    }
    else {
        char canon[48];
        uint64_t words[3];
        int n = canonical_ip(dst, dst_len, canon, words);
        dst_index = n < 0 ? -1 : intern(&sc->dsts, canon, (size_t)n);
        if (n >= 0 && dst_index < 0)
            return -1;
        if (dst_index >= 0 && (size_t)dst_index == sc->n_dst_words) {
            /* a new canonical destination: its address, for classification by network */
            if (sc->n_dst_words % 1024 == 0 &&
                grow((void **)&sc->dst_words, 3 * sizeof(uint64_t), sc->n_dst_words + 1024))
                return -1;
            memcpy(sc->dst_words + 3 * sc->n_dst_words++, words, sizeof(words));
        }
        if (strtab_add(&sc->dst_raw, dst, (size_t)dst_len, hd, slot, dst_index) < 0)
            return -1;
    }
    if (dst_index < 0)
        goto slow;
    if (sc->require_trusted && h.verifiable && !h.trusted) {
        sc->forged++; /* kmsg facility != 0, journal not _TRANSPORT=kernel: not the kernel's */
        return LINE_ROW;
    }
    /* The log prefix as str.strip() leaves it (ASCII whitespace, 0x1c-0x1f included). */
    const char *ps = m, *pe = in;
    while (ps < pe && (is_space((unsigned char)*ps) || (*ps >= 0x1c && *ps <= 0x1f)))
        ps++;
    while (pe > ps && (is_space((unsigned char)pe[-1]) || (pe[-1] >= 0x1c && pe[-1] <= 0x1f)))
        pe--;
    identity ident;
    memset(&ident, 0, sizeof(ident));
    ident.dst = dst_index;
    if ((ident.out = field_index(&sc->outs, &sc->last_out, out, out_len)) < 0 ||
        (ident.prefix = field_index(&sc->prefixes, &sc->last_prefix, ps, pe - ps)) < 0 ||
        (ident.proto = field_index(&sc->protos, &sc->last_proto, proto ? proto : "", proto_len)) < 0)
        return -1;
    ident.dpt = dpt ? (int64_t)parse_u64(dpt, dpt_len) : -1;
    ident.uid = uid ? (int64_t)parse_u64(uid, uid_len) : -1;
    int32_t id = intern(&sc->ids, (const char *)&ident, sizeof(ident));
    if (id < 0 || add_cell(&sc->cells, h.tick, id, length))
        return -1;
    return LINE_ROW;

slow:
    return holds_prefix(sc, s, le) ? LINE_FALLBACK : LINE_SKIP;
}

/* ---- Python interface ------------------------------------------------------------------- */

static PyObject *strings(const strtab *t)
{
    PyObject *list = PyList_New((Py_ssize_t)t->n);
    if (!list)
        return NULL;
    for (size_t i = 0; i < t->n; i++) {
        PyObject *o = PyUnicode_DecodeASCII(t->arena + t->off[i], (Py_ssize_t)t->klen[i], "strict");
        if (!o) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, o);
    }
    return list;
}

/* (lines, forged, fallback, (dsts, outs, prefixes, protos), dst_words, identities, cells,
 * max_ts):
 * dst_words: per destination (IP version, high 64 bits, low 64 bits) as uint64; identities
 * as one packed array of 6 int64 columns per row (dst, out, prefix, proto, dpt, uid), cells
 * as packed arrays (tick int64, identity int32, bytes int64, packets int64); max_ts the
 * newest time among the record headers read (0.0 if none). */
static PyObject *build_result(scanner *sc, Py_ssize_t lines, PyObject *fallback)
{
    PyObject *tables = Py_BuildValue("(NNNN)", strings(&sc->dsts), strings(&sc->outs),
                                     strings(&sc->prefixes), strings(&sc->protos));
    if (!tables)
        return NULL;
    size_t n = sc->ids.n;
    int64_t *cols = malloc((n ? n : 1) * 6 * sizeof(int64_t));
    if (!cols) {
        Py_DECREF(tables);
        return PyErr_NoMemory();
    }
    for (size_t i = 0; i < n; i++) {
        identity id;
        memcpy(&id, sc->ids.arena + sc->ids.off[i], sizeof(id));
        int64_t *row = cols + 6 * i;
        row[0] = id.dst;
        row[1] = id.out;
        row[2] = id.prefix;
        row[3] = id.proto;
        row[4] = id.dpt;
        row[5] = id.uid;
    }
    const celltab *c = &sc->cells;
    PyObject *res = Py_BuildValue(
        "(nLONy#y#(y#y#y#y#)d)", lines, (long long)sc->forged, fallback, tables,
        sc->dst_words ? (const char *)sc->dst_words : "",
        (Py_ssize_t)(sc->n_dst_words * 3 * sizeof(uint64_t)),
        (const char *)cols, (Py_ssize_t)(n * 6 * sizeof(int64_t)),
        (const char *)c->tick, (Py_ssize_t)(c->n * sizeof(int64_t)),
        (const char *)c->id, (Py_ssize_t)(c->n * sizeof(int32_t)),
        (const char *)c->bytes, (Py_ssize_t)(c->n * sizeof(int64_t)),
        (const char *)c->packets, (Py_ssize_t)(c->n * sizeof(int64_t)), sc->max_ts);
    free(cols);
    return res;
}

static PyObject *scan_flows(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer data;
    int fmt;
    PyObject *prefixes;
    long year;
    double tick, boot_wall;
    int live = 0, require_trusted = 1;
    if (!PyArg_ParseTuple(args, "y*iO!ldd|pp", &data, &fmt, &PyTuple_Type, &prefixes, &year,
                          &tick, &boot_wall, &live, &require_trusted))
        return NULL;
    PyObject *res = NULL;
    PyObject *fallback = NULL;
    scanner *sc = calloc(1, sizeof(scanner));
    if (!sc) {
        PyBuffer_Release(&data);
        return PyErr_NoMemory();
    }
    sc->last_stamp_len = -1;
    sc->last_src_len = -1;
    sc->last_out.len = sc->last_prefix.len = sc->last_proto.len = -1;
    Py_ssize_t np = PyTuple_GET_SIZE(prefixes);
    /* auto only live: the regex path that takes the rest has no per-line format */
    if (fmt < FMT_SYSLOG || fmt > FMT_AUTO || (fmt == FMT_AUTO && !live) || np < 1 ||
        np > MAX_PREFIXES || year < 1 || !(tick > 0) || !isfinite(boot_wall)) {
        PyErr_SetString(PyExc_ValueError, "scan_flows: bad format, prefixes, year or tick");
        goto done;
    }
    sc->fmt = fmt;
    sc->live = live;
    sc->require_trusted = require_trusted;
    sc->n_prefixes = (int)np;
    sc->year = year;
    sc->tick = tick;
    sc->boot_wall = boot_wall;
    for (Py_ssize_t i = 0; i < np; i++) {
        PyObject *p = PyTuple_GET_ITEM(prefixes, i);
        if (!PyBytes_Check(p) || PyBytes_GET_SIZE(p) < 1) {
            PyErr_SetString(PyExc_TypeError, "scan_flows: prefixes must be non-empty bytes");
            goto done;
        }
        sc->prefix[i] = PyBytes_AS_STRING(p);
        sc->prefix_len[i] = PyBytes_GET_SIZE(p);
    }
    if (strtab_init(&sc->dst_raw, 1024) || strtab_init(&sc->dsts, 1024) ||
        strtab_init(&sc->outs, 16) || strtab_init(&sc->prefixes, 16) ||
        strtab_init(&sc->protos, 16) || strtab_init(&sc->ids, 1024) ||
        celltab_init(&sc->cells)) {
        PyErr_NoMemory();
        goto done;
    }
    const char *buf = data.buf;
    const char *end = buf + data.len;
    Py_ssize_t lines = 0;
    /* Handed-back lines: offsets into the buffer, joined once at the end. */
    Py_ssize_t *fb = NULL;
    size_t n_fb = 0, fb_cap = 0, fb_bytes = 0;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS;
    const char *s = buf;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        lines++;
        int r = scan_line(sc, s, e);
        if (r < 0) {
            failed = 1;
            break;
        }
        if (r == LINE_FALLBACK) {
            if (n_fb + 2 > fb_cap) {
                fb_cap = fb_cap ? fb_cap * 2 : 256;
                Py_ssize_t *g = realloc(fb, fb_cap * sizeof(Py_ssize_t));
                if (!g) {
                    failed = 1;
                    break;
                }
                fb = g;
            }
            fb[n_fb++] = s - buf;
            fb[n_fb++] = e - buf;
            fb_bytes += (size_t)(e - s) + 1;
        }
        s = nl ? nl + 1 : end;
    }
    Py_END_ALLOW_THREADS;
    if (failed) {
        free(fb);
        PyErr_NoMemory();
        goto done;
    }
    fallback = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)fb_bytes);
    if (!fallback) {
        free(fb);
        goto done;
    }
    char *w = PyBytes_AS_STRING(fallback);
    for (size_t i = 0; i < n_fb; i += 2) {
        memcpy(w, buf + fb[i], (size_t)(fb[i + 1] - fb[i]));
        w += fb[i + 1] - fb[i];
        *w++ = '\n';
    }
    free(fb);
    res = build_result(sc, lines, fallback);
done:
    Py_XDECREF(fallback);
    strtab_free(&sc->dst_raw);
    strtab_free(&sc->dsts);
    free(sc->dst_words);
    strtab_free(&sc->outs);
    strtab_free(&sc->prefixes);
    strtab_free(&sc->protos);
    strtab_free(&sc->ids);
    celltab_free(&sc->cells);
    free(sc);
    PyBuffer_Release(&data);
    return res;
}

static PyMethodDef methods[] = {
    {"scan_flows", scan_flows, METH_VARARGS,
     "scan_flows(data, fmt, prefixes, year, tick, boot_wall, live=False, require_trusted=True) "
     "-> (lines, forged, fallback, tables, dst_words, identities, cells, max_ts): fence lines "
     "aggregated per (tick, flow identity); lines it cannot read with certainty are returned "
     "in fallback for the regex path (live: for the per-line parsers)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "alarm.collectors.kernel._fastscan",
    .m_doc = "Native one-pass fence-line scanner (see alarm/fastscan.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__fastscan(void) { return PyModule_Create(&module); }
