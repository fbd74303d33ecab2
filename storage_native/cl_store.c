/* Storage core: see cl_store.h.  No Python API in this file. */
#define _GNU_SOURCE
#include "cl_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32.h"

static void syncer_free(cl_log *c);

const char CL_INVALID_ARGUMENT[] = "INVALID_ARGUMENT", CL_OFFSET_ILLEGAL[] = "OFFSET_ILLEGAL",
           CL_OFFSET_TOO_SMALL[] = "OFFSET_TOO_SMALL", CL_OFFSET_OVERFLOW[] = "OFFSET_OVERFLOW",
           CL_OFFSET_MISMATCH[] = "OFFSET_MISMATCH",
           CL_CORRUPT_RECORD[] = "CORRUPT_RECORD", CL_CORRUPT_STORE[] = "CORRUPT_STORE",
           CL_DISK_FULL[] = "DISK_FULL", CL_IO_ERROR[] = "IO_ERROR", CL_CLOSED[] = "CLOSED",
           CL_MESSAGE_ILLEGAL[] = "MESSAGE_ILLEGAL", CL_MESSAGE_TOO_LARGE[] = "MESSAGE_TOO_LARGE",
           CL_PROPERTIES_TOO_LARGE[] = "PROPERTIES_TOO_LARGE";

typedef long long ll; /* for printf: int64_t is long on LP64, long long elsewhere */

/* ------------------------------------------------------------------ errors */

int cl_fail(cl_err *e, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    e->code = code;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int cl_oserr(cl_err *e, int errnum, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    e->code = errnum == ENOSPC ? CL_DISK_FULL : CL_IO_ERROR;
    int n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof e->msg)
        n = (int)strlen(e->msg);
    /* GNU strerror_r: same text as Python's os.strerror */
    snprintf(e->msg + n, sizeof e->msg - (size_t)n, ": %s", strerror_r(errnum, buf, sizeof buf));
    return -1;
}

static int oom(cl_err *e) { return cl_oserr(e, ENOMEM, "out of memory"); }

/* --------------------------------------------------------- small helpers */

static inline uint16_t ld16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t ld32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline int64_t ld64(const char *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline void st16(char *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void st32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void st64(char *p, int64_t v) { memcpy(p, &v, 8); }

static size_t page_size(void)
{
    static size_t ps;
    if (!ps) {
        long v = sysconf(_SC_PAGESIZE);
        ps = v > 0 ? (size_t)v : 4096;
    }
    return ps;
}

int64_t cl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t cl_record_size(size_t body_len, size_t topic_len, size_t props_len)
{
    return (uint64_t)CL_HEADER_SIZE + body_len + 1 + topic_len + 2 + props_len;
}

/* Python's strict UTF-8: no overlongs, no surrogates, nothing above U+10FFFF. */
int cl_utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0xC2)
            return 0;
        else if (c < 0xE0)
            need = 1;
        else if (c < 0xF0) {
            need = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c < 0xF5) {
            need = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if (n - i <= need)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (size_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return 0;
        i += need + 1;
    }
    return 1;
}

/* os.path.join(a, b) for a relative b */
static char *path_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int sep = la > 0 && a[la - 1] != '/';
    char *p = malloc(la + sep + lb + 1);
    if (!p)
        return NULL;
    memcpy(p, a, la);
    if (sep)
        p[la] = '/';
    memcpy(p + la + sep, b, lb + 1);
    return p;
}

static void name20(char out[21], int64_t v) { snprintf(out, 21, "%020lld", (ll)v); }

/* exactly 20 ASCII digits; the value (names above INT64_MAX are treated as foreign) */
static int parse_name20(const char *name, int64_t *v)
{
    uint64_t acc = 0;
    for (int i = 0; i < 20; i++) {
        if (name[i] < '0' || name[i] > '9')
            return 0;
        uint64_t d = (uint64_t)(name[i] - '0');
        if (acc > (UINT64_MAX - d) / 10)
            return 0;
        acc = acc * 10 + d;
    }
    if (name[20] != '\0' || acc > (uint64_t)INT64_MAX)
        return 0;
    *v = (int64_t)acc;
    return 1;
}

/* ------------------------------------------------------- directory lists */

typedef struct namelist {
    char **v;
    size_t n, cap;
} namelist;

static void names_free(namelist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

/* every entry but . and .. */
static int list_dir(const char *dir, namelist *out, cl_err *e)
{
    DIR *d = opendir(dir);
    if (!d)
        return cl_oserr(e, errno, "listdir %s", dir);
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 16;
            char **v = realloc(out->v, cap * sizeof *v);
            if (!v)
                goto nomem;
            out->v = v;
            out->cap = cap;
        }
        if (!(out->v[out->n] = strdup(de->d_name)))
            goto nomem;
        out->n++;
    }
    closedir(d);
    return 0;
nomem:
    closedir(d);
    names_free(out);
    return oom(e);
}

static int cmp_str(const void *a, const void *b)
{
    /* byte order == code point order for UTF-8, i.e. Python's sorted() */
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct numname {
    int64_t v;
    char *name;
} numname;

static int cmp_numname(const void *a, const void *b)
{
    int64_t x = ((const numname *)a)->v, y = ((const numname *)b)->v;
    return (x > y) - (x < y);
}

static void remove_stale_tmp(const char *dir, const namelist *l);

/* the 20-digit names of dir, sorted by value; *out owns nothing of l */
static int list_name20(const char *dir, namelist *l, numname **out, size_t *nout, cl_err *e)
{
    if (list_dir(dir, l, e))
        return -1;
    remove_stale_tmp(dir, l);
    numname *v = malloc((l->n ? l->n : 1) * sizeof *v);
    if (!v) {
        names_free(l);
        return oom(e);
    }
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        if (strlen(l->v[i]) == 20 && parse_name20(l->v[i], &v[n].v))
            v[n++].name = l->v[i];
    if (n)
        qsort(v, n, sizeof *v, cmp_numname);
    *out = v;
    *nout = n;
    return 0;
}

/* ---------------------------------------------------------- mapped files */

void mf_ref(mfile *f) { atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed); }

void mf_unref(mfile *f)
{
    if (!f || atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel) != 1)
        return;
    munmap(f->base, f->size);
    free(f->path);
    free(f);
}

static mfile *mf_wrap(char *base, size_t size, int64_t start, const char *path)
{
    mfile *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    if (!(f->path = strdup(path))) {
        free(f);
        return NULL;
    }
    atomic_init(&f->refs, 1);
    f->base = base;
    f->size = size;
    f->start = start;
    return f;
}

/* Zero-filled blocks for the whole file.  fallocate(2) directly rather than
 * posix_fallocate: glibc's posix_fallocate emulates an unsupporting file system
 * by writing every block, which is slow for 1 GiB; ftruncate is the fallback. */
static int alloc_file(int fd, size_t size)
{
    int err;
#ifdef __linux__
    do
        err = fallocate(fd, 0, 0, (off_t)size) == 0 ? 0 : errno;
    while (err == EINTR);
#else
    err = posix_fallocate(fd, 0, (off_t)size);
#endif
    if (err == 0)
        return 0;
    if (err != EOPNOTSUPP && err != ENOSYS && err != EINVAL)
        return err;
    return ftruncate(fd, (off_t)size) == 0 ? 0 : errno;
}

#define TMP_SUFFIX ".tmp" /* never 20 digits: ignored by the loaders */

/* A new file of `size` zero bytes, mapped.  It is built under a temporary name
 * and renamed into place, so a kill -9 during creation can never leave a
 * short file under a 20-digit name (which would make the store unopenable);
 * a partial file is removed on failure. */
static mfile *mf_create(const char *path, int64_t start, size_t size, cl_err *e)
{
    size_t n = strlen(path);
    char *tmp = malloc(n + sizeof TMP_SUFFIX);
    if (!tmp) {
        oom(e);
        return NULL;
    }
    memcpy(tmp, path, n);
    memcpy(tmp + n, TMP_SUFFIX, sizeof TMP_SUFFIX);
    if (access(path, F_OK) == 0) { /* O_EXCL semantics for the final name */
        cl_oserr(e, EEXIST, "open %s", path);
        free(tmp);
        return NULL;
    }
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        cl_oserr(e, errno, "open %s", path);
        free(tmp);
        return NULL;
    }
    int err = alloc_file(fd, size);
    void *p = MAP_FAILED;
    if (!err) {
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            err = errno;
    }
    close(fd); /* the mapping keeps the file; msync needs no descriptor */
    if (!err && rename(tmp, path) != 0)
        err = errno;
    mfile *f = err ? NULL : mf_wrap(p, size, start, path);
    if (!f) {
        if (p != MAP_FAILED)
            munmap(p, size);
        unlink(err ? tmp : path);
        cl_oserr(e, err ? err : ENOMEM, "create %s", path);
    }
    free(tmp);
    return f;
}

/* leftovers of a creation interrupted by a crash */
static void remove_stale_tmp(const char *dir, const namelist *l)
{
    for (size_t i = 0; i < l->n; i++) {
        const char *name = l->v[i];
        int64_t v;
        char base[21];
        if (strlen(name) != 20 + strlen(TMP_SUFFIX) || strcmp(name + 20, TMP_SUFFIX))
            continue;
        memcpy(base, name, 20);
        base[20] = '\0';
        char *path = parse_name20(base, &v) ? path_join(dir, name) : NULL;
        if (path)
            unlink(path);
        free(path);
    }
}

static mfile *mf_open(const char *path, int64_t start, size_t size, cl_err *e)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        cl_oserr(e, errno, "open %s", path);
        return NULL;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = p == MAP_FAILED ? errno : 0;
    close(fd);
    if (err) {
        cl_oserr(e, err, "mmap %s", path);
        return NULL;
    }
    mfile *f = mf_wrap(p, size, start, path);
    if (!f) {
        munmap(p, size);
        oom(e);
    }
    return f;
}

/* The file leaves its directory now; the mapping stays until the last reference. */
static int mf_delete(mfile *f, cl_err *e)
{
    int rc = 0;
    if (unlink(f->path) != 0 && errno != ENOENT)
        rc = cl_oserr(e, errno, "unlink %s", f->path);
    mf_unref(f);
    return rc;
}

/* msync(MS_SYNC) of a range is vfs_fsync_range(datasync=1) on Linux: the
 * fdatasync of that range, without keeping a descriptor per queue file open. */
static int mf_sync(mfile *f, size_t lo, size_t hi, cl_err *e)
{
    if (hi > f->size)
        hi = f->size;
    if (lo >= hi)
        return 0;
    size_t a = lo & ~(page_size() - 1);
    if (msync(f->base + a, hi - a, MS_SYNC) != 0)
        return cl_oserr(e, errno, "msync %s", f->path);
    return 0;
}

/* Drop page-table entries only: MAP_SHARED file pages stay in the page cache
 * (dirty ones included), so this bounds RSS without losing data. */
static void mf_drop(mfile *f, size_t len)
{
    len &= ~(page_size() - 1);
    if (len)
        madvise(f->base, len, MADV_DONTNEED);
}

/* ------------------------------------------------------- dirty bookkeeping */

static void note_dir(cl_log *c, const char *dir)
{
    for (size_t i = 0; i < c->ndirsync; i++)
        if (!strcmp(c->dirsync[i], dir))
            return;
    if (c->ndirsync == c->dirsynccap) {
        size_t cap = c->dirsynccap ? c->dirsynccap * 2 : 8;
        char **v = realloc(c->dirsync, cap * sizeof *v);
        if (!v)
            return; /* durability of the entry then rests on the next journal commit */
        c->dirsync = v;
        c->dirsynccap = cap;
    }
    char *d = strdup(dir);
    if (d)
        c->dirsync[c->ndirsync++] = d;
}

static void note_parent(cl_log *c, const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        note_dir(c, ".");
        return;
    }
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = strndup(path, n);
    if (d) {
        note_dir(c, d);
        free(d);
    }
}

/* Remember [lo, hi) of f as written; flush syncs it (flush_log too for a segment). */
static void mark_dirty(cl_log *c, mfile *f, size_t lo, size_t hi)
{
    if (f->listed) {
        if (lo < f->dlo)
            f->dlo = lo;
        if (hi > f->dhi)
            f->dhi = hi;
        return;
    }
    mfile ***list = f->segment ? &c->sdirty : &c->dirty;
    size_t *n = f->segment ? &c->nsdirty : &c->ndirty, *capp = f->segment ? &c->sdirtycap : &c->dirtycap;
    if (*n == *capp) {
        size_t cap = *capp ? *capp * 2 : 64;
        mfile **v = realloc(*list, cap * sizeof *v);
        if (!v) { /* cannot remember it: make it durable right away instead */
            cl_err e;
            mf_sync(f, lo, hi, &e);
            return;
        }
        *list = v;
        *capp = cap;
    }
    mf_ref(f);
    (*list)[(*n)++] = f;
    f->listed = 1;
    f->dlo = lo;
    f->dhi = hi;
}

/* mkdir -p; the parents of created directories are remembered for fsync.
 * Errors read "mkdir <what>" (what defaults to path). */
static int mkdir_p(cl_log *c, const char *path, const char *what, cl_err *e)
{
    char *buf = strdup(path);
    if (!buf)
        return oom(e);
    size_t n = strlen(buf);
    for (size_t i = 1; i <= n; i++) {
        if (i < n && buf[i] != '/')
            continue;
        char save = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) == 0) {
            if (c)
                note_parent(c, buf);
        } else if (errno != EEXIST) {
            int err = errno;
            free(buf);
            return cl_oserr(e, err, "mkdir %s", what ? what : path);
        }
        buf[i] = save;
    }
    free(buf);
    return 0;
}

/* ---------------------------------------------------------------- queues */

static uint64_t qhash(const char *t, size_t n, int64_t qid)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)t[i]) * 1099511628211ULL;
    return (h ^ (uint64_t)qid) * 0x9E3779B97F4A7C15ULL;
}

cl_queue *cl_find_queue_locked(cl_log *c, const char *topic, size_t tlen, int64_t qid)
{
    if (!c->nbuckets)
        return NULL;
    cl_queue *q = c->buckets[qhash(topic, tlen, qid) & (c->nbuckets - 1)];
    for (; q; q = q->hnext)
        if (q->queue_id == qid && q->topic_len == tlen && !memcmp(q->topic, topic, tlen))
            return q;
    return NULL;
}

static int grow_buckets(cl_log *c)
{
    size_t nb = c->nbuckets ? c->nbuckets * 2 : 64;
    cl_queue **b = calloc(nb, sizeof *b);
    if (!b)
        return -1;
    for (size_t i = 0; i < c->nqueues; i++) {
        cl_queue *q = c->queues[i];
        size_t h = qhash(q->topic, q->topic_len, q->queue_id) & (nb - 1);
        q->hnext = b[h];
        b[h] = q;
    }
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = nb;
    return 0;
}

static void queue_free(cl_queue *q)
{
    for (size_t i = 0; i < q->nfiles; i++)
        mf_unref(q->files[i]);
    free(q->files);
    free(q->topic);
    free(q->dir);
    free(q);
}

/* a detached queue; dir NULL means <cq_dir>/<topic>/<queue_id> */
static cl_queue *queue_alloc(cl_log *c, const char *topic, size_t tlen, int64_t qid, const char *dir)
{
    cl_queue *q = calloc(1, sizeof *q);
    if (!q || !(q->topic = malloc(tlen + 1)))
        goto fail;
    memcpy(q->topic, topic, tlen);
    q->topic[tlen] = '\0';
    q->topic_len = tlen;
    q->queue_id = qid;
    if (dir)
        q->dir = strdup(dir);
    else {
        char qname[32];
        snprintf(qname, sizeof qname, "%lld", (ll)qid);
        char *t = path_join(c->cq_dir, q->topic);
        q->dir = t ? path_join(t, qname) : NULL;
        free(t);
    }
    if (!q->dir)
        goto fail;
    return q;
fail:
    if (q) {
        free(q->topic);
        free(q);
    }
    return NULL;
}

static int queue_insert(cl_log *c, cl_queue *q)
{
    if (c->nqueues == c->qcap) {
        size_t cap = c->qcap ? c->qcap * 2 : 64;
        cl_queue **v = realloc(c->queues, cap * sizeof *v);
        if (!v)
            return -1;
        c->queues = v;
        c->qcap = cap;
    }
    if ((c->nqueues + 1) * 4 > c->nbuckets * 3 && grow_buckets(c))
        return -1;
    c->queues[c->nqueues++] = q;
    size_t h = qhash(q->topic, q->topic_len, q->queue_id) & (c->nbuckets - 1);
    q->hnext = c->buckets[h];
    c->buckets[h] = q;
    return 0;
}

static cl_queue *queue_get(cl_log *c, const char *topic, size_t tlen, int64_t qid, cl_err *e)
{
    cl_queue *q = cl_find_queue_locked(c, topic, tlen, qid);
    if (q)
        return q;
    q = queue_alloc(c, topic, tlen, qid, NULL);
    if (!q || queue_insert(c, q)) {
        if (q)
            queue_free(q);
        oom(e);
        return NULL;
    }
    return q;
}

/* index of the file starting at fstart, or -1 with *ins = insertion point */
static ptrdiff_t cq_find(const cl_queue *q, int64_t fstart, size_t *ins)
{
    size_t lo = 0, hi = q->nfiles;
    if (hi && q->files[hi - 1]->start == fstart) /* the newest file: the usual case */
        return (ptrdiff_t)hi - 1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (q->files[mid]->start < fstart)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < q->nfiles && q->files[lo]->start == fstart)
        return (ptrdiff_t)lo;
    if (ins)
        *ins = lo;
    return -1;
}

static int64_t cq_file_start(const cl_log *c, int64_t idx) { return (idx / c->cq_units) * c->cq_units * CL_UNIT_SIZE; }

/* the file holding unit idx; created (with its directory) when `create` */
static mfile *cq_file(cl_log *c, cl_queue *q, int64_t idx, int create, cl_err *e)
{
    int64_t fstart = cq_file_start(c, idx);
    size_t ins = 0;
    ptrdiff_t i = cq_find(q, fstart, &ins);
    if (i >= 0)
        return q->files[i];
    if (!create)
        return NULL;
    if (q->nfiles == q->fcap) {
        size_t cap = q->fcap ? q->fcap * 2 : 4;
        mfile **v = realloc(q->files, cap * sizeof *v);
        if (!v) {
            oom(e);
            return NULL;
        }
        q->files = v;
        q->fcap = cap;
    }
    if (mkdir_p(c, q->dir, NULL, e))
        return NULL;
    char name[21];
    name20(name, fstart);
    char *path = path_join(q->dir, name);
    if (!path) {
        oom(e);
        return NULL;
    }
    mfile *f = mf_create(path, fstart, c->cq_file_size, e);
    free(path);
    if (!f)
        return NULL;
    note_dir(c, q->dir);
    memmove(q->files + ins + 1, q->files + ins, (q->nfiles - ins) * sizeof *q->files);
    q->files[ins] = f;
    q->nfiles++;
    return f;
}

/* A unit of a missing file reads as zeros. */
void cl_queue_unit_locked(cl_log *c, cl_queue *q, int64_t idx, int64_t *clo, int32_t *size, int64_t *tag)
{
    mfile *f = idx >= 0 ? cq_file(c, q, idx, 0, NULL) : NULL;
    if (!f) {
        *clo = 0;
        *size = 0;
        *tag = 0;
        return;
    }
    const char *p = f->base + (size_t)(idx % c->cq_units) * CL_UNIT_SIZE;
    f->touched = 1;
    *clo = ld64(p);
    *size = (int32_t)ld32(p + 8);
    *tag = ld64(p + 12);
}

static int cq_write(cl_log *c, cl_queue *q, int64_t idx, int64_t clo, int32_t size, int64_t tag, cl_err *e)
{
    mfile *f = cq_file(c, q, idx, 1, e);
    if (!f)
        return -1;
    size_t pos = (size_t)(idx % c->cq_units) * CL_UNIT_SIZE;
    char *p = f->base + pos;
    st64(p, clo);
    st32(p + 8, (uint32_t)size);
    st64(p + 12, tag);
    f->touched = 1;
    mark_dirty(c, f, pos, pos + CL_UNIT_SIZE);
    return 0;
}

static int cq_remove_file(cl_queue *q, size_t i, cl_err *e)
{
    mfile *f = q->files[i];
    memmove(q->files + i, q->files + i + 1, (q->nfiles - i - 1) * sizeof *q->files);
    q->nfiles--;
    return mf_delete(f, e);
}

/* Zero units [off, max), delete files starting at or above off (never the
 * first one); later appends continue at off. */
static int cq_truncate(cl_log *c, cl_queue *q, int64_t off, int64_t *dropped, cl_err *e)
{
    *dropped = 0;
    if (off >= q->max)
        return 0;
    *dropped = q->max - off;
    int rc = 0;
    size_t i = 0;
    int first_file = 1;
    while (i < q->nfiles) {
        mfile *f = q->files[i];
        int64_t first = f->start / CL_UNIT_SIZE;
        if (first >= off && !first_file) {
            if (cq_remove_file(q, i, e))
                rc = -1;
            continue;
        }
        first_file = 0;
        if (first + c->cq_units > off) {
            int64_t lo = (off - first > 0 ? off - first : 0) * CL_UNIT_SIZE;
            int64_t hi = (q->max - first < c->cq_units ? q->max - first : c->cq_units) * CL_UNIT_SIZE;
            if (hi > lo) {
                memset(f->base + lo, 0, (size_t)(hi - lo));
                mark_dirty(c, f, (size_t)lo, (size_t)hi);
            }
        }
        i++;
    }
    q->max = off;
    return rc;
}

int cl_queue_truncate_locked(cl_log *c, cl_queue *q, int64_t off, int64_t *dropped, cl_err *e)
{
    *dropped = 0;
    if (c->closed)
        return cl_fail(e, CL_CLOSED, "commit log is closed");
    if (off < 0)
        return cl_fail(e, CL_INVALID_ARGUMENT, "queue offset must be >= 0, got %lld", (ll)off);
    if (off < q->min)
        return cl_fail(e, CL_OFFSET_TOO_SMALL, "queue offset %lld is below the minimum queue offset %lld", (ll)off,
                       (ll)q->min);
    return cq_truncate(c, q, off, dropped, e);
}

/* min moves to the first unit pointing at or above the log's minimum */
static void cq_advance_min(cl_log *c, cl_queue *q, int64_t log_min)
{
    int64_t clo, tag;
    int32_t size;
    while (q->min < q->max) {
        cl_queue_unit_locked(c, q, q->min, &clo, &size, &tag);
        if (clo >= log_min)
            break;
        q->min++;
    }
}

/* Retention moved the log's minimum: advance min, delete wholly-old files
 * (never the newest one). */
static int cq_correct_min(cl_log *c, cl_queue *q, int64_t log_min, cl_err *e)
{
    cq_advance_min(c, q, log_min);
    int rc = 0;
    while (q->nfiles > 1 && q->files[0]->start / CL_UNIT_SIZE + c->cq_units <= q->min)
        if (cq_remove_file(q, 0, e))
            rc = -1;
    return rc;
}

/* index of the last unit of f with size > 0, or -1 */
static int64_t cq_last_written(const mfile *f)
{
    size_t n = f->size;
    const char *b = f->base;
    while (n >= 8 && ld64(b + n - 8) == 0) /* skip the zero tail a word at a time */
        n -= 8;
    while (n > 0 && b[n - 1] == 0)
        n--;
    if (n == 0)
        return -1;
    for (int64_t i = (int64_t)((n - 1) / CL_UNIT_SIZE); i >= 0; i--)
        if ((int32_t)ld32(b + i * CL_UNIT_SIZE + 8) > 0)
            return i;
    return -1;
}

/* load one <topic>/<queue_id> directory; *out NULL when it has no files */
static int cq_load(cl_log *c, const char *topic, int64_t qid, const char *qdir, int64_t log_min, cl_queue **out,
                   cl_err *e)
{
    *out = NULL;
    cl_queue *q = queue_alloc(c, topic, strlen(topic), qid, qdir);
    if (!q)
        return oom(e);
    namelist l = {0};
    numname *v = NULL;
    size_t n = 0;
    if (list_name20(qdir, &l, &v, &n, e)) {
        queue_free(q);
        return -1;
    }
    int rc = 0;
    if (n && !(q->files = malloc(n * sizeof *q->files)))
        rc = oom(e);
    for (size_t i = 0; i < n && !rc; i++) {
        char *path = path_join(qdir, v[i].name);
        struct stat st;
        if (!path)
            rc = oom(e);
        else if (stat(path, &st) != 0)
            rc = cl_oserr(e, errno, "stat %s", path);
        else if ((uint64_t)st.st_size != c->cq_file_size)
            rc = cl_fail(e, CL_CORRUPT_STORE, "queue file %s/%lld/%s: size %lld != %lld", topic, (ll)qid, v[i].name,
                         (ll)st.st_size, (ll)c->cq_file_size);
        else if (!(q->files[q->nfiles] = mf_open(path, v[i].v, c->cq_file_size, e)))
            rc = -1;
        else
            q->nfiles++;
        free(path);
    }
    q->fcap = n;
    free(v);
    names_free(&l);
    if (rc || !q->nfiles) {
        queue_free(q);
        return rc;
    }
    /* max: one past the last unit with size > 0, looking from the newest file */
    q->max = q->files[0]->start / CL_UNIT_SIZE;
    for (size_t i = q->nfiles; i-- > 0;) {
        int64_t last = cq_last_written(q->files[i]);
        if (last >= 0) {
            q->max = q->files[i]->start / CL_UNIT_SIZE + last + 1;
            break;
        }
    }
    /* min: the first unit pointing at or above the log's minimum */
    q->min = q->files[0]->start / CL_UNIT_SIZE;
    cq_advance_min(c, q, log_min);
    for (size_t i = 0; i < q->nfiles; i++) /* the scan for max mapped them all */
        mf_drop(q->files[i], q->files[i]->size);
    *out = q;
    return 0;
}

static int all_digits(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* consumequeue/<topic>/<queue_id>/; directories without files are not queues */
static int load_queues(cl_log *c, int64_t log_min, cl_err *e)
{
    namelist topics = {0};
    if (list_dir(c->cq_dir, &topics, e))
        return -1;
    if (topics.n)
        qsort(topics.v, topics.n, sizeof *topics.v, cmp_str);
    int rc = 0;
    for (size_t t = 0; t < topics.n && !rc; t++) {
        char *tdir = path_join(c->cq_dir, topics.v[t]);
        if (!tdir) {
            rc = oom(e);
            break;
        }
        namelist qs = {0};
        if (!is_dir(tdir) || list_dir(tdir, &qs, e)) {
            rc = is_dir(tdir) ? -1 : 0;
            free(tdir);
            continue;
        }
        if (qs.n)
            qsort(qs.v, qs.n, sizeof *qs.v, cmp_str);
        for (size_t i = 0; i < qs.n && !rc; i++) {
            if (!all_digits(qs.v[i]) || strlen(qs.v[i]) > 18)
                continue;
            char *qdir = path_join(tdir, qs.v[i]);
            cl_queue *q = NULL;
            if (!qdir)
                rc = oom(e);
            else if (is_dir(qdir))
                rc = cq_load(c, topics.v[t], strtoll(qs.v[i], NULL, 10), qdir, log_min, &q, e);
            free(qdir);
            if (q && !rc && !cl_find_queue_locked(c, q->topic, q->topic_len, q->queue_id)) {
                if (queue_insert(c, q)) {
                    queue_free(q);
                    rc = oom(e);
                }
            } else if (q)
                queue_free(q);
        }
        names_free(&qs);
        free(tdir);
    }
    names_free(&topics);
    return rc;
}

/* -------------------------------------------------------------- segments */

int64_t cl_min_offset_locked(const cl_log *c) { return c->nsegs ? c->segs[0]->start : 0; }

static int64_t files_end(const cl_log *c) { return c->nsegs ? c->segs[c->nsegs - 1]->start + c->seg_size : 0; }

static mfile *seg_for(const cl_log *c, int64_t off)
{
    if (!c->nsegs || off < c->segs[0]->start)
        return NULL;
    uint64_t i = (uint64_t)(off - c->segs[0]->start) / (uint64_t)c->seg_size;
    return i < c->nsegs ? c->segs[i] : NULL;
}

static int push_seg(cl_log *c, mfile *f)
{
    if (c->nsegs == c->segcap) {
        size_t cap = c->segcap ? c->segcap * 2 : 16;
        mfile **v = realloc(c->segs, cap * sizeof *v);
        if (!v)
            return -1;
        c->segs = v;
        c->segcap = cap;
    }
    f->segment = 1; /* every segment comes through here: its writes go on the segment dirty list */
    c->segs[c->nsegs++] = f;
    return 0;
}

static int load_segments(cl_log *c, cl_err *e)
{
    namelist l = {0};
    numname *v = NULL;
    size_t n = 0;
    if (list_name20(c->clog_dir, &l, &v, &n, e))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char *path = path_join(c->clog_dir, v[i].name);
        struct stat st;
        mfile *f = NULL;
        if (!path)
            rc = oom(e);
        else if (stat(path, &st) != 0)
            rc = cl_oserr(e, errno, "stat %s", path);
        else if ((int64_t)st.st_size != c->seg_size)
            rc = cl_fail(e, CL_CORRUPT_STORE, "segment %s: size %lld != segment_size %lld", v[i].name,
                         (ll)st.st_size, (ll)c->seg_size);
        else if (v[i].v % c->seg_size)
            rc = cl_fail(e, CL_CORRUPT_STORE, "segment %s is not aligned to segment_size %lld", v[i].name,
                         (ll)c->seg_size);
        else if (i > 0 && v[i].v != v[i - 1].v + c->seg_size)
            rc = cl_fail(e, CL_CORRUPT_STORE, "segment %s does not follow %s", v[i].name, v[i - 1].name);
        else if (!(f = mf_open(path, v[i].v, (size_t)c->seg_size, e)))
            rc = -1;
        else if (push_seg(c, f)) {
            mf_unref(f);
            rc = oom(e);
        }
        free(path);
    }
    free(v);
    names_free(&l);
    return rc;
}

/* a new, zero-filled segment after the last one */
static mfile *roll(cl_log *c, cl_err *e)
{
    int64_t start = files_end(c);
    char name[21];
    name20(name, start);
    char *path = path_join(c->clog_dir, name);
    if (!path) {
        oom(e);
        return NULL;
    }
    mfile *f = mf_create(path, start, (size_t)c->seg_size, e);
    if (f && push_seg(c, f)) {
        mf_delete(f, e);
        f = NULL;
        oom(e);
    }
    free(path);
    if (f)
        note_dir(c, c->clog_dir);
    return f;
}

/* ------------------------------------------------------------ prefault */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* MADV_POPULATE_WRITE of [a, a + len) with readahead off: with it, a fault
 * reads (zero-fills) the device's whole readahead window, up to ~20 ms on the
 * appending thread (the broker's event loop) every other chunk. */
static int populate(char *a, size_t len)
{
    madvise(a, len, MADV_RANDOM);
    int rc = madvise(a, len, MADV_POPULATE_WRITE);
    int err = errno;
    madvise(a, len, MADV_NORMAL); /* the range merges back into the segment's mapping */
    errno = err;
    return rc;
}

/* The pre-fault thread: faults in the active segment ahead of the appends, off
 * the appending thread (the broker's event loop).  With pf_readahead it leaves
 * readahead on, so the page cache fills with large folios a window at a time:
 * about half the kernel time per byte of order-0 pages, and the stalls of a
 * window's zero-fill fall on this thread, not on a send.  Without it, pages
 * are order-0: a sync writes back a whole folio, so frequent small syncs
 * (SYNC_FLUSH) would write up to a large folio each instead of a page. */
static void *prefault_main(void *arg)
{
    cl_log *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->pf_stop) {
        mfile *f = c->pf_seg;
        if (!f || c->prefault_off || c->pf_start != f->start || c->pf_end >= c->pf_want) {
            pthread_cond_wait(&c->pf_cond, &c->mu);
            continue;
        }
        size_t lo = c->pf_end, hi = c->pf_want;
        if (hi - lo > CL_PREFAULT_STEP)
            hi = lo + CL_PREFAULT_STEP;
        mf_ref(f);
        pthread_mutex_unlock(&c->mu);
        int rc = c->pf_readahead ? madvise(f->base + lo, hi - lo, MADV_POPULATE_WRITE) : populate(f->base + lo, hi - lo);
        int err = errno;
        pthread_mutex_lock(&c->mu);
        if (c->pf_seg == f && c->pf_start == f->start) {
            if (rc == 0 && c->pf_end < hi)
                c->pf_end = hi;
            else if (rc != 0) /* unsupported, or no memory: the appends fault in themselves */
                c->pf_want = c->pf_end;
        }
        if (rc != 0 && (err == EINVAL || err == ENOSYS))
            c->prefault_off = 1;
        mf_unref(f);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* mu held */
static void start_prefault_thread(cl_log *c)
{
    c->pf_thread_state = -1;
    if (pthread_cond_init(&c->pf_cond, NULL))
        return;
    if (pthread_create(&c->pf_thread, NULL, prefault_main, c)) {
        pthread_cond_destroy(&c->pf_cond);
        return;
    }
    c->pf_thread_state = 1;
}

/* mu not held; pf_stop already set under mu */
static void join_prefault_thread(cl_log *c)
{
    if (c->pf_thread_state != 1)
        return;
    pthread_mutex_lock(&c->mu);
    pthread_cond_signal(&c->pf_cond);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->pf_thread, NULL);
    pthread_cond_destroy(&c->pf_cond);
    c->pf_thread_state = 0;
}

/* mu held: have the pages ahead of a write ending at `upto` in s faulted in.
 * The pre-fault thread keeps CL_PREFAULT_AHEAD faulted in; when it is behind
 * (or cannot run), this thread faults in a chunk itself: one madvise per chunk
 * instead of a trap per page cuts the cost of first writes to a fallocated
 * ext4 file from ~4.4 to ~1 us per page.  The pages are beyond max_offset, so
 * readers never look at them. */
static void prefault(cl_log *c, mfile *s, size_t upto)
{
    if (c->prefault_off)
        return;
    if (c->pf_start != s->start || c->pf_end > s->size) {
        c->pf_start = s->start;
        c->pf_end = (upto - 1) & ~(page_size() - 1); /* from the page being written */
    }
    if (!c->pf_thread_state && !c->closed)
        start_prefault_thread(c);
    if (c->pf_thread_state == 1) {
        if (c->pf_seg != s) {
            if (c->pf_seg)
                mf_unref(c->pf_seg);
            mf_ref(s);
            c->pf_seg = s;
            c->pf_want = 0;
        }
        size_t want = ((upto + page_size() - 1) & ~(page_size() - 1)) + CL_PREFAULT_AHEAD;
        if (want > s->size)
            want = s->size;
        if (want >= c->pf_want + CL_PREFAULT_CHUNK || (want == s->size && want > c->pf_want)) {
            c->pf_want = want;
            pthread_cond_signal(&c->pf_cond);
        }
    }
    if (upto <= c->pf_end)
        return;
    size_t end = ((upto + page_size() - 1) & ~(page_size() - 1)) + CL_PREFAULT_CHUNK;
    if (end > s->size)
        end = s->size;
    if (end > c->pf_end && populate(s->base + c->pf_end, end - c->pf_end) != 0 &&
        (errno == EINVAL || errno == ENOSYS))
        c->prefault_off = 1; /* kernel < 5.14: plain page faults */
    c->pf_end = end;
}

/* ------------------------------------------------------------------ trim */

/* Only files touched since the last trim are advised: with thousands of
 * queues a trim stays a walk over memory, not thousands of syscalls. */
static void trim_locked(cl_log *c)
{
    c->io_since_trim = 0;
    for (size_t i = 0; i < c->nsegs; i++) {
        mfile *f = c->segs[i];
        int active = i + 1 == c->nsegs && c->max >= f->start && c->max < f->start + c->seg_size;
        if (f->touched || active)
            mf_drop(f, active ? (size_t)(c->max - f->start) : f->size); /* keeps the write page */
        f->touched = 0;
    }
    for (size_t i = 0; i < c->nqueues; i++)
        for (size_t k = 0; k < c->queues[i]->nfiles; k++) {
            mfile *f = c->queues[i]->files[k];
            if (f->touched)
                mf_drop(f, f->size);
            f->touched = 0;
        }
}

void cl_note_io_locked(cl_log *c, uint64_t bytes)
{
    c->io_since_trim += bytes;
    if (c->io_since_trim >= CL_TRIM_EVERY)
        trim_locked(c);
}

/* --------------------------------------------------------- cache release */

/* Drops [lo, hi) of f from the page cache: first our page-table entries (a
 * mapped page is never invalidated), then the pages themselves, which are
 * clean (the range is below log_flushed).  A deleted file is skipped: its
 * pages go with its last mapping. */
static void mf_release(mfile *f, size_t lo, size_t hi)
{
    size_t page = page_size();
    lo = (lo + page - 1) & ~(page - 1);
    hi &= ~(page - 1);
    if (hi <= lo)
        return;
    madvise(f->base + lo, hi - lo, MADV_DONTNEED);
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    posix_fadvise(fd, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_DONTNEED);
    close(fd);
}

void cl_release_cache(cl_log *c, int64_t keep)
{
    pthread_mutex_lock(&c->mu);
    int64_t upto = c->max - keep;
    if (c->log_flushed < upto)
        upto = c->log_flushed;
    upto &= ~(int64_t)(page_size() - 1); /* whole pages: the next step starts where this one ended */
    int64_t from = c->released;
    int64_t min = cl_min_offset_locked(c);
    if (from < min)
        from = min;
    if (c->closed || keep <= 0 || upto - from < CL_RELEASE_STEP) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    mfile *segs[64]; /* at least one whole segment per step: a step spans few of them */
    size_t n = 0;
    for (size_t i = 0; i < c->nsegs && n < sizeof segs / sizeof *segs; i++) {
        mfile *f = c->segs[i];
        if (f->start + (int64_t)f->size <= from || f->start >= upto)
            continue;
        mf_ref(f);
        segs[n++] = f;
    }
    if (n == sizeof segs / sizeof *segs && segs[n - 1]->start + (int64_t)segs[n - 1]->size < upto)
        upto = segs[n - 1]->start + (int64_t)segs[n - 1]->size;
    uint64_t truncations = cl_truncations(c);
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        mfile *f = segs[i];
        int64_t lo = from > f->start ? from - f->start : 0;
        int64_t hi = upto < f->start + (int64_t)f->size ? upto - f->start : (int64_t)f->size;
        mf_release(f, (size_t)lo, (size_t)hi);
        mf_unref(f);
    }
    pthread_mutex_lock(&c->mu);
    if (truncations == cl_truncations(c) && upto > c->released) /* a truncation meanwhile: its writes are new */
        c->released = upto;
    pthread_mutex_unlock(&c->mu);
}

/* A read fault maps more than the bytes read: the fault-around window, or a
 * whole large folio (up to 2 MiB) on recent kernels.  So reads are charged by
 * the span of the log they walk: a read up to READ_SLACK after the previous
 * one is charged the gap too (a queue's records interleaved with others'),
 * any other jump is charged READ_SLACK on top of its length. */
#define READ_SLACK ((size_t)2 << 20)

void cl_note_read_locked(cl_log *c, const mfile *f, size_t rel, size_t len)
{
    size_t end = rel + len;
    uint64_t charge;
    if (c->rd_file == f && rel + READ_SLACK >= c->rd_end && rel <= c->rd_end + READ_SLACK) {
        charge = end > c->rd_end ? end - c->rd_end : 0;
        if (end > c->rd_end)
            c->rd_end = end;
    } else {
        charge = len + READ_SLACK;
        c->rd_file = f;
        c->rd_end = end;
    }
    ((mfile *)f)->touched = 1;
    cl_note_io_locked(c, charge);
}

/* ---------------------------------------------------------------- append */

/* Where a record of `size` bytes goes: the write position when it fits (exactly
 * or leaving room for a blank marker), else a blank marker closes the segment
 * and the record starts the next one. */
static mfile *place(cl_log *c, uint64_t size, size_t *relp, cl_err *e)
{
    if (c->nsegs && c->max < files_end(c)) {
        mfile *s = seg_for(c, c->max);
        size_t rel = (size_t)(c->max - s->start), left = s->size - rel;
        if (size == left || size + CL_BLANK_SIZE <= left) {
            *relp = rel;
            return s;
        }
        st32(s->base + rel + F_MAGIC, CL_BLANK_MAGIC);
        st32(s->base + rel, (uint32_t)left);
        mark_dirty(c, s, rel, rel + CL_BLANK_SIZE);
    }
    mfile *s = roll(c, e);
    if (!s)
        return NULL;
    c->max = s->start;
    *relp = 0;
    return s;
}

/* Every byte is written (the area may hold garbage the recovery left beyond a
 * zero page); total_size goes last so a kill -9 mid-copy leaves size 0 or a
 * CRC mismatch, never a plausible record. */
static void write_record(char *p, const cl_msg *m, uint32_t size, int qid, int64_t qoff, int64_t off,
                         int64_t store_ts, const uint8_t *store_host, const char *topic, size_t tlen)
{
    static const uint8_t zero_host[CL_HOST_SIZE];
    st32(p + F_MAGIC, CL_RECORD_MAGIC);
    st32(p + F_QID, (uint32_t)qid);
    st32(p + F_FLAG, (uint32_t)m->flag);
    st64(p + F_QOFF, qoff);
    st64(p + F_CLOFF, off);
    st32(p + F_SYSFLAG, (uint32_t)m->sys_flag);
    st64(p + F_BORN_TS, m->born_ts);
    memcpy(p + F_BORN_HOST, m->born_host, CL_HOST_SIZE);
    st64(p + F_STORE_TS, store_ts);
    memcpy(p + F_STORE_HOST, store_host ? store_host : zero_host, CL_HOST_SIZE);
    st32(p + F_RECONSUME, (uint32_t)m->reconsume);
    st64(p + F_PREPARED, m->prepared);
    st64(p + F_TAG, m->tag_hash);
    st32(p + F_BODY_LEN, (uint32_t)m->body_len);
    char *q = p + CL_HEADER_SIZE;
    memcpy(q, m->body, m->body_len);
    q += m->body_len;
    *q++ = (char)(unsigned char)tlen;
    memcpy(q, topic, tlen);
    q += tlen;
    st16(q, (uint16_t)m->props_len);
    memcpy(q + 2, m->props, m->props_len);
    st32(p + F_CRC, sparkmq_crc32(0, p + F_QID, size - F_QID));
    __atomic_thread_fence(__ATOMIC_RELEASE);
    st32(p + F_TOTAL, size);
}

int cl_append_locked(cl_log *c, const char *topic, size_t tlen, int qid, const cl_msg *msgs, size_t n,
                     int64_t store_ts, const uint8_t *store_host, int64_t *offsets, int64_t *first_qo, cl_err *e)
{
    if (c->closed)
        return cl_fail(e, CL_CLOSED, "commit log is closed");
    cl_queue *q = queue_get(c, topic, tlen, qid, e);
    if (!q)
        return -1;
    *first_qo = q->max;
    uint64_t bytes = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        int64_t qoff = q->max;
        size_t rel;
        mfile *s;
        /* the queue file first: a failure then leaves no record without its unit */
        if (!cq_file(c, q, qoff, 1, e) || !(s = place(c, msgs[i].size, &rel, e))) {
            rc = -1;
            break;
        }
        int64_t off = s->start + (int64_t)rel;
        uint32_t size = (uint32_t)msgs[i].size;
        prefault(c, s, rel + size);
        s->touched = 1;
        write_record(s->base + rel, &msgs[i], size, qid, qoff, off, store_ts, store_host, topic, tlen);
        mark_dirty(c, s, rel, rel + size);
        c->max = off + size;
        rc = cq_write(c, q, qoff, off, (int32_t)size, msgs[i].tag_hash, e);
        if (!rc)
            q->max = qoff + 1;
        offsets[i] = off;
        bytes += size;
    }
    cl_note_io_locked(c, bytes);
    return rc;
}

/* ------------------------------------------------------------------ reads */

int cl_check_read_offset_locked(cl_log *c, int64_t off, int allow_max, cl_err *e)
{
    if (c->closed)
        return cl_fail(e, CL_CLOSED, "commit log is closed");
    if (off < 0)
        return cl_fail(e, CL_INVALID_ARGUMENT, "offset must be >= 0, got %lld", (ll)off);
    int64_t min = cl_min_offset_locked(c);
    if (off < min)
        return cl_fail(e, CL_OFFSET_TOO_SMALL, "offset %lld is below the minimum offset %lld", (ll)off, (ll)min);
    if (off > c->max || (off == c->max && !allow_max))
        return cl_fail(e, CL_OFFSET_OVERFLOW, "offset %lld is at or past the maximum offset %lld", (ll)off,
                       (ll)c->max);
    return 0;
}

int cl_record_at_locked(cl_log *c, int64_t off, mfile **fp, size_t *relp, uint32_t *sizep, cl_err *e)
{
    mfile *s = seg_for(c, off);
    if (s) {
        size_t rel = (size_t)(off - s->start), left = s->size - rel;
        if (left >= CL_BLANK_SIZE) {
            const char *p = s->base + rel;
            uint32_t total = ld32(p);
            if (ld32(p + F_MAGIC) == CL_RECORD_MAGIC && total >= CL_MIN_RECORD && total <= left &&
                ld64(p + F_CLOFF) == off) {
                *fp = s;
                *relp = rel;
                *sizep = total;
                return 0;
            }
        }
    }
    return cl_fail(e, CL_OFFSET_ILLEGAL, "no record starts at offset %lld", (ll)off);
}

static int ents_add(cl_ents *es, int64_t a, int64_t b, mfile *f, const char *ptr, size_t len)
{
    if (es->n == es->cap) {
        size_t cap = es->cap ? es->cap * 2 : 32;
        cl_ent *v = realloc(es->v, cap * sizeof *v);
        if (!v)
            return -1;
        es->v = v;
        es->cap = cap;
    }
    if (f)
        mf_ref(f);
    es->v[es->n++] = (cl_ent){a, b, f, ptr, len};
    return 0;
}

void cl_ents_release(cl_ents *es)
{
    for (size_t i = 0; i < es->n; i++)
        mf_unref(es->v[i].f);
    free(es->v);
    es->v = NULL;
    es->n = es->cap = 0;
}

int cl_scan_locked(cl_log *c, int64_t off, int64_t max_count, int64_t max_bytes, cl_ents *out, int64_t *next,
                   cl_err *e)
{
    if (cl_check_read_offset_locked(c, off, 1, e))
        return -1;
    if (max_count < 1)
        return cl_fail(e, CL_INVALID_ARGUMENT, "max_count must be >= 1, got %lld", (ll)max_count);
    int64_t used = 0;
    while (off < c->max && (int64_t)out->n < max_count) {
        mfile *s = seg_for(c, off);
        size_t rel = s ? (size_t)(off - s->start) : 0;
        if (s && s->size - rel >= CL_BLANK_SIZE && ld32(s->base + rel + F_MAGIC) == CL_BLANK_MAGIC) {
            off = s->start + c->seg_size; /* skip to the next segment */
            continue;
        }
        uint32_t total;
        if (cl_record_at_locked(c, off, &s, &rel, &total, e))
            return -1;
        if (out->n && used + (int64_t)total > max_bytes)
            break;
        if (ents_add(out, off, 0, s, s->base + rel, total))
            return oom(e);
        cl_note_read_locked(c, s, rel, total);
        used += total;
        off += total;
    }
    *next = off;
    return 0;
}

int cl_read_raw_locked(cl_log *c, int64_t off, int64_t len, cl_ents *out, cl_err *e)
{
    if (c->closed)
        return cl_fail(e, CL_CLOSED, "commit log is closed");
    if (off < 0)
        return cl_fail(e, CL_INVALID_ARGUMENT, "offset must be >= 0, got %lld", (ll)off);
    if (len < 0)
        return cl_fail(e, CL_INVALID_ARGUMENT, "length must be >= 0, got %lld", (ll)len);
    if (cl_check_read_offset_locked(c, off, 1, e))
        return -1;
    if (off == c->max || len == 0)
        return 0;
    mfile *s = seg_for(c, off);
    int64_t end = len > c->max - off ? c->max : off + len;
    if (end > s->start + c->seg_size)
        end = s->start + c->seg_size;
    if (ents_add(out, off, 0, s, s->base + (off - s->start), (size_t)(end - off)))
        return oom(e);
    cl_note_read_locked(c, s, (size_t)(off - s->start), (size_t)(end - off));
    return 0;
}

static int tag_in(int64_t tag, const int64_t *tags, size_t n)
{
    size_t lo = 0, hi = n; /* tags are sorted by the binding */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tags[mid] < tag)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && tags[lo] == tag;
}

/* q may be NULL (unknown queue).  Validation of queue_offset / max_count is
 * done before the lookup, as the pure-Python twin does. */
int cl_get_locked(cl_log *c, cl_queue *q, int64_t qoff, int64_t max_count, const int64_t *tags, size_t ntags,
                  int filter, int64_t max_bytes, cl_ents *out, int64_t *next, cl_err *e)
{
    if (c->closed)
        return cl_fail(e, CL_CLOSED, "commit log is closed");
    if (qoff < 0)
        return cl_fail(e, CL_INVALID_ARGUMENT, "queue offset must be >= 0, got %lld", (ll)qoff);
    if (max_count < 1)
        return cl_fail(e, CL_INVALID_ARGUMENT, "max_count must be >= 1, got %lld", (ll)max_count);
    *next = qoff;
    if (!q || qoff >= q->max)
        return 0;
    if (qoff < q->min)
        return cl_fail(e, CL_OFFSET_TOO_SMALL, "queue offset %lld is below the minimum queue offset %lld",
                       (ll)qoff, (ll)q->min);
    int64_t log_min = cl_min_offset_locked(c), visible = c->visible;
    int64_t end = q->max - qoff > CL_GET_MAX_EXAMINED ? qoff + CL_GET_MAX_EXAMINED : q->max;
    int64_t idx = qoff, used = 0;
    while (idx < end && (int64_t)out->n < max_count) {
        int64_t clo, tag;
        int32_t size;
        cl_queue_unit_locked(c, q, idx, &clo, &size, &tag);
        if (clo >= visible) /* not committed yet: the queue ends here for its readers */
            break;
        mfile *s = clo < log_min ? NULL : seg_for(c, clo);
        if (!s || (filter && !tag_in(tag, tags, ntags))) {
            idx++;
            continue;
        }
        if (max_bytes > 0 && out->n && used + size > max_bytes)
            break;
        size_t rel = (size_t)(clo - s->start), len = size > 0 ? (size_t)size : 0;
        if (len > s->size - rel)
            len = s->size - rel;
        if (ents_add(out, idx, clo, s, s->base + rel, len))
            return oom(e);
        cl_note_read_locked(c, s, rel, len);
        used += size;
        idx++;
    }
    *next = idx;
    return 0;
}

/* ------------------------------------------------------------ replication */

int cl_read_replication_locked(cl_log *c, int64_t off, int64_t max_bytes, cl_ents *out, cl_err *e)
{
    if (cl_check_read_offset_locked(c, off, 1, e))
        return -1;
    if (max_bytes < 1)
        return cl_fail(e, CL_INVALID_ARGUMENT, "max_bytes must be >= 1, got %lld", (ll)max_bytes);
    int64_t used = 0;
    while (off < c->max) {
        mfile *s = seg_for(c, off);
        size_t rel = (size_t)(off - s->start), left = s->size - rel;
        uint32_t total;
        /* a blank marker ships whole (padding included): the slave's segment ends as the master's */
        if (left >= CL_BLANK_SIZE && ld32(s->base + rel + F_MAGIC) == CL_BLANK_MAGIC && ld32(s->base + rel) == left)
            total = (uint32_t)left;
        else if (cl_record_at_locked(c, off, &s, &rel, &total, e))
            return -1;
        if (used && used + (int64_t)total > max_bytes)
            break;
        cl_ent *last = out->n ? &out->v[out->n - 1] : NULL;
        if (last && last->f == s && last->ptr + last->len == s->base + rel)
            last->len += total; /* one range per segment */
        else if (ents_add(out, off, 0, s, s->base + rel, total))
            return oom(e);
        cl_note_read_locked(c, s, rel, total);
        used += total;
        off += total;
    }
    return 0;
}

/* One entry of a replicated run: data[at, at + size) goes to log offset pos. */
typedef struct repl_ent {
    int64_t pos;
    size_t at;
    uint32_t size;
    int blank;
    const char *topic;
    size_t tlen;
    int32_t qid;
    int64_t qoff, tag;
} repl_ent;

/* what append's check_topic allows: the topic names a directory */
static int topic_name_ok(const char *t, size_t n)
{
    return n && !memchr(t, '/', n) && !memchr(t, '\0', n) && !(n == 1 && t[0] == '.') &&
           !(n == 2 && t[0] == '.' && t[1] == '.');
}

/* Split data, the master's bytes from off on, into whole entries (*vp, *np;
 * free *vp) and check each as recovery would accept it, and stricter (the
 * placement rule of appends, a topic and queue id append would take).  No
 * lock: only off and the segment size matter.  -1 on the first fault. */
static int repl_split(int64_t seg_size, int64_t off, const char *data, size_t len, repl_ent **vp, size_t *np,
                      cl_err *e)
{
    repl_ent *v = NULL;
    size_t n = 0, cap = 0, at = 0;
    int64_t pos = off;
    while (at < len) {
        size_t avail = len - at;
        int64_t left = seg_size - pos % seg_size;
        const char *p = data + at;
        repl_ent r = {pos, at, 0, 0, NULL, 0, 0, 0, 0};
        uint32_t total = 0, magic = 0;
        if (avail < CL_BLANK_SIZE)
            goto cut;
        total = ld32(p);
        magic = ld32(p + F_MAGIC);
        if (magic == CL_BLANK_MAGIC) {
            if ((int64_t)total != left || total < CL_BLANK_SIZE)
                goto bad_blank;
            if (avail < total)
                goto cut;
            r.blank = 1;
        } else if (magic == CL_RECORD_MAGIC) {
            /* fits exactly or leaves room for a blank marker, as place() does */
            if (total < CL_MIN_RECORD || ((int64_t)total != left && (int64_t)total + CL_BLANK_SIZE > left)) {
                cl_fail(e, CL_CORRUPT_RECORD, "record at offset %lld has an impossible size %u (%lld bytes left in "
                        "its segment)", (ll)pos, total, (ll)left);
                goto fail;
            }
            if (avail < total)
                goto cut;
            if (sparkmq_crc32(0, p + F_QID, total - F_QID) != ld32(p + F_CRC)) {
                cl_fail(e, CL_CORRUPT_RECORD, "record at offset %lld fails its CRC check", (ll)pos);
                goto fail;
            }
            uint64_t tpos = (uint64_t)CL_HEADER_SIZE + ld32(p + F_BODY_LEN), ppos = 0;
            int framed = tpos + 1 <= total;
            if (framed) {
                ppos = tpos + 1 + (unsigned char)p[tpos];
                framed = ppos + 2 <= total && ppos + 2 + ld16(p + ppos) == total;
            }
            if (!framed) {
                cl_fail(e, CL_CORRUPT_RECORD, "record at offset %lld is malformed: lengths overrun the record", (ll)pos);
                goto fail;
            }
            r.topic = p + tpos + 1;
            r.tlen = (size_t)(ppos - tpos - 1);
            if (!cl_utf8_valid((const unsigned char *)r.topic, r.tlen)) {
                cl_fail(e, CL_CORRUPT_RECORD, "record at offset %lld is malformed: topic is not UTF-8", (ll)pos);
                goto fail;
            }
            if (!topic_name_ok(r.topic, r.tlen)) {
                cl_fail(e, CL_CORRUPT_RECORD, "record at offset %lld is malformed: topic is not a valid file name",
                        (ll)pos);
                goto fail;
            }
            r.qid = (int32_t)ld32(p + F_QID);
            if (r.qid < 0 || r.qid > CL_MAX_QUEUE_ID) {
                cl_fail(e, CL_CORRUPT_RECORD, "record at offset %lld is malformed: queue_id %d is out of range",
                        (ll)pos, (int)r.qid);
                goto fail;
            }
            /* recovery ends the log at a record whose stored offset is not its own */
            if (ld64(p + F_CLOFF) != pos) {
                cl_fail(e, CL_OFFSET_MISMATCH, "record at offset %lld says it is at offset %lld", (ll)pos,
                        (ll)ld64(p + F_CLOFF));
                goto fail;
            }
            r.qoff = ld64(p + F_QOFF);
            r.tag = ld64(p + F_TAG);
        } else {
            cl_fail(e, CL_CORRUPT_RECORD, "bad magic 0x%08x at offset %lld", magic, (ll)pos);
            goto fail;
        }
        r.size = total;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            repl_ent *nv = realloc(v, ncap * sizeof *nv);
            if (!nv) {
                oom(e);
                goto fail;
            }
            v = nv;
            cap = ncap;
        }
        v[n++] = r;
        at += total;
        pos += total;
        continue;
    bad_blank:
        cl_fail(e, CL_CORRUPT_RECORD, "blank marker at offset %lld has size %u, its segment has %lld bytes left",
                (ll)pos, total, (ll)left);
        goto fail;
    cut: /* the master ships whole entries only */
        cl_fail(e, CL_CORRUPT_RECORD, "the data ends inside the record at offset %lld (%zu bytes left)", (ll)pos, avail);
        goto fail;
    }
    *vp = v;
    *np = n;
    return 0;
fail:
    free(v);
    return -1;
}

/* mu held: the run must start at the end of the log */
static int repl_check_end_locked(cl_log *c, int64_t off, cl_err *e)
{
    if (c->closed)
        return cl_fail(e, CL_CLOSED, "commit log is closed");
    if (off < 0)
        return cl_fail(e, CL_INVALID_ARGUMENT, "offset must be >= 0, got %lld", (ll)off);
    if (off != c->max)
        return cl_fail(e, CL_OFFSET_MISMATCH, "replicated data starts at offset %lld, the log ends at %lld", (ll)off,
                       (ll)c->max);
    return 0;
}

typedef struct repl_slot {
    const char *topic;
    size_t tlen;
    int32_t qid;
    int used;
    int64_t next;
} repl_slot;

/* mu held: each record's queue offset must be the next of its queue (counting
 * the records before it in the run): a slave never numbers messages itself */
static int repl_check_queues_locked(cl_log *c, const repl_ent *v, size_t n, cl_err *e)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    repl_slot *h = calloc(cap, sizeof *h);
    if (!h)
        return oom(e);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const repl_ent *r = &v[i];
        if (r->blank)
            continue;
        size_t k = qhash(r->topic, r->tlen, r->qid) & (cap - 1);
        while (h[k].used && !(h[k].qid == r->qid && h[k].tlen == r->tlen && !memcmp(h[k].topic, r->topic, r->tlen)))
            k = (k + 1) & (cap - 1);
        if (!h[k].used) {
            cl_queue *q = cl_find_queue_locked(c, r->topic, r->tlen, r->qid);
            h[k] = (repl_slot){r->topic, r->tlen, r->qid, 1, q ? q->max : 0};
        }
        if (r->qoff != h[k].next)
            rc = cl_fail(e, CL_OFFSET_MISMATCH, "record at offset %lld has queue offset %lld, queue %.*s/%d expects %lld",
                         (ll)r->pos, (ll)r->qoff, (int)r->tlen, r->topic, (int)r->qid, (ll)h[k].next);
        h[k].next++;
    }
    free(h);
    return rc;
}

/* mu held, every check passed: each entry at max, then its unit */
static int repl_write_locked(cl_log *c, const char *data, const repl_ent *v, size_t n, cl_err *e)
{
    uint64_t bytes = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const repl_ent *r = &v[i];
        cl_queue *q = NULL;
        /* the queue file first: a failure then leaves no record without its unit */
        if (!r->blank && (!(q = queue_get(c, r->topic, r->tlen, r->qid, e)) || !cq_file(c, q, r->qoff, 1, e))) {
            rc = -1;
            break;
        }
        /* r->pos == max: in the segment holding it, or at the end of the files (a new segment) */
        mfile *s = c->nsegs && c->max < files_end(c) ? seg_for(c, c->max) : roll(c, e);
        if (!s) {
            rc = -1;
            break;
        }
        size_t rel = (size_t)(r->pos - s->start);
        char *p = s->base + rel;
        prefault(c, s, rel + r->size);
        s->touched = 1;
        /* total_size last, as write_record: a kill -9 mid-copy leaves no plausible record */
        memcpy(p + 4, data + r->at + 4, r->size - 4);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        memcpy(p, data + r->at, 4);
        mark_dirty(c, s, rel, rel + r->size);
        c->max = r->pos + r->size;
        bytes += r->size;
        if (q) {
            if (cq_write(c, q, r->qoff, r->pos, (int32_t)r->size, r->tag, e)) {
                rc = -1;
                break;
            }
            q->max = r->qoff + 1;
        }
    }
    cl_note_io_locked(c, bytes);
    return rc;
}

int cl_append_replicated(cl_log *c, int64_t off, const char *data, size_t len, int64_t *end, cl_err *e)
{
    /* a wrong offset is reported as such, before the data is judged against it */
    pthread_mutex_lock(&c->mu);
    int rc = repl_check_end_locked(c, off, e);
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return -1;
    size_t n = 0;
    repl_ent *v = NULL;
    if (repl_split(c->seg_size, off, data, len, &v, &n, e)) /* the CRCs, without the lock */
        return -1;
    pthread_mutex_lock(&c->mu);
    rc = repl_check_end_locked(c, off, e); /* again: another writer may have moved the end meanwhile */
    if (!rc)
        rc = repl_check_queues_locked(c, v, n, e);
    if (!rc)
        rc = repl_write_locked(c, data, v, n, e);
    *end = c->max;
    pthread_mutex_unlock(&c->mu);
    free(v);
    return rc;
}

/* ------------------------------------------------------------- retention */

int cl_delete_segments_before_locked(cl_log *c, int64_t off, int64_t *deleted, cl_err *e)
{
    *deleted = 0;
    if (c->closed)
        return cl_fail(e, CL_CLOSED, "commit log is closed");
    int rc = 0;
    size_t k = 0;
    while (c->nsegs - k > 1 && c->segs[k]->start + c->seg_size <= off) {
        if (mf_delete(c->segs[k], e))
            rc = -1;
        k++;
    }
    if (!k)
        return rc;
    memmove(c->segs, c->segs + k, (c->nsegs - k) * sizeof *c->segs);
    c->nsegs -= k;
    *deleted = (int64_t)k;
    int64_t log_min = cl_min_offset_locked(c);
    for (size_t i = 0; i < c->nqueues; i++)
        if (cq_correct_min(c, c->queues[i], log_min, e))
            rc = -1;
    return rc;
}

/* ------------------------------------------------------------------ Raft */

/* mu held: q loses every file and its directory (and its topic's, when empty):
 * it is as if never written, and the next append starts it again at 0 */
static int cq_drop(cl_log *c, cl_queue *q, int64_t *dropped, cl_err *e)
{
    *dropped = q->max - q->min;
    int rc = 0;
    while (q->nfiles)
        if (cq_remove_file(q, q->nfiles - 1, e))
            rc = -1;
    q->min = q->max = 0;
    if (rmdir(q->dir) == 0) {
        char *slash = strrchr(q->dir, '/');
        char *topic_dir = slash ? strndup(q->dir, (size_t)(slash - q->dir)) : NULL;
        if (topic_dir && rmdir(topic_dir) != 0)
            note_dir(c, topic_dir); /* still holds other queues: its entry for q went */
        else
            note_dir(c, c->cq_dir);
        free(topic_dir);
    }
    return rc;
}

/* mu held: the units of q pointing at or past end go, and empty ones among them
 * (as recovery's truncate_queues) */
static int cq_cut_at(cl_log *c, cl_queue *q, int64_t end, cl_err *e)
{
    int64_t cut = q->max, clo, tag, dropped;
    int32_t size;
    while (cut > q->min) {
        cl_queue_unit_locked(c, q, cut - 1, &clo, &size, &tag);
        if (clo < end && size > 0)
            break;
        cut--;
    }
    if (cut == 0 && q->nfiles) /* min is 0 too: nothing of it is left */
        return cq_drop(c, q, &dropped, e);
    return cq_truncate(c, q, cut, &dropped, e);
}

/* mu held */
static int truncate_locked(cl_log *c, int64_t off, cl_err *e)
{
    if (cl_check_read_offset_locked(c, off, 1, e)) /* CLOSED, < 0, below min, past max */
        return -1;
    if (off < c->max) { /* a record or a blank marker must start there */
        mfile *s = seg_for(c, off), *f;
        size_t rel = (size_t)(off - s->start), left = s->size - rel, frel;
        uint32_t size;
        int blank = left >= CL_BLANK_SIZE && ld32(s->base + rel + F_MAGIC) == CL_BLANK_MAGIC &&
                    ld32(s->base + rel) == left;
        if (!blank && cl_record_at_locked(c, off, &f, &frel, &size, e))
            return -1;
    }
    int64_t end = off, old_max = c->max;
    int rc = 0;
    /* counted before any byte changes, with a full barrier: a reader copying without the lock that
     * sees a changed byte then sees the new count (cl_copy_valid) */
    atomic_fetch_add_explicit(&c->truncations, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    for (size_t i = 0; i < c->nqueues; i++)
        if (cq_cut_at(c, c->queues[i], end, e))
            rc = -1;
    /* segments: those starting at or past the end go (the oldest one stays while it holds min > 0) */
    size_t keep = c->nsegs;
    while (keep > 0 && c->segs[keep - 1]->start >= end)
        keep--;
    if (keep == 0 && end > 0 && c->nsegs)
        keep = 1;
    if (keep) {
        mfile *s = c->segs[keep - 1];
        int64_t seg_end = s->start + c->seg_size, hi = old_max < seg_end ? old_max : seg_end;
        if (end < hi) { /* zeroed, so recovery can never bring the cut records back */
            size_t lo = (size_t)(end - s->start), h = (size_t)(hi - s->start);
            memset(s->base + lo, 0, h - lo);
            s->touched = 1;
            mark_dirty(c, s, lo, h);
        }
    }
    if (c->nsegs > keep) {
        while (c->nsegs > keep)
            if (mf_delete(c->segs[--c->nsegs], e))
                rc = -1;
        note_dir(c, c->clog_dir);
    }
    c->max = end;
    if (c->flushed > end)
        c->flushed = end;
    if (c->log_flushed > end)
        c->log_flushed = end;
    if (c->released > end)
        c->released = end;
    if (c->visible != CL_NO_LIMIT && c->visible > end)
        c->visible = end; /* what is appended from now on is not committed */
    c->pf_start = -1;
    c->rd_file = NULL;
    return rc;
}

int cl_truncate(cl_log *c, int64_t off, int64_t *end, cl_err *e)
{
    pthread_mutex_lock(&c->mu);
    int rc = truncate_locked(c, off, e);
    *end = c->max;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int64_t cl_queue_visible_max_locked(cl_log *c, cl_queue *q)
{
    int64_t visible = c->visible, clo, tag;
    int32_t size;
    if (visible == CL_NO_LIMIT || q->max <= q->min)
        return q->max;
    cl_queue_unit_locked(c, q, q->max - 1, &clo, &size, &tag);
    if (clo < visible) /* the usual case: the whole queue is committed */
        return q->max;
    int64_t lo = q->min, hi = q->max - 1; /* the first invisible unit is in [lo, hi] */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        cl_queue_unit_locked(c, q, mid, &clo, &size, &tag);
        if (clo < visible)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* records examined per lock hold by cl_queues_in_range */
#define QUEUES_CHUNK 4096

typedef struct qset {
    cl_queue **slots; /* open addressing, cap a power of two */
    size_t cap, n;
    cl_queue **order; /* insertion order */
} qset;

static int qset_add(qset *s, cl_queue *q)
{
    if ((s->n + 1) * 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        cl_queue **slots = calloc(cap, sizeof *slots), **order = realloc(s->order, cap * sizeof *order);
        if (!slots || !order) {
            free(slots);
            if (order)
                s->order = order;
            return -1;
        }
        for (size_t i = 0; i < s->n; i++) {
            size_t k = ((uintptr_t)order[i] >> 4) * 0x9E3779B97F4A7C15ULL & (cap - 1);
            while (slots[k])
                k = (k + 1) & (cap - 1);
            slots[k] = order[i];
        }
        free(s->slots);
        s->slots = slots;
        s->order = order;
        s->cap = cap;
    }
    size_t k = ((uintptr_t)q >> 4) * 0x9E3779B97F4A7C15ULL & (s->cap - 1);
    while (s->slots[k]) {
        if (s->slots[k] == q)
            return 0;
        k = (k + 1) & (s->cap - 1);
    }
    s->slots[k] = q;
    s->order[s->n++] = q;
    return 0;
}

int cl_queues_in_range(cl_log *c, int64_t start, int64_t end, cl_queue ***out, size_t *nout, cl_err *e)
{
    qset set = {0};
    int rc = 0;
    *out = NULL;
    *nout = 0;
    pthread_mutex_lock(&c->mu);
    if (c->closed)
        rc = cl_fail(e, CL_CLOSED, "commit log is closed");
    else if (start < 0)
        rc = cl_fail(e, CL_INVALID_ARGUMENT, "start must be >= 0, got %lld", (ll)start);
    else if (end < 0)
        rc = cl_fail(e, CL_INVALID_ARGUMENT, "end must be >= 0, got %lld", (ll)end);
    int64_t pos = start;
    uint64_t truncations = cl_truncations(c);
    while (!rc) {
        int64_t min = cl_min_offset_locked(c), lim = end < c->max ? end : c->max;
        if (pos < min) /* the start, or retention while the lock was let go */
            pos = min;
        for (int n = 0; pos < lim && n < QUEUES_CHUNK; n++) {
            mfile *s = seg_for(c, pos);
            size_t rel = (size_t)(pos - s->start), left = s->size - rel;
            uint32_t total;
            if (left >= CL_BLANK_SIZE && ld32(s->base + rel + F_MAGIC) == CL_BLANK_MAGIC &&
                ld32(s->base + rel) == left) {
                pos = s->start + c->seg_size;
                continue;
            }
            if (cl_record_at_locked(c, pos, &s, &rel, &total, e)) {
                rc = -1;
                break;
            }
            const char *p = s->base + rel;
            size_t tpos = CL_HEADER_SIZE + ld32(p + F_BODY_LEN);
            size_t tlen = tpos < total ? (unsigned char)p[tpos] : 0;
            cl_queue *q = tpos < total && tpos + 1 + tlen <= total
                              ? cl_find_queue_locked(c, p + tpos + 1, tlen, (int32_t)ld32(p + F_QID))
                              : NULL;
            if (q && qset_add(&set, q)) {
                rc = oom(e);
                break;
            }
            cl_note_read_locked(c, s, rel, CL_HEADER_SIZE);
            pos += total;
        }
        if (rc || pos >= lim)
            break;
        /* let appends and reads in between chunks */
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_lock(&c->mu);
        if (c->closed)
            rc = cl_fail(e, CL_CLOSED, "commit log is closed");
        else if (cl_truncations(c) != truncations)
            break; /* the range was cut: its records are gone, later appends announce themselves */
    }
    pthread_mutex_unlock(&c->mu);
    free(set.slots);
    if (rc) {
        free(set.order);
        return -1;
    }
    *out = set.order;
    *nout = set.n;
    return 0;
}

/* ---------------------------------------------------- flush / close / open */

typedef struct sync_item {
    mfile *f;
    size_t lo, hi;
} sync_item;

typedef struct sync_batch {
    sync_item *items;
    size_t n;
    char **dirs;
    size_t ndirs;
} sync_batch;

/* mu held: append a dirty list's entries (and their references) to b->items,
 * which has room for them */
static void take_list(mfile **list, size_t *n, sync_batch *b)
{
    for (size_t i = 0; i < *n; i++) {
        mfile *f = list[i];
        b->items[b->n++] = (sync_item){f, f->dlo, f->dhi};
        f->listed = 0;
    }
    *n = 0;
}

/* mu held: move both dirty lists and the directories into b; segments first,
 * so the log is on disk before the queues that point into it */
static int take_dirty(cl_log *c, sync_batch *b, cl_err *e)
{
    memset(b, 0, sizeof *b);
    size_t n = c->nsdirty + c->ndirty;
    if (n && !(b->items = malloc(n * sizeof *b->items)))
        return oom(e);
    take_list(c->sdirty, &c->nsdirty, b);
    take_list(c->dirty, &c->ndirty, b);
    b->dirs = c->dirsync;
    b->ndirs = c->ndirsync;
    c->dirsync = NULL;
    c->ndirsync = c->dirsynccap = 0;
    return 0;
}

/* mu held: the log-only part, the segment list and commitlog/ when a roll
 * added an entry to it; queue files and their directories stay listed */
static int take_log_dirty(cl_log *c, sync_batch *b, cl_err *e)
{
    memset(b, 0, sizeof *b);
    if (c->nsdirty && !(b->items = malloc(c->nsdirty * sizeof *b->items)))
        return oom(e);
    for (size_t i = 0; i < c->ndirsync; i++) {
        if (strcmp(c->dirsync[i], c->clog_dir))
            continue;
        if (!(b->dirs = malloc(sizeof *b->dirs))) {
            free(b->items);
            b->items = NULL;
            return oom(e);
        }
        b->dirs[0] = c->dirsync[i];
        b->ndirs = 1;
        c->dirsync[i] = c->dirsync[--c->ndirsync]; /* the order of the rest does not matter */
        break;
    }
    take_list(c->sdirty, &c->nsdirty, b);
    return 0;
}

/* no lock: the references keep every mapping valid */
static int sync_batch_run(sync_batch *b, cl_err *e)
{
    int rc = 0;
    for (size_t i = 0; i < b->n; i++)
        if (mf_sync(b->items[i].f, b->items[i].lo, b->items[i].hi, e))
            rc = -1;
    for (size_t i = 0; i < b->ndirs; i++) {
        int fd = open(b->dirs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
            continue; /* removed since: nothing left to make durable */
        if (fsync(fd) != 0 && errno != EINVAL)
            rc = cl_oserr(e, errno, "fsync %s", b->dirs[i]);
        close(fd);
    }
    return rc;
}

/* mu held when `c` is given: a failed batch goes back on the dirty list */
static void sync_batch_done(cl_log *c, sync_batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        if (c)
            mark_dirty(c, b->items[i].f, b->items[i].lo, b->items[i].hi);
        mf_unref(b->items[i].f);
    }
    for (size_t i = 0; i < b->ndirs; i++) {
        if (c)
            note_dir(c, b->dirs[i]);
        free(b->dirs[i]);
    }
    free(b->items);
    free(b->dirs);
}

/* Group commit: snapshot the end and the dirty files under mu, sync without
 * it (appends continue), then publish. */
int cl_flush(cl_log *c, int64_t *flushed, cl_err *e)
{
    sync_batch b;
    pthread_mutex_lock(&c->flush_mu);
    pthread_mutex_lock(&c->mu);
    int rc = c->closed ? cl_fail(e, CL_CLOSED, "commit log is closed") : take_dirty(c, &b, e);
    int64_t end = c->max;
    uint64_t truncations = cl_truncations(c);
    pthread_mutex_unlock(&c->mu);
    if (!rc) {
        rc = sync_batch_run(&b, e);
        pthread_mutex_lock(&c->mu);
        /* a truncation meanwhile: end may name bytes that are gone or were rewritten since the snapshot */
        if (!rc && end > c->flushed && truncations == cl_truncations(c))
            c->flushed = end;
        if (c->flushed > c->log_flushed)
            c->log_flushed = c->flushed;
        *flushed = c->flushed;
        sync_batch_done(rc ? c : NULL, &b);
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&c->flush_mu);
    return rc;
}

/* Log-only group commit, as cl_flush but for the segments alone: a record's
 * queue unit is derived data that recovery rewrites from the log past the
 * checkpoint, and the checkpoint only ever holds a cl_flush offset. */
int cl_flush_log(cl_log *c, int64_t *log_flushed, cl_err *e)
{
    sync_batch b;
    pthread_mutex_lock(&c->flush_mu);
    pthread_mutex_lock(&c->mu);
    int rc = c->closed ? cl_fail(e, CL_CLOSED, "commit log is closed") : take_log_dirty(c, &b, e);
    int64_t end = c->max;
    uint64_t truncations = cl_truncations(c);
    pthread_mutex_unlock(&c->mu);
    if (!rc) {
        rc = sync_batch_run(&b, e);
        pthread_mutex_lock(&c->mu);
        if (!rc && end > c->log_flushed && truncations == cl_truncations(c)) /* as cl_flush */
            c->log_flushed = end;
        *log_flushed = c->log_flushed;
        sync_batch_done(rc ? c : NULL, &b);
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&c->flush_mu);
    return rc;
}

static void release_files_locked(cl_log *c)
{
    if (c->pf_seg) {
        mf_unref(c->pf_seg);
        c->pf_seg = NULL;
    }
    for (size_t i = 0; i < c->nsegs; i++)
        mf_unref(c->segs[i]);
    c->nsegs = 0;
    for (size_t i = 0; i < c->nqueues; i++) {
        cl_queue *q = c->queues[i];
        for (size_t k = 0; k < q->nfiles; k++)
            mf_unref(q->files[k]);
        q->nfiles = 0;
    }
    for (size_t i = 0; i < c->ndirty; i++) {
        c->dirty[i]->listed = 0;
        mf_unref(c->dirty[i]);
    }
    c->ndirty = 0;
    for (size_t i = 0; i < c->nsdirty; i++) {
        c->sdirty[i]->listed = 0;
        mf_unref(c->sdirty[i]);
    }
    c->nsdirty = 0;
}

int cl_close(cl_log *c, cl_err *e)
{
    sync_batch b;
    cl_syncer_stop(c); /* it takes flush_mu itself */
    pthread_mutex_lock(&c->flush_mu);
    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_unlock(&c->flush_mu);
        return 0;
    }
    c->closed = 1; /* from here every operation fails with CLOSED */
    c->pf_stop = 1;
    int rc = take_dirty(c, &b, e);
    pthread_mutex_unlock(&c->mu);
    join_prefault_thread(c);
    if (!rc)
        rc = sync_batch_run(&b, e);
    pthread_mutex_lock(&c->mu);
    if (!rc)
        c->flushed = c->log_flushed = c->max;
    if (b.items || b.dirs)
        sync_batch_done(NULL, &b);
    release_files_locked(c);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->flush_mu);
    return rc;
}

cl_log *cl_log_new(const char *root, int64_t seg_size, int64_t cq_units)
{
    cl_log *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->flush_mu, NULL);
    c->seg_size = seg_size;
    c->cq_units = cq_units;
    c->pf_start = -1;
    c->visible = CL_NO_LIMIT;
    c->cq_file_size = (size_t)cq_units * CL_UNIT_SIZE;
    c->root = strdup(root);
    c->clog_dir = path_join(root, "commitlog");
    c->cq_dir = path_join(root, "consumequeue");
    if (!c->root || !c->clog_dir || !c->cq_dir) {
        cl_log_free(c);
        return NULL;
    }
    return c;
}

void cl_log_free(cl_log *c)
{
    if (!c)
        return;
    cl_err e;
    if (!c->closed)
        cl_close(c, &e);
    syncer_free(c);
    for (size_t i = 0; i < c->nqueues; i++)
        queue_free(c->queues[i]);
    free(c->queues);
    free(c->buckets);
    free(c->segs);
    free(c->dirty);
    free(c->sdirty);
    for (size_t i = 0; i < c->ndirsync; i++)
        free(c->dirsync[i]);
    free(c->dirsync);
    free(c->root);
    free(c->clog_dir);
    free(c->cq_dir);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->flush_mu);
    free(c);
}

/* Recovery check of one position: 1 = valid record (*sizep), 2 = blank marker
 * closing the segment, 0 = the end of the log. */
static int valid_at(const cl_log *c, int64_t pos, uint32_t *sizep)
{
    mfile *s = seg_for(c, pos);
    size_t rel = (size_t)(pos - s->start), left = s->size - rel;
    if (left < CL_BLANK_SIZE)
        return 0;
    const char *p = s->base + rel;
    uint32_t total = ld32(p), magic = ld32(p + F_MAGIC);
    s->touched = 1;
    if (magic == CL_BLANK_MAGIC && total == left)
        return 2;
    if (magic != CL_RECORD_MAGIC || total < CL_MIN_RECORD || total > left)
        return 0;
    if (sparkmq_crc32(0, p + F_QID, total - F_QID) != ld32(p + F_CRC))
        return 0;
    uint64_t tpos = (uint64_t)CL_HEADER_SIZE + ld32(p + F_BODY_LEN);
    if (tpos + 1 > total)
        return 0;
    uint64_t ppos = tpos + 1 + (unsigned char)p[tpos];
    if (ppos + 2 > total || ppos + 2 + ld16(p + ppos) != total)
        return 0;
    if (!cl_utf8_valid((const unsigned char *)p + tpos + 1, ppos - tpos - 1) || ld64(p + F_CLOFF) != pos)
        return 0;
    *sizep = total;
    return 1;
}

/* Zero [rel, ...) page by page until a page (from rel on) is already all zero;
 * 1 when a non-zero byte was met. */
static int zero_tail(mfile *f, size_t rel)
{
    int met = 0;
    size_t start = rel;
    while (start < f->size) {
        size_t end = (start / CL_PAGE + 1) * CL_PAGE;
        if (end > f->size)
            end = f->size;
        int nonzero = 0;
        for (size_t i = start; i < end && !nonzero; i++)
            nonzero = f->base[i] != 0;
        if (!nonzero)
            break;
        memset(f->base + start, 0, end - start);
        met = 1;
        start = end;
    }
    return met;
}

/* scan from pos, CRC-checking; returns the end of the valid log */
static int64_t scan_valid(cl_log *c, int64_t pos)
{
    int64_t fend = files_end(c);
    while (pos < fend) {
        uint32_t size = 0;
        int kind = valid_at(c, pos, &size);
        if (!kind)
            break;
        if (kind == 2) {
            pos = (pos / c->seg_size + 1) * c->seg_size;
            continue;
        }
        c->rec.records_checked++;
        pos += size;
        cl_note_io_locked(c, size);
    }
    return pos;
}

/* zero after the end, delete later segments */
static int cut_tail(cl_log *c, int64_t end, cl_err *e)
{
    if (end >= files_end(c))
        return 0;
    mfile *s = seg_for(c, end);
    size_t rel = (size_t)(end - s->start);
    if (zero_tail(s, rel))
        c->rec.torn = 1;
    mark_dirty(c, s, rel, s->size);
    int rc = 0;
    while (c->segs[c->nsegs - 1] != s) {
        if (mf_delete(c->segs[--c->nsegs], e))
            rc = -1;
        c->rec.discarded_segments++;
        c->rec.torn = 1;
    }
    return rc;
}

/* Units at the tail pointing at or past the end go, and empty ones among them:
 * a queue page the kernel never wrote back reads as zeros while a later one may
 * have been written (redo_units rewrites the units of the records that remain). */
static int truncate_queues(cl_log *c, int64_t end, cl_err *e)
{
    for (size_t i = 0; i < c->nqueues; i++) {
        cl_queue *q = c->queues[i];
        int64_t cut = q->max, clo, tag, dropped;
        int32_t size;
        while (cut > q->min) {
            cl_queue_unit_locked(c, q, cut - 1, &clo, &size, &tag);
            if (clo < end && size > 0)
                break;
            cut--;
        }
        if (cq_truncate(c, q, cut, &dropped, e))
            return -1;
        c->rec.cq_units_truncated += dropped;
    }
    return 0;
}

/* (re)write the unit of every scanned record that is missing or differs */
static int redo_units(cl_log *c, int64_t pos, int64_t end, cl_err *e)
{
    while (pos < end) {
        mfile *s = seg_for(c, pos);
        const char *p = s->base + (pos - s->start);
        s->touched = 1;
        if (ld32(p + F_MAGIC) == CL_BLANK_MAGIC) {
            pos = s->start + c->seg_size;
            continue;
        }
        uint32_t total = ld32(p);
        int32_t qid = (int32_t)ld32(p + F_QID);
        int64_t qoff = ld64(p + F_QOFF), tag = ld64(p + F_TAG);
        size_t tpos = CL_HEADER_SIZE + ld32(p + F_BODY_LEN);
        cl_queue *q = queue_get(c, p + tpos + 1, (unsigned char)p[tpos], qid, e);
        if (!q)
            return -1;
        int write = 1;
        if (qoff < q->max && qoff >= q->min) {
            int64_t clo, utag;
            int32_t size;
            cl_queue_unit_locked(c, q, qoff, &clo, &size, &utag);
            write = !(clo == pos && size == (int32_t)total && utag == tag);
        } else if (qoff < q->min)
            write = 0;
        if (write) {
            if (cq_write(c, q, qoff, pos, (int32_t)total, tag, e))
                return -1;
            if (qoff + 1 > q->max)
                q->max = qoff + 1;
            c->rec.cq_units_redone++;
        }
        pos += total;
        cl_note_io_locked(c, total);
    }
    return 0;
}

/* everything below the end becomes durable: the scanned segments, every queue
 * file and whatever recovery wrote */
static int sync_after_recovery(cl_log *c, int64_t from, cl_err *e)
{
    int rc = 0;
    for (size_t i = 0; i < c->nsegs; i++)
        if (c->segs[i]->start + c->seg_size > from && mf_sync(c->segs[i], 0, c->segs[i]->size, e))
            rc = -1;
    for (size_t i = 0; i < c->nqueues; i++)
        for (size_t k = 0; k < c->queues[i]->nfiles; k++) {
            mfile *f = c->queues[i]->files[k];
            if (mf_sync(f, 0, f->size, e))
                rc = -1;
        }
    sync_batch b;
    if (take_dirty(c, &b, e))
        return -1;
    if (sync_batch_run(&b, e))
        rc = -1;
    sync_batch_done(NULL, &b);
    return rc;
}

/* Open and recover (the constructor); the log is not shared yet, but mu is
 * held anyway so the *_locked helpers keep their contract. */
int cl_log_open(cl_log *c, int64_t check_from, cl_err *e)
{
    int rc = -1;
    pthread_mutex_lock(&c->mu);
    if (mkdir_p(NULL, c->clog_dir, c->root, e) || mkdir_p(NULL, c->cq_dir, c->root, e))
        goto out;
    if (load_segments(c, e))
        goto out;
    int64_t fend = files_end(c);
    if (check_from > fend) {
        cl_fail(e, CL_CORRUPT_STORE, "check_from %lld is past the end of the log files (%lld)", (ll)check_from,
                (ll)fend);
        goto out;
    }
    int64_t from = check_from > cl_min_offset_locked(c) ? check_from : cl_min_offset_locked(c);
    c->rec.check_from = from;
    int64_t end = scan_valid(c, from);
    c->rec.end_offset = end;
    if (cut_tail(c, end, e))
        goto out;
    c->max = end;
    if (load_queues(c, cl_min_offset_locked(c), e) || truncate_queues(c, end, e) || redo_units(c, from, end, e) ||
        sync_after_recovery(c, from, e))
        goto out;
    c->flushed = c->log_flushed = c->released = end;
    for (size_t i = 0; i < c->nsegs; i++) /* drop whatever recovery mapped */
        c->segs[i]->touched = 1;
    for (size_t i = 0; i < c->nqueues; i++)
        for (size_t k = 0; k < c->queues[i]->nfiles; k++)
            c->queues[i]->files[k]->touched = 1;
    trim_locked(c);
    rc = 0;
out:
    if (rc)
        release_files_locked(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* --------------------------------------------------------- packed batches */

int cl_packed_frame(const char *data, size_t len, int64_t count, cl_err *e)
{
    if (count < 1)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "batch count must be >= 1, got %lld", (ll)count);
    size_t pos = 0;
    for (int64_t i = 0; i < count; i++) {
        size_t left = len - pos;
        if (left == 0)
            return cl_fail(e, CL_MESSAGE_ILLEGAL, "the batch holds %lld messages, the count says %lld", (ll)i,
                           (ll)count);
        if (left < CL_PACKED_HEADER)
            return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: the entry header is truncated (%zu bytes left)",
                           (ll)i, left);
        uint64_t need = (uint64_t)CL_PACKED_HEADER + ld32(data + pos) + ld16(data + pos + 4);
        if (need > left)
            return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: the entry needs %llu bytes, %zu are left", (ll)i,
                           (unsigned long long)need, left);
        pos += (size_t)need;
    }
    if (pos < len)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "the batch has %zu bytes after its %lld messages", len - pos, (ll)count);
    return 0;
}

static int is_ascii_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

int cl_tag_ok(const char *s, size_t n)
{
    if (n == 0 || is_ascii_space((unsigned char)s[0]) || is_ascii_space((unsigned char)s[n - 1]))
        return 0;
    for (size_t k = 0; k + 1 < n; k++)
        if (s[k] == '|' && s[k + 1] == '|')
            return 0;
    return 1;
}

int cl_uniq_ok(const char *s, size_t n)
{
    if (n == 0 || n > CL_MAX_UNIQ_KEY)
        return 0;
    for (size_t k = 0; k < n; k++)
        if ((unsigned char)s[k] < 0x21 || (unsigned char)s[k] > 0x7E)
            return 0;
    return 1;
}

/* space-separated keys, none empty */
static int keys_ok(const char *s, size_t n)
{
    if (n == 0 || s[0] == ' ' || s[n - 1] == ' ')
        return 0;
    for (size_t k = 0; k + 1 < n; k++)
        if (s[k] == ' ' && s[k + 1] == ' ')
            return 0;
    return 1;
}

static int key_is(const char *k, size_t n, const char *name)
{
    size_t m = strlen(name);
    return n == m && !memcmp(k, name, m);
}

/* The property rules of one entry; sets m->tag_hash (CRC-32 of TAGS, 0 without). */
static int check_props(const cl_packed_rules *r, int64_t i, cl_msg *m, cl_err *e)
{
    const char *p = m->props;
    size_t n = m->props_len, pos = 0, pair = 0;
    int seen_tags = 0, seen_keys = 0, seen_uniq = 0;
    if (!cl_utf8_valid((const unsigned char *)p, n))
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: the properties are not valid UTF-8", (ll)i);
    m->tag_hash = 0;
    for (; pos < n; pair++) {
        const char *end = memchr(p + pos, 2, n - pos);
        if (!end)
            return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: property %zu is not terminated by \\x02", (ll)i, pair);
        size_t plen = (size_t)(end - (p + pos));
        const char *key = p + pos, *sep = memchr(key, 1, plen);
        if (!sep)
            return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: property %zu has no \\x01 between name and value",
                           (ll)i, pair);
        size_t klen = (size_t)(sep - key);
        if (klen == 0)
            return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: property %zu has an empty name", (ll)i, pair);
        const char *val = sep + 1;
        size_t vlen = plen - klen - 1;
        if (memchr(val, 1, vlen))
            return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: property %zu has more than one \\x01", (ll)i, pair);
        for (size_t k = 0; k < r->nreserved; k++)
            if (r->reserved_len[k] == klen && !memcmp(r->reserved[k], key, klen))
                return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: the property %.*s is reserved", (ll)i, (int)klen,
                               key);
        if (key_is(key, klen, "TAGS")) {
            if (seen_tags++)
                return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: property TAGS appears twice", (ll)i);
            if (!cl_tag_ok(val, vlen))
                return cl_fail(e, CL_MESSAGE_ILLEGAL,
                               "message %lld: the TAGS value is empty, padded with whitespace or has '||'", (ll)i);
            m->tag_hash = (int64_t)sparkmq_crc32(0, val, vlen);
        } else if (key_is(key, klen, "KEYS")) {
            if (seen_keys++)
                return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: property KEYS appears twice", (ll)i);
            if (!keys_ok(val, vlen))
                return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: the KEYS value is empty or has an empty key",
                               (ll)i);
        } else if (key_is(key, klen, "UNIQ_KEY")) {
            if (seen_uniq++)
                return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: property UNIQ_KEY appears twice", (ll)i);
            if (!cl_uniq_ok(val, vlen))
                return cl_fail(e, CL_MESSAGE_ILLEGAL,
                               "message %lld: the UNIQ_KEY must be 1 to 128 printable ASCII characters without spaces",
                               (ll)i);
        }
        pos += plen + 1;
    }
    if (!seen_uniq)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: the properties have no UNIQ_KEY", (ll)i);
    return 0;
}

/* Every rule of one framed entry, in the order of _commitlog.pyi. */
static int check_entry(const cl_packed_rules *r, int64_t i, cl_msg *m, cl_err *e)
{
    if (m->body_len == 0)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: the body is empty", (ll)i);
    if ((int64_t)m->body_len > r->max_body)
        return cl_fail(e, CL_MESSAGE_TOO_LARGE, "message %lld: the body is %zu bytes, the limit is %lld", (ll)i,
                       m->body_len, (ll)r->max_body);
    if ((int64_t)m->props_len > r->max_props)
        return cl_fail(e, CL_PROPERTIES_TOO_LARGE, "message %lld: the properties are %zu bytes, the limit is %lld",
                       (ll)i, m->props_len, (ll)r->max_props);
    if (r->sys_flag & 1) { /* COMPRESSED: each body must start with a zlib header */
        const unsigned char *b = (const unsigned char *)m->body;
        if (m->body_len < 2 || (b[0] & 0x0F) != 8 || ((unsigned)b[0] << 8 | b[1]) % 31 != 0)
            return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %lld: the batch is compressed but the body is not zlib data",
                           (ll)i);
    }
    if (check_props(r, i, m, e))
        return -1;
    m->size = cl_record_size(m->body_len, r->topic_len, m->props_len);
    if (m->size > (uint64_t)(r->seg_size - CL_BLANK_SIZE) || m->size > UINT32_MAX)
        return cl_fail(e, CL_INVALID_ARGUMENT,
                       "message %lld: record of %llu bytes does not fit in a segment of %lld bytes", (ll)i,
                       (unsigned long long)m->size, (ll)r->seg_size);
    return 0;
}

cl_msg *cl_packed_prepare(const char *data, size_t len, int64_t count, const cl_packed_rules *r, cl_err *e)
{
    if (cl_packed_frame(data, len, count, e))
        return NULL;
    /* framing bounds count by len / 18; malloc'd pages are touched only as entries
     * pass, so a huge batch of bad entries costs no memory */
    cl_msg *msgs = malloc((size_t)count * sizeof *msgs);
    if (!msgs) {
        oom(e);
        return NULL;
    }
    size_t pos = 0;
    for (int64_t i = 0; i < count; i++) {
        const char *h = data + pos;
        cl_msg *m = &msgs[i];
        if (len - pos < CL_PACKED_HEADER)
            goto changed;
        m->body_len = ld32(h);
        m->props_len = ld16(h + 4);
        m->flag = (int32_t)ld32(h + 6);
        m->born_ts = ld64(h + 10);
        /* framing checked these bounds; a bytearray another thread writes to
         * while the GIL is released may have changed them since */
        if ((uint64_t)CL_PACKED_HEADER + m->body_len + m->props_len > len - pos)
            goto changed;
        m->body = h + CL_PACKED_HEADER;
        m->props = m->body + m->body_len;
        m->sys_flag = r->sys_flag;
        m->reconsume = 0;
        m->prepared = 0;
        memcpy(m->born_host, r->born_host, CL_HOST_SIZE);
        if (check_entry(r, i, m, e)) {
            free(msgs);
            return NULL;
        }
        pos += CL_PACKED_HEADER + m->body_len + m->props_len;
    }
    return msgs;
changed:
    free(msgs);
    cl_fail(e, CL_MESSAGE_ILLEGAL, "the batch changed while it was being read");
    return NULL;
}

/* ------------------------------------------------------------ group-commit syncer */

typedef struct cl_syncer {
    pthread_mutex_t mu;
    pthread_cond_t work; /* the idle thread sleeps here; a request past `covering` wakes it */
    pthread_cond_t done; /* cl_syncer_wait sleeps here; every sync and the stop wake it */
    int running;         /* 1 from start until stop asked */
    int idle;
    int64_t requested;   /* the highest offset anyone asked for */
    int64_t covering;    /* the highest offset a started sync is sure to cover */
    int64_t synced;      /* the log's synced offset after the last sync (what cl_syncer_wait reads) */
    uint64_t syncs, failures;
    char last_error[256];
    int fds[CL_SYNC_MAX_NOTIFIERS];
    size_t nfds;
    pthread_t thread;
} cl_syncer;

static cl_syncer *syncer_of(cl_log *c) { return __atomic_load_n(&c->syncer, __ATOMIC_ACQUIRE); }

static int64_t log_flushed_now(cl_log *c)
{
    pthread_mutex_lock(&c->mu);
    int64_t v = c->log_flushed;
    pthread_mutex_unlock(&c->mu);
    return v;
}

static void deadline_after(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    if (seconds > 1e9)
        seconds = 1e9;
    time_t whole = (time_t)seconds;
    ts->tv_sec += whole;
    ts->tv_nsec += (long)((seconds - (double)whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

static void *syncer_main(void *arg)
{
    cl_log *c = arg;
    cl_syncer *s = c->syncer;
    static const uint64_t one = 1;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->running && s->requested <= s->covering) {
            s->idle = 1;
            pthread_cond_wait(&s->work, &s->mu);
            s->idle = 0;
        }
        if (!s->running)
            break;
        /* every request so far names the end of a record appended before it was made, and the
         * sync snapshots the log's end after it starts: it covers them all */
        int64_t before = s->covering;
        s->covering = s->requested;
        pthread_mutex_unlock(&s->mu);
        int64_t flushed = 0;
        cl_err e;
        int rc = cl_flush_log(c, &flushed, &e);
        pthread_mutex_lock(&s->mu);
        if (rc) {
            /* keep the thread; what this sync was to cover is wanted again after a pause (no spin on a
             * failing disk), and the waiters time out meanwhile */
            s->failures++;
            size_t n = strnlen(e.msg, sizeof s->last_error - 1); /* the text is cut to fit */
            memcpy(s->last_error, e.msg, n);
            s->last_error[n] = 0;
            s->covering = before;
            struct timespec until;
            deadline_after(&until, 0.1);
            while (s->running && pthread_cond_timedwait(&s->done, &s->mu, &until) != ETIMEDOUT) {
            }
            continue;
        }
        s->syncs++;
        if (flushed > s->synced)
            s->synced = flushed;
        /* the sync covered everything appended before it started, requested meanwhile or not: a request it
         * covered must not start another (waiters that asked during a sync would otherwise cost one more) */
        if (flushed > s->covering)
            s->covering = flushed;
        pthread_cond_broadcast(&s->done);
        for (size_t i = 0; i < s->nfds; i++) /* a full counter (EAGAIN) still wakes its reader */
            if (write(s->fds[i], &one, sizeof one) < 0 && errno != EAGAIN) {
            }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int cl_syncer_start(cl_log *c, cl_err *e)
{
    cl_syncer *s = syncer_of(c);
    if (s) { /* stopped before (a flush service replaced after a truncation): a new thread */
        int64_t synced = log_flushed_now(c);
        pthread_mutex_lock(&s->mu);
        int rc = 0;
        if (s->running) {
            rc = cl_fail(e, CL_INVALID_ARGUMENT, "the syncer is running already");
        } else {
            s->requested = s->covering = s->synced = synced;
            s->running = 1;
            int err = pthread_create(&s->thread, NULL, syncer_main, c);
            if (err) {
                s->running = 0;
                rc = cl_fail(e, CL_IO_ERROR, "cannot start the syncer thread: %s", strerror(err));
            }
        }
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    s = calloc(1, sizeof *s);
    if (!s)
        return cl_fail(e, CL_IO_ERROR, "out of memory");
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, &attr);
    pthread_cond_init(&s->done, &attr);
    pthread_condattr_destroy(&attr);
    s->requested = s->covering = s->synced = log_flushed_now(c);
    s->running = 1;
    c->syncer = s; /* published below, once the thread runs */
    int err = pthread_create(&s->thread, NULL, syncer_main, c);
    if (err) {
        c->syncer = NULL;
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work);
        pthread_cond_destroy(&s->done);
        free(s);
        return cl_fail(e, CL_IO_ERROR, "cannot start the syncer thread: %s", strerror(err));
    }
    __atomic_store_n(&c->syncer, s, __ATOMIC_RELEASE);
    return 0;
}

void cl_syncer_stop(cl_log *c)
{
    cl_syncer *s = syncer_of(c);
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    int was_running = s->running;
    s->running = 0;
    pthread_cond_broadcast(&s->work);
    pthread_cond_broadcast(&s->done);
    pthread_mutex_unlock(&s->mu);
    if (was_running)
        pthread_join(s->thread, NULL);
}

int cl_syncer_request(cl_log *c, int64_t offset, int try_only)
{
    cl_syncer *s = syncer_of(c);
    if (!s)
        return 0;
    if (try_only) {
        if (pthread_mutex_trylock(&s->mu) != 0)
            return -1;
    } else {
        pthread_mutex_lock(&s->mu);
    }
    if (offset > s->requested)
        s->requested = offset;
    if (offset > s->covering && s->idle && s->running)
        pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int cl_syncer_wait(cl_log *c, int64_t offset, double timeout_s)
{
    cl_syncer *s = syncer_of(c);
    if (log_flushed_now(c) >= offset)
        return 1;
    if (!s)
        return 0;
    struct timespec until;
    deadline_after(&until, timeout_s > 0 ? timeout_s : 0);
    /* the syncer publishes `synced` and broadcasts under its lock: no wake-up is missed, and mu is
     * never taken here with the syncer's lock held */
    pthread_mutex_lock(&s->mu);
    while (s->synced < offset && s->running)
        if (pthread_cond_timedwait(&s->done, &s->mu, &until) == ETIMEDOUT)
            break;
    int covered = s->synced >= offset;
    pthread_mutex_unlock(&s->mu);
    return covered || log_flushed_now(c) >= offset; /* a full flush may have covered it meanwhile */
}

int cl_syncer_notify(cl_log *c, int fd, int add, cl_err *e)
{
    cl_syncer *s = syncer_of(c);
    if (!s)
        return cl_fail(e, CL_INVALID_ARGUMENT, "the syncer is not started");
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    size_t i = 0;
    while (i < s->nfds && s->fds[i] != fd)
        i++;
    if (add && i == s->nfds) {
        if (s->nfds == CL_SYNC_MAX_NOTIFIERS)
            rc = cl_fail(e, CL_INVALID_ARGUMENT, "more than %d sync notifiers", CL_SYNC_MAX_NOTIFIERS);
        else
            s->fds[s->nfds++] = fd;
    } else if (!add && i < s->nfds) {
        s->fds[i] = s->fds[--s->nfds];
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void cl_syncer_counts(cl_log *c, uint64_t *syncs, uint64_t *failures, char *msg, size_t msg_size)
{
    cl_syncer *s = syncer_of(c);
    *syncs = *failures = 0;
    if (msg_size)
        msg[0] = 0;
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    *syncs = s->syncs;
    *failures = s->failures;
    if (msg_size)
        snprintf(msg, msg_size, "%s", s->last_error);
    pthread_mutex_unlock(&s->mu);
}

static void syncer_free(cl_log *c)
{
    cl_syncer *s = syncer_of(c);
    if (!s)
        return;
    cl_syncer_stop(c);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
    free(s);
    c->syncer = NULL;
}

/* ------------------------------------------------------------ record framing */

int cl_record_frame(const char *p, size_t left, uint32_t *total, uint64_t *tpos, uint64_t *ppos, uint16_t *plen,
                    cl_err *e)
{
    if (left < CL_HEADER_SIZE)
        return cl_fail(e, CL_CORRUPT_RECORD, "record is malformed: buffer shorter than the header");
    uint32_t magic = ld32(p + F_MAGIC);
    if (magic != CL_RECORD_MAGIC)
        return cl_fail(e, CL_CORRUPT_RECORD, "record is malformed: bad magic 0x%08x", (unsigned)magic);
    *total = ld32(p + F_TOTAL);
    if (*total < CL_HEADER_SIZE || *total > left)
        return cl_fail(e, CL_CORRUPT_RECORD, "record is malformed: total_size %u != buffer length %zu",
                       (unsigned)*total, left);
    *tpos = (uint64_t)CL_HEADER_SIZE + ld32(p + F_BODY_LEN);
    if (*tpos + 1 > *total)
        return cl_fail(e, CL_CORRUPT_RECORD, "record is malformed: lengths overrun the record");
    *ppos = *tpos + 1 + (unsigned char)p[*tpos];
    *plen = *ppos + 2 <= *total ? ld16(p + *ppos) : 0;
    if (*ppos + 2 > *total || *ppos + 2 + *plen != *total)
        return cl_fail(e, CL_CORRUPT_RECORD, "record is malformed: lengths overrun the record");
    return 0;
}
