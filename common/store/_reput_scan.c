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
 *
 * merge_run(digests, first, end, max_records)
 *     -> None, or (entries, cq, last_end, count, store_timestamp)
 *
 * The loop of CommitLog.take_digest_run (common/store/commit_log.py): takes from the left of
 * ``digests`` (a deque of WriteDigest) the writes that continue ``first`` (the digest already
 * taken) in the log and in its queue, all ending by ``end``, until about ``max_records``
 * entries; returns their entries and ConsumeQueue bytes joined with ``first``'s (``cq`` is b""
 * unless every digest had its bytes), or None when the next digest does not continue it. The
 * GIL is held throughout, so the putting thread's appends at the other end wait for it.
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

/* WriteDigest fields, by position (commit_log.py) */
enum { D_START, D_END, D_TOPIC, D_QUEUE, D_FIRST, D_ENTRIES, D_TS, D_CQ, D_FIELDS };

static int digest_ok(PyObject *d) {
    if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != D_FIELDS
        || !PyList_Check(PyTuple_GET_ITEM(d, D_ENTRIES))
        || !PyBytes_Check(PyTuple_GET_ITEM(d, D_CQ))) {
        PyErr_SetString(PyExc_TypeError, "merge_run: a digest is not a WriteDigest");
        return 0;
    }
    return 1;
}

static PyObject *popleft_name; /* "popleft", interned at import */

static PyObject *merge_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "merge_run takes 4 arguments");
        return NULL;
    }
    PyObject *digests = args[0], *first = args[1];
    long long end = PyLong_AsLongLong(args[2]);
    Py_ssize_t max_records = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred() || !digest_ok(first)) return NULL;
    long long last_end = PyLong_AsLongLong(PyTuple_GET_ITEM(first, D_END));
    long long first_offset = PyLong_AsLongLong(PyTuple_GET_ITEM(first, D_FIRST));
    if (PyErr_Occurred()) return NULL;
    PyObject *topic = PyTuple_GET_ITEM(first, D_TOPIC);
    PyObject *queue = PyTuple_GET_ITEM(first, D_QUEUE);
    PyObject *first_entries = PyTuple_GET_ITEM(first, D_ENTRIES);
    Py_ssize_t count = PyList_GET_SIZE(first_entries);
    PyObject *entries = NULL, *cqs = NULL, *result = NULL, *ts = PyTuple_GET_ITEM(first, D_TS);
    Py_INCREF(ts);
    int all_cq = PyBytes_GET_SIZE(PyTuple_GET_ITEM(first, D_CQ)) > 0;
    while (count < max_records) {
        Py_ssize_t left = PySequence_Size(digests);
        if (left < 0) goto done;
        if (left == 0) break;
        PyObject *nxt = PySequence_GetItem(digests, 0); /* the putting thread appends at the right */
        if (nxt == NULL) goto done;
        if (!digest_ok(nxt)) {
            Py_DECREF(nxt);
            goto done;
        }
        long long start = PyLong_AsLongLong(PyTuple_GET_ITEM(nxt, D_START));
        long long nxt_end = PyLong_AsLongLong(PyTuple_GET_ITEM(nxt, D_END));
        long long nxt_first = PyLong_AsLongLong(PyTuple_GET_ITEM(nxt, D_FIRST));
        if (PyErr_Occurred()) {
            Py_DECREF(nxt);
            goto done;
        }
        int same = start == last_end && nxt_end <= end && nxt_first == first_offset + count;
        if (same) {
            same = PyObject_RichCompareBool(PyTuple_GET_ITEM(nxt, D_TOPIC), topic, Py_EQ);
            if (same > 0)
                same = PyObject_RichCompareBool(PyTuple_GET_ITEM(nxt, D_QUEUE), queue, Py_EQ);
        }
        if (same <= 0) {
            Py_DECREF(nxt);
            if (same < 0) goto done;
            break;
        }
        PyObject *taken = PyObject_CallMethodNoArgs(digests, popleft_name);
        if (taken == NULL) {
            Py_DECREF(nxt);
            goto done;
        }
        Py_DECREF(taken); /* nxt itself: the GIL was held since it was read */
        if (entries == NULL) {
            entries = PyList_GetSlice(first_entries, 0, count);
            cqs = PyList_New(0);
            if (entries == NULL || cqs == NULL || PyList_Append(cqs, PyTuple_GET_ITEM(first, D_CQ)) < 0) {
                Py_DECREF(nxt);
                goto done;
            }
        }
        PyObject *more = PyTuple_GET_ITEM(nxt, D_ENTRIES);
        Py_ssize_t have = PyList_GET_SIZE(entries), added = PyList_GET_SIZE(more);
        PyObject *cq = PyTuple_GET_ITEM(nxt, D_CQ);
        if (PyList_SetSlice(entries, have, have, more) < 0 || PyList_Append(cqs, cq) < 0) {
            Py_DECREF(nxt);
            goto done;
        }
        all_cq = all_cq && PyBytes_GET_SIZE(cq) > 0;
        count += added;
        last_end = nxt_end;
        Py_DECREF(ts);
        ts = Py_NewRef(PyTuple_GET_ITEM(nxt, D_TS));
        Py_DECREF(nxt);
    }
    if (entries == NULL) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *cq = NULL;
    if (all_cq) {
        PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
        if (empty == NULL) goto done;
        cq = PyObject_CallMethod(empty, "join", "O", cqs);
        Py_DECREF(empty);
    } else {
        cq = PyBytes_FromStringAndSize(NULL, 0);
    }
    if (cq == NULL) goto done;
    result = Py_BuildValue("(NNLnO)", Py_NewRef(entries), cq, last_end, count, ts);
done:
    Py_XDECREF(entries);
    Py_XDECREF(cqs);
    Py_XDECREF(ts);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "Plain records from pos: (runs, pos, count, last_store_timestamp)."},
    {"merge_run", (PyCFunction)(void (*)(void))merge_run, METH_FASTCALL,
     "The digests that continue first: None or (entries, cq, last_end, count, store_timestamp)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_reput_scan", "Reput's record scan in C (see reput.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__reput_scan(void) {
    popleft_name = PyUnicode_InternFromString("popleft");
    if (popleft_name == NULL) return NULL;
    return PyModule_Create(&module);
}
