/* A growable byte buffer on the Python allocator, shared by the codecs that build records and answers. */
#ifndef SPARKMQ_GROWBUF_H
#define SPARKMQ_GROWBUF_H

#include <Python.h>
#include <string.h>

typedef struct growbuf {
    char *p;
    size_t n, cap;
} growbuf;

/* Append n bytes (doubling from 4 KiB); -1 with MemoryError set. */
static inline int growbuf_put(growbuf *b, const void *s, size_t n)
{
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n < n)
            cap *= 2;
        char *p = PyMem_Realloc(b->p, cap);
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* One stored property: key \x01 value \x02 (the commit log's property encoding). */
static inline int growbuf_pair(growbuf *b, const char *k, size_t kn, const char *v, size_t vn)
{
    return growbuf_put(b, k, kn) || growbuf_put(b, "\x01", 1) || growbuf_put(b, v, vn) || growbuf_put(b, "\x02", 1);
}

#endif
