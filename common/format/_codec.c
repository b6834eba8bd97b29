/* The request and response checks of common/format/protocol.py in C: decode_request and
 * decode_response for well-formed frames, without a Python-level step per field.
 *
 * This is the first piece of the native request path (docs/architecture.md, "A request path
 * outside the interpreter"): the broker's decode and check of every request header, and the
 * client's of every answer. The Python functions stay the reference and the only source of
 * errors: whenever anything here is not plainly valid (a type, a bound, a name's characters,
 * a field kind this file does not check, such as a SEND_BATCH's meta and sizes), the function
 * answers None and the caller runs the Python path, which accepts it the same way or raises the
 * ProtocolError naming the field (where the header was unpacked here, the Python checks go on
 * from that header, not a second unpack). So a result from here is always the Python path's:
 * tests/unit/format/test_native_codec.py holds the two to that, field by field, on generated
 * and malformed headers.
 *
 * configure() is called once by protocol.py with its tables (the request schemas as kinds and
 * bounds, the code -> enum maps, the Request and Response types, msgpack.unpackb and the
 * constants); limits are read from a Limits object once and kept by identity.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include "../core/_native_helpers.h"
#include "_codec_internal.h"
#include <string.h>

/* protocol.py's _NATIVE_KINDS, in its order; K_TEXT is a str bound for a record (tags): one
 * with a property separator is left to the Python path, which refuses it; K_KEYS a message's
 * KEYS, the same, and also one with a key that starts with a broker-only property's name */
enum { K_INT = 0, K_STR, K_TOPIC, K_GROUP, K_PROPS, K_SYSFLAG, K_ROLE, K_TEXT, K_KEYS, K_OTHER };

typedef struct {
    PyObject *limits;  /* strong: the Limits object these were read from */
    PyObject *unpack_kwargs;
    long long max_batch_count, max_frame_bytes, max_header_bytes, max_body_bytes, max_topic_length;
} LimitsEntry;

#define LIMITS_CACHE 4

static struct {
    int ready;
    PyObject *schemas;        /* {code int: (fields {name: (kind, lo, hi)}, required, defaults, body_lo, body_hi)} */
    PyObject *request_codes;  /* {int: RequestCode} */
    PyObject *response_codes; /* {int: ResponseCode} */
    PyObject *request_type, *response_type;
    PyObject *born_host_default;
    PyObject *unpackb, *packer_type, *str_pack, *version_obj, *no_bodies, *no_remark;
    PyObject *unpack_kwargs_of; /* protocol._unpack_kwargs(max_batch_count) */
    PyObject *str_sync_master, *str_async_master;
    long long protocol_version, max_offset, max_group_length, max_properties_bytes;
    long long client_sysflags, unknown_opaque;
    PyObject *broker_only; /* tuple of str: boundary.BROKER_ONLY_KEY_STARTS */
    PyObject *uniq_key;    /* str: the UNIQ_KEY property's name */
    LimitsEntry cache[LIMITS_CACHE];
    int cache_next;
} S;


/* The bounds of ``limits`` (read once per Limits object) copied into ``out``, with a new
 * reference to its unpack kwargs (the caller's to drop: a cache slot may be taken over by
 * another thread while this one still decodes, whenever Python code runs in between, a
 * finalizer during an allocation included); -1 with an exception set. */
static int limits_of(PyObject *limits, LimitsEntry *out) {
    for (int i = 0; i < LIMITS_CACHE; i++) {
        if (S.cache[i].limits == limits) {
            *out = S.cache[i];
            Py_INCREF(out->unpack_kwargs);
            return 0;
        }
    }
    LimitsEntry fresh;
    if (read_ll(limits, "max_batch_count", &fresh.max_batch_count) < 0 ||
        read_ll(limits, "max_frame_bytes", &fresh.max_frame_bytes) < 0 ||
        read_ll(limits, "max_header_bytes", &fresh.max_header_bytes) < 0 ||
        read_ll(limits, "max_body_bytes", &fresh.max_body_bytes) < 0 ||
        read_ll(limits, "max_topic_length", &fresh.max_topic_length) < 0)
        return -1;
    fresh.unpack_kwargs = PyObject_CallFunction(S.unpack_kwargs_of, "L", fresh.max_batch_count);
    if (fresh.unpack_kwargs == NULL) return -1;
    if (!PyDict_Check(fresh.unpack_kwargs)) {
        Py_DECREF(fresh.unpack_kwargs);
        PyErr_SetString(PyExc_TypeError, "_unpack_kwargs must answer a dict");
        return -1;
    }
    fresh.limits = limits;
    *out = fresh;  /* the caller's reference to unpack_kwargs */
    /* the slot's own references; nothing below runs Python code until the slot is whole */
    LimitsEntry *slot = &S.cache[S.cache_next];
    S.cache_next = (S.cache_next + 1) % LIMITS_CACHE;
    PyObject *old_limits = slot->limits, *old_kwargs = slot->unpack_kwargs;
    Py_INCREF(limits);
    Py_INCREF(fresh.unpack_kwargs);
    *slot = fresh;
    Py_XDECREF(old_limits);  /* may run Python code: the slot is consistent by now */
    Py_XDECREF(old_kwargs);
    return 0;
}

/* The frames as the Python path checks them first (_check_envelope): 1 on a plain envelope,
 * 0 when the Python path must look (it may refuse), -1 on an error. */
static int envelope_ok(PyObject *frames, const LimitsEntry *lim) {
    if (!PyList_CheckExact(frames)) return 0;
    Py_ssize_t n = PyList_GET_SIZE(frames);
    if (n < 1 || n > lim->max_batch_count + 1) return 0;
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyList_GET_ITEM(frames, i);
        if (!PyBytes_CheckExact(f)) return 0;
        total += PyBytes_GET_SIZE(f);
    }
    if (total > lim->max_frame_bytes) return 0;
    Py_ssize_t head = PyBytes_GET_SIZE(PyList_GET_ITEM(frames, 0));
    return head > 0 && head <= lim->max_header_bytes;
}

/* msgpack.unpackb(frames[0], raw=False, **kwargs), or NULL (no exception: not plain). */
static PyObject *unpack(PyObject *raw, const LimitsEntry *lim) {
    PyObject *args = PyTuple_Pack(1, raw);
    if (args == NULL) return NULL;
    PyObject *value = PyObject_Call(S.unpackb, args, lim->unpack_kwargs);
    Py_DECREF(args);
    if (value == NULL) PyErr_Clear();  /* the Python path names what is wrong */
    return value;
}


/* The UTF-8 size of a str, or -1 (no exception) where it has none. */
static Py_ssize_t utf8_size(PyObject *s) {
    if (PyUnicode_IS_ASCII(s)) return PyUnicode_GET_LENGTH(s);
    Py_ssize_t size;
    if (PyUnicode_AsUTF8AndSize(s, &size) == NULL) {
        PyErr_Clear();
        return -1;
    }
    return size;
}

/* RocketMQ's topic and group characters, [%|a-zA-Z0-9_-], one or more. */
static int good_name(PyObject *s, long long max_length) {
    if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s)) return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n < 1 || n > max_length) return 0;
    const unsigned char *p = PyUnicode_1BYTE_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '%' || c == '|' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int has_separator(PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c == 1 || c == 2) return 1;
    }
    return 0;
}

/* 1 when a space-separated key of ``s`` (a str) starts with a broker-only property's name
 * (boundary.key_refusal: the Python path refuses it), else 0; -1 with an exception set. */
int replog_key_screened(PyObject *s) {
    if (S.broker_only == NULL) return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0 && PyUnicode_READ(kind, data, i - 1) != ' ') continue;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(S.broker_only); j++) {
            Py_ssize_t hit = PyUnicode_Tailmatch(s, PyTuple_GET_ITEM(S.broker_only, j), i,
                                                 PY_SSIZE_T_MAX, -1);
            if (hit != 0) return hit < 0 ? -1 : 1;
        }
    }
    return 0;
}

/* 1 when the dict ``props`` holds a UNIQ_KEY that is not a plain str or that
 * replog_key_screened, else 0; -1 with an exception set. */
int replog_uniq_screened(PyObject *props) {
    if (S.uniq_key == NULL) return 0;
    PyObject *uniq = PyDict_GetItemWithError(props, S.uniq_key);
    if (uniq == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyUnicode_CheckExact(uniq)) return 1;
    return replog_key_screened(uniq);
}

/* _check_props: a dict of non-empty str -> str without separators, within the size. */
static int props_ok(PyObject *v) {
    if (!PyDict_CheckExact(v)) return 0;
    PyObject *key, *item;
    Py_ssize_t pos = 0;
    long long size = 0;
    while (PyDict_Next(v, &pos, &key, &item)) {
        if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(item)) return 0;
        if (PyUnicode_GET_LENGTH(key) == 0) return 0;
        if (has_separator(key) || has_separator(item)) return 0;
        size += PyUnicode_GET_LENGTH(key) + PyUnicode_GET_LENGTH(item) + 2;
    }
    if (size > S.max_properties_bytes) return 0;
    int screened = replog_uniq_screened(v);
    if (screened < 0) PyErr_Clear();
    return screened == 0;
}

/* One field's value, as _check_value accepts it: 1, else 0. */
static int value_ok(PyObject *spec, PyObject *v, const LimitsEntry *lim) {
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    long long lo = PyLong_AsLongLong(PyTuple_GET_ITEM(spec, 1));
    long long hi = PyLong_AsLongLong(PyTuple_GET_ITEM(spec, 2));
    switch (kind) {
    case K_INT:
        return int_in(v, lo, hi, NULL);
    case K_STR:
    case K_TEXT:
    case K_KEYS: {
        if (!PyUnicode_CheckExact(v)) return 0;
        Py_ssize_t size = utf8_size(v);
        if (size < 0 || size < lo || size > hi) return 0;
        if (kind == K_STR) return 1;
        if (has_separator(v)) return 0;
        if (kind == K_TEXT) return 1;
        int screened = replog_key_screened(v);
        if (screened < 0) PyErr_Clear();
        return screened == 0;
    }
    case K_TOPIC:
        return good_name(v, lim->max_topic_length);
    case K_GROUP:
        return good_name(v, S.max_group_length);
    case K_PROPS:
        return props_ok(v);
    case K_SYSFLAG: {
        long long x;
        return int_in(v, 0, 0x7FFFFFFF, &x) && (x & ~S.client_sysflags) == 0;
    }
    case K_ROLE:
        return PyUnicode_CheckExact(v) &&
               (PyUnicode_Compare(v, S.str_sync_master) == 0 ||
                PyUnicode_Compare(v, S.str_async_master) == 0);
    default:
        return 0;  /* meta, sizes: the Python path checks those */
    }
}

/* _check_fields for a plain header: the checked dict (new reference), or NULL (no exception)
 * when the Python path must look. */
static PyObject *checked_fields(PyObject *schema, PyObject *fields, const LimitsEntry *lim) {
    if (!PyDict_CheckExact(fields)) return NULL;
    PyObject *specs = PyTuple_GET_ITEM(schema, 0);
    PyObject *required = PyTuple_GET_ITEM(schema, 1);
    PyObject *defaults = PyTuple_GET_ITEM(schema, 2);
    PyObject *out = PyDict_New();
    if (out == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *name, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(fields, &pos, &name, &value)) {
        if (!PyUnicode_CheckExact(name)) goto not_plain;
        PyObject *spec = PyDict_GetItemWithError(specs, name);
        if (spec == NULL) goto not_plain;  /* unknown field (or an error: cleared below) */
        if (value == Py_None) continue;
        if (!value_ok(spec, value, lim)) goto not_plain;
        if (PyDict_SetItem(out, name, value) < 0) goto not_plain;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(required); i++) {
        PyObject *req = PyTuple_GET_ITEM(required, i);
        if (PyDict_GetItemWithError(out, req) == NULL) goto not_plain;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(defaults); i++) {
        PyObject *pair = PyTuple_GET_ITEM(defaults, i);
        PyObject *dname = PyTuple_GET_ITEM(pair, 0);
        if (PyDict_GetItemWithError(out, dname) == NULL) {
            if (PyErr_Occurred()) goto not_plain;
            if (PyDict_SetItem(out, dname, PyTuple_GET_ITEM(pair, 1)) < 0) goto not_plain;
        }
    }
    return out;
not_plain:
    PyErr_Clear();
    Py_DECREF(out);
    return NULL;
}

static PyObject *new_tuple_of(PyObject *type, PyObject *items) {
    PyObject *args = PyTuple_Pack(1, items);
    if (args == NULL) return NULL;
    PyObject *obj = PyTuple_Type.tp_new((PyTypeObject *)type, args, NULL);
    Py_DECREF(args);
    return obj;
}

/* What both decodes begin with: the arguments, the bounds (copied into *lim), the envelope
 * and the unpack. 0 with *header the unpacked header (a new reference), or NULL when the
 * Python path must start over (no exception); -1 on an error. */
static int begin(const char *usage, PyObject *const *args, Py_ssize_t nargs, LimitsEntry *lim,
                 PyObject **frames, PyObject **header) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (!S.ready) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return -1;
    }
    *frames = args[0];
    if (limits_of(args[1], lim) < 0) return -1;
    *header = envelope_ok(*frames, lim) ? unpack(PyList_GET_ITEM(*frames, 0), lim) : NULL;
    Py_DECREF(lim->unpack_kwargs);
    return 0;
}

/* decode_request(frames, limits) -> Request, or the unpacked header (whatever msgpack made of
 * frames[0]: the Python checks go on from it), or None (the envelope or the unpack is not
 * plain: the Python path from the start) */
static PyObject *decode_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    LimitsEntry limits, *lim = &limits;
    PyObject *frames, *header;
    if (begin("decode_request(frames, limits)", args, nargs, lim, &frames, &header) < 0)
        return NULL;
    if (header == NULL) Py_RETURN_NONE;
    PyObject *result = NULL, *checked = NULL, *bodies = NULL;
    if (!PyList_CheckExact(header) || PyList_GET_SIZE(header) != 4) goto not_plain;
    if (!int_in(PyList_GET_ITEM(header, 0), S.protocol_version, S.protocol_version, NULL))
        goto not_plain;
    PyObject *code = PyList_GET_ITEM(header, 1);
    if (!int_in(PyList_GET_ITEM(header, 2), 0, S.max_offset, NULL)) goto not_plain;
    if (!PyLong_CheckExact(code)) goto not_plain;
    PyObject *req_code = PyDict_GetItemWithError(S.request_codes, code);
    PyObject *schema = req_code ? PyDict_GetItemWithError(S.schemas, code) : NULL;
    if (schema == NULL) goto not_plain;
    checked = checked_fields(schema, PyList_GET_ITEM(header, 3), lim);
    if (checked == NULL) goto not_plain;
    Py_ssize_t n_bodies = PyList_GET_SIZE(frames) - 1;
    long long body_lo = PyLong_AsLongLong(PyTuple_GET_ITEM(schema, 3));
    long long body_hi = PyLong_AsLongLong(PyTuple_GET_ITEM(schema, 4));
    if (body_hi < 0) body_hi = lim->max_batch_count;
    if (n_bodies < body_lo || n_bodies > body_hi) goto not_plain;
    for (Py_ssize_t i = 1; i <= n_bodies; i++)
        if (PyBytes_GET_SIZE(PyList_GET_ITEM(frames, i)) > lim->max_body_bytes) goto not_plain;
    bodies = PyList_GetSlice(frames, 1, n_bodies + 1);
    if (bodies == NULL) goto not_plain;
    PyObject *items = PyTuple_Pack(5, req_code, PyList_GET_ITEM(header, 2), checked, bodies,
                                   S.born_host_default);
    if (items == NULL) goto not_plain;
    result = new_tuple_of(S.request_type, items);
    Py_DECREF(items);
    if (result == NULL) goto not_plain;
    Py_DECREF(header);
    Py_DECREF(checked);
    Py_DECREF(bodies);
    return result;
not_plain:
    PyErr_Clear();
    Py_XDECREF(checked);
    Py_XDECREF(bodies);
    return header;  /* unpacked, not plain: the Python checks go on from it (no second unpack) */
}

/* decode_response(frames, limits) -> Response, or the unpacked header, or None: as
 * decode_request */
static PyObject *decode_response(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    LimitsEntry limits, *lim = &limits;
    PyObject *frames, *header;
    if (begin("decode_response(frames, limits)", args, nargs, lim, &frames, &header) < 0)
        return NULL;
    if (header == NULL) Py_RETURN_NONE;
    PyObject *bodies = NULL;
    /* _unpack_header's depth check: a plain answer is [.., {name: scalar or [scalars]}] */
    if (!PyList_CheckExact(header) || PyList_GET_SIZE(header) != 5) goto not_plain;
    PyObject *code = PyList_GET_ITEM(header, 1), *remark = PyList_GET_ITEM(header, 3);
    PyObject *fields = PyList_GET_ITEM(header, 4);
    if (!int_in(PyList_GET_ITEM(header, 0), S.protocol_version, S.protocol_version, NULL))
        goto not_plain;
    if (!PyLong_CheckExact(code)) goto not_plain;
    PyObject *resp_code = PyDict_GetItemWithError(S.response_codes, code);
    if (resp_code == NULL) goto not_plain;
    if (!int_in(PyList_GET_ITEM(header, 2), S.unknown_opaque, LLONG_MAX, NULL)) goto not_plain;
    if (!PyUnicode_CheckExact(remark) || !PyDict_CheckExact(fields)) goto not_plain;
    PyObject *name, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(fields, &pos, &name, &value)) {
        if (PyDict_Check(value)) goto not_plain;  /* nested: the Python path checks depth */
        if (PyList_Check(value)) {
            if (!PyList_CheckExact(value)) goto not_plain;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
                PyObject *item = PyList_GET_ITEM(value, i);
                if (PyList_Check(item) || PyDict_Check(item)) goto not_plain;
            }
        }
    }
    bodies = PyList_GetSlice(frames, 1, PyList_GET_SIZE(frames));
    if (bodies == NULL) goto not_plain;
    PyObject *items = PyTuple_Pack(5, resp_code, PyList_GET_ITEM(header, 2), remark, fields,
                                   bodies);
    if (items == NULL) goto not_plain;
    PyObject *result = new_tuple_of(S.response_type, items);
    Py_DECREF(items);
    if (result == NULL) goto not_plain;
    Py_DECREF(bodies);
    Py_DECREF(header);
    return result;
not_plain:
    PyErr_Clear();
    Py_XDECREF(bodies);
    return header;  /* unpacked, not plain: the Python checks go on from it */
}

/* [packb(header), *bodies]: the frames of a request (4 header items) or an answer (5), packed
 * as protocol.py's encode_request and encode_response pack them: the code as a plain int, the
 * fields a dict. NULL with an exception when packing fails (as the Python functions raise). */
static PyObject *frames_of(PyObject *items, PyObject *bodies) {
    /* msgpack.packb(items) is Packer().pack(items), the Packer and its pack compiled */
    PyObject *packer = PyObject_CallNoArgs(S.packer_type);
    if (packer == NULL) return NULL;
    PyObject *header = PyObject_CallMethodOneArg(packer, S.str_pack, items);
    Py_DECREF(packer);
    if (header == NULL) return NULL;
    PyObject *seq = PySequence_Fast(bodies, "bodies must be iterable");
    if (seq == NULL) {
        Py_DECREF(header);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n + 1);
    if (out == NULL) {
        Py_DECREF(seq);
        Py_DECREF(header);
        return NULL;
    }
    PyList_SET_ITEM(out, 0, header);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *body = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(body);
        PyList_SET_ITEM(out, i + 1, body);
    }
    Py_DECREF(seq);
    return out;
}

/* A dict to pack: ``fields`` itself when it is one, {} for None, else dict(fields). */
static PyObject *fields_dict(PyObject *fields) {
    if (fields == Py_None) return PyDict_New();
    if (PyDict_CheckExact(fields)) {
        Py_INCREF(fields);
        return fields;
    }
    int truth = PyObject_IsTrue(fields);  /* dict(fields or {}) */
    if (truth < 0) return NULL;
    return truth ? PyObject_CallOneArg((PyObject *)&PyDict_Type, fields) : PyDict_New();
}

/* The frames of a request, [version, int(code), opaque, dict(fields or {})], or an answer,
 * [version, int(code), opaque, remark, dict(fields or {})], then the bodies: ``args`` are the
 * Python functions' own (code, opaque, (remark,) fields, bodies), the last ones optional. */
static PyObject *encode(PyObject *const *args, Py_ssize_t nargs, int answer) {
    Py_ssize_t n_items = answer ? 5 : 4;  /* header items; the args are the same less version */
    if (nargs < 2 || nargs > n_items) {
        PyErr_SetString(PyExc_TypeError, answer
            ? "encode_response(code, opaque, remark='', fields=None, bodies=())"
            : "encode_request(code, opaque, fields=None, bodies=())");
        return NULL;
    }
    Py_ssize_t fields_at = answer ? 3 : 2;
    PyObject *code = PyNumber_Long(args[0]);  /* int(code) */
    if (code == NULL) return NULL;
    PyObject *fields = fields_dict(nargs > fields_at ? args[fields_at] : Py_None);
    PyObject *items = fields ? PyList_New(n_items) : NULL;
    if (items == NULL) {
        Py_DECREF(code);
        Py_XDECREF(fields);
        return NULL;
    }
    Py_INCREF(S.version_obj);
    PyList_SET_ITEM(items, 0, S.version_obj);
    PyList_SET_ITEM(items, 1, code);
    Py_INCREF(args[1]);
    PyList_SET_ITEM(items, 2, args[1]);
    if (answer) {
        PyObject *remark = nargs > 2 ? args[2] : S.no_remark;
        Py_INCREF(remark);
        PyList_SET_ITEM(items, 3, remark);
    }
    PyList_SET_ITEM(items, n_items - 1, fields);
    PyObject *out = frames_of(items, nargs > fields_at + 1 ? args[fields_at + 1] : S.no_bodies);
    Py_DECREF(items);
    return out;
}

/* encode_request(code, opaque, fields=None, bodies=()) -> frames */
static PyObject *encode_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return encode(args, nargs, 0);
}

/* encode_response(code, opaque, remark='', fields=None, bodies=()) -> frames */
static PyObject *encode_response(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return encode(args, nargs, 1);
}



/* configure(tables: dict) -- see protocol.py's _configure_native */
static PyObject *configure(PyObject *self, PyObject *tables) {
    if (!PyDict_Check(tables)) {
        PyErr_SetString(PyExc_TypeError, "configure(tables: dict)");
        return NULL;
    }
    S.ready = 0;
    if (take(tables, "schemas", &S.schemas) < 0 || take(tables, "request_codes", &S.request_codes) < 0 ||
        take(tables, "response_codes", &S.response_codes) < 0 ||
        take(tables, "request_type", &S.request_type) < 0 ||
        take(tables, "response_type", &S.response_type) < 0 ||
        take(tables, "born_host_default", &S.born_host_default) < 0 ||
        take(tables, "unpackb", &S.unpackb) < 0 || take(tables, "packer_type", &S.packer_type) < 0 ||
        take(tables, "protocol_version", &S.version_obj) < 0 ||
        take(tables, "unpack_kwargs_of", &S.unpack_kwargs_of) < 0 ||
        take(tables, "broker_only", &S.broker_only) < 0 ||
        take(tables, "uniq_key", &S.uniq_key) < 0 ||
        take_ll(tables, "protocol_version", &S.protocol_version) < 0 ||
        take_ll(tables, "max_offset", &S.max_offset) < 0 ||
        take_ll(tables, "max_group_length", &S.max_group_length) < 0 ||
        take_ll(tables, "max_properties_bytes", &S.max_properties_bytes) < 0 ||
        take_ll(tables, "client_sysflags", &S.client_sysflags) < 0 ||
        take_ll(tables, "unknown_opaque", &S.unknown_opaque) < 0)
        return NULL;
    if (!PyDict_Check(S.schemas) || !PyDict_Check(S.request_codes) ||
        !PyDict_Check(S.response_codes) || !PyType_Check(S.request_type) ||
        !PyType_IsSubtype((PyTypeObject *)S.request_type, &PyTuple_Type) ||
        !PyType_Check(S.response_type) ||
        !PyType_IsSubtype((PyTypeObject *)S.response_type, &PyTuple_Type) ||
        !PyTuple_CheckExact(S.broker_only) || !PyUnicode_CheckExact(S.uniq_key)) {
        PyErr_SetString(PyExc_TypeError, "configure: wrong table types");
        return NULL;
    }
    /* every schema row: (fields {str: (kind, lo, hi)}, required tuple, defaults tuple of pairs,
     * body_lo, body_hi (-1: the batch bound)) */
    PyObject *key, *row;
    Py_ssize_t pos = 0;
    while (PyDict_Next(S.schemas, &pos, &key, &row)) {
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 5 ||
            !PyDict_CheckExact(PyTuple_GET_ITEM(row, 0)) ||
            !PyTuple_CheckExact(PyTuple_GET_ITEM(row, 1)) ||
            !PyTuple_CheckExact(PyTuple_GET_ITEM(row, 2))) {
            PyErr_SetString(PyExc_TypeError, "configure: a schema row is not (fields, required, "
                                             "defaults, body_lo, body_hi)");
            return NULL;
        }
        PyObject *name, *spec;
        Py_ssize_t p2 = 0;
        while (PyDict_Next(PyTuple_GET_ITEM(row, 0), &p2, &name, &spec)) {
            if (!PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) != 3) {
                PyErr_SetString(PyExc_TypeError, "configure: a field spec is not (kind, lo, hi)");
                return NULL;
            }
        }
        PyObject *defaults = PyTuple_GET_ITEM(row, 2);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(defaults); i++) {
            PyObject *pair = PyTuple_GET_ITEM(defaults, i);
            if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
                PyErr_SetString(PyExc_TypeError, "configure: a default is not (name, value)");
                return NULL;
            }
        }
    }
    Py_XSETREF(S.str_pack, PyUnicode_InternFromString("pack"));
    Py_XSETREF(S.no_bodies, PyTuple_New(0));
    Py_XSETREF(S.no_remark, PyUnicode_FromString(""));
    if (S.str_pack == NULL || S.no_bodies == NULL || S.no_remark == NULL) return NULL;
    Py_XSETREF(S.str_sync_master, PyUnicode_FromString("SYNC_MASTER"));
    Py_XSETREF(S.str_async_master, PyUnicode_FromString("ASYNC_MASTER"));
    if (S.str_sync_master == NULL || S.str_async_master == NULL) return NULL;
    for (int i = 0; i < LIMITS_CACHE; i++) {
        Py_CLEAR(S.cache[i].limits);
        Py_CLEAR(S.cache[i].unpack_kwargs);
    }
    S.ready = 1;
    Py_RETURN_NONE;
}

/* ---- ZMTP traffic frames (common/format/zmtp.py) -------------------------------------------
 *
 * zmtp_scan(buf, pos, frames, size, max_frames, max_bytes, out) -> (pos, frames, size): the
 * common run of a plain port's traffic, data frames that arrived whole and within the bounds,
 * read from buf at pos: each frame's bytes appended to frames (the message being received, of
 * size payload bytes so far), each message its last frame completes appended to out and a
 * new list begun. It stops before anything else, leaving that frame to Connection.feed in
 * Python: a command, reserved flag bits, a header or body not whole in buf, a frame that would
 * take the message past max_frames or max_bytes. So the Python loop stays the reference for
 * every case, and this only saves its steps on the frames it would have kept at once.
 *
 * zmtp_encode(frames) -> bytes: zmtp.encode's framing of one message (at least one frame; each
 * a bytes-like object), as one bytes object. */
#define ZMTP_MORE 0x01
#define ZMTP_LONG 0x02

static PyObject *zmtp_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyBytes_CheckExact(args[0]) || !PyList_CheckExact(args[2])
        || !PyList_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "zmtp_scan(buf: bytes, pos, frames: list, size, max_frames, max_bytes, out: list)");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t end = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long long size = PyLong_AsLongLong(args[3]);
    long long max_frames = PyLong_AsLongLong(args[4]);
    long long max_bytes = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (pos < 0 || size < 0) {
        PyErr_SetString(PyExc_ValueError, "zmtp_scan: pos and size are never negative");
        return NULL;
    }
    PyObject *out = args[6];
    PyObject *frames = args[2];
    Py_INCREF(frames);
    while (pos < end && size <= max_bytes) {
        unsigned char flags = b[pos];
        unsigned long long length;
        Py_ssize_t start;
        if (flags & ~(ZMTP_MORE | ZMTP_LONG)) break;  /* a command, or reserved bits */
        if (flags & ZMTP_LONG) {
            if (end - pos < 9) break;
            length = 0;
            for (int i = 1; i <= 8; i++) length = (length << 8) | b[pos + i];
            start = pos + 9;
        } else {
            if (end - pos < 2) break;
            length = b[pos + 1];
            start = pos + 2;
        }
        if ((long long)PyList_GET_SIZE(frames) >= max_frames
            || length > (unsigned long long)(max_bytes - size)
            || length > (unsigned long long)(end - start))
            break;  /* past a bound (dropped there), or its body is still to come */
        PyObject *frame = PyBytes_FromStringAndSize((const char *)b + start, (Py_ssize_t)length);
        if (frame == NULL || PyList_Append(frames, frame) < 0) {
            Py_XDECREF(frame);
            Py_DECREF(frames);
            return NULL;
        }
        Py_DECREF(frame);
        size += (long long)length;
        pos = start + (Py_ssize_t)length;
        if (!(flags & ZMTP_MORE)) {
            int failed = PyList_Append(out, frames);
            Py_DECREF(frames);
            if (failed < 0) return NULL;
            frames = PyList_New(0);
            if (frames == NULL) return NULL;
            size = 0;
        }
    }
    return Py_BuildValue("(nNL)", pos, frames, size);
}

static PyObject *zmtp_encode(PyObject *self, PyObject *frames) {
    PyObject *seq = PySequence_Fast(frames, "zmtp_encode: frames must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n == 0) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "a message needs at least one frame");
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_buffer *views = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
    PyObject *result = NULL;
    Py_ssize_t got = 0, total = 0;
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(items[got], &views[got], PyBUF_SIMPLE) < 0) goto done;
        Py_ssize_t len = views[got].len;
        total += (len > 255 ? 9 : 2) + len;
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long len = (unsigned long long)views[i].len;
        unsigned char more = i < n - 1 ? ZMTP_MORE : 0;
        if (len > 255) {
            *w++ = more | ZMTP_LONG;
            for (int k = 7; k >= 0; k--) *w++ = (unsigned char)(len >> (8 * k));
        } else {
            *w++ = more;
            *w++ = (unsigned char)len;
        }
        memcpy(w, views[i].buf, (size_t)len);
        w += len;
    }
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(seq);
    return result;
}

/* send_results(cls, status, prefix, offsets, queue_id, first, topic, broker_name, handle)
 * -> [cls(status, prefix + "%016X" % phy, queue_id, first + i, phy, topic, broker_name,
 *         handle) for i, phy in enumerate(offsets)]
 * results.py's send_results after its checks of the answer: one SendResult (a tuple subclass,
 * made as tuple.__new__ makes it) per offset. ``prefix`` must be 16 ASCII characters and each
 * offset an int in [0, 2**63); anything else is ValueError, which the caller reports as the
 * Python loop does (a malformed answer). */
static PyObject *send_results(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char hex[] = "0123456789ABCDEF";
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "send_results takes 9 arguments");
        return NULL;
    }
    PyObject *cls_obj = args[0], *status = args[1], *prefix = args[2], *offsets = args[3];
    PyObject *queue_id = args[4], *topic = args[6], *broker = args[7], *handle = args[8];
    if (!PyType_Check(cls_obj) || !PyType_IsSubtype((PyTypeObject *)cls_obj, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "send_results: cls must be a tuple subclass");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)cls_obj;
    if (!PyUnicode_Check(prefix) || PyUnicode_GET_LENGTH(prefix) != 16 ||
        !PyUnicode_IS_ASCII(prefix)) {
        PyErr_SetString(PyExc_ValueError, "send_results: the prefix is not 16 ASCII characters");
        return NULL;
    }
    const char *pre = (const char *)PyUnicode_1BYTE_DATA(prefix);
    long long first = PyLong_AsLongLong(args[5]);
    if (first == -1 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(offsets, "send_results: offsets must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = NULL;
    if (first > LLONG_MAX - (long long)n) {
        PyErr_SetString(PyExc_OverflowError, "send_results: queue offsets past 2**63");
        goto fail;
    }
    out = PyList_New(n);
    if (out == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *phy = items[i];
        if (!PyLong_CheckExact(phy)) {
            PyErr_SetString(PyExc_ValueError, "send_results: an offset is not an int");
            goto fail;
        }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(phy, &overflow);
        if (overflow || v < 0) {
            PyErr_SetString(PyExc_ValueError, "send_results: an offset out of range");
            goto fail;
        }
        PyObject *msg_id = PyUnicode_New(32, 127);
        if (msg_id == NULL) goto fail;
        char *w = (char *)PyUnicode_1BYTE_DATA(msg_id);
        memcpy(w, pre, 16);
        unsigned long long u = (unsigned long long)v;
        for (int k = 15; k >= 0; k--) {
            w[16 + k] = hex[u & 0xF];
            u >>= 4;
        }
        PyObject *offset = PyLong_FromLongLong(first + (long long)i);
        if (offset == NULL) {
            Py_DECREF(msg_id);
            goto fail;
        }
        PyObject *result = cls->tp_alloc(cls, 8);
        if (result == NULL) {
            Py_DECREF(msg_id);
            Py_DECREF(offset);
            goto fail;
        }
        Py_INCREF(status);
        PyTuple_SET_ITEM(result, 0, status);
        PyTuple_SET_ITEM(result, 1, msg_id);
        Py_INCREF(queue_id);
        PyTuple_SET_ITEM(result, 2, queue_id);
        PyTuple_SET_ITEM(result, 3, offset);
        Py_INCREF(phy);
        PyTuple_SET_ITEM(result, 4, phy);
        Py_INCREF(topic);
        PyTuple_SET_ITEM(result, 5, topic);
        Py_INCREF(broker);
        PyTuple_SET_ITEM(result, 6, broker);
        Py_INCREF(handle);
        PyTuple_SET_ITEM(result, 7, handle);
        PyList_SET_ITEM(out, i, result);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* For the native put path (_put_path.c, the same extension): the functions above, by name. */
PyObject *replog_decode_request(PyObject *frames, PyObject *limits) {
    PyObject *args[2] = {frames, limits};
    return decode_request(NULL, args, 2);
}

PyObject *replog_encode_response(PyObject *const *args, Py_ssize_t nargs) {
    return encode(args, nargs, 1);
}

PyObject *replog_zmtp_encode(PyObject *frames) { return zmtp_encode(NULL, frames); }

PyObject *replog_request_type(void) { return S.ready ? S.request_type : NULL; }

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)configure, METH_O, "configure(tables)"},
    {"decode_request", (PyCFunction)(void (*)(void))decode_request, METH_FASTCALL,
     "decode_request(frames, limits) -> Request | header | None (see the source)"},
    {"decode_response", (PyCFunction)(void (*)(void))decode_response, METH_FASTCALL,
     "decode_response(frames, limits) -> Response | header | None (see the source)"},
    {"encode_request", (PyCFunction)(void (*)(void))encode_request, METH_FASTCALL,
     "encode_request(code, opaque, fields=None, bodies=()) -> frames"},
    {"encode_response", (PyCFunction)(void (*)(void))encode_response, METH_FASTCALL,
     "encode_response(code, opaque, remark='', fields=None, bodies=()) -> frames"},
    {"zmtp_scan", (PyCFunction)(void (*)(void))zmtp_scan, METH_FASTCALL,
     "zmtp_scan(buf, pos, frames, size, max_frames, max_bytes, out) -> (pos, frames, size)"},
    {"zmtp_encode", (PyCFunction)zmtp_encode, METH_O, "zmtp_encode(frames) -> bytes"},
    {"send_results", (PyCFunction)(void (*)(void))send_results, METH_FASTCALL,
     "send_results(cls, status, prefix, offsets, queue_id, first, topic, broker_name, handle)"
     " -> [SendResult]"},
    {"put_sends", (PyCFunction)(void (*)(void))replog_put_sends, METH_FASTCALL,
     "put_sends(conf, burst, start, buf, pos, stop, base, ts, limit) -> (next, pos, answers, ts, n)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_codec",
    "protocol.py's decode_request and decode_response for plain frames, in C", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__codec(void) { return PyModule_Create(&module); }
