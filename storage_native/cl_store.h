/* The storage core without Python: mapped files, the commit log, consume queues,
 * recovery.  Everything here runs with the GIL released, so it never touches a
 * Python object; failures are reported through cl_err (code + message text, the
 * texts of _commitlog.pyi) and turned into StoreError by _commitlog.c.
 *
 * Locking: cl_log.mu protects every field of the log, its queues and the dirty
 * lists.  Functions named *_locked expect the caller to hold it.  cl_log.flush_mu
 * serialises flush/flush_log/close so no flush publishes an offset whose bytes
 * another one is still syncing; its order is flush_mu before mu.
 */
#ifndef SPARKMQ_CL_STORE_H
#define SPARKMQ_CL_STORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the on-disk format is little-endian and the store writes it with native stores"
#endif

/* layout.py, format version 1 */
#define CL_FORMAT_VERSION 1
#define CL_RECORD_MAGIC (0x534D5100u | CL_FORMAT_VERSION)
#define CL_BLANK_MAGIC 0x534D51FFu
#define CL_HEADER_SIZE 120
#define CL_BLANK_SIZE 8
#define CL_MIN_RECORD (CL_HEADER_SIZE + 1 + 2)
#define CL_UNIT_SIZE 20
#define CL_HOST_SIZE 20
#define CL_MAX_TOPIC 255
#define CL_MAX_PROPS 65535
#define CL_MAX_QUEUE_ID 65535
#define CL_MIN_SEGMENT 4096
#define CL_PAGE 4096
#define CL_GET_MAX_EXAMINED 16384
/* packed batch entry header (docs/remoting.md): body_length u32, properties_length
 * u16, flag i32, born_timestamp i64 */
#define CL_PACKED_HEADER 18
#define CL_MAX_UNIQ_KEY 128
#define CL_MAX_RESERVED_KEY 255
/* Drop page-table entries of cold mappings after this many bytes of I/O. */
#define CL_TRIM_EVERY ((uint64_t)64 << 20)
/* When the pre-fault thread is behind, the appending thread faults in this much
 * itself (one chunk costs it ~0.25 ms: small enough not to stall an event loop). */
#define CL_PREFAULT_CHUNK ((size_t)256 << 10)
/* The pre-fault thread keeps the active segment faulted in this far ahead of the
 * write head, this much per madvise. */
#define CL_PREFAULT_AHEAD ((size_t)32 << 20)
#define CL_PREFAULT_STEP ((size_t)2 << 20)

/* The page cache behind the end is released in steps of at least this. */
#define CL_RELEASE_STEP ((int64_t)16 << 20)

/* record field offsets */
enum {
    F_TOTAL = 0,
    F_MAGIC = 4,
    F_CRC = 8,
    F_QID = 12,
    F_FLAG = 16,
    F_QOFF = 20,
    F_CLOFF = 28,
    F_SYSFLAG = 36,
    F_BORN_TS = 40,
    F_BORN_HOST = 48,
    F_STORE_TS = 68,
    F_STORE_HOST = 76,
    F_RECONSUME = 96,
    F_PREPARED = 100,
    F_TAG = 108,
    F_BODY_LEN = 116
};

/* error codes (errors.py) */
extern const char CL_INVALID_ARGUMENT[], CL_OFFSET_ILLEGAL[], CL_OFFSET_TOO_SMALL[], CL_OFFSET_OVERFLOW[],
    CL_OFFSET_MISMATCH[], CL_CORRUPT_RECORD[], CL_CORRUPT_STORE[], CL_DISK_FULL[], CL_IO_ERROR[], CL_CLOSED[],
    CL_MESSAGE_ILLEGAL[], CL_MESSAGE_TOO_LARGE[], CL_PROPERTIES_TOO_LARGE[];

typedef struct cl_err {
    const char *code;
    char msg[4608]; /* room for a PATH_MAX path and errno text */
} cl_err;

int cl_fail(cl_err *e, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* IO_ERROR (DISK_FULL for ENOSPC) "<what>: <strerror>" */
int cl_oserr(cl_err *e, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One fixed-size file mapped MAP_SHARED read/write: a segment or a queue file.
 * Refcounted so a mapping outlives deletion while a reader (a read_view
 * memoryview, a copy in progress without the lock) still points into it. */
typedef struct mfile {
    atomic_long refs;
    char *base;
    size_t size;
    int64_t start; /* segment: log offset; queue file: byte offset (first unit * 20) */
    char *path;
    size_t dlo, dhi; /* dirty byte range not yet synced (mu) */
    int segment;     /* a commit-log segment: on the segment dirty list, synced by cl_flush_log too */
    int listed;      /* on one of the log's dirty lists (mu) */
    int touched;     /* mapped pages may have been faulted in since the last trim (mu) */
} mfile;

void mf_ref(mfile *f);
void mf_unref(mfile *f);

typedef struct cl_queue {
    char *topic; /* raw bytes (UTF-8 or the directory name as found) */
    size_t topic_len;
    int64_t queue_id;
    char *dir;
    int64_t min, max; /* served units are [min, max) */
    mfile **files;    /* sorted by start */
    size_t nfiles, fcap;
    struct cl_queue *hnext; /* hash chain */
    void *py_topic;         /* str cached by the binding (owned by it) */
} cl_queue;

typedef struct cl_recovery {
    int64_t check_from, end_offset, records_checked, torn, discarded_segments, cq_units_truncated,
        cq_units_redone;
} cl_recovery;

typedef struct cl_log {
    pthread_mutex_t mu;
    pthread_mutex_t flush_mu;
    char *root, *clog_dir, *cq_dir;
    int64_t seg_size, cq_units;
    size_t cq_file_size;
    mfile **segs; /* contiguous, oldest first */
    size_t nsegs, segcap;
    int64_t max;
    int64_t flushed;     /* log and queues durable below (cl_flush) */
    int64_t log_flushed; /* the log durable below (cl_flush_log or cl_flush); >= flushed */
    int closed;
    cl_queue **buckets; /* hash of (topic, queue_id) */
    size_t nbuckets;
    cl_queue **queues; /* every queue, creation order; freed only by cl_log_free */
    size_t nqueues, qcap;
    mfile **dirty; /* queue files with unsynced writes, each holding a reference */
    size_t ndirty, dirtycap;
    mfile **sdirty; /* the same for segments, apart so a log-only flush need not walk the queues */
    size_t nsdirty, sdirtycap;
    char **dirsync; /* directories that gained entries since the last flush */
    size_t ndirsync, dirsynccap;
    uint64_t io_since_trim;
    const void *rd_file; /* last read: file and end position */
    size_t rd_end;
    int prefault_off;    /* MADV_POPULATE_WRITE unsupported here */
    int64_t pf_start;    /* segment whose pages are pre-faulted ... */
    size_t pf_end;       /* ... up to this position (by either thread) */
    /* the pre-fault thread (mu): faults in pf_seg up to pf_want, ahead of the appends */
    pthread_t pf_thread;
    pthread_cond_t pf_cond;
    int pf_thread_state; /* 0: not started, 1: running, -1: could not start (appends fault in themselves) */
    int pf_stop;
    mfile *pf_seg; /* a reference */
    size_t pf_want;
    int pf_readahead; /* the thread faults in with readahead on (large folios): for logs synced seldom */
    int64_t visible;     /* reads through the queues stop at a unit pointing at or past it; CL_NO_LIMIT: none */
    int64_t released;    /* log pages below it were released from the page cache (mu) */
    /* cl_truncate calls, counted before it changes a byte (a seqlock's sequence): a flush, or a copy made
     * after the lock was let go, that saw another count may hold bytes the truncation cut or rewrote */
    _Atomic uint64_t truncations;
    cl_recovery rec;
    struct cl_syncer *syncer; /* the group-commit thread, once started (cl_syncer_start) */
} cl_log;

/* cl_log.visible when no visibility limit is set */
#define CL_NO_LIMIT INT64_MAX

/* One message to append; size is filled by cl_record_size. */
typedef struct cl_msg {
    const char *body;
    size_t body_len;
    const char *props;
    size_t props_len;
    int64_t tag_hash, born_ts, prepared;
    int32_t flag, sys_flag, reconsume;
    uint8_t born_host[CL_HOST_SIZE];
    uint64_t size;
} cl_msg;

/* A located record or byte range, with a reference on its mapping. */
typedef struct cl_ent {
    int64_t a, b; /* (offset) or (queue_offset, commitlog_offset) */
    mfile *f;
    const char *ptr;
    size_t len;
} cl_ent;

typedef struct cl_ents {
    cl_ent *v;
    size_t n, cap;
} cl_ents;

void cl_ents_release(cl_ents *es); /* drops references and frees */

uint64_t cl_record_size(size_t body_len, size_t topic_len, size_t props_len);
int cl_utf8_valid(const unsigned char *s, size_t n);
int64_t cl_now_ms(void);

cl_log *cl_log_new(const char *root, int64_t seg_size, int64_t cq_units);
int cl_log_open(cl_log *c, int64_t check_from, cl_err *e); /* recovery; no lock needed */
void cl_log_free(cl_log *c);                                /* closes without flushing if still open */

int64_t cl_min_offset_locked(const cl_log *c);
cl_queue *cl_find_queue_locked(cl_log *c, const char *topic, size_t tlen, int64_t qid);

int cl_append_locked(cl_log *c, const char *topic, size_t tlen, int qid, const cl_msg *msgs, size_t n,
                     int64_t store_ts, const uint8_t *store_host, int64_t *offsets, int64_t *first_qo,
                     cl_err *e);

int cl_check_read_offset_locked(cl_log *c, int64_t off, int allow_max, cl_err *e);
int cl_record_at_locked(cl_log *c, int64_t off, mfile **fp, size_t *relp, uint32_t *sizep, cl_err *e);
int cl_scan_locked(cl_log *c, int64_t off, int64_t max_count, int64_t max_bytes, cl_ents *out,
                   int64_t *next, cl_err *e);
int cl_read_raw_locked(cl_log *c, int64_t off, int64_t len, cl_ents *out, cl_err *e);
int cl_get_locked(cl_log *c, cl_queue *q, int64_t qoff, int64_t max_count, const int64_t *tags,
                  size_t ntags, int filter, int64_t max_bytes, cl_ents *out, int64_t *next, cl_err *e);

/* ------------------------------------------------------------ replication
 * A slave's log is a byte-for-byte copy of its master's: the master ships runs
 * of whole entries (records and blank markers, as they lie in its log), the
 * slave writes them at the same offsets and indexes each record at the queue
 * offset the record names. */

/* Whole entries from the boundary off (a record or a blank marker) up to
 * max_bytes (at least one when off < max), going on into the next segment
 * after a blank marker: out gets one byte range per segment. */
int cl_read_replication_locked(cl_log *c, int64_t off, int64_t max_bytes, cl_ents *out, cl_err *e);
/* Takes mu itself (call without it, GIL released): checks off == max, checks
 * every entry of data without the lock (magic, size, placement, CRC, lengths,
 * topic, queue id, stored offset), then in one lock hold checks the queue
 * offsets and writes; *end = max afterwards.  Nothing is written unless all
 * checks pass (an I/O failure while writing leaves a prefix of whole entries). */
int cl_append_replicated(cl_log *c, int64_t off, const char *data, size_t len, int64_t *end, cl_err *e);

int cl_delete_segments_before_locked(cl_log *c, int64_t off, int64_t *deleted, cl_err *e);

/* --------------------------------------------------------------- Raft
 * The commit log as a Raft log: an uncommitted tail can be cut off, and the
 * readers of the consume queues see only what lies below the commit index. */

/* Takes mu itself (call without it, GIL released).  Cuts the log back to off,
 * an entry boundary (a record, a blank marker) or max, at or above the
 * minimum: max becomes off, every record from off on goes with its queue
 * units, segments starting at or past off are deleted (the oldest one stays,
 * zeroed, when off is its start and above 0), the written rest of the segment
 * holding off is zeroed.  The kept bytes [min, off) do not change (a blank
 * marker closing the segment before off stays).  A queue left without any unit
 * from queue offset 0 loses its files (it is as if never written).  flushed,
 * log_flushed and visible are lowered to off; *end = max afterwards.  A failure
 * to delete a file is reported after the rest is done. */
int cl_truncate(cl_log *c, int64_t off, int64_t *end, cl_err *e);

/* Takes mu itself (call without it).  Releases from the page cache the log's
 * pages that are durable (below log_flushed) and more than keep bytes behind
 * the end, when at least CL_RELEASE_STEP of them are not released yet (keep <=
 * 0: nothing); the flush service calls it after each full flush.  Why: a log written faster than it is read fills the
 * page cache with pages only a lagging reader would want, and a new page costs
 * the writer far more than a recycled one (on a VM whose free memory goes back
 * to the host, ~4x).  A reader of released bytes reads them from the disk. */
void cl_release_cache(cl_log *c, int64_t keep);
/* c->truncations; read it with mu held, before letting go of the lock to copy */
static inline uint64_t cl_truncations(cl_log *c) { return atomic_load_explicit(&c->truncations, memory_order_relaxed); }
/* After a copy made without the lock from records located with mu held when cl_truncations gave seq: 1
 * when no truncation began since (the copy holds what was located), 0 when the copy must be made again. */
static inline int cl_copy_valid(cl_log *c, uint64_t seq)
{
    atomic_thread_fence(memory_order_acquire); /* the copy's loads before the count's */
    return atomic_load_explicit(&c->truncations, memory_order_relaxed) == seq;
}
/* One past the last unit of q pointing below c->visible (q->max without a limit):
 * what a consumer sees as the queue's max offset.  Units are in log order. */
int64_t cl_queue_visible_max_locked(cl_log *c, cl_queue *q);
/* Takes mu itself, a chunk of records at a time.  The queues of the records
 * starting in [start, end) (clamped to [min, max]), in order of first
 * appearance, each once: *out is malloc'ed (free it), the queues themselves
 * live as long as the log.  The clamped start must be an entry boundary when
 * it is below the clamped end; a truncation meanwhile ends the walk. */
int cl_queues_in_range(cl_log *c, int64_t start, int64_t end, cl_queue ***out, size_t *nout, cl_err *e);
void cl_note_io_locked(cl_log *c, uint64_t bytes);
void cl_note_read_locked(cl_log *c, const mfile *f, size_t rel, size_t len);

void cl_queue_unit_locked(cl_log *c, cl_queue *q, int64_t idx, int64_t *clo, int32_t *size, int64_t *tag);
int cl_queue_truncate_locked(cl_log *c, cl_queue *q, int64_t off, int64_t *dropped, cl_err *e);

/* ------------------------------------------------------- packed batches
 * No lock and no Python: the binding runs these with the GIL released, before
 * it takes the log lock to append. */

/* What append_packed checks besides the framing. */
typedef struct cl_packed_rules {
    int64_t max_body, max_props, seg_size;
    size_t topic_len;
    int32_t sys_flag; /* compressed when bit 0 is set */
    uint8_t born_host[CL_HOST_SIZE];
    const char *const *reserved; /* names no property may use (UTF-8) */
    const size_t *reserved_len;
    size_t nreserved;
} cl_packed_rules;

/* Framing only: `count` entries whose lengths add up to `len` exactly.
 * MESSAGE_ILLEGAL with the texts of _commitlog.pyi. */
int cl_packed_frame(const char *data, size_t len, int64_t count, cl_err *e);
/* Frames and validates every entry, then returns them as messages ready for
 * cl_append_locked (bodies and properties point into data); free() the array. */
cl_msg *cl_packed_prepare(const char *data, size_t len, int64_t count, const cl_packed_rules *r, cl_err *e);

/* The framing decode_records checks of the stored record at p (left bytes remain): its total size,
 * the position of its topic length byte and of its properties length, and that length.
 * CORRUPT_RECORD with the texts of _commitlog.pyi ("record is malformed: ..."). */
int cl_record_frame(const char *p, size_t left, uint32_t *total, uint64_t *tpos, uint64_t *ppos, uint16_t *plen,
                    cl_err *e);

/* Value rules shared with the encoder (UTF-8 bytes). */
int cl_tag_ok(const char *s, size_t n);  /* non-empty, no "||", no ASCII space at either end */
int cl_uniq_ok(const char *s, size_t n); /* 1..128 bytes of 0x21..0x7E */

/* Take flush_mu and mu themselves (call without either, GIL released).
 * cl_flush syncs the segments, the queue files and new directory entries and
 * sets *flushed = flushed; cl_flush_log syncs only the segments (and the new
 * entries of commitlog/) and sets *log_flushed = log_flushed: what SYNC_FLUSH
 * needs, since recovery rebuilds queue units from the log past the checkpoint. */
int cl_flush(cl_log *c, int64_t *flushed, cl_err *e);
int cl_flush_log(cl_log *c, int64_t *log_flushed, cl_err *e);
int cl_close(cl_log *c, cl_err *e);

/* The group-commit syncer: one thread that runs cl_flush_log back to back
 * while anyone has asked (cl_syncer_request) for an offset past what a started
 * sync covers, then wakes the threads blocked in cl_syncer_wait and writes 1 to
 * every registered eventfd (an event loop's wake-up).  It needs no Python and
 * no GIL, so a sync starts as soon as a send asks for it.  Its own lock is never
 * taken with mu or flush_mu held, and mu never with it held.  cl_close stops it
 * first. */
#define CL_SYNC_MAX_NOTIFIERS 64
int cl_syncer_start(cl_log *c, cl_err *e); /* again after a stop: a new thread */
void cl_syncer_stop(cl_log *c);                     /* joins; wakes every waiter; idempotent */
/* a no-op unless running; with try_only, -1 (nothing done) when the syncer's lock is busy */
int cl_syncer_request(cl_log *c, int64_t offset, int try_only);
/* 1 once the log is synced to offset; 0 at the deadline or when the syncer stops first */
int cl_syncer_wait(cl_log *c, int64_t offset, double timeout_s);
int cl_syncer_notify(cl_log *c, int fd, int add, cl_err *e); /* (un)register an eventfd */
/* completed syncs, failed ones; the last failure's text (empty if none) into msg */
void cl_syncer_counts(cl_log *c, uint64_t *syncs, uint64_t *failures, char *msg, size_t msg_size);

#endif
