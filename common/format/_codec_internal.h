/* What _codec.c and _put_path.c (one extension, two files) call of each other. */
#ifndef REPLOG_CODEC_INTERNAL_H
#define REPLOG_CODEC_INTERNAL_H

#include <Python.h>

/* _codec.c: decode_request(frames, limits) (a Request, the unpacked header, or None),
 * encode_response's args (code, opaque, remark, fields[, bodies]) -> frames, zmtp_encode,
 * and the Request type configure() was given (NULL before it). */
PyObject *replog_decode_request(PyObject *frames, PyObject *limits);
PyObject *replog_encode_response(PyObject *const *args, Py_ssize_t nargs);
PyObject *replog_zmtp_encode(PyObject *frames);
PyObject *replog_request_type(void);
/* 1 when a key of a KEYS str, or a dict's UNIQ_KEY, starts with a broker-only property's name
 * (or the UNIQ_KEY is no str), else 0; -1 with an exception set. */
int replog_key_screened(PyObject *s);
int replog_uniq_screened(PyObject *props);

/* _put_path.c */
PyObject *replog_put_sends(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
