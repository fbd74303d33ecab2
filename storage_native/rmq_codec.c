/*
 * RocketMQ's message encodings, for the remoting protocol's hot paths (layout.py, "RocketMQ's encodings"):
 *
 * - a pull's answer: sparkmq's stored records (what read_packed copies out) re-encoded as RocketMQ's
 *   stored messages, the bytes MessageDecoder.decodesBatch reads on the Java client;
 * - a SEND_BATCH_MESSAGE body (MessageDecoder.encodeMessages) turned into sparkmq's packed batch, which
 *   CommitLog.append_packed validates and appends.
 *
 * Each runs in two passes over the input without Python (so without the GIL): one checks the framing and
 * sizes the output, the binding allocates it, the other writes it.  RocketMQ's integers are big-endian,
 * sparkmq's little-endian.
 */
#include <string.h>

#include "crc32.h"
#include "rmq_codec.h"

typedef long long ll;

static inline uint16_t ld16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t ld32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t ld64(const char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline int32_t be32(const char *p) { uint32_t v; memcpy(&v, p, 4); return (int32_t)__builtin_bswap32(v); }
static inline int16_t be16(const char *p) { uint16_t v; memcpy(&v, p, 2); return (int16_t)__builtin_bswap16(v); }
static inline char *put_be16(char *w, uint16_t v) { v = __builtin_bswap16(v); memcpy(w, &v, 2); return w + 2; }
static inline char *put_be32(char *w, uint32_t v) { v = __builtin_bswap32(v); memcpy(w, &v, 4); return w + 4; }
static inline char *put_be64(char *w, uint64_t v) { v = __builtin_bswap64(v); memcpy(w, &v, 8); return w + 8; }
static inline char *put_le16(char *w, uint16_t v) { memcpy(w, &v, 2); return w + 2; }
static inline char *put_le32(char *w, uint32_t v) { memcpy(w, &v, 4); return w + 4; }
static inline char *put_le64(char *w, uint64_t v) { memcpy(w, &v, 8); return w + 8; }

/* ------------------------------------------------------------------ stored records */

/* An IPv4-mapped (::ffff:a.b.c.d) or all-zero host is written as RocketMQ's IPv4 form (4 + 4 bytes); any
 * other as IPv6 (16 + 4) with its sysFlag bit. */
static int host_is_v4(const char *h)
{
    static const char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, (char)0xFF, (char)0xFF};
    static const char zero[16];
    return !memcmp(h, mapped, 12) || !memcmp(h, zero, 16);
}

static size_t host_size(const char *h) { return host_is_v4(h) ? 8 : 20; }

/* The RocketMQ form of a record framed by cl_record_frame: its size and the parts it is made of. */
typedef struct rmq_rec {
    uint32_t total;
    uint64_t tpos, ppos;
    uint16_t plen;
    size_t tlen;
    uint64_t out; /* bytes in RocketMQ's encoding */
} rmq_rec;

/* 4 TOTALSIZE, 4 MAGIC, 4 BODYCRC, 4 QUEUEID, 4 FLAG, 8 QUEUEOFFSET, 8 PHYSICALOFFSET, 4 SYSFLAG,
 * 8 BORNTIMESTAMP, 8 STORETIMESTAMP, 4 RECONSUMETIMES, 8 PREPARED_TX_OFFSET, 4 body length, 2 properties
 * length: everything but the hosts, the variable parts and the topic length */
#define RMQ_FIXED (4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 4 + 8 + 4 + 2)

static int frame_record(const char *p, size_t left, rmq_rec *r, cl_err *e)
{
    if (cl_record_frame(p, left, &r->total, &r->tpos, &r->ppos, &r->plen, e))
        return -1;
    r->tlen = (size_t)(r->ppos - r->tpos - 1);
    uint64_t body = r->tpos - CL_HEADER_SIZE;
    r->out = RMQ_FIXED + host_size(p + F_BORN_HOST) + host_size(p + F_STORE_HOST) + body +
             (r->tlen > RMQ_V1_MAX_TOPIC ? 2 : 1) + r->tlen + r->plen;
    if (r->out > INT32_MAX) /* TOTALSIZE is a Java int */
        return cl_fail(e, CL_CORRUPT_RECORD, "record is malformed: %llu bytes do not fit RocketMQ's encoding",
                       (unsigned long long)r->out);
    return 0;
}

int rmq_encode_size(const char *in, size_t n, size_t *out_size, size_t *count, cl_err *e)
{
    size_t pos = 0, out = 0, k = 0;
    rmq_rec r;
    while (pos < n) {
        if (frame_record(in + pos, n - pos, &r, e))
            return -1;
        out += (size_t)r.out;
        pos += r.total;
        k++;
    }
    *out_size = out;
    *count = k;
    return 0;
}

static char *put_host(char *w, const char *h, int v4)
{
    if (v4) {
        memcpy(w, h + 12, 4);
        w += 4;
    } else {
        memcpy(w, h, 16);
        w += 16;
    }
    return put_be32(w, ld32(h + 16)); /* sparkmq keeps the port little-endian */
}

int rmq_encode_write(const char *in, size_t n, char *out, size_t out_size, cl_err *e)
{
    size_t pos = 0;
    char *w = out, *end = out + out_size;
    rmq_rec r;
    while (pos < n) {
        const char *p = in + pos;
        if (frame_record(p, n - pos, &r, e))
            return -1;
        if (r.out > (uint64_t)(end - w)) /* a bytearray rewritten since rmq_encode_size */
            return cl_fail(e, CL_CORRUPT_RECORD, "the records changed while they were being read");
        const char *body = p + CL_HEADER_SIZE;
        size_t blen = (size_t)(r.tpos - CL_HEADER_SIZE);
        int born4 = host_is_v4(p + F_BORN_HOST), store4 = host_is_v4(p + F_STORE_HOST);
        uint32_t sys = ld32(p + F_SYSFLAG) & ~(uint32_t)(RMQ_BORNHOST_V6 | RMQ_STOREHOST_V6);
        sys |= (born4 ? 0 : RMQ_BORNHOST_V6) | (store4 ? 0 : RMQ_STOREHOST_V6);
        w = put_be32(w, (uint32_t)r.out);
        w = put_be32(w, r.tlen > RMQ_V1_MAX_TOPIC ? RMQ_MAGIC_V2 : RMQ_MAGIC_V1);
        w = put_be32(w, sparkmq_crc32(0, body, blen) & 0x7FFFFFFFu); /* UtilAll.crc32 */
        w = put_be32(w, ld32(p + F_QID));
        w = put_be32(w, ld32(p + F_FLAG));
        w = put_be64(w, ld64(p + F_QOFF));
        w = put_be64(w, ld64(p + F_CLOFF));
        w = put_be32(w, sys);
        w = put_be64(w, ld64(p + F_BORN_TS));
        w = put_host(w, p + F_BORN_HOST, born4);
        w = put_be64(w, ld64(p + F_STORE_TS));
        w = put_host(w, p + F_STORE_HOST, store4);
        w = put_be32(w, ld32(p + F_RECONSUME));
        w = put_be64(w, ld64(p + F_PREPARED));
        w = put_be32(w, (uint32_t)blen);
        memcpy(w, body, blen);
        w += blen;
        if (r.tlen > RMQ_V1_MAX_TOPIC)
            w = put_be16(w, (uint16_t)r.tlen);
        else
            *w++ = (char)r.tlen;
        memcpy(w, p + r.tpos + 1, r.tlen);
        w += r.tlen;
        /* a properties length past 32767 is what a Java short cannot read: the store's limit
         * (max_properties_size, 32767 by default) keeps them below */
        w = put_be16(w, r.plen);
        memcpy(w, p + r.ppos + 2, r.plen);
        w += r.plen;
        pos += r.total;
    }
    if (w != end)
        return cl_fail(e, CL_CORRUPT_RECORD, "the records changed while they were being read");
    return 0;
}

/* ------------------------------------------------------------------ batch bodies */

/* One SEND_BATCH_MESSAGE entry: TOTALSIZE, MAGIC, BODYCRC, FLAG, i32 body length, body, i16 properties
 * length, properties (MAGIC and BODYCRC are 0 from the Java client and ignored, as RocketMQ's broker does). */
typedef struct rmq_entry {
    size_t need;
    int32_t blen, plen;
} rmq_entry;

static int frame_entry(const char *p, size_t left, size_t i, rmq_entry *m, cl_err *e)
{
    if (left < RMQ_BATCH_HEAD)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %zu: the entry header is truncated (%zu bytes left)", i, left);
    int32_t total = be32(p);
    m->blen = be32(p + 16);
    if (m->blen < 0)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %zu: the body length %d is negative", i, (int)m->blen);
    uint64_t need = (uint64_t)RMQ_BATCH_HEAD + (uint64_t)m->blen + 2;
    if (need > left)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %zu: the entry needs %llu bytes, %zu are left", i,
                       (unsigned long long)need, left);
    m->plen = be16(p + RMQ_BATCH_HEAD + m->blen);
    if (m->plen < 0)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %zu: the properties length %d is negative", i, (int)m->plen);
    need += (uint64_t)m->plen;
    if (need > left)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %zu: the entry needs %llu bytes, %zu are left", i,
                       (unsigned long long)need, left);
    if ((uint64_t)(int64_t)total != need)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %zu: TOTALSIZE %d does not match the entry's %llu bytes", i,
                       (int)total, (unsigned long long)need);
    m->need = (size_t)need;
    return 0;
}

int rmq_batch_size(const char *in, size_t n, size_t *out_size, size_t *count, cl_err *e)
{
    if (n == 0)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "the batch is empty");
    size_t pos = 0, out = 0, i = 0;
    rmq_entry m;
    for (; pos < n; i++) {
        const char *p = in + pos;
        if (frame_entry(p, n - pos, i, &m, e))
            return -1;
        if (!cl_utf8_valid((const unsigned char *)p + RMQ_BATCH_HEAD + m.blen + 2, (size_t)m.plen))
            return cl_fail(e, CL_MESSAGE_ILLEGAL, "message %zu: the properties are not valid UTF-8", i);
        out += CL_PACKED_HEADER + (size_t)m.blen + (size_t)m.plen;
        pos += m.need;
    }
    *out_size = out;
    *count = i;
    return 0;
}

int rmq_batch_write(const char *in, size_t n, int64_t born_ts, char *out, size_t out_size, cl_err *e)
{
    size_t pos = 0, i = 0;
    char *w = out, *end = out + out_size;
    rmq_entry m;
    for (; pos < n; i++) {
        const char *p = in + pos;
        if (frame_entry(p, n - pos, i, &m, e))
            return -1;
        if ((size_t)(end - w) < CL_PACKED_HEADER + (size_t)m.blen + (size_t)m.plen)
            return cl_fail(e, CL_MESSAGE_ILLEGAL, "the batch changed while it was being read");
        w = put_le32(w, (uint32_t)m.blen);
        w = put_le16(w, (uint16_t)m.plen);
        w = put_le32(w, (uint32_t)be32(p + 12));
        w = put_le64(w, (uint64_t)born_ts);
        memcpy(w, p + RMQ_BATCH_HEAD, (size_t)m.blen);
        w += m.blen;
        memcpy(w, p + RMQ_BATCH_HEAD + m.blen + 2, (size_t)m.plen);
        w += m.plen;
        pos += m.need;
    }
    if (w != end)
        return cl_fail(e, CL_MESSAGE_ILLEGAL, "the batch changed while it was being read");
    return 0;
}
