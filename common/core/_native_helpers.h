/* Helpers the C extensions share (common/format/_codec.c, common/ha/_ha_codec.c): reading
 * their configuration from a dict, a Limits object's integer attributes, and the exact-int
 * range check their decoders apply the way the Python checks do. Header-only: each extension
 * is built on its own (setup.py). */
#ifndef REPLOG_NATIVE_HELPERS_H
#define REPLOG_NATIVE_HELPERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static inline int read_ll(PyObject *obj, const char *name, long long *out) {
    PyObject *v = PyObject_GetAttrString(obj, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* An exact int in [lo, hi]: 1, else 0. */
static inline int int_in(PyObject *v, long long lo, long long hi, long long *out) {
    if (!PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (x < lo || x > hi) return 0;
    if (out) *out = x;
    return 1;
}

static inline int take(PyObject *dict, const char *name, PyObject **out) {
    PyObject *v = PyDict_GetItemString(dict, name);
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: %s missing", name);
        return -1;
    }
    Py_INCREF(v);
    Py_XSETREF(*out, v);
    return 0;
}

static inline int take_ll(PyObject *dict, const char *name, long long *out) {
    PyObject *v = PyDict_GetItemString(dict, name);
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: %s missing", name);
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

#endif
