/* A POP answer's records as RocketMQ 5's gRPC ReceiveMessageResponse bytes, in one C call: what
 * common/proxy/convert.py's Python path makes of each record (protocol.decode_record, then
 * convert.incoming) without a MessageExt, a dict or a protobuf object per message.
 *
 * encode_received(bodies, handles, attempts) -> list: for each record, the serialized
 * ReceiveMessageResponse{message} (topic, user properties, system properties, body), or None
 * where the record is one this function leaves to the Python path: a compressed body (it is
 * inflated there), a string that is not strict UTF-8 (decoded there with replacement, or
 * refused), an attempt count outside int32, or a record that fails any check decode_record
 * makes (magic, sizes, body CRC, whole-record CRC): the Python path raises its ProtocolError.
 * configure(uniq, tags, keys, group, excluded) first: the names of the properties read (bytes),
 * and the tuple of names never carried among the user properties.
 *
 * Fields written as the upb serializer writes what convert.message_of sets: proto3 scalars only
 * when not zero or empty, the optional ones (receipt handle, queue offset, delivery attempt,
 * tag, message group) and the sub-messages whenever message_of sets them. The Python path is the
 * reference: tests/unit/proxy/test_received_codec.py parses both and compares them. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../format/_record_core.h"

#define FIXED_BYTES 91
#define SYSFLAG_COMPRESSED 0x1
static const char CRC_NAME[] = "__CRC32#";

/* protobuf wire types */
#define VARINT 0
#define LEN 2

enum { NORMAL = 1, FIFO = 2, CRC32_TYPE = 1, IDENTITY = 1 };

typedef struct {
    unsigned char *p; /* the next byte */
} W;

static inline void varint(W *w, uint64_t v) {
    while (v >= 0x80) {
        *w->p++ = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    *w->p++ = (unsigned char)v;
}

static inline void key(W *w, int field, int type) { varint(w, ((uint64_t)field << 3) | type); }

static inline void bytes_field(W *w, int field, const unsigned char *s, Py_ssize_t n) {
    key(w, field, LEN);
    varint(w, (uint64_t)n);
    memcpy(w->p, s, (size_t)n);
    w->p += n;
}

/* A length-delimited sub-message: its key and 5 bytes reserved for its length; close() moves
 * the content back over what the length's varint did not need. */
static inline unsigned char *open_len(W *w, int field) {
    key(w, field, LEN);
    unsigned char *at = w->p;
    w->p += 5;
    return at;
}

static inline void close_len(W *w, unsigned char *at) {
    unsigned char *content = at + 5;
    size_t n = (size_t)(w->p - content);
    W len = {at};
    varint(&len, n);
    if (len.p != content) memmove(len.p, content, n);
    w->p = len.p + n;
}

/* int32 / int64 as protobuf writes them: negative ones sign-extended to 64 bits */
static inline void int_field(W *w, int field, int64_t v) {
    key(w, field, VARINT);
    varint(w, (uint64_t)v);
}

static void timestamp(W *w, int field, int64_t ms) {
    int64_t seconds = ms / 1000, rest = ms % 1000;
    if (rest < 0) { /* Python's floor division and modulo */
        rest += 1000;
        seconds -= 1;
    }
    unsigned char *at = open_len(w, field);
    if (seconds) int_field(w, 1, seconds);
    if (rest) int_field(w, 2, rest * 1000000);
    close_len(w, at);
}

/* Strict UTF-8 (what Python's decoder accepts): no overlong forms, no surrogates, nothing past
 * U+10FFFF. */
static int utf8_ok(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) {
            more = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            more = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            more = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (i + more >= n) return 0;
        for (int k = 1; k <= more; k++) {
            unsigned char d = s[i + k];
            if ((d & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (d & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += more + 1;
    }
    return 1;
}

static void ip_text(char *out, const unsigned char *ip) {
    sprintf(out, "%u.%u.%u.%u", ip[0], ip[1], ip[2], ip[3]);
}

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
} Span;

static inline int named(const unsigned char *name, Py_ssize_t n, PyObject *what) {
    return n == PyBytes_GET_SIZE(what) && memcmp(name, PyBytes_AS_STRING(what), (size_t)n) == 0;
}

/* configure()'s: the names of the message id, tag, keys and message group properties, and
 * the names never carried among the user properties (a tuple of bytes) */
static struct {
    PyObject *read[4];
    PyObject *excluded;
} config;

static int excluded(const unsigned char *name, Py_ssize_t n) {
    Py_ssize_t count = PyTuple_GET_SIZE(config.excluded);
    for (Py_ssize_t i = 0; i < count; i++)
        if (named(name, n, PyTuple_GET_ITEM(config.excluded, i))) return 1;
    return n == (Py_ssize_t)sizeof(CRC_NAME) - 1 && memcmp(CRC_NAME, name, (size_t)n) == 0;
}

/* The record's checks (record.check with the CRCs): 1 when sound. */
static int sound(const unsigned char *r, Py_ssize_t size, int32_t *body_len, int *topic_len,
                 int *props_len, uint32_t *body_crc) {
    if (size < FIXED_BYTES) return 0;
    if ((Py_ssize_t)(int32_t)get32(r) != size || get32(r + 4) != MAGIC_V1) return 0;
    int32_t b = (int32_t)get32(r + 84);
    if (b < 0 || HEADER_BYTES + (Py_ssize_t)b + 3 > size) return 0;
    int t = r[HEADER_BYTES + b];
    if (HEADER_BYTES + (Py_ssize_t)b + 1 + t + 2 > size) return 0;
    const unsigned char *q = r + HEADER_BYTES + b + 1 + t;
    int pl = (q[0] << 8) | q[1];
    if (FIXED_BYTES + (Py_ssize_t)b + t + pl != size) return 0;
    uint32_t crc = (uint32_t)crc_of(0, r + HEADER_BYTES, b);
    if ((crc & 0x7FFFFFFFu) != get32(r + 8)) return 0;
    if (pl >= CRC_ENTRY_BYTES && memcmp(r + size - CRC_ENTRY_BYTES, CRC_PREFIX, 9) == 0
        && r[size - 1] == 2) {
        uint32_t whole = (uint32_t)crc_of(0, r, size - CRC_ENTRY_BYTES) & 0x7FFFFFFFu;
        const unsigned char *digits = r + size - 11; /* least significant first */
        for (int k = 0; k < 10; k++) {
            if (digits[k] != (unsigned char)('0' + whole % 10)) return 0;
            whole /= 10;
        }
    }
    *body_len = b;
    *body_crc = crc;
    *topic_len = t;
    *props_len = pl;
    return 1;
}

/* One record -> its ReceiveMessageResponse bytes, or Py_None (the Python path's), or NULL with
 * an exception (memory). */
static PyObject *encode_one(const unsigned char *r, Py_ssize_t size, const char *handle,
                            Py_ssize_t handle_len, int64_t attempt) {
    int32_t body_len;
    int topic_len, props_len;
    uint32_t body_crc;
    if (!sound(r, size, &body_len, &topic_len, &props_len, &body_crc)) Py_RETURN_NONE;
    if (get32(r + 36) & SYSFLAG_COMPRESSED) Py_RETURN_NONE;
    const unsigned char *body = r + HEADER_BYTES;
    const unsigned char *topic = body + body_len + 1;
    const unsigned char *props = topic + topic_len + 2;
    if (!utf8_ok(topic, topic_len) || !utf8_ok(props, props_len)) Py_RETURN_NONE;

    /* the properties' last values of the names read here */
    Span uniq = {NULL, 0}, tags = {NULL, 0}, keys = {NULL, 0}, group = {NULL, 0};
    for (const unsigned char *p = props, *end = props + props_len; p < end;) {
        const unsigned char *stop = memchr(p, 2, (size_t)(end - p));
        if (stop == NULL) stop = end;
        const unsigned char *sep = memchr(p, 1, (size_t)(stop - p));
        if (sep != NULL) {
            Py_ssize_t n = sep - p;
            Span value = {sep + 1, stop - sep - 1};
            if (named(p, n, config.read[0])) uniq = value;
            else if (named(p, n, config.read[1])) tags = value;
            else if (named(p, n, config.read[2])) keys = value;
            else if (named(p, n, config.read[3])) group = value;
        }
        p = stop + 1;
    }

    /* at most: the record's bytes once, 6 more a property (a map entry's keys and lengths
     * against the record's two separators), the handle, and the fixed fields */
    Py_ssize_t bound = size + 6 * (Py_ssize_t)props_len + handle_len + 512;
    PyObject *out = PyBytes_FromStringAndSize(NULL, bound);
    if (out == NULL) return NULL;
    W w = {(unsigned char *)PyBytes_AS_STRING(out)};

    unsigned char *message = open_len(&w, 2); /* ReceiveMessageResponse.message */
    unsigned char *resource = open_len(&w, 1); /* Message.topic */
    if (topic_len) bytes_field(&w, 2, topic, topic_len);
    close_len(&w, resource);
    for (const unsigned char *p = props, *end = props + props_len; p < end;) {
        const unsigned char *stop = memchr(p, 2, (size_t)(end - p));
        if (stop == NULL) stop = end;
        const unsigned char *sep = memchr(p, 1, (size_t)(stop - p));
        if (sep != NULL && !excluded(p, sep - p)) {
            unsigned char *entry = open_len(&w, 2); /* Message.user_properties */
            bytes_field(&w, 1, p, sep - p);
            bytes_field(&w, 2, sep + 1, stop - sep - 1);
            close_len(&w, entry);
        }
        p = stop + 1;
    }

    unsigned char *sp = open_len(&w, 3); /* Message.system_properties */
    if (tags.n) bytes_field(&w, 1, tags.p, tags.n);
    for (const unsigned char *k = keys.p, *end = keys.p + keys.n; keys.n && k < end;) {
        const unsigned char *space = memchr(k, ' ', (size_t)(end - k));
        if (space == NULL) space = end;
        if (space > k) bytes_field(&w, 2, k, space - k);
        k = space + 1;
    }
    if (uniq.n) {
        bytes_field(&w, 3, uniq.p, uniq.n);
    } else { /* the msgId: store host, port and CommitLog offset, in hex */
        static const char hex[] = "0123456789ABCDEF";
        unsigned char raw[16], text[32];
        memcpy(raw, r + 64, 8);
        memcpy(raw + 8, r + 28, 8);
        for (int k = 0; k < 16; k++) {
            text[2 * k] = (unsigned char)hex[raw[k] >> 4];
            text[2 * k + 1] = (unsigned char)hex[raw[k] & 15];
        }
        bytes_field(&w, 3, text, 32);
    }
    unsigned char *digest = open_len(&w, 4);
    int_field(&w, 1, CRC32_TYPE);
    char checksum[9];
    sprintf(checksum, "%08X", (unsigned)body_crc);
    bytes_field(&w, 2, (const unsigned char *)checksum, 8);
    close_len(&w, digest);
    int_field(&w, 5, IDENTITY);
    int_field(&w, 6, group.n ? FIFO : NORMAL);
    timestamp(&w, 7, (int64_t)get64(r + 40));
    char host[32];
    ip_text(host, r + 48);
    bytes_field(&w, 8, (const unsigned char *)host, (Py_ssize_t)strlen(host));
    timestamp(&w, 9, (int64_t)get64(r + 56));
    ip_text(host, r + 64);
    sprintf(host + strlen(host), ":%d", (int32_t)get32(r + 68));
    bytes_field(&w, 10, (const unsigned char *)host, (Py_ssize_t)strlen(host));
    bytes_field(&w, 12, (const unsigned char *)handle, handle_len);
    int32_t queue_id = (int32_t)get32(r + 12);
    if (queue_id) int_field(&w, 13, queue_id);
    int_field(&w, 14, (int64_t)get64(r + 20));
    int_field(&w, 16, attempt);
    if (group.n) bytes_field(&w, 17, group.p, group.n);
    close_len(&w, sp);
    if (body_len) bytes_field(&w, 4, body, body_len); /* Message.body */
    close_len(&w, message);

    if (_PyBytes_Resize(&out, (Py_ssize_t)(w.p - (unsigned char *)PyBytes_AS_STRING(out))) < 0)
        return NULL;
    return out;
}

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(uniq, tags, keys, group, excluded) takes 5 arguments");
        return NULL;
    }
    for (int i = 0; i < 4; i++)
        if (!PyBytes_CheckExact(args[i])) {
            PyErr_SetString(PyExc_TypeError, "a property name must be bytes");
            return NULL;
        }
    if (!PyTuple_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "excluded must be a tuple of bytes");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[4]); i++)
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(args[4], i))) {
            PyErr_SetString(PyExc_TypeError, "excluded must be a tuple of bytes");
            return NULL;
        }
    for (int i = 0; i < 4; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(config.read[i], args[i]);
    }
    Py_INCREF(args[4]);
    Py_XSETREF(config.excluded, args[4]);
    Py_RETURN_NONE;
}

static PyObject *encode_received(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_received(bodies, handles, attempts) takes 3 arguments");
        return NULL;
    }
    if (config.excluded == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "encode_received before configure");
        return NULL;
    }
    if (!PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])
        || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "bodies, handles and attempts must be lists");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    if (PyList_GET_SIZE(args[1]) != n || PyList_GET_SIZE(args[2]) != n) {
        PyErr_SetString(PyExc_ValueError, "bodies, handles and attempts differ in length");
        return NULL;
    }
    PyObject *result = PyList_New(n);
    if (result == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *handle_obj = PyList_GET_ITEM(args[1], i);
        PyObject *times_obj = PyList_GET_ITEM(args[2], i);
        const char *handle = NULL;
        Py_ssize_t handle_len = 0;
        long long times = -1;
        int overflow = 0;
        if (PyUnicode_Check(handle_obj)) handle = PyUnicode_AsUTF8AndSize(handle_obj, &handle_len);
        if (PyLong_Check(times_obj)) times = PyLong_AsLongLongAndOverflow(times_obj, &overflow);
        PyErr_Clear(); /* a handle with a lone surrogate, say: the Python path's to refuse */
        PyObject *one;
        Py_buffer view;
        if (handle == NULL || overflow || times < 0 || times >= INT32_MAX
            || PyObject_GetBuffer(PyList_GET_ITEM(args[0], i), &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            one = Py_None;
            Py_INCREF(one);
        } else {
            one = encode_one(view.buf, view.len, handle, handle_len, times + 1);
            PyBuffer_Release(&view);
            if (one == NULL) {
                Py_DECREF(result);
                return NULL;
            }
        }
        PyList_SET_ITEM(result, i, one);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(uniq, tags, keys, group, excluded)"},
    {"encode_received", (PyCFunction)(void (*)(void))encode_received, METH_FASTCALL,
     "encode_received(bodies, handles, attempts) -> list of bytes or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_received",
    "A POP answer's records as gRPC ReceiveMessageResponse bytes (see convert.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__received(void) { return PyModule_Create(&module); }
