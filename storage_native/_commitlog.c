/* sparkmq.storage_native._commitlog -- the C core of the message store.
 *
 * This file is the CPython binding: argument parsing and validation (with the
 * exact error texts of _commitlog.pyi), conversion of results, and the GIL/lock
 * choreography.  The store itself is cl_store.c (no Python API, so it can run
 * without the GIL) and crc32.c.
 *
 * Locking rules (why there is no deadlock between the GIL and the log mutex):
 *  - a thread holding the GIL never blocks on the mutex: it try-locks, and on
 *    failure releases the GIL before blocking (lock_log);
 *  - no Python API is called while the mutex is held, so a garbage-collector
 *    finaliser can never re-enter the log on a thread that holds the mutex.
 * Data that outlives the unlock (records being copied, read_view memoryviews)
 * is pinned by a reference on its mapped file, so deletion and close cannot
 * unmap it underneath.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX: a class's __slots__ members (see record_slots) */

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cl_store.h"
#include "growbuf.h"
#include "crc32.h"
#include "rmq_codec.h"
#include "v2_codec.h"

/* Copies larger than this are done with the GIL released. */
#define BIG_COPY (256 * 1024)

static PyObject *StoreError; /* sparkmq.storage_native.errors.StoreError */

/* ------------------------------------------------------------------ errors */

static PyObject *raise_store(const char *code, PyObject *msg)
{
    if (!msg)
        return NULL;
    PyObject *exc = PyObject_CallFunction(StoreError, "sO", code, msg);
    Py_DECREF(msg);
    if (exc) {
        PyErr_SetObject(StoreError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static PyObject *store_error(const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    return raise_store(code, msg);
}

/* A core error.  When `arg` is given, the argument was outside int64 and was
 * clamped to `clamped`: its real value replaces the clamped one in the text. */
static PyObject *raise_err_arg(const cl_err *e, PyObject *arg, int64_t clamped)
{
    PyObject *msg = PyUnicode_DecodeFSDefault(e->msg);
    if (msg && arg) {
        PyObject *old = PyUnicode_FromFormat("%lld", (long long)clamped);
        PyObject *new = PyObject_Str(arg);
        PyObject *fixed = old && new ? PyUnicode_Replace(msg, old, new, 1) : NULL;
        Py_XDECREF(old);
        Py_XDECREF(new);
        Py_SETREF(msg, fixed);
    }
    return raise_store(e->code, msg);
}

static PyObject *raise_err(const cl_err *e) { return raise_err_arg(e, NULL, 0); }

/* --------------------------------------------------------- argument parsing */

/* operator.index() semantics.  Values outside int64 are clamped and reported in
 * *big (+1/-1) when big is given, else they raise OverflowError. */
static int as_i64(PyObject *o, int64_t *v, int *big, const char *what)
{
    PyObject *n = PyLong_Check(o) ? Py_NewRef(o) : PyNumber_Index(o);
    if (!n)
        return -1;
    int ovf = 0;
    long long x = PyLong_AsLongLongAndOverflow(n, &ovf);
    Py_DECREF(n);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (ovf) {
        if (!big) {
            PyErr_Format(PyExc_OverflowError, "%s does not fit in 64 bits", what);
            return -1;
        }
        x = ovf > 0 ? LLONG_MAX : LLONG_MIN;
    }
    if (big)
        *big = ovf;
    *v = x;
    return 0;
}

static int as_i32(PyObject *o, int32_t *v, const char *what)
{
    int64_t x;
    if (as_i64(o, &x, NULL, what))
        return -1;
    if (x < INT32_MIN || x > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s does not fit in 32 bits", what);
        return -1;
    }
    *v = (int32_t)x;
    return 0;
}

/* an optional int argument (NULL = default) */
static int opt_i64(PyObject *o, int64_t dflt, int64_t *v, int *big, const char *what)
{
    if (!o) {
        *v = dflt;
        if (big)
            *big = 0;
        return 0;
    }
    return as_i64(o, v, big, what);
}

/* Minimal vectorcall parser: names[i] are interned, cnames[i] their C text. */
static int parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      PyObject **names, const char *const *cnames, int nreq, int nmax, PyObject **out)
{
    for (int i = 0; i < nmax; i++)
        out[i] = NULL;
    if (nargs > nmax) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, nmax, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int idx = -1;
        for (int j = 0; j < nmax && idx < 0; j++)
            if (names[j] == key)
                idx = j;
        for (int j = 0; j < nmax && idx < 0; j++)
            if (PyUnicode_Compare(key, names[j]) == 0)
                idx = j;
        if (idx < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%S'", fname, key);
            return -1;
        }
        if (out[idx]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, cnames[idx]);
            return -1;
        }
        out[idx] = args[nargs + k];
    }
    for (int i = 0; i < nreq; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", fname, cnames[i], i + 1);
            return -1;
        }
    return 0;
}

/* keyword tables, interned at module init */
enum { MAXKW = 13 };
typedef struct kwtab {
    const char *const names[MAXKW + 1];
    PyObject *interned[MAXKW];
} kwtab;

static kwtab KW_APPEND = {{"topic", "queue_id", "body", "properties", "tag_hash", "flag", "sys_flag", "born_timestamp",
                           "born_host", "store_timestamp", "store_host", "reconsume_times", "prepared_offset", NULL}, {0}};
static kwtab KW_BATCH = {{"topic", "queue_id", "messages", "store_timestamp", "store_host", NULL}, {0}};
static kwtab KW_SCAN = {{"offset", "max_count", "max_bytes", NULL}, {0}};
static kwtab KW_RAW = {{"offset", "length", NULL}, {0}};
static kwtab KW_GET = {{"topic", "queue_id", "queue_offset", "max_count", "tag_hashes", "max_bytes", NULL}, {0}};
static kwtab KW_QUEUE = {{"topic", "queue_id", NULL}, {0}};
static kwtab KW_UNITS = {{"queue_offset", "max_count", NULL}, {0}};
static kwtab KW_DECODE = {{"buf", "verify_crc", NULL}, {0}};
static kwtab KW_CRC = {{"data", "value", NULL}, {0}};
static kwtab KW_PACKED = {{"topic", "queue_id", "data", "count", "sys_flag", "born_host", "store_host",
                           "store_timestamp", "max_body", "max_properties", "reserved_keys", NULL}, {0}};
static kwtab KW_DECODE_BATCH = {{"data", "count", NULL}, {0}};
static kwtab KW_ENCODE = {{"messages", "id_prefix", "month_start_ms", "counter", "born_timestamp", NULL}, {0}};
static kwtab KW_RECORDS = {{"data", "broker_name", "factory", "inflate", NULL}, {0}};
static kwtab KW_REPL_APPEND = {{"offset", "data", NULL}, {0}};
static kwtab KW_REPL_READ = {{"offset", "max_bytes", NULL}, {0}};
static kwtab KW_RANGE = {{"start", "end", NULL}, {0}};
static kwtab *const ALL_KW[] = {&KW_APPEND, &KW_BATCH,  &KW_SCAN,         &KW_RAW,    &KW_GET,    &KW_QUEUE,
                                &KW_UNITS,  &KW_DECODE, &KW_CRC,          &KW_PACKED, &KW_ENCODE, &KW_RECORDS,
                                &KW_DECODE_BATCH, &KW_REPL_APPEND, &KW_REPL_READ, &KW_RANGE};

static int intern_kw(void)
{
    for (size_t t = 0; t < sizeof ALL_KW / sizeof *ALL_KW; t++)
        for (int i = 0; ALL_KW[t]->names[i]; i++)
            if (!(ALL_KW[t]->interned[i] = PyUnicode_InternFromString(ALL_KW[t]->names[i])))
                return -1;
    return 0;
}

#define PARSE(fname, tab, nreq, nmax, out)                                                                         \
    parse_args(fname, args, nargs, kwnames, (tab).interned, (tab).names, nreq, nmax, out)

/* ------------------------------------------------------------------ objects */

typedef struct {
    PyObject_HEAD cl_log *c;
    PyObject *root;
    PyObject *weakreflist;
} LogObject;

typedef struct {
    PyObject_HEAD LogObject *log;
    cl_queue *q;
} QueueObject;

/* exporter of read_view: a read-only slice of a mapping it keeps alive */
typedef struct {
    PyObject_HEAD mfile *f;
    char *ptr;
    Py_ssize_t len;
} ViewObject;

static PyTypeObject LogType, QueueType, ViewType;

/* Lock with the GIL held, without ever blocking while holding it. */
static void lock_log(cl_log *c)
{
    if (pthread_mutex_trylock(&c->mu) != 0) {
        Py_BEGIN_ALLOW_THREADS
            pthread_mutex_lock(&c->mu);
        Py_END_ALLOW_THREADS
    }
}

static void unlock_log(cl_log *c) { pthread_mutex_unlock(&c->mu); }

static cl_log *log_of(LogObject *self)
{
    if (!self->c) {
        store_error("CLOSED", "commit log is closed");
        return NULL;
    }
    return self->c;
}

/* ------------------------------------------------------------ copying out */

/* bytes copies of located entries; the GIL is released for large copies */
static int copy_out(const cl_ents *es, PyObject **objs)
{
    size_t total = 0;
    for (size_t i = 0; i < es->n; i++) {
        if (!(objs[i] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)es->v[i].len))) {
            while (i-- > 0)
                Py_DECREF(objs[i]);
            return -1;
        }
        total += es->v[i].len;
    }
    if (total >= BIG_COPY) {
        Py_BEGIN_ALLOW_THREADS
            for (size_t i = 0; i < es->n; i++)
                memcpy(PyBytes_AS_STRING(objs[i]), es->v[i].ptr, es->v[i].len);
        Py_END_ALLOW_THREADS
    } else {
        for (size_t i = 0; i < es->n; i++)
            memcpy(PyBytes_AS_STRING(objs[i]), es->v[i].ptr, es->v[i].len);
    }
    return 0;
}

/* list of (a, bytes) or (a, b, bytes) tuples */
static PyObject *ents_to_list(const cl_ents *es, int pairs)
{
    PyObject **objs = PyMem_Malloc((es->n ? es->n : 1) * sizeof *objs);
    if (!objs)
        return PyErr_NoMemory();
    if (copy_out(es, objs)) {
        PyMem_Free(objs);
        return NULL;
    }
    PyObject *list = PyList_New((Py_ssize_t)es->n);
    for (size_t i = 0; i < es->n; i++) {
        PyObject *t = NULL;
        if (list)
            t = pairs ? Py_BuildValue("(LN)", (long long)es->v[i].a, objs[i])
                      : Py_BuildValue("(LLN)", (long long)es->v[i].a, (long long)es->v[i].b, objs[i]);
        else
            Py_DECREF(objs[i]);
        if (list && !t)
            Py_CLEAR(list);
        if (list)
            PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    PyMem_Free(objs);
    return list;
}

/* ---------------------------------------------------------- validation */

/* topic as UTF-8, validated in the contract's order */
static int check_topic(PyObject *topic, const char **s, Py_ssize_t *n)
{
    if (!PyUnicode_Check(topic)) {
        PyErr_Format(PyExc_TypeError, "topic must be str, not %s", Py_TYPE(topic)->tp_name);
        return -1;
    }
    if (!(*s = PyUnicode_AsUTF8AndSize(topic, n)))
        return -1;
    if (*n == 0)
        return store_error("INVALID_ARGUMENT", "topic must not be empty"), -1;
    if (*n > CL_MAX_TOPIC)
        return store_error("INVALID_ARGUMENT", "topic is %zd bytes, the limit is %d", *n, CL_MAX_TOPIC), -1;
    if (memchr(*s, '/', (size_t)*n) || memchr(*s, '\0', (size_t)*n) || !strcmp(*s, ".") || !strcmp(*s, ".."))
        return store_error("INVALID_ARGUMENT", "topic contains a character not allowed in a file name"), -1;
    return 0;
}

static int check_queue_id(PyObject *o, int *qid)
{
    int64_t v;
    int big;
    if (as_i64(o, &v, &big, "queue_id"))
        return -1;
    if (big || v < 0 || v > CL_MAX_QUEUE_ID)
        return store_error("INVALID_ARGUMENT", "queue_id must be in [0, %d], got %S", CL_MAX_QUEUE_ID, o), -1;
    *qid = (int)v;
    return 0;
}

/* None (all zero) or exactly 20 bytes; *has = 0 for None */
static int check_host(PyObject *o, const char *name, const char *prefix, uint8_t out[CL_HOST_SIZE], int *has)
{
    *has = 0;
    memset(out, 0, CL_HOST_SIZE);
    if (!o || o == Py_None)
        return 0;
    Py_buffer b;
    if (PyObject_GetBuffer(o, &b, PyBUF_SIMPLE))
        return -1;
    Py_ssize_t len = b.len;
    if (len == CL_HOST_SIZE)
        memcpy(out, b.buf, CL_HOST_SIZE);
    PyBuffer_Release(&b);
    if (len != CL_HOST_SIZE)
        return store_error("INVALID_ARGUMENT", "%s%s must be %d bytes, got %zd", prefix, name, CL_HOST_SIZE, len), -1;
    *has = 1;
    return 0;
}

/* body/properties stay exported (zero-copy) until the append returns */
typedef struct msg_bufs {
    Py_buffer body, props;
    int have_body, have_props;
} msg_bufs;

static void bufs_release(msg_bufs *b)
{
    if (b->have_body)
        PyBuffer_Release(&b->body);
    if (b->have_props)
        PyBuffer_Release(&b->props);
    b->have_body = b->have_props = 0;
}

/* the fields of one message, in the twin's conversion order; then born_host */
static int msg_convert(cl_msg *m, msg_bufs *b, PyObject *const f[9], const char *prefix)
{
    /* f: body, properties, tag_hash, flag, sys_flag, born_timestamp, born_host, reconsume_times, prepared_offset */
    memset(m, 0, sizeof *m);
    if (PyObject_GetBuffer(f[0], &b->body, PyBUF_SIMPLE))
        return -1;
    b->have_body = 1;
    m->body = b->body.buf;
    m->body_len = (size_t)b->body.len;
    if (f[1]) {
        if (PyObject_GetBuffer(f[1], &b->props, PyBUF_SIMPLE))
            return -1;
        b->have_props = 1;
        m->props = b->props.buf;
        m->props_len = (size_t)b->props.len;
    } else
        m->props = "";
    int has;
    if ((f[2] && as_i64(f[2], &m->tag_hash, NULL, "tag_hash")) || (f[3] && as_i32(f[3], &m->flag, "flag")) ||
        (f[4] && as_i32(f[4], &m->sys_flag, "sys_flag")) ||
        (f[5] && as_i64(f[5], &m->born_ts, NULL, "born_timestamp")) ||
        (f[7] && as_i32(f[7], &m->reconsume, "reconsume_times")) ||
        (f[8] && as_i64(f[8], &m->prepared, NULL, "prepared_offset")))
        return -1;
    return check_host(f[6], "born_host", prefix, m->born_host, &has);
}

/* properties limit and the record size against the segment */
static int msg_limits(const cl_log *c, cl_msg *m, size_t tlen, const char *prefix)
{
    if (m->props_len > CL_MAX_PROPS)
        return store_error("INVALID_ARGUMENT", "%sproperties are %zu bytes, the limit is %d", prefix, m->props_len,
                           CL_MAX_PROPS),
               -1;
    m->size = cl_record_size(m->body_len, tlen, m->props_len);
    if (m->size > (uint64_t)(c->seg_size - CL_BLANK_SIZE) || m->size > UINT32_MAX)
        return store_error("INVALID_ARGUMENT", "%srecord of %llu bytes does not fit in a segment of %lld bytes", prefix,
                           (unsigned long long)m->size, (long long)c->seg_size),
               -1;
    return 0;
}

static int store_ts_arg(PyObject *o, int64_t *ts)
{
    if (opt_i64(o, 0, ts, NULL, "store_timestamp"))
        return -1;
    if (*ts == 0)
        *ts = cl_now_ms();
    return 0;
}

static int check_open(cl_log *c)
{
    /* a racy early exit only; the locked operation checks again */
    if (c->closed) {
        store_error("CLOSED", "commit log is closed");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- appending */

static PyObject *Log_append(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[13];
    cl_log *c;
    if (PARSE("append", KW_APPEND, 3, 13, a) || !(c = log_of(self)) || check_open(c))
        return NULL;
    const char *topic;
    Py_ssize_t tlen;
    int qid, has_shost;
    uint8_t shost[CL_HOST_SIZE];
    int64_t store_ts, off = 0, qoff = 0;
    cl_msg m;
    msg_bufs b = {0};
    PyObject *const fields[9] = {a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[11], a[12]};
    if (check_topic(a[0], &topic, &tlen) || check_queue_id(a[1], &qid) || msg_convert(&m, &b, fields, "") ||
        check_host(a[10], "store_host", "", shost, &has_shost) || msg_limits(c, &m, (size_t)tlen, "") ||
        store_ts_arg(a[9], &store_ts)) {
        bufs_release(&b);
        return NULL;
    }
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&c->mu);
        rc = cl_append_locked(c, topic, (size_t)tlen, qid, &m, 1, store_ts, has_shost ? shost : NULL, &off,
                              &qoff, &e);
        pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
    bufs_release(&b);
    if (rc)
        return raise_err(&e);
    return Py_BuildValue("(LLL)", (long long)off, (long long)qoff, (long long)store_ts);
}

/* validated batch: messages and their exported buffers */
typedef struct batch {
    Py_ssize_t n;
    cl_msg *msgs;
    msg_bufs *bufs;
    int64_t *offsets;
} batch;

static void batch_free(batch *bt)
{
    for (Py_ssize_t i = 0; bt->bufs && i < bt->n; i++)
        bufs_release(&bt->bufs[i]);
    PyMem_Free(bt->msgs);
    PyMem_Free(bt->bufs);
    PyMem_Free(bt->offsets);
}

static int batch_build(const cl_log *c, PyObject *messages, size_t tlen, batch *bt)
{
    memset(bt, 0, sizeof *bt);
    if (!PyList_Check(messages) && !PyTuple_Check(messages)) {
        PyErr_SetString(PyExc_TypeError, "messages must be a list or tuple");
        return -1;
    }
    /* a snapshot: converting an item may run Python code that mutates a list */
    PyObject *items = PyList_Check(messages) ? PyList_AsTuple(messages) : Py_NewRef(messages);
    if (!items)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    int rc = -1;
    if (n == 0) {
        store_error("INVALID_ARGUMENT", "batch is empty");
        goto out;
    }
    bt->msgs = PyMem_Calloc((size_t)n, sizeof *bt->msgs);
    bt->bufs = PyMem_Calloc((size_t)n, sizeof *bt->bufs);
    bt->offsets = PyMem_Calloc((size_t)n, sizeof *bt->offsets);
    if (!bt->msgs || !bt->bufs || !bt->offsets) {
        PyErr_NoMemory();
        goto out;
    }
    bt->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        char prefix[48];
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError, "message %zd must be a tuple", i);
            goto out;
        }
        if (PyTuple_GET_SIZE(item) != 9) {
            store_error("INVALID_ARGUMENT", "message %zd: expected 9 fields, got %zd", i, PyTuple_GET_SIZE(item));
            goto out;
        }
        snprintf(prefix, sizeof prefix, "message %zd: ", i);
        if (msg_convert(&bt->msgs[i], &bt->bufs[i], &PyTuple_GET_ITEM(item, 0), prefix) ||
            msg_limits(c, &bt->msgs[i], tlen, prefix))
            goto out;
    }
    rc = 0;
out:
    Py_DECREF(items); /* the exported buffers keep bodies alive */
    return rc;
}

static PyObject *Log_append_batch(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[5];
    cl_log *c;
    if (PARSE("append_batch", KW_BATCH, 3, 5, a) || !(c = log_of(self)) || check_open(c))
        return NULL;
    const char *topic;
    Py_ssize_t tlen;
    int qid, has_shost;
    uint8_t shost[CL_HOST_SIZE];
    int64_t store_ts, first = 0;
    batch bt;
    if (check_topic(a[0], &topic, &tlen) || check_queue_id(a[1], &qid) ||
        check_host(a[4], "store_host", "", shost, &has_shost) || store_ts_arg(a[3], &store_ts))
        return NULL;
    if (batch_build(c, a[2], (size_t)tlen, &bt)) {
        batch_free(&bt);
        return NULL;
    }
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&c->mu);
        rc = cl_append_locked(c, topic, (size_t)tlen, qid, bt.msgs, (size_t)bt.n, store_ts,
                              has_shost ? shost : NULL, bt.offsets, &first, &e);
        pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
    PyObject *res = NULL;
    if (rc)
        raise_err(&e);
    else {
        PyObject *offs = PyList_New(bt.n);
        for (Py_ssize_t i = 0; offs && i < bt.n; i++) {
            PyObject *v = PyLong_FromLongLong(bt.offsets[i]);
            if (!v)
                Py_CLEAR(offs);
            else
                PyList_SET_ITEM(offs, i, v);
        }
        if (offs)
            res = Py_BuildValue("(LLN)", (long long)first, (long long)store_ts, offs);
    }
    batch_free(&bt);
    return res;
}

/* reserved_keys: a tuple of str, each at most CL_MAX_RESERVED_KEY bytes of UTF-8 */
static int reserved_arg(PyObject *o, const char ***names, size_t **lens, size_t *n)
{
    *names = NULL;
    *lens = NULL;
    *n = 0;
    if (!o)
        return 0;
    if (!PyTuple_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "reserved_keys must be a tuple of str");
        return -1;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(o);
    *names = PyMem_Malloc((size_t)(k ? k : 1) * sizeof **names);
    *lens = PyMem_Malloc((size_t)(k ? k : 1) * sizeof **lens);
    if (!*names || !*lens) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *name = PyTuple_GET_ITEM(o, i);
        Py_ssize_t len;
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "reserved_keys must be a tuple of str");
            return -1;
        }
        if (!((*names)[i] = PyUnicode_AsUTF8AndSize(name, &len)))
            return -1;
        if (len > CL_MAX_RESERVED_KEY)
            return store_error("INVALID_ARGUMENT", "reserved key %zd is %zd bytes, the limit is %d", i, len,
                               CL_MAX_RESERVED_KEY),
                   -1;
        (*lens)[i] = (size_t)len;
    }
    *n = (size_t)k;
    return 0;
}

static PyObject *Log_append_packed(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[11];
    cl_log *c;
    if (nargs > 4) {
        PyErr_Format(PyExc_TypeError, "append_packed() takes 4 positional arguments but %zd were given", nargs);
        return NULL;
    }
    if (PARSE("append_packed", KW_PACKED, 4, 11, a) || !(c = log_of(self)) || check_open(c))
        return NULL;
    const char *topic;
    Py_ssize_t tlen;
    int qid, has_bhost, has_shost;
    uint8_t shost[CL_HOST_SIZE];
    int64_t store_ts, count, first = 0;
    cl_packed_rules r;
    memset(&r, 0, sizeof r);
    const char **rnames = NULL;
    size_t *rlens = NULL, nres = 0;
    Py_buffer b;
    b.obj = NULL;
    PyObject *offs = NULL, *res = NULL;
    if (check_topic(a[0], &topic, &tlen) || check_queue_id(a[1], &qid) ||
        check_host(a[5], "born_host", "", r.born_host, &has_bhost) ||
        check_host(a[6], "store_host", "", shost, &has_shost) || store_ts_arg(a[7], &store_ts) ||
        (a[4] && as_i32(a[4], &r.sys_flag, "sys_flag")) || opt_i64(a[8], 4194304, &r.max_body, NULL, "max_body") ||
        opt_i64(a[9], 32767, &r.max_props, NULL, "max_properties") || reserved_arg(a[10], &rnames, &rlens, &nres) ||
        as_i64(a[3], &count, NULL, "count") || PyObject_GetBuffer(a[2], &b, PyBUF_SIMPLE))
        goto out;
    r.topic_len = (size_t)tlen;
    r.seg_size = c->seg_size;
    r.reserved = rnames;
    r.reserved_len = rlens;
    r.nreserved = nres;
    /* the answer's buffer is made while we hold the GIL; a count the data cannot
     * hold fails the framing, so it needs none */
    if (count >= 1 && (uint64_t)count <= (uint64_t)b.len / CL_PACKED_HEADER &&
        !(offs = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)count * 8)))
        goto out;
    cl_err e;
    cl_msg *msgs;
    int rc;
    int64_t end = 0;
    Py_BEGIN_ALLOW_THREADS
        msgs = cl_packed_prepare(b.buf, (size_t)b.len, count, &r, &e);
        rc = msgs ? 0 : -1;
        if (!rc) {
            int64_t *offsets = (int64_t *)PyBytes_AS_STRING(offs);
            pthread_mutex_lock(&c->mu);
            rc = cl_append_locked(c, topic, (size_t)tlen, qid, msgs, (size_t)count, store_ts,
                                  has_shost ? shost : NULL, offsets, &first, &e);
            pthread_mutex_unlock(&c->mu);
            end = offsets[count - 1] + (int64_t)msgs[count - 1].size;
        }
        free(msgs);
    Py_END_ALLOW_THREADS
    if (rc)
        raise_err(&e);
    else
        res = Py_BuildValue("(LLLO)", (long long)first, (long long)store_ts, (long long)end, offs);
out:
    if (b.obj)
        PyBuffer_Release(&b);
    Py_XDECREF(offs);
    PyMem_Free(rnames);
    PyMem_Free(rlens);
    return res;
}

/* ---------------------------------------------------------------- reading */

/* the record at `offset`, pinned: *fp holds a reference for the caller; *seq for cl_copy_valid */
static int locate(cl_log *c, PyObject *arg, mfile **fp, size_t *rel, uint32_t *size, uint64_t *seq)
{
    int64_t off;
    int big;
    if (as_i64(arg, &off, &big, "offset"))
        return -1;
    cl_err e;
    lock_log(c);
    int rc = cl_check_read_offset_locked(c, off, 0, &e);
    if (!rc)
        rc = cl_record_at_locked(c, off, fp, rel, size, &e);
    if (!rc) {
        mf_ref(*fp);
        cl_note_read_locked(c, *fp, *rel, *size);
    }
    *seq = cl_truncations(c);
    unlock_log(c);
    if (rc)
        raise_err_arg(&e, big ? arg : NULL, off);
    return rc;
}

/* Readers copy what they located after letting go of the lock (the mapping is pinned); a truncation
 * meanwhile may have zeroed or rewritten those bytes, so they check cl_copy_valid and read again. */
static PyObject *Log_read(LogObject *self, PyObject *arg)
{
    cl_log *c = log_of(self);
    mfile *f;
    size_t rel;
    uint32_t size;
    uint64_t seq;
    for (;;) {
        if (!c || locate(c, arg, &f, &rel, &size, &seq))
            return NULL;
        PyObject *r = PyBytes_FromStringAndSize(f->base + rel, size);
        mf_unref(f);
        if (!r || cl_copy_valid(c, seq))
            return r;
        Py_DECREF(r);
    }
}

static PyObject *Log_read_view(LogObject *self, PyObject *arg)
{
    cl_log *c = log_of(self);
    mfile *f;
    size_t rel;
    uint32_t size;
    uint64_t seq; /* a view is no copy: a later truncation of its record changes what it shows */
    if (!c || locate(c, arg, &f, &rel, &size, &seq))
        return NULL;
    ViewObject *v = PyObject_New(ViewObject, &ViewType);
    if (!v) {
        mf_unref(f);
        return NULL;
    }
    v->f = f; /* the reference moves to the exporter */
    v->ptr = f->base + rel;
    v->len = size;
    PyObject *mv = PyMemoryView_FromObject((PyObject *)v);
    Py_DECREF(v);
    return mv;
}

static PyObject *Log_store_timestamp_at(LogObject *self, PyObject *arg)
{
    cl_log *c = log_of(self);
    mfile *f;
    size_t rel;
    uint32_t size;
    uint64_t seq;
    int64_t ts;
    do {
        if (!c || locate(c, arg, &f, &rel, &size, &seq))
            return NULL;
        memcpy(&ts, f->base + rel + F_STORE_TS, 8);
        mf_unref(f);
    } while (!cl_copy_valid(c, seq));
    return PyLong_FromLongLong(ts);
}

static PyObject *Log_scan(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[3];
    cl_log *c;
    int64_t off, count, limit, next = 0;
    int big_off, big_count;
    if (PARSE("scan", KW_SCAN, 1, 3, a) || !(c = log_of(self)) || as_i64(a[0], &off, &big_off, "offset") ||
        opt_i64(a[1], 1024, &count, &big_count, "max_count") || opt_i64(a[2], 4 << 20, &limit, NULL, "max_bytes"))
        return NULL;
    PyObject *res = NULL, *list = NULL;
    uint64_t seq;
    do {
        Py_XDECREF(list);
        cl_ents es = {0};
        cl_err e;
        lock_log(c);
        int rc = cl_scan_locked(c, off, count, limit, &es, &next, &e);
        seq = cl_truncations(c);
        unlock_log(c);
        if (rc) {
            cl_ents_release(&es);
            return raise_err_arg(&e, big_off ? a[0] : big_count ? a[1] : NULL, big_off ? off : count);
        }
        list = ents_to_list(&es, 1);
        cl_ents_release(&es);
        if (!list)
            return NULL;
    } while (!cl_copy_valid(c, seq));
    res = Py_BuildValue("(LN)", (long long)next, list);
    return res;
}

static PyObject *Log_read_raw(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    cl_log *c;
    int64_t off, len;
    int big_off, big_len;
    if (PARSE("read_raw", KW_RAW, 2, 2, a) || !(c = log_of(self)) || as_i64(a[0], &off, &big_off, "offset") ||
        as_i64(a[1], &len, &big_len, "length"))
        return NULL;
    PyObject *res = NULL;
    uint64_t seq;
    do {
        Py_XDECREF(res);
        res = NULL;
        cl_ents es = {0};
        cl_err e;
        lock_log(c);
        int rc = cl_read_raw_locked(c, off, len, &es, &e);
        seq = cl_truncations(c);
        unlock_log(c);
        if (rc)
            raise_err_arg(&e, big_off ? a[0] : big_len < 0 ? a[1] : NULL, big_off ? off : len);
        else if (!es.n)
            res = PyBytes_FromStringAndSize("", 0);
        else if (copy_out(&es, &res))
            res = NULL;
        cl_ents_release(&es);
        if (!res)
            return NULL;
    } while (!cl_copy_valid(c, seq));
    return res;
}

/* ------------------------------------------------------------ replication */

static PyObject *Log_read_replication(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    cl_log *c;
    int64_t off, max_bytes;
    int big_off, big_max;
    if (PARSE("read_replication", KW_REPL_READ, 2, 2, a) || !(c = log_of(self)) ||
        as_i64(a[0], &off, &big_off, "offset") || as_i64(a[1], &max_bytes, &big_max, "max_bytes"))
        return NULL;
    PyObject *res = NULL;
    uint64_t seq = 0;
    do { /* again after a truncation meanwhile: the bytes may have changed */
        Py_XDECREF(res);
        res = NULL;
        cl_ents es = {0};
        cl_err e;
        int rc;
        Py_BEGIN_ALLOW_THREADS
            pthread_mutex_lock(&c->mu);
            rc = cl_read_replication_locked(c, off, max_bytes, &es, &e);
            seq = cl_truncations(c);
            pthread_mutex_unlock(&c->mu);
        Py_END_ALLOW_THREADS
        if (rc)
            raise_err_arg(&e, big_off ? a[0] : big_max < 0 ? a[1] : NULL, big_off ? off : max_bytes);
        else {
            size_t total = 0;
            for (size_t i = 0; i < es.n; i++)
                total += es.v[i].len;
            res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
            if (res) { /* the ranges stay mapped: es holds a reference on each file */
                char *dst = PyBytes_AS_STRING(res);
                if (total >= BIG_COPY) {
                    Py_BEGIN_ALLOW_THREADS
                        for (size_t i = 0; i < es.n; dst += es.v[i].len, i++)
                            memcpy(dst, es.v[i].ptr, es.v[i].len);
                    Py_END_ALLOW_THREADS
                } else
                    for (size_t i = 0; i < es.n; dst += es.v[i].len, i++)
                        memcpy(dst, es.v[i].ptr, es.v[i].len);
            }
        }
        cl_ents_release(&es);
        if (!res)
            return NULL;
    } while (!cl_copy_valid(c, seq));
    return res;
}

static PyObject *Log_append_replicated(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    cl_log *c;
    int64_t off;
    int big;
    if (PARSE("append_replicated", KW_REPL_APPEND, 2, 2, a) || !(c = log_of(self)) || check_open(c) ||
        as_i64(a[0], &off, &big, "offset"))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(a[1], &b, PyBUF_SIMPLE))
        return NULL;
    /* bytes cannot change while the GIL is released; any other buffer is copied
     * first, so the run that was checked is the run that is written */
    int copy = !PyBytes_CheckExact(a[1]) && b.len > 0;
    cl_err e;
    int rc;
    int64_t end = 0;
    Py_BEGIN_ALLOW_THREADS
        char *own = copy ? malloc((size_t)b.len) : NULL;
        if (copy && !own)
            rc = cl_oserr(&e, ENOMEM, "out of memory");
        else {
            if (own)
                memcpy(own, b.buf, (size_t)b.len);
            rc = cl_append_replicated(c, off, own ? own : b.buf, (size_t)b.len, &end, &e);
        }
        free(own);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (rc)
        return raise_err_arg(&e, big ? a[0] : NULL, off);
    return PyLong_FromLongLong(end);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* the int members of a set, sorted (others can never equal an int64 tag) */
static int tags_from_set(PyObject *set, int64_t **tags, size_t *n)
{
    Py_ssize_t cap = PySet_GET_SIZE(set);
    *tags = PyMem_Malloc((size_t)(cap ? cap : 1) * sizeof **tags);
    *n = 0;
    if (!*tags) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *it = PyObject_GetIter(set), *item;
    if (!it)
        return -1;
    while ((item = PyIter_Next(it))) {
        int ovf = 0;
        long long v = 0;
        int ok = 0;
        if (PyLong_Check(item)) {
            v = PyLong_AsLongLongAndOverflow(item, &ovf);
            ok = !ovf && !(v == -1 && PyErr_Occurred());
        } else if (PyFloat_Check(item)) { /* 5.0 == 5 in a set */
            double d = PyFloat_AS_DOUBLE(item);
            ok = d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == (double)(long long)d;
            v = ok ? (long long)d : 0;
        }
        Py_DECREF(item);
        PyErr_Clear();
        if (ok && (Py_ssize_t)*n < cap)
            (*tags)[(*n)++] = v;
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return -1;
    if (*n)
        qsort(*tags, *n, sizeof **tags, cmp_i64);
    return 0;
}

/* UTF-8 of a str key, or NULL (unknown queue) for anything else */
static const char *topic_key(PyObject *topic, Py_ssize_t *n)
{
    if (!PyUnicode_Check(topic))
        return NULL;
    const char *s = PyUnicode_AsUTF8AndSize(topic, n);
    if (!s)
        PyErr_Clear();
    return s;
}

/* The records get and read_packed return (pinned in es) and next_queue_offset. */
static int get_locate(LogObject *self, const char *fname, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames, cl_ents *es, PyObject **nx, uint64_t *seq)
{
    PyObject *a[6];
    cl_log *c;
    int64_t qoff, count, limit, qid, next = 0;
    int big_off, big_count, big_qid;
    if (parse_args(fname, args, nargs, kwnames, KW_GET.interned, KW_GET.names, 4, 6, a) || !(c = log_of(self)) ||
        check_open(c) || as_i64(a[2], &qoff, &big_off, "queue_offset") ||
        as_i64(a[3], &count, &big_count, "max_count") || opt_i64(a[5], 0, &limit, NULL, "max_bytes") ||
        as_i64(a[1], &qid, &big_qid, "queue_id"))
        return -1;
    PyObject *tagset = a[4] && a[4] != Py_None ? a[4] : NULL;
    if (tagset && !PyAnySet_Check(tagset)) {
        PyErr_SetString(PyExc_TypeError, "tag_hashes must be a set or frozenset");
        return -1;
    }
    int64_t *tags = NULL;
    size_t ntags = 0;
    if (tagset && tags_from_set(tagset, &tags, &ntags)) {
        PyMem_Free(tags);
        return -1;
    }
    Py_ssize_t tlen = 0;
    const char *topic = topic_key(a[0], &tlen);
    cl_err e;
    lock_log(c);
    cl_queue *q = topic && !big_qid ? cl_find_queue_locked(c, topic, (size_t)tlen, qid) : NULL;
    int rc = cl_get_locked(c, q, qoff, count, tags, ntags, tagset != NULL, limit, es, &next, &e);
    *seq = cl_truncations(c);
    unlock_log(c);
    PyMem_Free(tags);
    if (rc) {
        cl_ents_release(es);
        raise_err_arg(&e, big_off ? a[2] : big_count ? a[3] : NULL, big_off ? qoff : count);
        return -1;
    }
    if (!(*nx = big_off ? PyNumber_Index(a[2]) : PyLong_FromLongLong(next))) {
        cl_ents_release(es);
        return -1;
    }
    return 0;
}

static PyObject *Log_get(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    for (;;) {
        cl_ents es = {0};
        PyObject *nx;
        uint64_t seq;
        if (get_locate(self, "get", args, nargs, kwnames, &es, &nx, &seq))
            return NULL;
        PyObject *list = ents_to_list(&es, 0);
        cl_ents_release(&es);
        int again = list && !cl_copy_valid(self->c, seq); /* a truncation meanwhile: read again */
        PyObject *res = list && !again ? PyTuple_Pack(2, nx, list) : NULL;
        Py_XDECREF(list);
        Py_DECREF(nx);
        if (!again)
            return res;
    }
}

static PyObject *Log_read_packed(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    cl_ents es = {0};
    PyObject *nx;
    uint64_t seq;
again:
    if (get_locate(self, "read_packed", args, nargs, kwnames, &es, &nx, &seq))
        return NULL;
    size_t total = 0;
    for (size_t i = 0; i < es.n; i++)
        total += es.v[i].len;
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total), *res = NULL;
    if (data) {
        char *dst = PyBytes_AS_STRING(data);
        /* one copy of every record; the mappings are pinned by es, not by the lock */
        if (total >= BIG_COPY) {
            Py_BEGIN_ALLOW_THREADS
                for (size_t i = 0; i < es.n; dst += es.v[i].len, i++)
                    memcpy(dst, es.v[i].ptr, es.v[i].len);
            Py_END_ALLOW_THREADS
        } else
            for (size_t i = 0; i < es.n; dst += es.v[i].len, i++)
                memcpy(dst, es.v[i].ptr, es.v[i].len);
        if (!cl_copy_valid(self->c, seq)) { /* a truncation meanwhile: read again */
            Py_DECREF(data);
            cl_ents_release(&es);
            Py_DECREF(nx);
            goto again;
        }
        res = Py_BuildValue("(OnN)", nx, (Py_ssize_t)es.n, data);
    }
    cl_ents_release(&es);
    Py_DECREF(nx);
    return res;
}

/* ---------------------------------------------------------- queues/segments */

static PyObject *queue_topic(cl_queue *q)
{
    if (!q->py_topic) {
        PyObject *t = PyUnicode_DecodeFSDefaultAndSize(q->topic, (Py_ssize_t)q->topic_len);
        if (!t)
            return NULL;
        if (q->py_topic) /* filled meanwhile (decoding may run other threads) */
            Py_DECREF(t);
        else
            q->py_topic = t;
    }
    return Py_NewRef((PyObject *)q->py_topic);
}

static PyObject *Log_consume_queue(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    cl_log *c;
    int64_t qid;
    int big;
    if (PARSE("consume_queue", KW_QUEUE, 2, 2, a) || !(c = log_of(self)) || check_open(c) ||
        as_i64(a[1], &qid, &big, "queue_id"))
        return NULL;
    Py_ssize_t tlen = 0;
    const char *topic = topic_key(a[0], &tlen);
    lock_log(c);
    int closed = c->closed;
    cl_queue *q = topic && !big && !closed ? cl_find_queue_locked(c, topic, (size_t)tlen, qid) : NULL;
    if (q && !q->nfiles) /* every unit truncated away: as if never written */
        q = NULL;
    unlock_log(c);
    if (closed)
        return store_error("CLOSED", "commit log is closed");
    if (!q)
        Py_RETURN_NONE;
    QueueObject *o = PyObject_New(QueueObject, &QueueType);
    if (!o)
        return NULL;
    o->log = (LogObject *)Py_NewRef(self); /* queues live as long as the log object */
    o->q = q;
    return (PyObject *)o;
}

static PyObject *Log_queues(LogObject *self, PyObject *unused)
{
    cl_log *c = log_of(self);
    if (!c)
        return NULL;
    lock_log(c);
    int closed = c->closed;
    size_t n = 0;
    cl_queue **qs = closed ? NULL : malloc((c->nqueues ? c->nqueues : 1) * sizeof *qs);
    for (size_t i = 0; qs && i < c->nqueues; i++)
        if (c->queues[i]->nfiles) /* not one truncated away */
            qs[n++] = c->queues[i];
    unlock_log(c);
    if (closed)
        return store_error("CLOSED", "commit log is closed");
    if (!qs)
        return PyErr_NoMemory();
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *t = queue_topic(qs[i]);
        PyObject *tup = t ? Py_BuildValue("(NL)", t, (long long)qs[i]->queue_id) : NULL;
        if (!tup)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, tup);
    }
    free(qs);
    if (list && PyList_Sort(list))
        Py_CLEAR(list);
    return list;
}

static PyObject *Log_segments(LogObject *self, PyObject *unused)
{
    cl_log *c = log_of(self);
    if (!c)
        return NULL;
    lock_log(c);
    int closed = c->closed;
    size_t n = c->nsegs;
    mfile **fs = closed ? NULL : malloc((n ? n : 1) * sizeof *fs);
    for (size_t i = 0; fs && i < n; i++) {
        fs[i] = c->segs[i];
        mf_ref(fs[i]); /* the path must survive a concurrent delete */
    }
    unlock_log(c);
    if (closed)
        return store_error("CLOSED", "commit log is closed");
    if (!fs)
        return PyErr_NoMemory();
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; i < n; i++) {
        PyObject *tup = list ? Py_BuildValue("(LN)", (long long)fs[i]->start, PyUnicode_DecodeFSDefault(fs[i]->path))
                             : NULL;
        if (list && !tup)
            Py_CLEAR(list);
        else if (list)
            PyList_SET_ITEM(list, (Py_ssize_t)i, tup);
        mf_unref(fs[i]);
    }
    free(fs);
    return list;
}

static PyObject *Log_delete_segments_before(LogObject *self, PyObject *arg)
{
    cl_log *c = log_of(self);
    int64_t off, deleted = 0;
    int big;
    if (!c || as_i64(arg, &off, &big, "offset"))
        return NULL;
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&c->mu);
        rc = cl_delete_segments_before_locked(c, off, &deleted, &e);
        pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
    if (rc)
        return raise_err(&e);
    return PyLong_FromLongLong(deleted);
}

/* ------------------------------------------------------------------ Raft */

static PyObject *Log_truncate(LogObject *self, PyObject *arg)
{
    cl_log *c = log_of(self);
    int64_t off, end = 0;
    int big;
    if (!c || as_i64(arg, &off, &big, "offset"))
        return NULL;
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = cl_truncate(c, off, &end, &e);
    Py_END_ALLOW_THREADS
    if (rc)
        return raise_err_arg(&e, big ? arg : NULL, off);
    return PyLong_FromLongLong(end);
}

static PyObject *Log_set_visible_offset(LogObject *self, PyObject *arg)
{
    cl_log *c = log_of(self);
    int64_t v = CL_NO_LIMIT;
    if (!c || (arg != Py_None && as_i64(arg, &v, NULL, "visible offset")))
        return NULL;
    if (v < 0)
        return store_error("INVALID_ARGUMENT", "visible offset must be >= 0, got %lld", (long long)v);
    lock_log(c);
    int closed = c->closed;
    if (!closed)
        c->visible = v;
    unlock_log(c);
    if (closed)
        return store_error("CLOSED", "commit log is closed");
    Py_RETURN_NONE;
}

static PyObject *Log_get_prefault_readahead(LogObject *self, void *x)
{
    cl_log *c = log_of(self);
    if (!c)
        return NULL;
    lock_log(c);
    int v = c->pf_readahead;
    unlock_log(c);
    return PyBool_FromLong(v);
}

static int Log_set_prefault_readahead(LogObject *self, PyObject *value, void *x)
{
    cl_log *c = log_of(self);
    if (!c)
        return -1;
    if (!value) {
        PyErr_SetString(PyExc_AttributeError, "prefault_readahead cannot be deleted");
        return -1;
    }
    int v = PyObject_IsTrue(value);
    if (v < 0)
        return -1;
    lock_log(c);
    c->pf_readahead = v;
    unlock_log(c);
    return 0;
}

static PyObject *Log_get_visible(LogObject *self, void *x)
{
    cl_log *c = log_of(self);
    if (!c)
        return NULL;
    lock_log(c);
    int64_t v = c->visible;
    unlock_log(c);
    if (v == CL_NO_LIMIT)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

static PyObject *Log_queues_in_range(LogObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    cl_log *c;
    int64_t start, end;
    int big_start, big_end;
    if (PARSE("queues_in_range", KW_RANGE, 2, 2, a) || !(c = log_of(self)) ||
        as_i64(a[0], &start, &big_start, "start") || as_i64(a[1], &end, &big_end, "end"))
        return NULL;
    cl_queue **qs = NULL;
    size_t n = 0;
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = cl_queues_in_range(c, start, end, &qs, &n, &e);
    Py_END_ALLOW_THREADS
    if (rc)
        /* only a value below int64 can show in an error (one above clamps to an empty range) */
        return raise_err_arg(&e, big_start < 0 ? a[0] : big_end < 0 ? a[1] : NULL, big_start < 0 ? start : end);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) { /* queues are never freed while the log object lives */
        PyObject *t = queue_topic(qs[i]);
        PyObject *tup = t ? Py_BuildValue("(NL)", t, (long long)qs[i]->queue_id) : NULL;
        if (!tup)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, tup);
    }
    free(qs);
    return list;
}

static PyObject *Log_flush(LogObject *self, PyObject *unused)
{
    cl_log *c = log_of(self);
    if (!c)
        return NULL;
    int64_t flushed = 0;
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = cl_flush(c, &flushed, &e);
    Py_END_ALLOW_THREADS
    if (rc)
        return raise_err(&e);
    return PyLong_FromLongLong(flushed);
}

static PyObject *Log_flush_log(LogObject *self, PyObject *unused)
{
    cl_log *c = log_of(self);
    if (!c)
        return NULL;
    int64_t flushed = 0;
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = cl_flush_log(c, &flushed, &e);
    Py_END_ALLOW_THREADS
    if (rc)
        return raise_err(&e);
    return PyLong_FromLongLong(flushed);
}

/* ------------------------------------------------------------ group-commit syncer */

static PyObject *Log_start_syncer(LogObject *self, PyObject *unused)
{
    cl_log *c = log_of(self);
    if (!c || check_open(c))
        return NULL;
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS /* it reads the synced offset under mu */
        rc = cl_syncer_start(c, &e);
    Py_END_ALLOW_THREADS
    if (rc)
        return raise_err(&e);
    Py_RETURN_NONE;
}

static PyObject *Log_stop_syncer(LogObject *self, PyObject *unused)
{
    cl_log *c = self->c;
    if (c) {
        Py_BEGIN_ALLOW_THREADS
            cl_syncer_stop(c);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Log_request_sync(LogObject *self, PyObject *arg)
{
    cl_log *c = log_of(self);
    int64_t offset;
    if (!c || as_i64(arg, &offset, NULL, "offset"))
        return NULL;
    /* as lock_log: never block on a lock with the GIL held (a thread holding mu may be waiting for it) */
    if (cl_syncer_request(c, offset, 1) < 0) {
        Py_BEGIN_ALLOW_THREADS
            cl_syncer_request(c, offset, 0);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Log_wait_log_flushed(LogObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    cl_log *c = log_of(self);
    int64_t offset;
    if (!c)
        return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait_log_flushed(offset, timeout_s) takes 2 arguments");
        return NULL;
    }
    double timeout_s = PyFloat_AsDouble(args[1]);
    if ((timeout_s == -1.0 && PyErr_Occurred()) || as_i64(args[0], &offset, NULL, "offset"))
        return NULL;
    int covered;
    Py_BEGIN_ALLOW_THREADS
        covered = cl_syncer_wait(c, offset, timeout_s);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(covered);
}

static PyObject *syncer_notifier(LogObject *self, PyObject *arg, int add)
{
    cl_log *c = log_of(self);
    if (!c)
        return NULL;
    int fd = PyObject_AsFileDescriptor(arg);
    if (fd < 0)
        return NULL;
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = cl_syncer_notify(c, fd, add, &e);
    Py_END_ALLOW_THREADS
    if (rc)
        return raise_err(&e);
    Py_RETURN_NONE;
}

static PyObject *Log_add_sync_notifier(LogObject *self, PyObject *arg) { return syncer_notifier(self, arg, 1); }

static PyObject *Log_remove_sync_notifier(LogObject *self, PyObject *arg) { return syncer_notifier(self, arg, 0); }

static PyObject *Log_syncer_state(LogObject *self, PyObject *unused)
{
    uint64_t syncs = 0, failures = 0;
    char msg[256] = "";
    if (self->c) {
        Py_BEGIN_ALLOW_THREADS
            cl_syncer_counts(self->c, &syncs, &failures, msg, sizeof msg);
        Py_END_ALLOW_THREADS
    }
    return Py_BuildValue("(KKs)", (unsigned long long)syncs, (unsigned long long)failures, msg);
}

static PyObject *Log_release_page_cache(LogObject *self, PyObject *arg)
{
    cl_log *c = log_of(self);
    int64_t keep = 0;
    if (!c || as_i64(arg, &keep, NULL, "keep"))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
        cl_release_cache(c, keep);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Log_close(LogObject *self, PyObject *unused)
{
    cl_log *c = self->c;
    if (!c)
        Py_RETURN_NONE;
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = cl_close(c, &e);
    Py_END_ALLOW_THREADS
    if (rc)
        return raise_err(&e);
    Py_RETURN_NONE;
}

static PyObject *Log_enter(LogObject *self, PyObject *unused) { return Py_NewRef((PyObject *)self); }

static PyObject *Log_exit(LogObject *self, PyObject *args)
{
    return Log_close(self, NULL); /* None: exceptions propagate */
}

/* ------------------------------------------------------------ lifecycle */

static int Log_init(LogObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"root", "segment_size", "cq_units_per_file", "check_from", NULL};
    PyObject *root, *seg_o = NULL, *cq_o = NULL, *cf_o = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OOO:CommitLog", kwlist, &root, &seg_o, &cq_o, &cf_o))
        return -1;
    int64_t seg, cq, cf;
    int big_seg, big_cq, big_cf;
    if (opt_i64(seg_o, (int64_t)1 << 30, &seg, &big_seg, "segment_size") ||
        opt_i64(cq_o, 300000, &cq, &big_cq, "cq_units_per_file") || opt_i64(cf_o, 0, &cf, &big_cf, "check_from"))
        return -1;
    if (big_seg || seg < CL_MIN_SEGMENT || seg % CL_MIN_SEGMENT)
        return store_error("INVALID_ARGUMENT", "segment_size must be a multiple of 4096 and at least 4096, got %S",
                           seg_o),
               -1;
    if (big_cq < 0 || cq < 1)
        return store_error("INVALID_ARGUMENT", "cq_units_per_file must be positive, got %S", cq_o), -1;
    if (big_cq > 0 || cq > INT64_MAX / CL_UNIT_SIZE)
        return PyErr_SetString(PyExc_OverflowError, "cq_units_per_file is too large"), -1;
    if (big_cf < 0 || cf < 0)
        return store_error("INVALID_ARGUMENT", "check_from must be >= 0, got %S", cf_o), -1;
    PyObject *path = PyOS_FSPath(root);
    if (!path)
        return -1;
    if (!PyUnicode_Check(path)) {
        PyErr_Format(PyExc_TypeError, "root must be a str path, not %s", Py_TYPE(path)->tp_name);
        Py_DECREF(path);
        return -1;
    }
    PyObject *encoded = PyUnicode_EncodeFSDefault(path);
    if (!encoded || (size_t)PyBytes_GET_SIZE(encoded) != strlen(PyBytes_AS_STRING(encoded))) {
        if (encoded)
            PyErr_SetString(PyExc_ValueError, "embedded null byte");
        Py_XDECREF(encoded);
        Py_DECREF(path);
        return -1;
    }
    cl_log *c = cl_log_new(PyBytes_AS_STRING(encoded), seg, cq);
    Py_DECREF(encoded);
    if (!c) {
        Py_DECREF(path);
        PyErr_NoMemory();
        return -1;
    }
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = cl_log_open(c, cf, &e);
        if (rc)
            cl_log_free(c);
    Py_END_ALLOW_THREADS
    if (rc) {
        Py_DECREF(path);
        raise_err_arg(&e, big_cf ? cf_o : NULL, cf);
        return -1;
    }
    cl_log *old = self->c;
    self->c = c;
    Py_XSETREF(self->root, path);
    if (old) { /* __init__ called twice: drop the previous log */
        Py_BEGIN_ALLOW_THREADS
            cl_log_free(old);
        Py_END_ALLOW_THREADS
    }
    return 0;
}

static void Log_dealloc(LogObject *self)
{
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    cl_log *c = self->c;
    if (c) {
        for (size_t i = 0; i < c->nqueues; i++)
            Py_CLEAR(*(PyObject **)&c->queues[i]->py_topic);
        Py_BEGIN_ALLOW_THREADS
            cl_log_free(c); /* flushes if still open */
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->root);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Log_repr(LogObject *self)
{
    return PyUnicode_FromFormat("<CommitLog root=%R%s>", self->root ? self->root : Py_None,
                                self->c && !self->c->closed ? "" : " closed");
}

/* -------------------------------------------------------------- properties */

static PyObject *Log_get_root(LogObject *self, void *x) { return Py_NewRef(self->root ? self->root : Py_None); }

static PyObject *Log_get_segment_size(LogObject *self, void *x)
{
    cl_log *c = log_of(self);
    return c ? PyLong_FromLongLong(c->seg_size) : NULL;
}

static PyObject *Log_get_cq_units(LogObject *self, void *x)
{
    cl_log *c = log_of(self);
    return c ? PyLong_FromLongLong(c->cq_units) : NULL;
}

enum { P_MIN, P_MAX, P_FLUSHED, P_LOG_FLUSHED, P_CLOSED };

static PyObject *log_counter(LogObject *self, int which)
{
    cl_log *c = log_of(self);
    if (!c)
        return NULL;
    lock_log(c);
    int64_t v = which == P_MIN           ? cl_min_offset_locked(c)
                : which == P_MAX         ? c->max
                : which == P_FLUSHED     ? c->flushed
                : which == P_LOG_FLUSHED ? c->log_flushed
                                         : c->closed;
    unlock_log(c);
    if (which == P_CLOSED)
        return PyBool_FromLong((long)v);
    return PyLong_FromLongLong(v);
}

static PyObject *Log_get_min(LogObject *self, void *x) { return log_counter(self, P_MIN); }
static PyObject *Log_get_max(LogObject *self, void *x) { return log_counter(self, P_MAX); }
static PyObject *Log_get_flushed(LogObject *self, void *x) { return log_counter(self, P_FLUSHED); }
static PyObject *Log_get_log_flushed(LogObject *self, void *x) { return log_counter(self, P_LOG_FLUSHED); }
static PyObject *Log_get_closed(LogObject *self, void *x)
{
    return self->c ? log_counter(self, P_CLOSED) : Py_NewRef(Py_True);
}

static PyObject *Log_get_recovery(LogObject *self, void *x)
{
    cl_log *c = log_of(self);
    if (!c)
        return NULL;
    const cl_recovery *r = &c->rec;
    return Py_BuildValue("{sLsLsLsLsLsLsL}", "check_from", (long long)r->check_from, "end_offset",
                         (long long)r->end_offset, "records_checked", (long long)r->records_checked, "torn",
                         (long long)r->torn, "discarded_segments", (long long)r->discarded_segments,
                         "cq_units_truncated", (long long)r->cq_units_truncated, "cq_units_redone",
                         (long long)r->cq_units_redone);
}

static PyMethodDef Log_methods[] = {
    {"append", (PyCFunction)(void (*)(void))Log_append, METH_FASTCALL | METH_KEYWORDS,
     "append(topic, queue_id, body, properties=b'', tag_hash=0, flag=0, sys_flag=0, born_timestamp=0, "
     "born_host=None, store_timestamp=0, store_host=None, reconsume_times=0, prepared_offset=0)\n--\n\n"
     "Append one record and its consume-queue unit; returns (commitlog_offset, queue_offset, store_timestamp)."},
    {"append_batch", (PyCFunction)(void (*)(void))Log_append_batch, METH_FASTCALL | METH_KEYWORDS,
     "append_batch(topic, queue_id, messages, store_timestamp=0, store_host=None)\n--\n\n"
     "Append records to one queue in one lock hold; returns (first_queue_offset, store_timestamp, offsets)."},
    {"read", (PyCFunction)Log_read, METH_O, "read(offset)\n--\n\nThe whole record at offset (a copy)."},
    {"read_view", (PyCFunction)Log_read_view, METH_O,
     "read_view(offset)\n--\n\nThe record at offset as a read-only memoryview of the mapping (kept mapped)."},
    {"store_timestamp_at", (PyCFunction)Log_store_timestamp_at, METH_O,
     "store_timestamp_at(offset)\n--\n\nstore_timestamp of the record at offset."},
    {"scan", (PyCFunction)(void (*)(void))Log_scan, METH_FASTCALL | METH_KEYWORDS,
     "scan(offset, max_count=1024, max_bytes=4194304)\n--\n\nRecords in log order: (next_offset, [(offset, record)])."},
    {"read_raw", (PyCFunction)(void (*)(void))Log_read_raw, METH_FASTCALL | METH_KEYWORDS,
     "read_raw(offset, length)\n--\n\nRaw bytes clipped to max_offset and to the segment end."},
    {"get", (PyCFunction)(void (*)(void))Log_get, METH_FASTCALL | METH_KEYWORDS,
     "get(topic, queue_id, queue_offset, max_count, tag_hashes=None, max_bytes=0)\n--\n\n"
     "Read through the consume queue: (next_queue_offset, [(queue_offset, commitlog_offset, record)])."},
    {"append_packed", (PyCFunction)(void (*)(void))Log_append_packed, METH_FASTCALL | METH_KEYWORDS,
     "append_packed(topic, queue_id, data, count, *, sys_flag=0, born_host=None, store_host=None, "
     "store_timestamp=0, max_body=4194304, max_properties=32767, reserved_keys=())\n--\n\n"
     "Validate a packed batch and append it to one queue in one lock hold; returns "
     "(first_queue_offset, store_timestamp, end_offset, offsets)."},
    {"append_replicated", (PyCFunction)(void (*)(void))Log_append_replicated, METH_FASTCALL | METH_KEYWORDS,
     "append_replicated(offset, data)\n--\n\n"
     "Append a run of the master's whole records at offset == max_offset, byte for byte; returns the new max_offset."},
    {"read_replication", (PyCFunction)(void (*)(void))Log_read_replication, METH_FASTCALL | METH_KEYWORDS,
     "read_replication(offset, max_bytes)\n--\n\n"
     "Whole records (and blank markers) from the boundary offset, up to max_bytes (at least one): what a slave appends."},
    {"read_packed", (PyCFunction)(void (*)(void))Log_read_packed, METH_FASTCALL | METH_KEYWORDS,
     "read_packed(topic, queue_id, queue_offset, max_count, tag_hashes=None, max_bytes=0)\n--\n\n"
     "Like get, but the records concatenated: (next_queue_offset, count, data)."},
    {"consume_queue", (PyCFunction)(void (*)(void))Log_consume_queue, METH_FASTCALL | METH_KEYWORDS,
     "consume_queue(topic, queue_id)\n--\n\nThe queue's index, or None."},
    {"queues", (PyCFunction)Log_queues, METH_NOARGS, "queues()\n--\n\nEvery (topic, queue_id), sorted."},
    {"segments", (PyCFunction)Log_segments, METH_NOARGS, "segments()\n--\n\n(start_offset, path) of every segment."},
    {"delete_segments_before", (PyCFunction)Log_delete_segments_before, METH_O,
     "delete_segments_before(offset)\n--\n\nDelete whole segments ending at or before offset (never the newest)."},
    {"truncate", (PyCFunction)Log_truncate, METH_O,
     "truncate(offset)\n--\n\nCut the log back to the entry boundary offset (records, units, segments after it go); "
     "returns the new max_offset."},
    {"set_visible_offset", (PyCFunction)Log_set_visible_offset, METH_O,
     "set_visible_offset(offset)\n--\n\nget/read_packed and ConsumeQueue.visible_max_offset stop at units pointing "
     "at or past offset; None: no limit."},
    {"queues_in_range", (PyCFunction)(void (*)(void))Log_queues_in_range, METH_FASTCALL | METH_KEYWORDS,
     "queues_in_range(start, end)\n--\n\n(topic, queue_id) of the records starting in [start, end), in order of "
     "first appearance."},
    {"flush", (PyCFunction)Log_flush, METH_NOARGS,
     "flush()\n--\n\nfdatasync the log and the consume queues up to the current end; returns flushed_offset."},
    {"flush_log", (PyCFunction)Log_flush_log, METH_NOARGS,
     "flush_log()\n--\n\nfdatasync the log alone up to the current end; returns log_flushed_offset."},
    {"start_syncer", (PyCFunction)Log_start_syncer, METH_NOARGS,
     "start_syncer()\n--\n\nStart the group-commit thread (again after stop_syncer): it runs flush_log back to back "
     "while a request_sync asks for more than a started sync covers, without the GIL."},
    {"stop_syncer", (PyCFunction)Log_stop_syncer, METH_NOARGS,
     "stop_syncer()\n--\n\nStop and join the group-commit thread; blocked waits return (close stops it too)."},
    {"request_sync", (PyCFunction)Log_request_sync, METH_O,
     "request_sync(offset)\n--\n\nAsk the group-commit thread for a sync covering offset (a record's end)."},
    {"wait_log_flushed", (PyCFunction)(void (*)(void))Log_wait_log_flushed, METH_FASTCALL,
     "wait_log_flushed(offset, timeout_s)\n--\n\nBlock, the GIL released, until log_flushed_offset >= offset: "
     "True, or False at the timeout or once the thread stopped."},
    {"add_sync_notifier", (PyCFunction)Log_add_sync_notifier, METH_O,
     "add_sync_notifier(fd)\n--\n\nWrite 1 (8 bytes) to the eventfd after each sync of the group-commit thread."},
    {"remove_sync_notifier", (PyCFunction)Log_remove_sync_notifier, METH_O,
     "remove_sync_notifier(fd)\n--\n\nNo more writes to fd once this returns (it may be closed then)."},
    {"syncer_state", (PyCFunction)Log_syncer_state, METH_NOARGS,
     "syncer_state()\n--\n\n(syncs completed, syncs failed, the last failure's text or '')."},
    {"release_page_cache", (PyCFunction)Log_release_page_cache, METH_O,
     "release_page_cache(keep)\n--\n\nDrop the log's durable pages more than keep bytes behind the end from the "
     "page cache (in steps of 16 MiB or more; keep <= 0: nothing)."},
    {"close", (PyCFunction)Log_close, METH_NOARGS, "close()\n--\n\nFlush and unmap everything; idempotent."},
    {"__enter__", (PyCFunction)Log_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Log_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Log_getset[] = {
    {"root", (getter)Log_get_root, NULL, "the directory of the store", NULL},
    {"segment_size", (getter)Log_get_segment_size, NULL, "bytes per segment file", NULL},
    {"cq_units_per_file", (getter)Log_get_cq_units, NULL, "units per consume-queue file", NULL},
    {"min_offset", (getter)Log_get_min, NULL, "start offset of the oldest segment (0 for an empty log)", NULL},
    {"max_offset", (getter)Log_get_max, NULL, "end of the last record", NULL},
    {"flushed_offset", (getter)Log_get_flushed, NULL, "the log and the queues are fdatasync'ed below it", NULL},
    {"log_flushed_offset", (getter)Log_get_log_flushed, NULL, "the log is fdatasync'ed below it", NULL},
    {"closed", (getter)Log_get_closed, NULL, "True after close()", NULL},
    {"recovery", (getter)Log_get_recovery, NULL, "what opening found", NULL},
    {"visible_offset", (getter)Log_get_visible, NULL, "the visibility limit of the queue readers, or None", NULL},
    {"prefault_readahead", (getter)Log_get_prefault_readahead, (setter)Log_set_prefault_readahead,
     "the pre-fault thread faults pages in with readahead (large folios; for logs synced seldom)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject LogType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkmq.storage_native._commitlog.CommitLog",
    .tp_basicsize = sizeof(LogObject),
    .tp_dealloc = (destructor)Log_dealloc,
    .tp_repr = (reprfunc)Log_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "CommitLog(root, segment_size=1<<30, cq_units_per_file=300000, check_from=0)\n--\n\n"
              "Append-only log of mmap'd segments plus the consume queues its appends write.",
    .tp_weaklistoffset = offsetof(LogObject, weakreflist),
    .tp_methods = Log_methods,
    .tp_getset = Log_getset,
    .tp_init = (initproc)Log_init,
    .tp_new = PyType_GenericNew,
};

/* ----------------------------------------------------------- ConsumeQueue */

/* lock + CLOSED check; returns the log locked, or NULL with an exception set */
static cl_log *queue_lock(QueueObject *self)
{
    cl_log *c = log_of(self->log);
    if (!c)
        return NULL;
    lock_log(c);
    if (c->closed) {
        unlock_log(c);
        store_error("CLOSED", "commit log is closed");
        return NULL;
    }
    return c;
}

/* offset checks of unit/units; mu held */
static int queue_check(cl_queue *q, int64_t off, int allow_max, cl_err *e)
{
    if (off < 0)
        return cl_fail(e, CL_INVALID_ARGUMENT, "queue offset must be >= 0, got %lld", (long long)off);
    if (off < q->min)
        return cl_fail(e, CL_OFFSET_TOO_SMALL, "queue offset %lld is below the minimum queue offset %lld",
                       (long long)off, (long long)q->min);
    if (off > q->max || (off == q->max && !allow_max))
        return cl_fail(e, CL_OFFSET_OVERFLOW, "queue offset %lld is at or past the maximum queue offset %lld",
                       (long long)off, (long long)q->max);
    return 0;
}

static PyObject *Queue_unit(QueueObject *self, PyObject *arg)
{
    int64_t off, clo = 0, tag = 0;
    int32_t size = 0;
    int big;
    cl_log *c;
    if (as_i64(arg, &off, &big, "queue_offset") || !(c = queue_lock(self)))
        return NULL;
    cl_err e;
    int rc = queue_check(self->q, off, 0, &e);
    if (!rc)
        cl_queue_unit_locked(c, self->q, off, &clo, &size, &tag);
    unlock_log(c);
    if (rc)
        return raise_err_arg(&e, big ? arg : NULL, off);
    return Py_BuildValue("(LiL)", (long long)clo, (int)size, (long long)tag);
}

typedef struct unit3 {
    int64_t clo, tag;
    int32_t size;
} unit3;

static PyObject *Queue_units(QueueObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    int64_t off, count;
    int big_off, big_count;
    cl_log *c;
    if (PARSE("units", KW_UNITS, 2, 2, a) || as_i64(a[0], &off, &big_off, "queue_offset") ||
        as_i64(a[1], &count, &big_count, "max_count") || !(c = queue_lock(self)))
        return NULL;
    cl_err e;
    cl_queue *q = self->q;
    unit3 *v = NULL;
    int64_t n = 0;
    int rc = queue_check(q, off, 1, &e);
    if (!rc && count < 1)
        rc = cl_fail(&e, CL_INVALID_ARGUMENT, "max_count must be >= 1, got %lld", (long long)count);
    if (!rc) {
        n = q->max - off < count ? q->max - off : count;
        if (n && !(v = malloc((size_t)n * sizeof *v)))
            rc = -2;
        for (int64_t i = 0; i < n && v; i++)
            cl_queue_unit_locked(c, q, off + i, &v[i].clo, &v[i].size, &v[i].tag);
    }
    unlock_log(c);
    if (rc == -2)
        return PyErr_NoMemory();
    if (rc)
        return raise_err_arg(&e, big_off ? a[0] : big_count ? a[1] : NULL, big_off ? off : count);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; list && i < n; i++) {
        PyObject *t = Py_BuildValue("(LiL)", (long long)v[i].clo, (int)v[i].size, (long long)v[i].tag);
        if (!t)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    free(v);
    return list;
}

static PyObject *Queue_truncate(QueueObject *self, PyObject *arg)
{
    int64_t off, dropped;
    int big;
    cl_log *c = log_of(self->log);
    if (!c || as_i64(arg, &off, &big, "queue_offset"))
        return NULL;
    cl_err e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&c->mu);
        rc = cl_queue_truncate_locked(c, self->q, off, &dropped, &e);
        pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
    if (rc)
        return raise_err_arg(&e, big ? arg : NULL, off);
    Py_RETURN_NONE;
}

static PyObject *Queue_get_topic(QueueObject *self, void *x) { return queue_topic(self->q); }
static PyObject *Queue_get_queue_id(QueueObject *self, void *x) { return PyLong_FromLongLong(self->q->queue_id); }

static PyObject *queue_bound(QueueObject *self, int want_max)
{
    cl_log *c = log_of(self->log);
    if (!c)
        return NULL;
    lock_log(c);
    int64_t v = want_max ? self->q->max : self->q->min;
    unlock_log(c);
    return PyLong_FromLongLong(v);
}

static PyObject *Queue_get_visible_max(QueueObject *self, void *x)
{
    cl_log *c = log_of(self->log);
    if (!c)
        return NULL;
    lock_log(c);
    int64_t v = cl_queue_visible_max_locked(c, self->q);
    unlock_log(c);
    return PyLong_FromLongLong(v);
}

static PyObject *Queue_get_min(QueueObject *self, void *x) { return queue_bound(self, 0); }
static PyObject *Queue_get_max(QueueObject *self, void *x) { return queue_bound(self, 1); }

static void Queue_dealloc(QueueObject *self)
{
    Py_XDECREF(self->log);
    PyObject_Free(self);
}

static PyObject *Queue_repr(QueueObject *self)
{
    PyObject *t = queue_topic(self->q);
    if (!t)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("<ConsumeQueue topic=%R queue_id=%lld>", t, (long long)self->q->queue_id);
    Py_DECREF(t);
    return r;
}

static PyMethodDef Queue_methods[] = {
    {"unit", (PyCFunction)Queue_unit, METH_O, "unit(queue_offset)\n--\n\n(commitlog_offset, size, tag_hash) of one unit."},
    {"units", (PyCFunction)(void (*)(void))Queue_units, METH_FASTCALL | METH_KEYWORDS,
     "units(queue_offset, max_count)\n--\n\nUp to max_count units from queue_offset."},
    {"truncate", (PyCFunction)Queue_truncate, METH_O,
     "truncate(max_queue_offset)\n--\n\nDrop (zero) every unit at or above max_queue_offset."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Queue_getset[] = {
    {"topic", (getter)Queue_get_topic, NULL, NULL, NULL},
    {"queue_id", (getter)Queue_get_queue_id, NULL, NULL, NULL},
    {"min_offset", (getter)Queue_get_min, NULL, "smallest queue offset still served", NULL},
    {"max_offset", (getter)Queue_get_max, NULL, "queue offset of the next appended record", NULL},
    {"visible_max_offset", (getter)Queue_get_visible_max, NULL,
     "one past the last unit below the log's visible_offset (max_offset without a limit)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject QueueType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkmq.storage_native._commitlog.ConsumeQueue",
    .tp_basicsize = sizeof(QueueObject),
    .tp_dealloc = (destructor)Queue_dealloc,
    .tp_repr = (reprfunc)Queue_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The 20-byte-unit index of one (topic, queue_id); obtained from CommitLog.consume_queue.",
    .tp_methods = Queue_methods,
    .tp_getset = Queue_getset,
};

/* ---------------------------------------------------------- view exporter */

static int View_getbuffer(ViewObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->len, 1, flags);
}

static void View_dealloc(ViewObject *self)
{
    mf_unref(self->f); /* may unmap a deleted segment */
    PyObject_Free(self);
}

static PyBufferProcs View_as_buffer = {(getbufferproc)View_getbuffer, NULL};

static PyTypeObject ViewType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkmq.storage_native._commitlog._SegmentView",
    .tp_basicsize = sizeof(ViewObject),
    .tp_dealloc = (destructor)View_dealloc,
    .tp_as_buffer = &View_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Read-only slice of a mapped segment, kept mapped while referenced.",
};

/* ---------------------------------------------------------- decode_record */

static PyObject *corrupt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    return raise_store("CORRUPT_RECORD", msg);
}

static PyObject *decode(const char *p, size_t n, int verify)
{
    uint32_t total, magic, crc, body_len;
    memcpy(&total, p + F_TOTAL, 4);
    memcpy(&magic, p + F_MAGIC, 4);
    memcpy(&crc, p + F_CRC, 4);
    memcpy(&body_len, p + F_BODY_LEN, 4);
    if (magic != CL_RECORD_MAGIC)
        return corrupt("record is malformed: bad magic 0x%08x", (unsigned)magic);
    if (total != n)
        return corrupt("record is malformed: total_size %u != buffer length %zu", (unsigned)total, n);
    uint64_t tpos = (uint64_t)CL_HEADER_SIZE + body_len;
    if (tpos + 1 > total)
        return corrupt("record is malformed: lengths overrun the record");
    uint64_t ppos = tpos + 1 + (unsigned char)p[tpos];
    uint16_t plen = 0;
    if (ppos + 2 <= total)
        memcpy(&plen, p + ppos, 2);
    if (ppos + 2 > total || ppos + 2 + plen != total)
        return corrupt("record is malformed: lengths overrun the record");
    PyObject *topic = PyUnicode_DecodeUTF8(p + tpos + 1, (Py_ssize_t)(ppos - tpos - 1), "strict");
    if (!topic) {
        PyErr_Clear();
        return corrupt("record is malformed: topic is not UTF-8");
    }
    if (verify) {
        uint32_t actual;
        if (n >= BIG_COPY) {
            Py_BEGIN_ALLOW_THREADS
                actual = sparkmq_crc32(0, p + F_QID, n - F_QID);
            Py_END_ALLOW_THREADS
        } else
            actual = sparkmq_crc32(0, p + F_QID, n - F_QID);
        if (actual != crc) {
            Py_DECREF(topic);
            return store_error("CORRUPT_RECORD", "record fails its CRC check");
        }
    }
    int32_t qid, flag, sys_flag, reconsume;
    int64_t qoff, clo, born_ts, store_ts, prepared, tag;
    memcpy(&qid, p + F_QID, 4);
    memcpy(&flag, p + F_FLAG, 4);
    memcpy(&qoff, p + F_QOFF, 8);
    memcpy(&clo, p + F_CLOFF, 8);
    memcpy(&sys_flag, p + F_SYSFLAG, 4);
    memcpy(&born_ts, p + F_BORN_TS, 8);
    memcpy(&store_ts, p + F_STORE_TS, 8);
    memcpy(&reconsume, p + F_RECONSUME, 4);
    memcpy(&prepared, p + F_PREPARED, 8);
    memcpy(&tag, p + F_TAG, 8);
    return Py_BuildValue("(kkiiLLiLy#Ly#iLLy#Ny#)", (unsigned long)total, (unsigned long)crc, (int)qid, (int)flag,
                         (long long)qoff, (long long)clo, (int)sys_flag, (long long)born_ts, p + F_BORN_HOST,
                         (Py_ssize_t)CL_HOST_SIZE, (long long)store_ts, p + F_STORE_HOST, (Py_ssize_t)CL_HOST_SIZE,
                         (int)reconsume, (long long)prepared, (long long)tag, p + CL_HEADER_SIZE, (Py_ssize_t)body_len,
                         topic, p + ppos + 2, (Py_ssize_t)plen);
}

static PyObject *mod_decode_record(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    if (PARSE("decode_record", KW_DECODE, 1, 2, a))
        return NULL;
    int verify = a[1] ? PyObject_IsTrue(a[1]) : 0;
    if (verify < 0)
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(a[0], &b, PyBUF_SIMPLE))
        return NULL;
    PyObject *r = b.len < CL_HEADER_SIZE ? corrupt("record is malformed: buffer shorter than the header")
                                         : decode(b.buf, (size_t)b.len, verify);
    PyBuffer_Release(&b);
    return r;
}

static PyObject *mod_crc32(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    int64_t start = 0;
    if (PARSE("_crc32", KW_CRC, 1, 2, a) || opt_i64(a[1], 0, &start, NULL, "value"))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(a[0], &b, PyBUF_SIMPLE))
        return NULL;
    uint32_t r = sparkmq_crc32((uint32_t)start, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(r);
}

/* ------------------------------------------------------------ packed codecs */

/* interned at module init */
static PyObject *S_body, *S_tags, *S_keys, *S_properties, *S_flag, *S_TAGS, *S_KEYS, *S_space, *S_empty;

static int intern_codec_names(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } t[] = {{&S_body, "body"}, {&S_tags, "tags"}, {&S_keys, "keys"}, {&S_properties, "properties"},
             {&S_flag, "flag"}, {&S_TAGS, "TAGS"}, {&S_KEYS, "KEYS"},     {&S_space, " "},
             {&S_empty, ""}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!(*t[i].slot = PyUnicode_InternFromString(t[i].text)))
            return -1;
    return 0;
}

static inline uint16_t rd16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline int32_t rdi32(const char *p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline int64_t rd64(const char *p) { int64_t v; memcpy(&v, p, 8); return v; }

static PyObject *mod_decode_batch(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    int64_t count;
    Py_buffer b;
    if (PARSE("decode_batch", KW_DECODE_BATCH, 2, 2, a) || as_i64(a[1], &count, NULL, "count") ||
        PyObject_GetBuffer(a[0], &b, PyBUF_SIMPLE))
        return NULL;
    cl_err e;
    PyObject *list = NULL;
    if (cl_packed_frame(b.buf, (size_t)b.len, count, &e))
        raise_err(&e);
    else if ((list = PyList_New((Py_ssize_t)count))) {
        const char *p = b.buf, *end = p + b.len;
        for (int64_t i = 0; i < count; i++) {
            /* framed above, but a finaliser run by an allocation may have rewritten a bytearray */
            if (end - p < CL_PACKED_HEADER ||
                (uint64_t)CL_PACKED_HEADER + rd32(p) + rd16(p + 4) > (uint64_t)(end - p)) {
                store_error("MESSAGE_ILLEGAL", "the batch changed while it was being read");
                Py_CLEAR(list);
                break;
            }
            uint32_t blen = rd32(p);
            uint16_t plen = rd16(p + 4);
            PyObject *t = Py_BuildValue("(y#y#iL)", p + CL_PACKED_HEADER, (Py_ssize_t)blen,
                                        p + CL_PACKED_HEADER + blen, (Py_ssize_t)plen, (int)rdi32(p + 6),
                                        (long long)rd64(p + 10));
            if (!t) {
                Py_CLEAR(list);
                break;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)i, t);
            p += CL_PACKED_HEADER + (size_t)blen + plen;
        }
    }
    PyBuffer_Release(&b);
    return list;
}

/* ---------------------------------------------------------- encode_batch */

/* StoreError(code, "message <i>: <text>") */
static int msg_error(const char *code, Py_ssize_t i, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *tail = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!tail)
        return -1;
    raise_store(code, PyUnicode_FromFormat("message %zd: %U", i, tail));
    Py_DECREF(tail);
    return -1;
}

#define ILLEGAL(i, ...) msg_error("MESSAGE_ILLEGAL", i, __VA_ARGS__)

/* UTF-8 of a str; NULL without an exception when it cannot be encoded (surrogates) */
static const char *utf8_or_null(PyObject *s, Py_ssize_t *n)
{
    const char *p = PyUnicode_AsUTF8AndSize(s, n);
    if (!p && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
        PyErr_Clear();
    return p;
}

static int has_separator(const char *p, Py_ssize_t n) { return memchr(p, 1, (size_t)n) || memchr(p, 2, (size_t)n); }

/* A property name or value that goes into the encoding: encodable, no separators. */
static const char *prop_text(Py_ssize_t i, PyObject *s, PyObject *name, Py_ssize_t *n)
{
    const char *p = utf8_or_null(s, n);
    if (!p) {
        if (!PyErr_Occurred())
            ILLEGAL(i, "property %R is not valid Unicode", name);
        return NULL;
    }
    if (has_separator(p, *n)) {
        ILLEGAL(i, "property %R contains a reserved control character (\\x01 or \\x02)", name);
        return NULL;
    }
    return p;
}

static PyObject *type_name(PyObject *o) { return PyType_GetName(Py_TYPE(o)); }

/* `digits` upper-case hex digits of v, most significant first (snprintf's "%0*X" without its format parsing) */
static void put_hex(char *out, uint32_t v, int digits)
{
    static const char hex[] = "0123456789ABCDEF";
    for (int k = digits - 1; k >= 0; k--, v >>= 4)
        out[k] = hex[v & 0xF];
}

/* one message between the two passes of encode_batch */
typedef struct enc_msg {
    Py_buffer body;
    size_t props_off, props_len;
    int32_t flag;
} enc_msg;

typedef struct enc_ids {
    const char *prefix; /* 20 hex digits */
    uint32_t since;     /* (born_timestamp - month_start_ms) & 0xFFFFFFFF */
    unsigned counter;
} enc_ids;

/* The key items of `keys` (a str is one key, "" none) as a new list, validated. */
static PyObject *attr_keys(Py_ssize_t i, PyObject *keys)
{
    PyObject *list;
    if (PyTuple_CheckExact(keys) && PyTuple_GET_SIZE(keys) == 0)
        return Py_NewRef(keys); /* the common case, no keys: callers only take its size (Py_SIZE) */
    if (PyUnicode_Check(keys))
        list = PyUnicode_GET_LENGTH(keys) ? PyList_New(1) : PyList_New(0);
    else if (PyList_Check(keys) || PyTuple_Check(keys))
        list = PySequence_List(keys);
    else {
        PyObject *tn = type_name(keys);
        if (tn)
            ILLEGAL(i, "keys must be a tuple of strings, got %U", tn);
        Py_XDECREF(tn);
        return NULL;
    }
    if (!list)
        return NULL;
    if (PyUnicode_Check(keys) && PyList_GET_SIZE(list))
        PyList_SET_ITEM(list, 0, Py_NewRef(keys));
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(list); k++) {
        PyObject *key = PyList_GET_ITEM(list, k);
        Py_ssize_t n;
        if (!PyUnicode_Check(key) || PyUnicode_GET_LENGTH(key) == 0 ||
            PyUnicode_FindChar(key, ' ', 0, PyUnicode_GET_LENGTH(key), 1) >= 0) {
            ILLEGAL(i, "keys must be non-empty strings without spaces");
            Py_DECREF(list);
            return NULL;
        }
        if (!prop_text(i, key, S_KEYS, &n)) {
            Py_DECREF(list);
            return NULL;
        }
    }
    return list;
}

/* Pass 1 for one message: validate, append its properties to `props`, its id to msg_ids. */
static int enc_message(Py_ssize_t i, PyObject *msg, enc_ids *ids, growbuf *props, enc_msg *em, PyObject *msg_ids)
{
    PyObject *body = NULL, *tags = NULL, *keys = NULL, *pd = NULL, *flag = NULL, *keylist = NULL, *id = NULL;
    PyObject *ptags = NULL, *pkeys = NULL, *pid = NULL, *k, *v, *tn = NULL;
    int rc = -1;
    if (!(body = PyObject_GetAttr(msg, S_body)) || !(tags = PyObject_GetAttr(msg, S_tags)) ||
        !(keys = PyObject_GetAttr(msg, S_keys)) || !(pd = PyObject_GetAttr(msg, S_properties)) ||
        !(flag = PyObject_GetAttr(msg, S_flag)))
        goto out;
    if (PyUnicode_Check(body) || !PyObject_CheckBuffer(body)) {
        if ((tn = type_name(body)))
            ILLEGAL(i, "the body must be bytes, got %U", tn);
        goto out;
    }
    if (PyObject_GetBuffer(body, &em->body, PyBUF_SIMPLE))
        goto out;
    if (em->body.len == 0) {
        ILLEGAL(i, "the body must not be empty");
        goto out;
    }
    if ((uint64_t)em->body.len > UINT32_MAX) {
        msg_error("MESSAGE_TOO_LARGE", i, "the body is %zd bytes, the limit is 4294967295", em->body.len);
        goto out;
    }
    if (tags != Py_None && !PyUnicode_Check(tags)) {
        if ((tn = type_name(tags)))
            ILLEGAL(i, "the tag must be a str, got %U", tn);
        goto out;
    }
    if (!(keylist = attr_keys(i, keys)))
        goto out;
    if (!PyDict_Check(pd)) {
        if ((tn = type_name(pd)))
            ILLEGAL(i, "properties must be a dict, got %U", tn);
        goto out;
    }
    Py_ssize_t pos = 0, n;
    while (PyDict_Next(pd, &pos, &k, &v)) {
        if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) {
            ILLEGAL(i, "property %R must map a string to a string", k);
            goto out;
        }
        if (PyUnicode_GET_LENGTH(k) == 0) {
            ILLEGAL(i, "property names must not be empty");
            goto out;
        }
        if (!prop_text(i, k, k, &n) || !prop_text(i, v, k, &n))
            goto out;
        if (!PyUnicode_CompareWithASCIIString(k, "TAGS"))
            ptags = v;
        else if (!PyUnicode_CompareWithASCIIString(k, "KEYS"))
            pkeys = v;
        else if (!PyUnicode_CompareWithASCIIString(k, "UNIQ_KEY"))
            pid = v;
    }
    int ovf = 0;
    long long fv = PyLong_Check(flag) ? PyLong_AsLongLongAndOverflow(flag, &ovf) : 0;
    if (!PyLong_Check(flag) || ovf || fv < INT32_MIN || fv > INT32_MAX) {
        ILLEGAL(i, "the flag must be an int in [-2147483648, 2147483647], got %R", flag);
        goto out;
    }
    em->flag = (int32_t)fv;
    /* TAGS: the attribute, or the property when the attribute is None */
    PyObject *tag = tags != Py_None ? tags : NULL;
    if (ptags) {
        if (tag && PyUnicode_Compare(tag, ptags) != 0) {
            ILLEGAL(i, "tags %R disagree with property TAGS %R", tag, ptags);
            goto out;
        }
        tag = ptags;
    }
    const char *tp = NULL;
    Py_ssize_t tlen = 0;
    if (tag) {
        if (!(tp = prop_text(i, tag, S_TAGS, &tlen)))
            goto out;
        if (!cl_tag_ok(tp, (size_t)tlen)) {
            ILLEGAL(i, "the TAGS value is empty, padded with whitespace or has '||'");
            goto out;
        }
    }
    /* KEYS: the attribute, or the property's space-separated keys */
    if (pkeys) {
        PyObject *parts = PyUnicode_Split(pkeys, S_space, -1), *from = parts ? PyList_New(0) : NULL;
        for (Py_ssize_t j = 0; from && j < PyList_GET_SIZE(parts); j++)
            if (PyUnicode_GET_LENGTH(PyList_GET_ITEM(parts, j)) && PyList_Append(from, PyList_GET_ITEM(parts, j)))
                Py_CLEAR(from);
        Py_XDECREF(parts);
        if (!from)
            goto out;
        if (Py_SIZE(keylist)) {
            int same = Py_SIZE(keylist) == PyList_GET_SIZE(from);
            for (Py_ssize_t j = 0; same && j < PyList_GET_SIZE(from); j++)
                same = PyUnicode_Compare(PyList_GET_ITEM(keylist, j), PyList_GET_ITEM(from, j)) == 0;
            Py_DECREF(from);
            if (!same) {
                ILLEGAL(i, "keys %R disagree with property KEYS", keylist);
                goto out;
            }
        } else
            Py_SETREF(keylist, from);
    }
    /* UNIQ_KEY: the user's, else a new one (UniqueIdGenerator.next_id's format) */
    char idbuf[33];
    const char *idp;
    Py_ssize_t idn;
    if (pid) {
        if (!(idp = PyUnicode_AsUTF8AndSize(pid, &idn)))
            goto out;
        if (!cl_uniq_ok(idp, (size_t)idn)) {
            ILLEGAL(i, "the UNIQ_KEY must be 1 to 128 printable ASCII characters without spaces");
            goto out;
        }
        id = Py_NewRef(pid);
    } else {
        ids->counter = (ids->counter + 1) & 0xFFFF;
        memcpy(idbuf, ids->prefix, 20);
        put_hex(idbuf + 20, ids->since, 8);
        put_hex(idbuf + 28, ids->counter, 4);
        idp = idbuf;
        idn = 32;
        if (!(id = PyUnicode_FromStringAndSize(idbuf, 32)))
            goto out;
    }
    /* TAGS, KEYS, UNIQ_KEY, then the user's properties in dict order */
    size_t start = props->n;
    if (tag && growbuf_pair(props, "TAGS", 4, tp, (size_t)tlen))
        goto out;
    if (Py_SIZE(keylist)) {
        if (growbuf_put(props, "KEYS\x01", 5))
            goto out;
        for (Py_ssize_t j = 0; j < Py_SIZE(keylist); j++) {
            const char *kp = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(keylist, j), &n);
            if (!kp || (j && growbuf_put(props, " ", 1)) || growbuf_put(props, kp, (size_t)n))
                goto out;
        }
        if (growbuf_put(props, "\x02", 1))
            goto out;
    }
    if (growbuf_pair(props, "UNIQ_KEY", 8, idp, (size_t)idn))
        goto out;
    pos = 0;
    while (PyDict_Next(pd, &pos, &k, &v)) {
        if (!PyUnicode_CompareWithASCIIString(k, "TAGS") || !PyUnicode_CompareWithASCIIString(k, "KEYS") ||
            !PyUnicode_CompareWithASCIIString(k, "UNIQ_KEY"))
            continue;
        Py_ssize_t kn, vn;
        const char *kp = PyUnicode_AsUTF8AndSize(k, &kn), *vp = kp ? PyUnicode_AsUTF8AndSize(v, &vn) : NULL;
        if (!vp || growbuf_pair(props, kp, (size_t)kn, vp, (size_t)vn))
            goto out;
    }
    em->props_off = start;
    em->props_len = props->n - start;
    if (em->props_len > CL_MAX_PROPS) {
        msg_error("PROPERTIES_TOO_LARGE", i, "the properties are %zu bytes, the limit is %d", em->props_len,
                  CL_MAX_PROPS);
        goto out;
    }
    rc = PyList_Append(msg_ids, id);
out:
    Py_XDECREF(tn);
    Py_XDECREF(body);
    Py_XDECREF(tags);
    Py_XDECREF(keys);
    Py_XDECREF(pd);
    Py_XDECREF(flag);
    Py_XDECREF(keylist);
    Py_XDECREF(id);
    return rc;
}

static int is_hex20(PyObject *o)
{
    if (!PyUnicode_Check(o) || !PyUnicode_IS_ASCII(o) || PyUnicode_GET_LENGTH(o) != 20)
        return 0;
    const Py_UCS1 *p = PyUnicode_1BYTE_DATA(o);
    for (int k = 0; k < 20; k++)
        if (!((p[k] >= '0' && p[k] <= '9') || (p[k] >= 'A' && p[k] <= 'F') || (p[k] >= 'a' && p[k] <= 'f')))
            return 0;
    return 1;
}

static PyObject *mod_encode_batch(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[5];
    int64_t month, born;
    if (PARSE("encode_batch", KW_ENCODE, 5, 5, a))
        return NULL;
    if (!PyList_Check(a[0]) && !PyTuple_Check(a[0])) {
        PyErr_SetString(PyExc_TypeError, "messages must be a list or tuple");
        return NULL;
    }
    if (!is_hex20(a[1]))
        return store_error("INVALID_ARGUMENT", "id_prefix must be 20 hexadecimal digits, got %R", a[1]);
    if (as_i64(a[2], &month, NULL, "month_start_ms"))
        return NULL;
    PyObject *cnt = PyNumber_Index(a[3]);
    if (!cnt)
        return NULL;
    unsigned long long cmask = PyLong_AsUnsignedLongLongMask(cnt); /* two's complement, as Python's & */
    Py_DECREF(cnt);
    if (cmask == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (as_i64(a[4], &born, NULL, "born_timestamp"))
        return NULL;
    enc_ids ids = {PyUnicode_AsUTF8(a[1]), (uint32_t)((uint64_t)born - (uint64_t)month), (unsigned)(cmask & 0xFFFF)};
    /* a snapshot: attribute access may run Python code that mutates a list */
    PyObject *items = PyList_Check(a[0]) ? PyList_AsTuple(a[0]) : Py_NewRef(a[0]);
    if (!items)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items), i = 0;
    PyObject *msg_ids = NULL, *data = NULL, *res = NULL;
    enc_msg *ems = NULL;
    growbuf props = {0};
    if (n == 0) {
        store_error("MESSAGE_ILLEGAL", "the batch is empty");
        goto out;
    }
    if (!(ems = PyMem_Calloc((size_t)n, sizeof *ems))) {
        PyErr_NoMemory();
        goto out;
    }
    if (!(msg_ids = PyList_New(0)))
        goto out;
    size_t total = 0;
    for (; i < n; i++) {
        if (enc_message(i, PyTuple_GET_ITEM(items, i), &ids, &props, &ems[i], msg_ids))
            goto out;
        total += CL_PACKED_HEADER + (size_t)ems[i].body.len + ems[i].props_len;
    }
    if (!(data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total)))
        goto out;
    char *w = PyBytes_AS_STRING(data);
    for (Py_ssize_t j = 0; j < n; j++) {
        uint32_t blen = (uint32_t)ems[j].body.len;
        uint16_t plen = (uint16_t)ems[j].props_len;
        memcpy(w, &blen, 4);
        memcpy(w + 4, &plen, 2);
        memcpy(w + 6, &ems[j].flag, 4);
        memcpy(w + 10, &born, 8);
        memcpy(w + CL_PACKED_HEADER, ems[j].body.buf, blen);
        memcpy(w + CL_PACKED_HEADER + blen, props.p + ems[j].props_off, plen);
        w += CL_PACKED_HEADER + (size_t)blen + plen;
    }
    res = Py_BuildValue("(OOI)", data, msg_ids, ids.counter);
out:
    for (Py_ssize_t j = 0; ems && j < n && j <= i; j++)
        if (ems[j].body.obj)
            PyBuffer_Release(&ems[j].body);
    PyMem_Free(ems);
    PyMem_Free(props.p);
    Py_XDECREF(msg_ids);
    Py_XDECREF(data);
    Py_DECREF(items);
    return res;
}

/* -------------------------------------------------------- decode_records */

/* recent (bytes -> str) conversions of one call; the bytes live in its buffer */
typedef struct str_cache {
    struct {
        const char *p;
        size_t n;
        PyObject *o;
    } e[16];
    unsigned next;
} str_cache;

static PyObject *cached_str(str_cache *c, const char *p, size_t n)
{
    for (int k = 0; k < 16; k++)
        if (c->e[k].o && c->e[k].n == n && !memcmp(c->e[k].p, p, n))
            return Py_NewRef(c->e[k].o);
    PyObject *o = PyUnicode_DecodeUTF8(p, (Py_ssize_t)n, "strict");
    if (!o)
        return NULL;
    unsigned k = c->next++ % 16;
    Py_XSETREF(c->e[k].o, Py_NewRef(o));
    c->e[k].p = p;
    c->e[k].n = n;
    return o;
}

static void cache_clear(str_cache *c)
{
    for (int k = 0; k < 16; k++)
        Py_CLEAR(c->e[k].o);
}

/* platform.common.codec.unpack_host: "" for all zero, "a.b.c.d:port" for an
 * IPv4-mapped address, else "[v6]:port" compressed as Python's ipaddress does
 * (the first longest run of two or more zero groups becomes "::") */
static size_t format_host(const uint8_t *h, char *out)
{
    static const uint8_t zero[CL_HOST_SIZE];
    if (!memcmp(h, zero, CL_HOST_SIZE))
        return 0;
    uint32_t port;
    memcpy(&port, h + 16, 4);
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    if (!memcmp(h, mapped, 12))
        return (size_t)sprintf(out, "%u.%u.%u.%u:%u", h[12], h[13], h[14], h[15], (unsigned)port);
    unsigned g[8];
    int best = -1, best_len = 0, run = -1, run_len = 0;
    for (int k = 0; k < 8; k++) {
        g[k] = (unsigned)h[2 * k] << 8 | h[2 * k + 1];
        if (g[k] == 0) {
            if (run < 0)
                run = k;
            if (++run_len > best_len) {
                best = run;
                best_len = run_len;
            }
        } else {
            run = -1;
            run_len = 0;
        }
    }
    if (best_len < 2)
        best = -1;
    char *w = out;
    *w++ = '[';
    for (int k = 0; k < 8; k++) {
        if (k == best) {
            w += sprintf(w, "::");
            k += best_len - 1;
            continue;
        }
        if (k && k != best + best_len)
            *w++ = ':';
        w += sprintf(w, "%x", g[k]);
    }
    w += sprintf(w, "]:%u", (unsigned)port);
    return (size_t)(w - out);
}

/* ids.offset_msg_id_prefix of the host (all zero counts as 0.0.0.0:0) */
static size_t offset_id_prefix(const uint8_t *h, char *out)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    static const uint8_t zero[CL_HOST_SIZE];
    uint32_t port;
    memcpy(&port, h + 16, 4);
    if (!memcmp(h, zero, CL_HOST_SIZE))
        return (size_t)sprintf(out, "%016X", 0);
    size_t n = 0;
    for (int k = memcmp(h, mapped, 12) ? 0 : 12; k < 16; k++)
        n += (size_t)sprintf(out + n, "%02X", h[k]);
    return n + (size_t)sprintf(out + n, "%08X", (unsigned)port);
}

/* one host field: its text and offsetMsgId prefix, reused while it repeats */
typedef struct host_cache {
    uint8_t raw[CL_HOST_SIZE];
    PyObject *text;
    char prefix[48];
    size_t prefix_len;
} host_cache;

static PyObject *host_text(host_cache *c, const char *raw)
{
    if (!c->text || memcmp(c->raw, raw, CL_HOST_SIZE)) {
        char buf[64];
        size_t n = format_host((const uint8_t *)raw, buf);
        PyObject *t = PyUnicode_FromStringAndSize(buf, (Py_ssize_t)n);
        if (!t)
            return NULL;
        Py_XSETREF(c->text, t);
        memcpy(c->raw, raw, CL_HOST_SIZE);
        c->prefix_len = offset_id_prefix((const uint8_t *)raw, c->prefix);
    }
    return Py_NewRef(c->text);
}

/* decode_record's checks for the record at the start of p (left bytes remain): cl_record_frame's */
static int record_frame(const char *p, size_t left, uint32_t *total, uint64_t *tpos, uint64_t *ppos, uint16_t *plen)
{
    cl_err e;
    if (cl_record_frame(p, left, total, tpos, ppos, plen, &e))
        return raise_err(&e), -1;
    return 0;
}

/* codec.decode_properties: split on \x02, skip empty pairs, name up to the first \x01.
 * special[] gets the values of TAGS, KEYS and UNIQ_KEY (new references; the last
 * one of a repeated name, as in the dict), saving three lookups per record. */
static PyObject *decode_props(const char *p, size_t n, str_cache *names, str_cache *tags, PyObject *special[3])
{
    PyObject *d = PyDict_New();
    size_t pos = 0;
    while (d && pos < n) {
        const char *end = memchr(p + pos, 2, n - pos);
        size_t plen = end ? (size_t)(end - (p + pos)) : n - pos;
        if (plen) {
            const char *key = p + pos, *sep = memchr(key, 1, plen);
            size_t klen = sep ? (size_t)(sep - key) : plen;
            PyObject *k = cached_str(names, key, klen);
            size_t vlen = sep ? plen - klen - 1 : 0;
            PyObject *v;
            if (!k)
                v = NULL;
            else if (!sep)
                v = Py_NewRef(S_empty);
            else if (klen == 4 && !memcmp(key, "TAGS", 4)) /* few distinct tags: reuse them */
                v = cached_str(tags, sep + 1, vlen);
            else
                v = PyUnicode_DecodeUTF8(sep + 1, (Py_ssize_t)vlen, "strict");
            if (!v || PyDict_SetItem(d, k, v))
                Py_CLEAR(d);
            else if (klen == 4 && !memcmp(key, "TAGS", 4))
                Py_XSETREF(special[0], Py_NewRef(v));
            else if (klen == 4 && !memcmp(key, "KEYS", 4))
                Py_XSETREF(special[1], Py_NewRef(v));
            else if (klen == 8 && !memcmp(key, "UNIQ_KEY", 8))
                Py_XSETREF(special[2], Py_NewRef(v));
            Py_XDECREF(k);
            Py_XDECREF(v);
        }
        pos += plen + 1;
    }
    if (!d && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        corrupt("record is malformed: properties are not UTF-8");
    }
    return d;
}

/* Python's f"{v:016X}": upper hex zero-padded to 16 characters, a sign included */
static size_t hex16(int64_t v, char *out)
{
    static const char digits[] = "0123456789ABCDEF";
    uint64_t u = v < 0 ? 0ULL - (uint64_t)v : (uint64_t)v;
    char tmp[16];
    int n = 0;
    do
        tmp[n++] = digits[u & 15];
    while (u >>= 4);
    char *w = out;
    if (v < 0)
        *w++ = '-';
    for (int pad = (v < 0 ? 15 : 16) - n; pad > 0; pad--)
        *w++ = '0';
    while (n)
        *w++ = tmp[--n];
    return (size_t)(w - out);
}

/* an int object, reused while the value repeats (timestamps, sizes of a batch) */
typedef struct int_cache {
    long long v;
    PyObject *o;
} int_cache;

static PyObject *cached_int(int_cache *c, long long v)
{
    if (!c->o || c->v != v) {
        PyObject *o = PyLong_FromLongLong(v);
        if (!o)
            return NULL;
        Py_XSETREF(c->o, o);
        c->v = v;
    }
    return Py_NewRef(c->o);
}

/* The factory's arguments, in order (decode_records calls factory(*fields) of these). */
static const char *const record_fields[18] = {
    "topic", "broker_name", "queue_id", "queue_offset", "msg_id", "offset_msg_id", "body", "tags", "keys",
    "properties", "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
    "sys_flag", "commitlog_offset", "store_size"};

static PyTypeObject *slots_type; /* the last factory checked (a strong reference) and its verdict */
static int slots_usable;
static Py_ssize_t slot_offsets[18];

/* Whether the dataclass fields of `factory` are exactly record_fields, in order (so its __init__ takes them
 * positionally and sets nothing else). */
static int same_fields(PyObject *factory)
{
    PyObject *fields = PyObject_GetAttrString(factory, "__dataclass_fields__");
    if (!fields) {
        PyErr_Clear();
        return 0;
    }
    int same = PyDict_Check(fields) && PyDict_GET_SIZE(fields) == 18;
    Py_ssize_t pos = 0;
    PyObject *name;
    for (int k = 0; same && PyDict_Next(fields, &pos, &name, NULL); k++)
        same = PyUnicode_Check(name) && !PyUnicode_CompareWithASCIIString(name, record_fields[k]);
    Py_DECREF(fields);
    return same;
}

/* 1 with the offsets of the factory's 18 fields in offsets[], when it is a slots dataclass whose fields are
 * exactly record_fields and that adds nothing to construction (no __post_init__), as ReceivedMessage: a
 * record is then one allocation and 18 stores instead of a Python __init__ call, the largest part of a
 * message's decoding.  0 when the factory is anything else (it is then called).  The caller keeps its own
 * copy of the offsets: the inflate callback runs Python, so another thread (or a decode that callback
 * starts) may check another factory while this call decodes. */
static int record_slots(PyObject *factory, Py_ssize_t offsets[18])
{
    if ((PyObject *)slots_type == factory) {
        memcpy(offsets, slot_offsets, sizeof slot_offsets);
        return slots_usable;
    }
    if (!PyType_Check(factory))
        return 0;
    PyTypeObject *t = (PyTypeObject *)factory;
    int usable = t->tp_new == PyBaseObject_Type.tp_new && t->tp_alloc == PyType_GenericAlloc
                 && !(t->tp_flags & Py_TPFLAGS_IS_ABSTRACT) && t->tp_dictoffset == 0
                 && !PyObject_HasAttrString(factory, "__post_init__") && same_fields(factory);
    for (int k = 0; usable && k < 18; k++) {
        PyObject *d = PyObject_GetAttrString(factory, record_fields[k]); /* a slot's descriptor, on the class */
        if (!d) {
            PyErr_Clear();
            usable = 0;
            break;
        }
        if (Py_IS_TYPE(d, &PyMemberDescr_Type) && PyType_IsSubtype(t, PyDescr_TYPE(d))) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            usable = m->type == T_OBJECT_EX && !(m->flags & READONLY);
            slot_offsets[k] = m->offset;
        } else
            usable = 0;
        Py_DECREF(d);
    }
    Py_XSETREF(slots_type, (PyTypeObject *)Py_NewRef(factory));
    slots_usable = usable;
    memcpy(offsets, slot_offsets, sizeof slot_offsets);
    return usable;
}

/* factory(*f) of record_slots' kind: the fields stored straight into a new instance (references stolen).
 * The instance and its keys tuple are left out of the garbage collector's lists: they hold only strings,
 * ints, bytes and a dict of strings, so no cycle runs through them, and a pull of a thousand messages
 * would otherwise set off collections that walk every message a consumer still buffers. */
static PyObject *record_from_slots(PyTypeObject *t, const Py_ssize_t offsets[18], PyObject *f[18])
{
    PyObject *m = t->tp_alloc(t, 0);
    if (!m)
        return NULL;
    for (int k = 0; k < 18; k++) {
        *(PyObject **)((char *)m + offsets[k]) = f[k];
        f[k] = NULL;
    }
    if (PyObject_GC_IsTracked(m))
        PyObject_GC_UnTrack(m);
    PyObject *keys = *(PyObject **)((char *)m + offsets[8]);
    if (PyTuple_CheckExact(keys) && PyObject_GC_IsTracked(keys))
        PyObject_GC_UnTrack(keys);
    return m;
}

static PyObject *mod_decode_records(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[4];
    Py_buffer b;
    if (PARSE("decode_records", KW_RECORDS, 4, 4, a) || PyObject_GetBuffer(a[0], &b, PyBUF_SIMPLE))
        return NULL;
    PyObject *out = PyList_New(0), *topic = NULL;
    const char *topic_raw = NULL;
    size_t topic_n = 0;
    str_cache names = {0}, tagvals = {0};
    host_cache born = {0}, store = {0};
    int_cache ints[3] = {{0}};
    Py_ssize_t offsets[18];
    int direct = record_slots(a[2], offsets);
    const char *base = b.buf;
    size_t len = (size_t)b.len, pos = 0;
    while (out && pos < len) {
        const char *p = base + pos;
        uint32_t total;
        uint64_t tpos, ppos;
        uint16_t plen;
        if (record_frame(p, len - pos, &total, &tpos, &ppos, &plen)) {
            Py_CLEAR(out);
            break;
        }
        size_t tn = (size_t)(ppos - tpos - 1); /* as framed: the buffer is not re-read */
        if (!topic || tn != topic_n || memcmp(topic_raw, p + tpos + 1, tn)) {
            PyObject *t = PyUnicode_DecodeUTF8(p + tpos + 1, (Py_ssize_t)tn, "strict");
            if (!t) {
                PyErr_Clear();
                corrupt("record is malformed: topic is not UTF-8");
                Py_CLEAR(out);
                break;
            }
            Py_XSETREF(topic, t);
            topic_raw = p + tpos + 1;
            topic_n = tn;
        }
        PyObject *f[18] = {0}; /* factory(*f): the fields named in record_fields, in that order */
        int32_t sys_flag = rdi32(p + F_SYSFLAG);
        int64_t clo = rd64(p + F_CLOFF);
        PyObject *special[3] = {NULL, NULL, NULL};
        PyObject *props = decode_props(p + ppos + 2, plen, &names, &tagvals, special);
        int ok = props != NULL;
        if (ok) {
            PyObject *tags = special[0], *keys = special[1], *uniq = special[2];
            f[0] = Py_NewRef(topic);
            f[1] = Py_NewRef(a[1]);
            f[2] = PyLong_FromLong(rdi32(p + F_QID));
            f[3] = PyLong_FromLongLong(rd64(p + F_QOFF));
            f[4] = Py_NewRef(uniq ? uniq : S_empty);
            f[11] = host_text(&born, p + F_BORN_HOST);
            f[13] = host_text(&store, p + F_STORE_HOST);
            if (f[13]) {
                char id[80];
                memcpy(id, store.prefix, store.prefix_len);
                size_t idn = store.prefix_len + hex16(clo, id + store.prefix_len);
                f[5] = PyUnicode_FromStringAndSize(id, (Py_ssize_t)idn);
            }
            f[6] = PyBytes_FromStringAndSize(p + CL_HEADER_SIZE, (Py_ssize_t)(tpos - CL_HEADER_SIZE));
            if (f[6] && (sys_flag & 1)) /* COMPRESSED */
                Py_SETREF(f[6], PyObject_CallOneArg(a[3], f[6]));
            f[7] = Py_NewRef(tags ? tags : Py_None);
            Py_ssize_t klen = keys ? PyUnicode_GET_LENGTH(keys) : 0;
            if (klen && PyUnicode_FindChar(keys, ' ', 0, klen, 1) == -1)
                f[8] = PyTuple_Pack(1, keys); /* the common single key */
            else if (keys) {
                PyObject *parts = PyUnicode_Split(keys, S_space, -1);
                Py_ssize_t kept = 0;
                for (Py_ssize_t j = 0; parts && j < PyList_GET_SIZE(parts); j++)
                    kept += PyUnicode_GET_LENGTH(PyList_GET_ITEM(parts, j)) > 0;
                if (parts && (f[8] = PyTuple_New(kept)))
                    for (Py_ssize_t j = 0, w = 0; j < PyList_GET_SIZE(parts); j++)
                        if (PyUnicode_GET_LENGTH(PyList_GET_ITEM(parts, j)))
                            PyTuple_SET_ITEM(f[8], w++, Py_NewRef(PyList_GET_ITEM(parts, j)));
                Py_XDECREF(parts);
            } else
                f[8] = PyTuple_New(0);
            f[9] = Py_NewRef(props);
            f[10] = cached_int(&ints[0], rd64(p + F_BORN_TS));
            f[12] = cached_int(&ints[1], rd64(p + F_STORE_TS));
            f[14] = PyLong_FromLong(rdi32(p + F_RECONSUME));
            f[15] = PyLong_FromLong(sys_flag);
            f[16] = PyLong_FromLongLong(clo);
            f[17] = cached_int(&ints[2], total);
            for (int k = 0; k < 18; k++)
                ok = ok && f[k];
            ok = ok && !PyErr_Occurred();
        }
        PyObject *m = !ok ? NULL
                      : direct ? record_from_slots((PyTypeObject *)a[2], offsets, f)
                               : PyObject_Vectorcall(a[2], f, 18, NULL);
        for (int k = 0; k < 18; k++)
            Py_XDECREF(f[k]);
        for (int k = 0; k < 3; k++)
            Py_XDECREF(special[k]);
        Py_XDECREF(props);
        if (!m || PyList_Append(out, m))
            Py_CLEAR(out);
        Py_XDECREF(m);
        pos += total;
    }
    Py_XDECREF(topic);
    Py_XDECREF(born.text);
    Py_XDECREF(store.text);
    for (int k = 0; k < 3; k++)
        Py_XDECREF(ints[k].o);
    cache_clear(&names);
    cache_clear(&tagvals);
    PyBuffer_Release(&b);
    return out;
}

/* --------------------------------------------------- RocketMQ's encodings (rmq_codec.c) */

/* Inputs at least this large are framed and converted with the GIL released (a pull of 32 records of 1 KiB
 * is about 40 KiB: below it, giving the GIL away and taking it back costs more than the work). */
#define RMQ_NOGIL_BYTES (64 * 1024)

typedef int (*rmq_size_fn)(const char *, size_t, size_t *, size_t *, cl_err *);

/* Run a codec's sizing pass over b, the GIL released for big inputs; -1 with StoreError set. */
static int rmq_size(rmq_size_fn fn, const Py_buffer *b, size_t *size, size_t *count)
{
    cl_err e;
    int rc;
    if (b->len >= RMQ_NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        rc = fn(b->buf, (size_t)b->len, size, count, &e);
        Py_END_ALLOW_THREADS
    } else
        rc = fn(b->buf, (size_t)b->len, size, count, &e);
    if (rc)
        raise_err(&e);
    return rc;
}

static PyObject *mod_encode_rocketmq_records(PyObject *mod, PyObject *arg)
{
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE))
        return NULL;
    size_t size, count;
    PyObject *out = NULL;
    if (!rmq_size(rmq_encode_size, &b, &size, &count) &&
        (out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size))) {
        cl_err e;
        int rc;
        if (b.len >= RMQ_NOGIL_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            rc = rmq_encode_write(b.buf, (size_t)b.len, PyBytes_AS_STRING(out), size, &e);
            Py_END_ALLOW_THREADS
        } else
            rc = rmq_encode_write(b.buf, (size_t)b.len, PyBytes_AS_STRING(out), size, &e);
        if (rc) {
            raise_err(&e);
            Py_CLEAR(out);
        }
    }
    PyBuffer_Release(&b);
    return out;
}

static PyObject *mod_decode_rocketmq_batch(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "decode_rocketmq_batch() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    int64_t born;
    Py_buffer b;
    if (as_i64(args[1], &born, NULL, "born_timestamp") || PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE))
        return NULL;
    size_t size, count;
    PyObject *out = NULL, *res = NULL;
    if (!rmq_size(rmq_batch_size, &b, &size, &count) && (out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size))) {
        cl_err e;
        int rc;
        if (b.len >= RMQ_NOGIL_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            rc = rmq_batch_write(b.buf, (size_t)b.len, born, PyBytes_AS_STRING(out), size, &e);
            Py_END_ALLOW_THREADS
        } else
            rc = rmq_batch_write(b.buf, (size_t)b.len, born, PyBytes_AS_STRING(out), size, &e);
        if (rc)
            raise_err(&e);
        else
            res = Py_BuildValue("(On)", out, (Py_ssize_t)count);
        Py_DECREF(out);
    }
    PyBuffer_Release(&b);
    return res;
}

/* gc_untrack(obj) / gc_track(obj): take a container out of the garbage collector's lists while its holder
 * keeps it alive, and put it back before letting go (see storage_native.gc_untrack).  Both are no-ops
 * for an object that is not a container or is already in the wanted state. */
static PyObject *mod_gc_untrack(PyObject *mod, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj))
        PyObject_GC_UnTrack(obj);
    Py_RETURN_NONE;
}

static PyObject *mod_gc_track(PyObject *mod, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj))
        PyObject_GC_Track(obj);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"decode_record", (PyCFunction)(void (*)(void))mod_decode_record, METH_FASTCALL | METH_KEYWORDS,
     "decode_record(buf, verify_crc=False)\n--\n\nDecode one whole record (as returned by CommitLog.read)."},
    {"decode_batch", (PyCFunction)(void (*)(void))mod_decode_batch, METH_FASTCALL | METH_KEYWORDS,
     "decode_batch(data, count)\n--\n\nThe entries of a packed batch: [(body, properties, flag, born_timestamp)]."},
    {"encode_batch", (PyCFunction)(void (*)(void))mod_encode_batch, METH_FASTCALL | METH_KEYWORDS,
     "encode_batch(messages, id_prefix, month_start_ms, counter, born_timestamp)\n--\n\n"
     "Validate messages and pack them: (data, msg_ids, next_counter)."},
    {"gc_untrack", mod_gc_untrack, METH_O, "gc_untrack(obj)\n--\n\nTake obj out of the collector's lists."},
    {"gc_track", mod_gc_track, METH_O, "gc_track(obj)\n--\n\nPut obj back in the collector's lists."},
    {"decode_records", (PyCFunction)(void (*)(void))mod_decode_records, METH_FASTCALL | METH_KEYWORDS,
     "decode_records(data, broker_name, factory, inflate)\n--\n\n"
     "factory(...) of every record of concatenated stored records (a pull's packed records)."},
    {"encode_rocketmq_records", mod_encode_rocketmq_records, METH_O,
     "encode_rocketmq_records(records, /)\n--\n\n"
     "Stored records back to back re-encoded, back to back, as RocketMQ's stored messages."},
    {"decode_rocketmq_batch", (PyCFunction)(void (*)(void))mod_decode_rocketmq_batch, METH_FASTCALL,
     "decode_rocketmq_batch(body, born_timestamp, /)\n--\n\n"
     "A SEND_BATCH_MESSAGE body as a packed batch: (data, count)."},
    {"v2_send_summary", v2_send_summary, METH_O,
     "v2_send_summary(request)\n--\n\nA serialized v2 SendMessageRequest's message count and its first "
     "message's born timestamp (ms, or None); (0, None) when it does not parse."},
    {"pack_v2_send", v2_pack_send, METH_VARARGS,
     "pack_v2_send(request, max_body, reserved, id_prefix, month_start_ms, counter, born_timestamp)\n--\n\n"
     "A serialized v2 SendMessageRequest of plain NORMAL messages of one topic as encode_batch packs them: "
     "(topic, namespace, data, msg_ids, next_counter); (None, counter) for anything else."},
    {"encode_v2_send_response", v2_encode_send_response, METH_VARARGS,
     "encode_v2_send_response(code, message, msg_ids, first_offset)\n--\n\n"
     "A serialized v2 SendMessageResponse: one status, one entry per id with consecutive queue offsets."},
    {"_crc32", (PyCFunction)(void (*)(void))mod_crc32, METH_FASTCALL | METH_KEYWORDS,
     "_crc32(data, value=0)\n--\n\nThe store's CRC-32 (equal to zlib.crc32); for tests."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    "sparkmq.storage_native._commitlog",
    "C core of the sparkmq message store: commit log + consume queues.\n\n"
    "Implements the contract of _commitlog.pyi over the formats of layout.py;\n"
    "errors are errors.StoreError(code, message).  Segments and queue files are\n"
    "mmap'd (MAP_SHARED); the GIL is released around copies, CRC and syncs.",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL};

PyMODINIT_FUNC PyInit__commitlog(void)
{
    sparkmq_crc32_init();
    if (intern_kw() || intern_codec_names() || PyType_Ready(&LogType) || PyType_Ready(&QueueType) ||
        PyType_Ready(&ViewType))
        return NULL;
    PyObject *errors = PyImport_ImportModule("sparkmq.storage_native.errors");
    if (!errors)
        return NULL;
    StoreError = PyObject_GetAttrString(errors, "StoreError");
    Py_DECREF(errors);
    if (!StoreError)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "FORMAT_VERSION", CL_FORMAT_VERSION) ||
        PyModule_AddObjectRef(m, "CommitLog", (PyObject *)&LogType) ||
        PyModule_AddObjectRef(m, "ConsumeQueue", (PyObject *)&QueueType) ||
        PyModule_AddObjectRef(m, "StoreError", StoreError) ||
        PyModule_AddStringConstant(m, "CRC32_IMPL", sparkmq_crc32_impl())) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
