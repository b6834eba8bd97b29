/* The CommitLog's record writer in C: common/format/record_writer.py's write_items and
 * write_bodies, byte for byte, without a Python-level step per record.
 *
 * A put's records are written straight into the segment's mapping: the 88-byte header (all
 * integers big-endian), the body, the topic and properties, and, when the whole-record CRC is
 * on, its 20-byte entry ("__CRC32#\x01", 10 digits least significant first, "\x02") over the
 * record's other bytes. Everything is checked before the first byte is written, so a refusal
 * (ValueError, TypeError, OverflowError) leaves the buffer as it was. The pure-Python writer
 * in record_writer.py is the reference: tests/unit/format/test_record_writer.py compares the two.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "_record_core.h"

/* An int field of the 32-bit signed kind (struct "i"): -1 and an exception when not. */
static int as_i32(PyObject *v, int32_t *out, const char *name) {
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", name);
        return -1;
    }
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < INT32_MIN || x > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s %ld out of the 32-bit range", name, x);
        return -1;
    }
    *out = (int32_t)x;
    return 0;
}

static int parse_shared(PyObject *const *args, Shared *s) {
    /* args: base, queue_id, queue_offset, born, born_ip, born_port, ts, store_ip,
     * store_port, crc_len */
    int32_t queue_id, born_port, store_port, crc_len;
    if (as_i32(args[1], &queue_id, "queue_id") < 0 || as_i32(args[5], &born_port, "born_port") < 0
        || as_i32(args[8], &store_port, "store_port") < 0
        || as_i32(args[9], &crc_len, "crc_len") < 0)
        return -1;
    s->queue_id = queue_id;
    s->born_port = born_port;
    s->store_port = store_port;
    s->crc_len = crc_len;
    s->base = PyLong_AsLongLong(args[0]);
    s->queue_offset = PyLong_AsLongLong(args[2]);
    s->born = PyLong_AsLongLong(args[3]);
    s->ts = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) return -1;
    if (s->crc_len != 0 && s->crc_len != CRC_ENTRY_BYTES) {
        PyErr_Format(PyExc_ValueError, "crc_len must be 0 or %d", CRC_ENTRY_BYTES);
        return -1;
    }
    PyObject *ips[2] = {args[4], args[7]};
    unsigned char *dst[2] = {s->born_ip, s->store_ip};
    for (int i = 0; i < 2; i++) {
        if (!PyBytes_Check(ips[i]) || PyBytes_GET_SIZE(ips[i]) != 4) {
            PyErr_SetString(PyExc_ValueError, "a host address must be 4 bytes (IPv4)");
            return -1;
        }
        memcpy(dst[i], PyBytes_AS_STRING(ips[i]), 4);
    }
    return 0;
}

static PyObject *entry(long long phy, Py_ssize_t size) {
    return Py_BuildValue("(Lni)", phy, size, 0);
}

/* write_items(buf, pos, items, base, queue_id, queue_offset, born, born_ip, born_port, ts,
 *             store_ip, store_port, crc_len, plain_tail_len) -> (entries, plain, cq) */
static PyObject *write_items(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "write_items takes 14 arguments");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t plain_tail_len = PyLong_AsSsize_t(args[13]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "items must be a list");
        return NULL;
    }
    Shared s;
    if (parse_shared(args + 3, &s) < 0) return NULL;
    /* a snapshot: nothing that runs while entries are made (a collection, a finalizer) can
     * change what the two passes read */
    PyObject *items = PyList_AsTuple(args[2]);
    if (items == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    int32_t *meta = PyMem_Malloc(sizeof(int32_t) * 5 * (size_t)(n ? n : 1));
    long long *prepared = PyMem_Malloc(sizeof(long long) * (size_t)(n ? n : 1));
    if (meta == NULL || prepared == NULL) {
        PyMem_Free(meta);
        PyMem_Free(prepared);
        Py_DECREF(items);
        return PyErr_NoMemory();
    }
    Py_buffer view;
    PyObject *entries = NULL, *cq = NULL, *result = NULL;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) {
        PyMem_Free(meta);
        PyMem_Free(prepared);
        Py_DECREF(items);
        return NULL;
    }
    /* pass 1: check everything, so a refusal writes nothing */
    Py_ssize_t total = 0;
    int plain = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyTuple_GET_ITEM(items, i);
        if (!PyTuple_Check(it) || (PyTuple_GET_SIZE(it) != 7 && PyTuple_GET_SIZE(it) != 8)) {
            PyErr_SetString(PyExc_TypeError, "an item is (size, crc, flag, body, tail, reconsume, sys_flag[, prepared offset])");
            goto done;
        }
        prepared[i] = 0;
        if (PyTuple_GET_SIZE(it) == 8) {
            prepared[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(it, 7));
            if (prepared[i] == -1 && PyErr_Occurred()) goto done;
        }
        int32_t *m = meta + 5 * i;
        if (as_i32(PyTuple_GET_ITEM(it, 0), &m[0], "size") < 0
            || as_i32(PyTuple_GET_ITEM(it, 1), &m[1], "crc") < 0
            || as_i32(PyTuple_GET_ITEM(it, 2), &m[2], "flag") < 0
            || as_i32(PyTuple_GET_ITEM(it, 5), &m[3], "reconsume") < 0
            || as_i32(PyTuple_GET_ITEM(it, 6), &m[4], "sys_flag") < 0)
            goto done;
        PyObject *body = PyTuple_GET_ITEM(it, 3), *tail = PyTuple_GET_ITEM(it, 4);
        if (!PyBytes_Check(body) || !PyBytes_Check(tail)) {
            PyErr_SetString(PyExc_TypeError, "an item's body and tail must be bytes");
            goto done;
        }
        Py_ssize_t tail_len = PyBytes_GET_SIZE(tail);
        if (tail_len < s.crc_len
            || (Py_ssize_t)m[0] != HEADER_BYTES + PyBytes_GET_SIZE(body) + tail_len) {
            PyErr_SetString(PyExc_ValueError, "an item's size does not match its pieces");
            goto done;
        }
        plain = plain && tail_len == plain_tail_len;
        total += m[0];
    }
    if (pos < 0 || pos > view.len || total > view.len - pos) {
        PyErr_SetString(PyExc_ValueError, "the records do not fit in the buffer");
        goto done;
    }
    entries = PyList_New(n);
    if (entries == NULL) goto done;
    cq = PyBytes_FromStringAndSize(NULL, n * CQ_ENTRY_BYTES);
    if (cq == NULL) goto done;
    unsigned char *cq_p = (unsigned char *)PyBytes_AS_STRING(cq);
    unsigned char *out = (unsigned char *)view.buf + pos;
    long long phy = s.base + pos, queue_offset = s.queue_offset;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyTuple_GET_ITEM(items, i);
        PyObject *body = PyTuple_GET_ITEM(it, 3), *tail = PyTuple_GET_ITEM(it, 4);
        const int32_t *m = meta + 5 * i;
        PyObject *e = entry(phy, m[0]);
        if (e == NULL) goto done; /* nothing written is visible: wrote_position is the caller's */
        PyList_SET_ITEM(entries, i, e);
        cq_entry(cq_p + i * CQ_ENTRY_BYTES, phy, m[0]);
        Py_ssize_t size = write_one(out, phy, queue_offset, &s, m[0], m[1], m[2], m[3], m[4],
                                    prepared[i], PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body),
                                    PyBytes_AS_STRING(tail), PyBytes_GET_SIZE(tail));
        out += size;
        phy += size;
        queue_offset++;
    }
    result = Py_BuildValue("(OOO)", entries, plain ? Py_True : Py_False, cq);
done:
    Py_XDECREF(entries);
    Py_XDECREF(cq);
    PyBuffer_Release(&view);
    PyMem_Free(meta);
    PyMem_Free(prepared);
    Py_DECREF(items);
    return result;
}

/* write_bodies(buf, pos, bodies, tail, base, queue_id, queue_offset, born, born_ip,
 *              born_port, ts, store_ip, store_port, crc_len) -> (entries, cq)
 * Records without flag, properties of their own or reconsume count: each body with the same
 * tail (topic, properties length, the CRC placeholder when sealed). */
static PyObject *write_bodies(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "write_bodies takes 14 arguments");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred()) return NULL;
    PyObject *tail = args[3];
    if (!PyList_Check(args[2]) || !PyBytes_Check(tail)) {
        PyErr_SetString(PyExc_TypeError, "bodies must be a list and tail bytes");
        return NULL;
    }
    Shared s;
    if (parse_shared(args + 4, &s) < 0) return NULL;
    Py_ssize_t tail_len = PyBytes_GET_SIZE(tail);
    if (tail_len < s.crc_len) {
        PyErr_SetString(PyExc_ValueError, "the tail is shorter than the CRC entry");
        return NULL;
    }
    PyObject *bodies = PyList_AsTuple(args[2]); /* a snapshot, as in write_items */
    if (bodies == NULL) return NULL;
    PyObject *entries = NULL, *cq = NULL, *result = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(bodies), total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyTuple_GET_ITEM(bodies, i);
        if (!PyBytes_Check(b)) {
            PyErr_SetString(PyExc_TypeError, "a body must be bytes");
            Py_DECREF(bodies);
            return NULL;
        }
        Py_ssize_t size = HEADER_BYTES + PyBytes_GET_SIZE(b) + tail_len;
        if (size > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "a record over 2 GiB");
            Py_DECREF(bodies);
            return NULL;
        }
        total += size;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(bodies);
        return NULL;
    }
    if (pos < 0 || pos > view.len || total > view.len - pos) {
        PyErr_SetString(PyExc_ValueError, "the records do not fit in the buffer");
        goto done;
    }
    entries = PyList_New(n);
    if (entries == NULL) goto done;
    cq = PyBytes_FromStringAndSize(NULL, n * CQ_ENTRY_BYTES);
    if (cq == NULL) goto done;
    unsigned char *cq_p = (unsigned char *)PyBytes_AS_STRING(cq);
    unsigned char *out = (unsigned char *)view.buf + pos;
    long long phy = s.base + pos, queue_offset = s.queue_offset;
    const char *tail_p = PyBytes_AS_STRING(tail);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyTuple_GET_ITEM(bodies, i);
        const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(b);
        Py_ssize_t body_len = PyBytes_GET_SIZE(b);
        int32_t size = (int32_t)(HEADER_BYTES + body_len + tail_len);
        int32_t body_crc = (int32_t)(crc_of(0, body, body_len) & 0x7FFFFFFFu);
        PyObject *e = entry(phy, size);
        if (e == NULL) goto done;
        PyList_SET_ITEM(entries, i, e);
        cq_entry(cq_p + i * CQ_ENTRY_BYTES, phy, size);
        write_one(out, phy, queue_offset, &s, size, body_crc, 0, 0, 0, 0, (const char *)body,
                  body_len, tail_p, tail_len);
        out += size;
        phy += size;
        queue_offset++;
    }
    result = PyTuple_Pack(2, entries, cq);
done:
    Py_XDECREF(entries);
    Py_XDECREF(cq);
    PyBuffer_Release(&view);
    Py_DECREF(bodies);
    return result;
}

static PyMethodDef methods[] = {
    {"write_items", (PyCFunction)(void (*)(void))write_items, METH_FASTCALL,
     "Write prepared records into a writable buffer: (entries, plain, cq)."},
    {"write_bodies", (PyCFunction)(void (*)(void))write_bodies, METH_FASTCALL,
     "Write plain records, one per body, into a writable buffer: (entries, cq)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record_writer",
    "The CommitLog's record writer in C (see record_writer.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__record_writer(void) { return PyModule_Create(&module); }
