/*
 * RocketMQ 5 (apache.rocketmq.v2) SendMessage in C: the gRPC endpoint's hot path.
 *
 * pack_v2_send reads a serialized SendMessageRequest straight from its protobuf wire bytes and,
 * when every message is a plain NORMAL message of one topic, writes the packed batch that
 * encode_batch would write for the same messages (docs/remoting.md, "packed batch").  Anything
 * else -- another type, topic or encoding, a delay, a message group, a malformed or unusual
 * field, a value encode_batch would refuse -- answers None and the caller takes the per-message
 * path, which parses with protobuf and names what is wrong.  So this file only has to be right
 * about what it accepts.
 *
 * encode_v2_send_response writes the SendMessageResponse of such a batch: one status, one entry
 * per message with its id and queue offset.
 *
 * Field numbers are those of definition.proto / service.proto; tests/test_grpc_native.py checks
 * both functions against the protobuf runtime.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "cl_store.h"
#include "growbuf.h"
#include "v2_codec.h"

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };
enum { TYPE_UNSPECIFIED = 0, TYPE_NORMAL = 1 };
enum { ENCODING_UNSPECIFIED = 0, ENCODING_IDENTITY = 1 };

typedef struct span {
    const uint8_t *p;
    size_t n;
} span;

/* ------------------------------------------------------------------ wire reading */

/* A varint at *p (< end); 0 and *p advanced, -1 when truncated or longer than 10 bytes. */
static int rd_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* The next field's number and wire type; -1 when malformed. */
static int rd_tag(const uint8_t **p, const uint8_t *end, uint32_t *field, int *wt)
{
    uint64_t t;
    if (rd_varint(p, end, &t) || (t >> 3) == 0 || (t >> 3) > 0x1FFFFFFF)
        return -1;
    *field = (uint32_t)(t >> 3);
    *wt = (int)(t & 7);
    return 0;
}

static int rd_len(const uint8_t **p, const uint8_t *end, span *s)
{
    uint64_t n;
    if (rd_varint(p, end, &n) || n > (uint64_t)(end - *p))
        return -1;
    s->p = *p;
    s->n = (size_t)n;
    *p += n;
    return 0;
}

/* Skip a field of wire type `wt` (groups are refused: proto3 has none). */
static int skip(const uint8_t **p, const uint8_t *end, int wt)
{
    uint64_t v;
    span s;
    switch (wt) {
    case WT_VARINT:
        return rd_varint(p, end, &v);
    case WT_I64:
        if (end - *p < 8)
            return -1;
        *p += 8;
        return 0;
    case WT_LEN:
        return rd_len(p, end, &s);
    case WT_I32:
        if (end - *p < 4)
            return -1;
        *p += 4;
        return 0;
    default:
        return -1;
    }
}

/* Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF), as protobuf requires of strings. */
static int utf8_ok(span s)
{
    const uint8_t *p = s.p, *end = s.p + s.n;
    while (p < end) {
        uint8_t c = *p++;
        if (c < 0x80)
            continue;
        int more;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF)
            more = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            more = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            more = 3, cp = c & 0x07;
        else
            return 0;
        if (end - p < more)
            return 0;
        for (int k = 0; k < more; k++) {
            if ((p[k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[k] & 0x3F);
        }
        p += more;
        if ((more == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (more == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
    }
    return 1;
}

static int has_sep(span s) { return memchr(s.p, 1, s.n) || memchr(s.p, 2, s.n); }

/* Text encode_batch would take as a property name or value: valid UTF-8 without \x01 or \x02. */
static int text_ok(span s) { return utf8_ok(s) && !has_sep(s); }

static int span_eq(span a, span b) { return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0); }

/* ------------------------------------------------------------------ output buffer */

/* ------------------------------------------------------------------ one message */

typedef struct v2msg {
    span topic_name, topic_ns, body, sysprops, whole;
    span tag, msg_id;
    int64_t born_ms;
    int has_born;
} v2msg;

/* -1: malformed or not plain (the caller answers None) */
#define NOT_PLAIN (-1)

/* A message of two string fields, 1 and 2 (Resource: namespace, name; a map entry: key, value). */
static int parse_two_strings(span m, span *first, span *second)
{
    const uint8_t *p = m.p, *end = m.p + m.n;
    first->p = second->p = m.p;
    first->n = second->n = 0;
    while (p < end) {
        uint32_t f;
        int wt;
        if (rd_tag(&p, end, &f, &wt))
            return NOT_PLAIN;
        if ((f == 1 || f == 2) && wt == WT_LEN) {
            if (rd_len(&p, end, f == 1 ? first : second))
                return NOT_PLAIN;
        } else if (skip(&p, end, wt))
            return NOT_PLAIN;
    }
    return 0;
}

static int parse_resource(span r, span *ns, span *name)
{
    if (parse_two_strings(r, ns, name))
        return NOT_PLAIN;
    return utf8_ok(*ns) && utf8_ok(*name) ? 0 : NOT_PLAIN;
}

static int parse_timestamp(span t, int64_t *ms)
{
    const uint8_t *p = t.p, *end = t.p + t.n;
    uint64_t seconds = 0, nanos = 0;
    while (p < end) {
        uint32_t f;
        int wt;
        if (rd_tag(&p, end, &f, &wt))
            return NOT_PLAIN;
        if ((f == 1 || f == 2) && wt == WT_VARINT) {
            if (rd_varint(&p, end, f == 1 ? &seconds : &nanos))
                return NOT_PLAIN;
        } else if (skip(&p, end, wt))
            return NOT_PLAIN;
    }
    int64_t s = (int64_t)seconds;
    int32_t ns = (int32_t)(uint32_t)nanos;
    /* a valid Timestamp (nanos 0..999,999,999) within what milliseconds hold */
    if (ns < 0 || ns > 999999999 || s < -(INT64_MAX / 1000) + 1 || s > INT64_MAX / 1000 - 1)
        return NOT_PLAIN;
    *ms = s * 1000 + ns / 1000000;
    return 0;
}

static int parse_sysprops(span sp, v2msg *m)
{
    const uint8_t *p = sp.p, *end = sp.p + sp.n;
    while (p < end) {
        uint32_t f;
        int wt;
        uint64_t v;
        span s;
        if (rd_tag(&p, end, &f, &wt))
            return NOT_PLAIN;
        switch (f) {
        case 1: /* tag */
        case 3: /* message_id */
            if (wt != WT_LEN || rd_len(&p, end, f == 1 ? &m->tag : &m->msg_id))
                return NOT_PLAIN;
            break;
        case 5: /* body_encoding */
        case 6: /* message_type */
            if (wt != WT_VARINT || rd_varint(&p, end, &v))
                return NOT_PLAIN;
            if (f == 5 && v != ENCODING_UNSPECIFIED && v != ENCODING_IDENTITY)
                return NOT_PLAIN;
            if (f == 6 && v != TYPE_UNSPECIFIED && v != TYPE_NORMAL)
                return NOT_PLAIN;
            break;
        case 7: /* born_timestamp */
            if (wt != WT_LEN || rd_len(&p, end, &s) || parse_timestamp(s, &m->born_ms))
                return NOT_PLAIN;
            m->has_born = 1;
            break;
        case 11: /* delivery_timestamp: a delay */
        case 17: /* message_group: FIFO */
            return NOT_PLAIN;
        case 2: /* keys: read when the properties are written */
        default:
            if (skip(&p, end, wt))
                return NOT_PLAIN;
        }
    }
    return 0;
}

static int parse_message(span whole, size_t max_body, v2msg *m)
{
    const uint8_t *p = whole.p, *end = whole.p + whole.n;
    span topic = {0};
    int has_topic = 0, has_sys = 0;
    memset(m, 0, sizeof *m);
    m->whole = whole;
    while (p < end) {
        uint32_t f;
        int wt;
        if (rd_tag(&p, end, &f, &wt))
            return NOT_PLAIN;
        if (f >= 1 && f <= 4 && wt != WT_LEN)
            return NOT_PLAIN;
        switch (f) {
        case 1:
            /* a repeated sub-message field merges on the wire: keep it simple, take one occurrence only */
            if (has_topic || rd_len(&p, end, &topic))
                return NOT_PLAIN;
            has_topic = 1;
            break;
        case 3:
            if (has_sys || rd_len(&p, end, &m->sysprops))
                return NOT_PLAIN;
            has_sys = 1;
            break;
        case 4:
            if (rd_len(&p, end, &m->body)) /* bytes: the last occurrence wins */
                return NOT_PLAIN;
            break;
        case 2: /* user_properties: read when the properties are written */
        default:
            if (skip(&p, end, wt))
                return NOT_PLAIN;
        }
    }
    if (!has_topic || parse_resource(topic, &m->topic_ns, &m->topic_name) || m->topic_name.n == 0)
        return NOT_PLAIN;
    if (m->body.n == 0 || m->body.n > max_body || m->body.n > UINT32_MAX)
        return NOT_PLAIN;
    return parse_sysprops(m->sysprops, m);
}

/* Is `name` one of the reserved property names (NUL-separated in `reserved`)? */
static int is_reserved(span name, span reserved)
{
    const uint8_t *p = reserved.p, *end = reserved.p + reserved.n;
    while (p < end) {
        const uint8_t *z = memchr(p, 0, (size_t)(end - p));
        size_t n = z ? (size_t)(z - p) : (size_t)(end - p);
        if (n == name.n && memcmp(p, name.p, n) == 0)
            return 1;
        p += n + 1;
    }
    return 0;
}


/* Append the message's properties (TAGS, KEYS, UNIQ_KEY, then the user's) to `props`, as encode_batch
 * orders them.  `id` receives the UNIQ_KEY (the producer's, or `fresh`). */
static int write_props(const v2msg *m, span reserved, span fresh, growbuf *props, span *id)
{
    if (m->tag.n) {
        if (!text_ok(m->tag) || !cl_tag_ok((const char *)m->tag.p, m->tag.n))
            return NOT_PLAIN;
        if (growbuf_pair(props, "TAGS", 4, (const char *)m->tag.p, m->tag.n))
            return -2;
    }
    /* KEYS: every keys item, space-separated; each non-empty, ASCII and without whitespace */
    const uint8_t *p = m->sysprops.p, *end = m->sysprops.p + m->sysprops.n;
    int nkeys = 0;
    while (p < end) {
        uint32_t f;
        int wt;
        span k;
        if (rd_tag(&p, end, &f, &wt))
            return NOT_PLAIN;
        if (f != 2) {
            if (skip(&p, end, wt))
                return NOT_PLAIN;
            continue;
        }
        if (wt != WT_LEN || rd_len(&p, end, &k) || k.n == 0)
            return NOT_PLAIN;
        for (size_t j = 0; j < k.n; j++) /* non-ASCII keys take the per-message path (Unicode whitespace) */
            if (k.p[j] <= 0x20 || k.p[j] >= 0x7F)
                return NOT_PLAIN;
        if (growbuf_put(props, nkeys ? " " : "KEYS\x01", nkeys ? 1 : 5) || growbuf_put(props, k.p, k.n))
            return -2;
        nkeys++;
    }
    if (nkeys && growbuf_put(props, "\x02", 1))
        return -2;
    if (m->msg_id.n) {
        if (!cl_uniq_ok((const char *)m->msg_id.p, m->msg_id.n))
            return NOT_PLAIN;
        *id = m->msg_id;
    } else
        *id = fresh;
    if (growbuf_pair(props, "UNIQ_KEY", 8, (const char *)id->p, id->n))
        return -2;
    /* the user's properties, in wire order; a repeated or reserved name takes the per-message path */
    size_t first_user = props->n;
    int nuser = 0;
    p = m->whole.p;
    end = m->whole.p + m->whole.n;
    while (p < end) {
        uint32_t f;
        int wt;
        span e, key, value;
        if (rd_tag(&p, end, &f, &wt))
            return NOT_PLAIN;
        if (f != 2) {
            if (skip(&p, end, wt))
                return NOT_PLAIN;
            continue;
        }
        if (rd_len(&p, end, &e) || parse_two_strings(e, &key, &value) || key.n == 0 || !text_ok(key) ||
            !text_ok(value) || is_reserved(key, reserved))
            return NOT_PLAIN;
        /* a repeated name: protobuf keeps the last one; rare enough to leave to the per-message path */
        const char *q = props->p + first_user, *qend = props->p + props->n;
        for (int u = 0; u < nuser; u++) {
            const char *sep = memchr(q, 1, (size_t)(qend - q));
            if ((size_t)(sep - q) == key.n && memcmp(q, key.p, key.n) == 0)
                return NOT_PLAIN;
            q = memchr(sep, 2, (size_t)(qend - sep)) + 1;
        }
        if (growbuf_pair(props, (const char *)key.p, key.n, (const char *)value.p, value.n))
            return -2;
        nuser++;
    }
    return 0;
}

/* ------------------------------------------------------------------ pack_v2_send */

typedef struct packed_msg {
    span body;
    size_t props_off, props_len;
} packed_msg;

static int is_hex20(const char *s, Py_ssize_t n)
{
    if (n != 20)
        return 0;
    for (int k = 0; k < 20; k++)
        if (!((s[k] >= '0' && s[k] <= '9') || (s[k] >= 'A' && s[k] <= 'F') || (s[k] >= 'a' && s[k] <= 'f')))
            return 0;
    return 1;
}

PyObject *v2_send_summary(PyObject *mod, PyObject *arg)
{
    Py_buffer raw;
    if (PyObject_GetBuffer(arg, &raw, PyBUF_SIMPLE))
        return NULL;
    const uint8_t *p = raw.buf, *end = p + raw.len;
    Py_ssize_t count = 0;
    int64_t born = 0;
    int has_born = 0, ok = 1;
    while (p < end) {
        uint32_t f;
        int wt;
        span s;
        v2msg m;
        if (rd_tag(&p, end, &f, &wt) || (f == 1 ? wt != WT_LEN || rd_len(&p, end, &s) : skip(&p, end, wt))) {
            ok = 0;
            break;
        }
        if (f == 1 && count++ == 0 && parse_message(s, SIZE_MAX, &m) == 0 && m.has_born) {
            born = m.born_ms;
            has_born = 1;
        }
    }
    PyBuffer_Release(&raw);
    if (!ok)
        return Py_BuildValue("(nO)", (Py_ssize_t)0, Py_None);
    if (!has_born)
        return Py_BuildValue("(nO)", count, Py_None);
    return Py_BuildValue("(nL)", count, (long long)born);
}

PyObject *v2_pack_send(PyObject *mod, PyObject *args)
{
    Py_buffer raw, reserved_buf;
    Py_ssize_t max_body;
    const char *prefix;
    Py_ssize_t prefix_n;
    long long month, born;
    unsigned int counter;
    if (!PyArg_ParseTuple(args, "y*ny*s#LIL:pack_v2_send", &raw, &max_body, &reserved_buf, &prefix, &prefix_n,
                          &month, &counter, &born))
        return NULL;
    PyObject *res = NULL, *msg_ids = NULL, *data = NULL;
    packed_msg *pm = NULL;
    size_t npm = 0, cap = 0;
    growbuf props = {0};
    span reserved = {reserved_buf.buf, (size_t)reserved_buf.len};
    span first_name = {0}, first_ns = {0};
    unsigned int start_counter = counter & 0xFFFF;
    counter = start_counter;
    int plain = 1;
    if (!is_hex20(prefix, prefix_n)) {
        PyErr_SetString(PyExc_ValueError, "id_prefix must be 20 hexadecimal digits");
        goto out;
    }
    if (max_body < 0 || born < 0) {
        plain = 0;
        goto answer;
    }
    if (!(msg_ids = PyList_New(0)))
        goto out;
    uint32_t since = (uint32_t)((uint64_t)born - (uint64_t)month);
    const uint8_t *p = raw.buf, *end = p + raw.len;
    size_t total = 0;
    while (p < end) {
        uint32_t f;
        int wt;
        span s;
        v2msg m;
        if (rd_tag(&p, end, &f, &wt)) {
            plain = 0;
            break;
        }
        if (f != 1) {
            if (skip(&p, end, wt)) {
                plain = 0;
                break;
            }
            continue;
        }
        if (wt != WT_LEN || rd_len(&p, end, &s) || parse_message(s, (size_t)max_body, &m)) {
            plain = 0;
            break;
        }
        if (npm == 0) {
            first_name = m.topic_name;
            first_ns = m.topic_ns;
        } else if (!span_eq(m.topic_name, first_name) || !span_eq(m.topic_ns, first_ns)) {
            plain = 0;
            break;
        }
        char idbuf[33];
        span id, fresh = {(const uint8_t *)idbuf, 0};
        if (!m.msg_id.n) { /* UniqueIdGenerator's format: prefix, ms since the month, counter */
            counter = (counter + 1) & 0xFFFF;
            memcpy(idbuf, prefix, 20);
            snprintf(idbuf + 20, sizeof idbuf - 20, "%08X%04X", (unsigned)since, counter);
            fresh.n = 32;
        }
        size_t start = props.n;
        int rc = write_props(&m, reserved, fresh, &props, &id);
        if (rc == -2)
            goto out;
        if (rc || props.n - start > CL_MAX_PROPS) {
            plain = 0;
            break;
        }
        PyObject *ido = PyUnicode_DecodeASCII((const char *)id.p, (Py_ssize_t)id.n, NULL);
        if (!ido || PyList_Append(msg_ids, ido)) {
            Py_XDECREF(ido);
            goto out;
        }
        Py_DECREF(ido);
        if (npm == cap) {
            cap = cap ? cap * 2 : 64;
            packed_msg *grown = PyMem_Realloc(pm, cap * sizeof *pm);
            if (!grown) {
                PyErr_NoMemory();
                goto out;
            }
            pm = grown;
        }
        pm[npm++] = (packed_msg){m.body, start, props.n - start};
        total += CL_PACKED_HEADER + m.body.n + (props.n - start);
    }
    if (!plain || npm == 0) {
        plain = 0;
        goto answer;
    }
    if (!(data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total)))
        goto out;
    char *w = PyBytes_AS_STRING(data);
    int32_t flag = 0;
    int64_t born64 = born;
    for (size_t j = 0; j < npm; j++) {
        uint32_t blen = (uint32_t)pm[j].body.n;
        uint16_t plen = (uint16_t)pm[j].props_len;
        memcpy(w, &blen, 4);
        memcpy(w + 4, &plen, 2);
        memcpy(w + 6, &flag, 4);
        memcpy(w + 10, &born64, 8);
        memcpy(w + CL_PACKED_HEADER, pm[j].body.p, blen);
        memcpy(w + CL_PACKED_HEADER + blen, props.p + pm[j].props_off, plen);
        w += CL_PACKED_HEADER + (size_t)blen + plen;
    }
answer:
    if (!plain)
        res = Py_BuildValue("(OI)", Py_None, start_counter);
    else {
        PyObject *name = PyUnicode_DecodeUTF8((const char *)first_name.p, (Py_ssize_t)first_name.n, NULL);
        PyObject *ns = name ? PyUnicode_DecodeUTF8((const char *)first_ns.p, (Py_ssize_t)first_ns.n, NULL) : NULL;
        if (ns)
            res = Py_BuildValue("(OOOOI)", name, ns, data, msg_ids, counter);
        Py_XDECREF(name);
        Py_XDECREF(ns);
    }
out:
    PyMem_Free(pm);
    PyMem_Free(props.p);
    Py_XDECREF(msg_ids);
    Py_XDECREF(data);
    PyBuffer_Release(&raw);
    PyBuffer_Release(&reserved_buf);
    return res;
}

/* ------------------------------------------------------------------ encode_v2_send_response */

static int ob_varint(growbuf *b, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (uint8_t)(v & 0x7F);
        v >>= 7;
        if (v)
            tmp[n] |= 0x80;
        n++;
    } while (v);
    return growbuf_put(b, tmp, n);
}

/* key + length + bytes of a length-delimited field */
static int ob_field(growbuf *b, uint32_t field, const void *s, size_t n)
{
    return ob_varint(b, ((uint64_t)field << 3) | WT_LEN) || ob_varint(b, n) || growbuf_put(b, s, n);
}

PyObject *v2_encode_send_response(PyObject *mod, PyObject *args)
{
    int code;
    const char *message;
    Py_ssize_t message_n;
    PyObject *msg_ids;
    long long first_offset;
    if (!PyArg_ParseTuple(args, "is#O!L:encode_v2_send_response", &code, &message, &message_n, &PyList_Type,
                          &msg_ids, &first_offset))
        return NULL;
    if (first_offset < 0) {
        PyErr_SetString(PyExc_ValueError, "first_offset must not be negative");
        return NULL;
    }
    growbuf status = {0}, out = {0}, entry = {0};
    PyObject *res = NULL;
    /* Status: code (1), message (2); proto3 leaves out defaults */
    if ((code && (ob_varint(&status, 1 << 3 | WT_VARINT) || ob_varint(&status, (uint64_t)(int64_t)code))) ||
        (message_n && ob_field(&status, 2, message, (size_t)message_n)))
        goto out;
    if (ob_field(&out, 1, status.p ? status.p : "", status.n))
        goto out;
    Py_ssize_t n = PyList_GET_SIZE(msg_ids);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t idn;
        const char *id = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(msg_ids, i), &idn);
        if (!id)
            goto out;
        entry.n = 0;
        uint64_t offset = (uint64_t)first_offset + (uint64_t)i;
        if (ob_field(&entry, 1, status.p ? status.p : "", status.n) || (idn && ob_field(&entry, 2, id, (size_t)idn)) ||
            (offset && (ob_varint(&entry, 4 << 3 | WT_VARINT) || ob_varint(&entry, offset))))
            goto out;
        if (ob_field(&out, 2, entry.p, entry.n))
            goto out;
    }
    res = PyBytes_FromStringAndSize(out.p ? out.p : "", (Py_ssize_t)out.n);
out:
    PyMem_Free(status.p);
    PyMem_Free(out.p);
    PyMem_Free(entry.p);
    return res;
}
