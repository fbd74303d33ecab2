/* RocketMQ's message encodings in C (rmq_codec.c), without Python: the binding in _commitlog.c
 * calls them with the GIL released.  The byte layouts are drawn in layout.py ("RocketMQ's
 * encodings"); the error texts are those of _commitlog.pyi. */
#ifndef SPARKMQ_RMQ_CODEC_H
#define SPARKMQ_RMQ_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "cl_store.h"

/* MessageDecoder's magic codes: V1 (a one-byte topic length) and V2 (two bytes, topics > 127 bytes) */
#define RMQ_MAGIC_V1 0xDAA320A7u
#define RMQ_MAGIC_V2 0xDAA320ABu
/* sysFlag bits of a host stored as 16 bytes of IPv6 instead of 4 of IPv4 */
#define RMQ_BORNHOST_V6 0x10
#define RMQ_STOREHOST_V6 0x20
/* the longest topic a V1 record can name (its length is a signed byte) */
#define RMQ_V1_MAX_TOPIC 127
/* a SEND_BATCH_MESSAGE entry before its body: TOTALSIZE, MAGIC, BODYCRC, FLAG, body length */
#define RMQ_BATCH_HEAD 20

/* Sizes the stored records in[0, n) (sparkmq's layout, back to back) take in RocketMQ's
 * stored-message encoding; checks each record's framing (CORRUPT_RECORD as decode_records). */
int rmq_encode_size(const char *in, size_t n, size_t *out_size, size_t *count, cl_err *e);
/* Writes them (out_size from rmq_encode_size); -1 (CORRUPT_RECORD) if the input changed meanwhile. */
int rmq_encode_write(const char *in, size_t n, char *out, size_t out_size, cl_err *e);

/* Frames a SEND_BATCH_MESSAGE body: each entry's lengths, and UTF-8 properties (MESSAGE_ILLEGAL
 * naming the entry); gives the packed batch's size and the entry count. */
int rmq_batch_size(const char *in, size_t n, size_t *out_size, size_t *count, cl_err *e);
/* Writes the packed batch (docs/remoting.md "Packed batch"), every entry born at born_ts. */
int rmq_batch_write(const char *in, size_t n, int64_t born_ts, char *out, size_t out_size, cl_err *e);

#endif
