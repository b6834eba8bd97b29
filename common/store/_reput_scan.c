/* Reput's record scan in C: the common case of ReputService._dispatch_pass (common/store/reput.py).
 *
 * scan(buf, pos, limit, file_size, max_records, base)
 *     -> (runs, pos, count, last_store_timestamp)
 *
 * Walks the whole records of one segment's mapping from ``pos`` while they are plain v1 records
 * without user properties (a whole-record CRC entry is not one) and end by ``limit``; at most
 * ``max_records``. Consecutive records of one queue with consecutive queue offsets form a run:
 * [raw topic bytes, queue id, first queue offset, [(phy offset, size, 0), ...]], phy offsets
 * counted from ``base``. It stops, returning where, at the first record it does not take: a
 * BLANK, a bad header, a record past the segment or not whole yet, one with properties (tags,
 * keys, a delay). The Python loop handles that record as it always has, so every rare case
 * keeps one implementation. Reads only; the caller keeps the mapping mapped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAGIC_V1 0xDAA320A7u
#define FIXED_BYTES 91
#define CRC_ENTRY_BYTES 20
static const char CRC_PREFIX[] = "__CRC32#\x01"; /* 9 bytes */

static inline uint32_t get32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline int64_t get64(const unsigned char *p) {
    return (int64_t)(((uint64_t)get32(p) << 32) | get32(p + 4));
}

/* Close the open run into ``runs``; 0 or -1 with an exception. */
static int close_run(PyObject *runs, PyObject **entries, const unsigned char *topic,
                     Py_ssize_t topic_len, int32_t queue_id, int64_t first) {
    if (*entries == NULL) return 0;
    PyObject *run = Py_BuildValue("[y#iLO]", (const char *)topic, topic_len, queue_id,
                                  (long long)first, *entries);
    Py_CLEAR(*entries);
    if (run == NULL) return -1;
    int rc = PyList_Append(runs, run);
    Py_DECREF(run);
    return rc;
}

static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "scan takes 6 arguments");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    Py_ssize_t file_size = PyLong_AsSsize_t(args[3]);
    Py_ssize_t max_records = PyLong_AsSsize_t(args[4]);
    long long base = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (limit > view.len) limit = view.len;
    if (file_size > view.len) file_size = view.len;
    const unsigned char *buf = (const unsigned char *)view.buf;
    PyObject *runs = PyList_New(0), *entries = NULL, *result = NULL;
    if (runs == NULL) goto done;
    const unsigned char *run_topic = NULL;
    Py_ssize_t run_topic_len = 0, count = 0;
    int32_t run_queue = 0;
    int64_t run_first = 0, run_next = 0, last_ts = 0;
    while (pos >= 0 && pos + 8 <= limit && count < max_records) {
        const unsigned char *r = buf + pos;
        int32_t total = (int32_t)get32(r);
        if (get32(r + 4) != MAGIC_V1 || total < FIXED_BYTES || pos + total > file_size
            || pos + total > limit)
            break; /* BLANK, bad header, past the segment, not whole yet: Python's */
        int32_t body_len = (int32_t)get32(r + 84);
        if (body_len < 0 || (Py_ssize_t)body_len > total - FIXED_BYTES) break;
        Py_ssize_t p = 88 + (Py_ssize_t)body_len; /* within the record from here */
        Py_ssize_t topic_len = r[p];
        Py_ssize_t topic_end = p + 1 + topic_len;
        if (topic_end + 2 > total) break;
        Py_ssize_t user_props = ((Py_ssize_t)r[topic_end] << 8) | r[topic_end + 1];
        if (user_props >= CRC_ENTRY_BYTES
            && memcmp(r + total - CRC_ENTRY_BYTES, CRC_PREFIX, 9) == 0 && r[total - 1] == 2)
            user_props -= CRC_ENTRY_BYTES;
        if (user_props) break; /* tags, keys or a delay: Python's */
        int32_t queue_id = (int32_t)get32(r + 12);
        int64_t queue_offset = get64(r + 20);
        const unsigned char *topic = r + p + 1;
        if (entries == NULL || queue_id != run_queue || queue_offset != run_next
            || topic_len != run_topic_len || memcmp(topic, run_topic, (size_t)topic_len) != 0) {
            if (close_run(runs, &entries, run_topic, run_topic_len, run_queue, run_first) < 0)
                goto done;
            entries = PyList_New(0);
            if (entries == NULL) goto done;
            run_topic = topic;
            run_topic_len = topic_len;
            run_queue = queue_id;
            run_first = run_next = queue_offset;
        }
        PyObject *e = Py_BuildValue("(Lii)", base + (long long)pos, total, 0);
        if (e == NULL) goto done;
        int rc = PyList_Append(entries, e);
        Py_DECREF(e);
        if (rc < 0) goto done;
        run_next++;
        last_ts = get64(r + 56);
        pos += total;
        count++;
    }
    if (close_run(runs, &entries, run_topic, run_topic_len, run_queue, run_first) < 0) goto done;
    result = Py_BuildValue("(OnnL)", runs, pos, count, (long long)last_ts);
done:
    Py_XDECREF(entries);
    Py_XDECREF(runs);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "Plain records from pos: (runs, pos, count, last_store_timestamp)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_reput_scan", "Reput's record scan in C (see reput.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__reput_scan(void) { return PyModule_Create(&module); }
