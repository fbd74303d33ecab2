/* RocketMQ 5 SendMessage in C (v2_codec.c): the module functions _commitlog.c registers. */
#ifndef SPARKMQ_V2_CODEC_H
#define SPARKMQ_V2_CODEC_H

#include <Python.h>

/* v2_send_summary(request_bytes) -> (message count, the first message's born timestamp in ms or None);
 * (0, None) for bytes that do not parse */
PyObject *v2_send_summary(PyObject *mod, PyObject *arg);
/* pack_v2_send(request_bytes, max_body, reserved, id_prefix, month_start_ms, counter, born_ms)
 *   -> (topic, namespace, packed, msg_ids, counter) or (None, counter) */
PyObject *v2_pack_send(PyObject *mod, PyObject *args);
/* encode_v2_send_response(code, message, msg_ids, first_offset) -> SendMessageResponse bytes */
PyObject *v2_encode_send_response(PyObject *mod, PyObject *args);

#endif
