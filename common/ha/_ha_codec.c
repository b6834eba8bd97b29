/* The HA frames a SYNC put waits for, decoded in C: common/ha/protocol.py's decode for a plain
 * DATA frame (on the slave) and a plain ACK (on the master), and encode_data (the master's
 * DATA header), without a Python-level step per field.
 *
 * As common/format/_codec.c does for the client protocol: protocol.py's Python functions stay
 * the reference and the only source of errors. decode answers None for anything that is not
 * a plain DATA or ACK (another frame type, a type, a bound, a field count, the payload's
 * length), and the caller runs the Python path, which accepts it the same way or raises the
 * HAProtocolError naming the field. tests/unit/ha/test_ha_codec.py holds the two to that.
 *
 * configure() is called once by protocol.py with its types and constants; a Limits object's
 * bounds are read once and kept by identity (each decode holds its own copy and a reference to
 * the unpack kwargs: a cache slot may be taken over while Python code runs in between).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include "../core/_native_helpers.h"

typedef struct {
    PyObject *limits, *unpack_kwargs;
    long long max_header_bytes, max_data_bytes;
} HALimits;

#define LIMITS_CACHE 4

static struct {
    int ready;
    PyObject *data_type, *ack_type, *unpackb, *unpack_kwargs_of, *packer_type, *str_pack;
    PyObject *no_offset_obj, *zero_obj, *zero_int_obj, *data_type_code, *ack_type_code;
    PyObject *n_session, *n_epoch, *n_epoch_start, *n_phy_offset, *n_data, *n_confirm_offset,
        *n_ack_offset;
    long long type_data, type_ack, max_offset, max_epoch, no_offset;
    unsigned long long max_session;
    HALimits cache[LIMITS_CACHE];
    int cache_next;
} H;


static int limits_of(PyObject *limits, HALimits *out) {
    for (int i = 0; i < LIMITS_CACHE; i++) {
        if (H.cache[i].limits == limits) {
            *out = H.cache[i];
            Py_INCREF(out->unpack_kwargs);
            return 0;
        }
    }
    HALimits fresh;
    if (read_ll(limits, "max_header_bytes", &fresh.max_header_bytes) < 0 ||
        read_ll(limits, "max_data_bytes", &fresh.max_data_bytes) < 0)
        return -1;
    fresh.unpack_kwargs = PyObject_CallOneArg(H.unpack_kwargs_of, limits);
    if (fresh.unpack_kwargs == NULL) return -1;
    if (!PyDict_Check(fresh.unpack_kwargs)) {
        Py_DECREF(fresh.unpack_kwargs);
        PyErr_SetString(PyExc_TypeError, "_unpack_kwargs must answer a dict");
        return -1;
    }
    fresh.limits = limits;
    *out = fresh;
    HALimits *slot = &H.cache[H.cache_next];
    H.cache_next = (H.cache_next + 1) % LIMITS_CACHE;
    PyObject *old_limits = slot->limits, *old_kwargs = slot->unpack_kwargs;
    Py_INCREF(limits);
    Py_INCREF(fresh.unpack_kwargs);
    *slot = fresh;
    Py_XDECREF(old_limits);  /* may run Python code: the slot is whole by now */
    Py_XDECREF(old_kwargs);
    return 0;
}


/* A session: an exact int in [0, max_session] (up to 2^64 - 1). */
static int session_ok(PyObject *v) {
    if (!PyLong_CheckExact(v)) return 0;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return x <= H.max_session;
}

/* object.__new__(type) with its slots set as a frozen dataclass's __init__ sets them. */
static PyObject *make(PyObject *type, PyObject *const *names, PyObject *const *values, int n) {
    PyObject *obj = PyBaseObject_Type.tp_new((PyTypeObject *)type, H.zero_obj, NULL);
    if (obj == NULL) return NULL;
    for (int i = 0; i < n; i++) {
        if (PyObject_GenericSetAttr(obj, names[i], values[i]) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    }
    return obj;
}

/* decode(frames, limits) -> Data | Ack | None */
static PyObject *decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode(frames, limits)");
        return NULL;
    }
    if (!H.ready) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    PyObject *frames = args[0];
    if (!PyList_CheckExact(frames) || PyList_GET_SIZE(frames) < 1) Py_RETURN_NONE;
    HALimits limits, *lim = &limits;
    if (limits_of(args[1], lim) < 0) return NULL;
    PyObject *raw = PyList_GET_ITEM(frames, 0);
    Py_ssize_t raw_len = PyObject_Size(raw);
    PyObject *items = NULL;
    if (raw_len >= 0 && raw_len <= lim->max_header_bytes) {
        PyObject *a = PyTuple_Pack(1, raw);
        if (a != NULL) {
            items = PyObject_Call(H.unpackb, a, lim->unpack_kwargs);
            Py_DECREF(a);
        }
    }
    Py_DECREF(lim->unpack_kwargs);
    if (items == NULL) {
        PyErr_Clear();  /* the Python path says what is wrong */
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    Py_ssize_t n = PyList_CheckExact(items) ? PyList_GET_SIZE(items) : 0;
    long long kind;
    if (n < 1 || !int_in(PyList_GET_ITEM(items, 0), 0, 255, &kind)) goto done;
    PyObject **f = PySequence_Fast_ITEMS(items) + 1;  /* items is an exact list */
    Py_ssize_t nf = n - 1;
    if (kind == H.type_data) {
        if (PyList_GET_SIZE(frames) != 2 || (nf != 5 && nf != 6)) goto done;
        long long length, start, phy, confirm = H.no_offset;
        PyObject *payload = PyList_GET_ITEM(frames, 1);
        if (!int_in(f[4], 1, lim->max_data_bytes, &length)) goto done;
        Py_ssize_t have = PyObject_Size(payload);
        if (have < 0) {
            PyErr_Clear();
            goto done;
        }
        if (have != length || !session_ok(f[0]) || !int_in(f[1], 1, H.max_epoch, NULL) ||
            !int_in(f[2], 0, H.max_offset, &start) ||
            !int_in(f[3], 0, H.max_offset - length, &phy) ||
            (nf == 6 && !int_in(f[5], H.no_offset, H.max_offset, &confirm)) || start > phy)
            goto done;
        PyObject *names[] = {H.n_session, H.n_epoch, H.n_epoch_start, H.n_phy_offset, H.n_data,
                             H.n_confirm_offset};
        PyObject *values[] = {f[0], f[1], f[2], f[3], payload, nf == 6 ? f[5] : H.no_offset_obj};
        result = make(H.data_type, names, values, 6);
    } else if (kind == H.type_ack) {
        if (PyList_GET_SIZE(frames) != 1 || (nf != 2 && nf != 3)) goto done;
        if (!session_ok(f[0]) || !int_in(f[1], 0, H.max_offset, NULL) ||
            (nf == 3 && !int_in(f[2], 0, H.max_epoch, NULL)))
            goto done;
        PyObject *names[] = {H.n_session, H.n_ack_offset, H.n_epoch};
        PyObject *values[] = {f[0], f[1], nf == 3 ? f[2] : H.zero_int_obj};
        result = make(H.ack_type, names, values, 3);
    }
done:
    Py_DECREF(items);
    if (result == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return result;
}

/* encode_data(session, epoch, epoch_start_phy_offset, phy_offset, data, confirm_offset=-1)
 * -> [header, data]: protocol.py's encode_data, Packer().pack from C */
static PyObject *encode_data(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 5 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError, "encode_data(session, epoch, epoch_start_phy_offset, "
                                         "phy_offset, data, confirm_offset=-1)");
        return NULL;
    }
    if (!H.ready) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    Py_ssize_t size = PyObject_Size(args[4]);
    if (size < 0) return NULL;
    PyObject *length = PyLong_FromSsize_t(size);
    if (length == NULL) return NULL;
    PyObject *items = PyList_New(7);
    if (items == NULL) {
        Py_DECREF(length);
        return NULL;
    }
    PyObject *values[] = {H.data_type_code, args[0], args[1], args[2], args[3], length,
                          nargs > 5 ? args[5] : H.no_offset_obj};
    for (int i = 0; i < 7; i++) {
        if (i != 5) Py_INCREF(values[i]);
        PyList_SET_ITEM(items, i, values[i]);
    }
    PyObject *packer = PyObject_CallNoArgs(H.packer_type);
    PyObject *header = packer ? PyObject_CallMethodOneArg(packer, H.str_pack, items) : NULL;
    Py_XDECREF(packer);
    Py_DECREF(items);
    if (header == NULL) return NULL;
    PyObject *out = PyList_New(2);
    if (out == NULL) {
        Py_DECREF(header);
        return NULL;
    }
    PyList_SET_ITEM(out, 0, header);
    Py_INCREF(args[4]);
    PyList_SET_ITEM(out, 1, args[4]);
    return out;
}

/* encode_ack(session, ack_offset, epoch) -> header: protocol.py's encode_ack */
static PyObject *encode_ack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_ack(session, ack_offset, epoch)");
        return NULL;
    }
    if (!H.ready) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    PyObject *items = PyList_New(4);
    if (items == NULL) return NULL;
    PyObject *values[] = {H.ack_type_code, args[0], args[1], args[2]};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(values[i]);
        PyList_SET_ITEM(items, i, values[i]);
    }
    PyObject *packer = PyObject_CallNoArgs(H.packer_type);
    PyObject *header = packer ? PyObject_CallMethodOneArg(packer, H.str_pack, items) : NULL;
    Py_XDECREF(packer);
    Py_DECREF(items);
    return header;
}



static int intern(PyObject **slot, const char *text) {
    Py_XSETREF(*slot, PyUnicode_InternFromString(text));
    return *slot == NULL ? -1 : 0;
}

/* configure(tables: dict) -- see common/ha/protocol.py's _native_tables */
static PyObject *configure(PyObject *self, PyObject *tables) {
    if (!PyDict_Check(tables)) {
        PyErr_SetString(PyExc_TypeError, "configure(tables: dict)");
        return NULL;
    }
    H.ready = 0;
    PyObject *max_session = NULL;
    if (take(tables, "data_type", &H.data_type) < 0 || take(tables, "ack_type", &H.ack_type) < 0 ||
        take(tables, "unpackb", &H.unpackb) < 0 ||
        take(tables, "unpack_kwargs_of", &H.unpack_kwargs_of) < 0 ||
        take(tables, "packer_type", &H.packer_type) < 0 ||
        take(tables, "data_code", &H.data_type_code) < 0 ||
        take(tables, "ack_code", &H.ack_type_code) < 0 ||
        take(tables, "max_session", &max_session) < 0 ||
        take_ll(tables, "type_data", &H.type_data) < 0 ||
        take_ll(tables, "type_ack", &H.type_ack) < 0 ||
        take_ll(tables, "max_offset", &H.max_offset) < 0 ||
        take_ll(tables, "max_epoch", &H.max_epoch) < 0 ||
        take_ll(tables, "no_offset", &H.no_offset) < 0) {
        Py_XDECREF(max_session);
        return NULL;
    }
    H.max_session = PyLong_AsUnsignedLongLong(max_session);
    Py_DECREF(max_session);
    if (H.max_session == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (!PyType_Check(H.data_type) || !PyType_Check(H.ack_type)) {
        PyErr_SetString(PyExc_TypeError, "configure: data_type and ack_type must be types");
        return NULL;
    }
    Py_XSETREF(H.no_offset_obj, PyLong_FromLongLong(H.no_offset));
    Py_XSETREF(H.zero_int_obj, PyLong_FromLong(0));
    Py_XSETREF(H.zero_obj, PyTuple_New(0));
    if (H.no_offset_obj == NULL || H.zero_int_obj == NULL || H.zero_obj == NULL ||
        intern(&H.str_pack, "pack") < 0 || intern(&H.n_session, "session") < 0 ||
        intern(&H.n_epoch, "epoch") < 0 ||
        intern(&H.n_epoch_start, "epoch_start_phy_offset") < 0 ||
        intern(&H.n_phy_offset, "phy_offset") < 0 || intern(&H.n_data, "data") < 0 ||
        intern(&H.n_confirm_offset, "confirm_offset") < 0 ||
        intern(&H.n_ack_offset, "ack_offset") < 0)
        return NULL;
    for (int i = 0; i < LIMITS_CACHE; i++) {
        Py_CLEAR(H.cache[i].limits);
        Py_CLEAR(H.cache[i].unpack_kwargs);
    }
    H.ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)configure, METH_O, "configure(tables)"},
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL,
     "decode(frames, limits) -> Data | Ack | None (None: take the Python path)"},
    {"encode_data", (PyCFunction)(void (*)(void))encode_data, METH_FASTCALL,
     "encode_data(session, epoch, epoch_start_phy_offset, phy_offset, data, "
     "confirm_offset=-1) -> [header, data]"},
    {"encode_ack", (PyCFunction)(void (*)(void))encode_ack, METH_FASTCALL,
     "encode_ack(session, ack_offset, epoch) -> header"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ha_codec",
    "common/ha/protocol.py's decode of a plain DATA or ACK, and encode_data, in C", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ha_codec(void) { return PyModule_Create(&module); }
