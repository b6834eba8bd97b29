/* Reput's record scan in C: the common case of ReputService._dispatch_pass (common/store/reput.py).
 *
 * scan(buf, pos, limit, file_size, max_records, base, markers, rule_topics)
 *     -> (runs, pos, count, last_store_timestamp, first)
 *
 * Walks the whole records of one segment's mapping from ``pos`` while they end by ``limit``;
 * at most ``max_records``. Consecutive records of one queue with consecutive queue offsets
 * form a run: [raw topic bytes, queue id, first queue offset, [(phy offset, size, tagsCode),
 * ...]], phy offsets counted from ``base``. A record whose properties (a whole-record CRC entry
 * is not one) hold none of ``markers`` (the "NAME\x01" of each watched property, bytes) is a
 * plain entry (tagsCode 0, nothing to dispatch); one that holds any is read as
 * reput.dispatch_request reads it, and taken only as the first record of the call and not in
 * a topic of ``rule_topics`` (raw topic bytes with a tags-code rule): ``first`` is then
 * (tagsCode, store timestamp, index keys, properties), what the record dispatchers are
 * handed, else None. So the Python loop calls the dispatchers for that record before its run
 * is merged, as it does for a record it reads itself. It stops, returning where, at the first
 * record it does not take: a BLANK, a bad header, a record past the segment or not whole yet,
 * one whose body, topic and properties lengths do not add up to its size (record.layout_error),
 * a record to dispatch that is not the first, one in a rule's topic. The Python loop handles one it
 * stops at as it always has, so every rare case keeps one implementation. Reads only; the
 * caller keeps the mapping mapped. configure(tags, keys, uniq) first: the names of the TAGS,
 * KEYS and UNIQ_KEY properties (str).
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
#include <string.h> /* memmem: Python.h defines _GNU_SOURCE */

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

static PyObject *tags_name, *keys_name, *uniq_name, *item_sep, *key_sep;

/* Java's String.hashCode over the UTF-16 units of ``text`` (common.core.message.java_hash) */
static int32_t java_hash(PyObject *text) {
    uint32_t h = 0;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    for (Py_ssize_t i = 0, n = PyUnicode_GET_LENGTH(text); i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {
            c -= 0x10000;
            h = 31 * h + (0xD800 + (c >> 10));
            h = 31 * h + (0xDC00 + (c & 0x3FF));
        } else {
            h = 31 * h + c;
        }
    }
    return (int32_t)h;
}

/* decode_properties: the text (UTF-8, errors replaced) split at 0x02, each item with a 0x01
 * split at its first one; items without are skipped, a later name wins. NULL: an exception. */
static PyObject *properties(const unsigned char *raw, Py_ssize_t n) {
    PyObject *props = PyDict_New(), *text = NULL, *items = NULL;
    if (props == NULL) return NULL;
    text = PyUnicode_DecodeUTF8((const char *)raw, n, "replace");
    items = text ? PyUnicode_Split(text, item_sep, -1) : NULL;
    if (items == NULL) goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        Py_ssize_t len = PyUnicode_GET_LENGTH(item);
        Py_ssize_t at = len ? PyUnicode_FindChar(item, 1, 0, len, 1) : -1;
        if (at == -2) goto fail;
        if (at < 0) continue;
        PyObject *name = PyUnicode_Substring(item, 0, at);
        PyObject *value = name ? PyUnicode_Substring(item, at + 1, len) : NULL;
        int rc = value ? PyDict_SetItem(props, name, value) : -1;
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (rc < 0) goto fail;
    }
    Py_DECREF(items);
    Py_DECREF(text);
    return props;
fail:
    Py_XDECREF(items);
    Py_XDECREF(text);
    Py_DECREF(props);
    return NULL;
}

/* What dispatch_request gives a marked record: (tagsCode, store timestamp, keys, properties) in
 * ``*first`` and the tagsCode; -1 with an exception. */
static int dispatched(const unsigned char *raw, Py_ssize_t n, int64_t ts, PyObject **first,
                      int32_t *code) {
    PyObject *props = properties(raw, n), *keys = NULL;
    if (props == NULL) return -1;
    *code = 0;
    PyObject *tags = PyDict_GetItemWithError(props, tags_name);
    if (tags == NULL && PyErr_Occurred()) goto fail;
    if (tags != NULL && PyUnicode_GET_LENGTH(tags) > 0) *code = java_hash(tags);
    keys = PyList_New(0);
    if (keys == NULL) goto fail;
    PyObject *text = PyDict_GetItemWithError(props, keys_name);
    if (text == NULL && PyErr_Occurred()) goto fail;
    if (text != NULL) {
        PyObject *parts = PyUnicode_Split(text, key_sep, -1);
        if (parts == NULL) goto fail;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parts); i++) {
            PyObject *part = PyList_GET_ITEM(parts, i);
            if (PyUnicode_GET_LENGTH(part) && PyList_Append(keys, part) < 0) {
                Py_DECREF(parts);
                goto fail;
            }
        }
        Py_DECREF(parts);
    }
    PyObject *uniq = PyDict_GetItemWithError(props, uniq_name);
    if (uniq == NULL && PyErr_Occurred()) goto fail;
    if (uniq != NULL && PyList_Append(keys, uniq) < 0) goto fail;
    PyObject *found = PyList_AsTuple(keys);
    if (found == NULL) goto fail;
    *first = Py_BuildValue("(iLNN)", *code, (long long)ts, found, props);
    Py_DECREF(keys);
    return *first == NULL ? -1 : 0;
fail:
    Py_XDECREF(keys);
    Py_DECREF(props);
    return -1;
}

/* Whether ``raw`` holds any of ``markers`` (a tuple of bytes): -1 on a bad marker. */
static int marked(const unsigned char *raw, Py_ssize_t n, PyObject *markers) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(markers); i++) {
        PyObject *m = PyTuple_GET_ITEM(markers, i);
        if (!PyBytes_Check(m)) {
            PyErr_SetString(PyExc_TypeError, "a marker must be bytes");
            return -1;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(m);
        if (len == 0 || (len <= n && memmem(raw, (size_t)n, PyBytes_AS_STRING(m), (size_t)len)))
            return 1;
    }
    return 0;
}

/* Whether the raw topic is one of ``topics`` (a tuple of bytes). */
static int ruled(const unsigned char *topic, Py_ssize_t len, PyObject *topics) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(topics); i++) {
        PyObject *t = PyTuple_GET_ITEM(topics, i);
        if (PyBytes_Check(t) && PyBytes_GET_SIZE(t) == len
            && memcmp(PyBytes_AS_STRING(t), topic, (size_t)len) == 0)
            return 1;
    }
    return 0;
}

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])
        || !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "configure(tags, keys, uniq): three names (str)");
        return NULL;
    }
    Py_XSETREF(tags_name, Py_NewRef(args[0]));
    Py_XSETREF(keys_name, Py_NewRef(args[1]));
    Py_XSETREF(uniq_name, Py_NewRef(args[2]));
    Py_RETURN_NONE;
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
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "scan takes 8 arguments");
        return NULL;
    }
    PyObject *markers = args[6], *rule_topics = args[7];
    if (!PyTuple_Check(markers) || !PyTuple_Check(rule_topics)) {
        PyErr_SetString(PyExc_TypeError, "markers and rule_topics must be tuples of bytes");
        return NULL;
    }
    if (tags_name == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "scan with markers before configure");
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
    PyObject *runs = PyList_New(0), *entries = NULL, *result = NULL, *first = NULL;
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
        if (topic_end + 2 + user_props != total)
            break; /* lengths that do not add up to the record's: Python's, which refuses it */
        if (user_props >= CRC_ENTRY_BYTES
            && memcmp(r + total - CRC_ENTRY_BYTES, CRC_PREFIX, 9) == 0 && r[total - 1] == 2)
            user_props -= CRC_ENTRY_BYTES;
        int32_t code = 0;
        if (user_props) { /* tags, keys, a delay, a user's */
            const unsigned char *props = r + topic_end + 2;
            int watched = marked(props, user_props, markers);
            if (watched < 0) goto done;
            if (watched) { /* dispatched: the call's first record only, no tags-code rule */
                if (count > 0 || ruled(r + p + 1, topic_len, rule_topics)) break;
                if (dispatched(props, user_props, get64(r + 56), &first, &code) < 0) goto done;
            }
        }
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
        PyObject *e = Py_BuildValue("(Lii)", base + (long long)pos, total, code);
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
    result = Py_BuildValue("(OnnLO)", runs, pos, count, (long long)last_ts,
                           first ? first : Py_None);
done:
    Py_XDECREF(first);
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
     "Records from pos: (runs, pos, count, last_store_timestamp, first)."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(tags, keys, uniq): the property names a dispatched record's are read by."},
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
    item_sep = PyUnicode_FromString("\x02");
    key_sep = PyUnicode_FromString(" ");
    if (popleft_name == NULL || item_sep == NULL || key_sep == NULL)
        return NULL;
    return PyModule_Create(&module);
}
