/* The master's common put in C: a run of plain SEND (and SEND_BATCH) requests of one burst,
 * from their frames to their answers' bytes, in one call (master/put_path.py drives it;
 * docs/architecture.md, "A request path outside the interpreter").
 *
 * For each request, in order: its header decoded and checked by decode_request (the same C
 * checks as every request's), then what the Python path decides for a SEND (the request
 * server's _serve, master/role.py's send, the store's put_nowait and the CommitLog's put),
 * then its record written into the segment's mapping by the record writer's write_one, the
 * topic's queue offset advanced, the write's digest left for reput, and its SEND_OK answer
 * encoded and framed for ZMTP. The run stops, before anything of it is changed, at the first
 * request that is anything but a plain SEND this path takes whole: a response, another code, a
 * header decode_request does not take for plain, a topic the caller's table does not list
 * (system topics, topics not made yet, FIFO topics without a message group), a queue id past
 * the topic's queues, a delay level, a prepared transaction, a property the caller screens (a
 * put hook's trigger, a timer's, a transaction's, one only the broker sets), a body or
 * properties past the bounds, a record that does not fit before ``stop`` (the segment's end or
 * its populated pages), a peer without an address. The caller serves that one by the Python
 * path, which takes or refuses it with its reason, and calls again after it.
 *
 * Everything a request needs is checked and every object it makes is made before its record is
 * written; the only steps after the write cannot fail. The Python path is the reference: the
 * tests (tests/unit/master/test_put_path.py) hold the two to the same log bytes, queue offsets,
 * digests and answers.
 *
 * put_sends(conf, burst, start, buf, pos, stop, base, ts, limit)
 *   -> (next, pos, answers, last_ts, messages)
 *   conf: the tuple master/put_path.py builds (see CONF_* below)
 *   burst: [(identity, frames)], start: the first to look at
 *   buf: the segment's writable mapping; pos: its write position; stop: the end no record may
 *   pass; base: the segment's first offset; ts: the store timestamp (0: the clock's, per put);
 *   limit: how many requests the run may take at most
 *   next: the first request not taken; answers: [(identity, bytes)] of those taken; messages:
 *   how many records they wrote
 *
 * A SEND_BATCH of bodies alone (no meta: records without properties, flag or system flag) is
 * taken the same way, written as the CommitLog's put_batch writes plain bodies (one tail, one
 * digest, ``offsets`` in the answer); its sizes and split are checked by the Python decode,
 * once a batch, as the C decode leaves them to it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "_codec_internal.h"
#include "_record_core.h"

enum {
    CONF_LIMITS = 0, CONF_TABLE, CONF_TOPICS, CONF_LEARN, CONF_PEERS, CONF_HOSTS,
    CONF_HOST_BYTES, CONF_SCREEN, CONF_STORE_IP, CONF_STORE_PORT, CONF_CRC_LEN, CONF_MAX_BODY,
    CONF_DIGESTS, CONF_DIGEST_TYPE, CONF_STORE_HOST, CONF_SEND_CODE, CONF_SHARDING_KEY,
    CONF_TAGS, CONF_KEYS, CONF_MAX_PROPS, CONF_MAX_RECORD, CONF_PREPARED, CONF_RESPONSE_MARK,
    CONF_BATCH_CODE, CONF_DECODE, CONF_SEGMENT_ROOM, CONF_SIZE
};

#define MAX_HOSTS 4096
#define MAX_TAIL (1 + 255 + 2 + 65536)

static PyObject *s_topic, *s_queue_id, *s_tags, *s_keys, *s_properties, *s_flag, *s_delay,
    *s_born, *s_sys_flag, *s_queue_offset, *s_commit_log_offset, *s_store_host, *s_append,
    *s_empty, *s_meta, *s_offsets, *i_zero;

static int intern_names(void) {
    if (s_topic != NULL) return 0;
    struct { PyObject **slot; const char *text; } names[] = {
        {&s_topic, "topic"}, {&s_queue_id, "queueId"}, {&s_tags, "tags"}, {&s_keys, "keys"},
        {&s_properties, "properties"}, {&s_flag, "flag"}, {&s_delay, "delayLevel"},
        {&s_born, "bornTimestamp"}, {&s_sys_flag, "sysFlag"}, {&s_queue_offset, "queueOffset"},
        {&s_commit_log_offset, "commitLogOffset"}, {&s_store_host, "storeHost"},
        {&s_append, "append"}, {&s_empty, ""}, {&s_meta, "meta"}, {&s_offsets, "offsets"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL) return -1;
    }
    i_zero = PyLong_FromLong(0);
    return i_zero == NULL ? -1 : 0;
}

static long long clock_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* A field's int value (the checks made it an int in range), or -1 with an exception. */
static int long_of(PyObject *fields, PyObject *name, long long *out) {
    PyObject *v = PyDict_GetItemWithError(fields, name);
    if (v == NULL) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "field %S", name);
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Append ``text`` as UTF-8 at t (room for ``room`` bytes): its length, or -1 when it does not
 * fit or is not a str (the Python path then decides). */
static Py_ssize_t put_text(unsigned char *t, Py_ssize_t room, PyObject *text) {
    if (!PyUnicode_CheckExact(text)) return -1;
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &n);
    if (utf8 == NULL) {
        PyErr_Clear();
        return -1;
    }
    if (n > room) return -1;
    /* a separator would add properties: decode_request refuses it before here, and a text
     * that holds one anyway is the Python path's to refuse (boundary.py) */
    if (memchr(utf8, 0x01, (size_t)n) != NULL || memchr(utf8, 0x02, (size_t)n) != NULL)
        return -1;
    memcpy(t, utf8, (size_t)n);
    return n;
}

/* The record's properties, as Message.all_properties and encode_properties make them (the
 * producer's, then TAGS and KEYS set over them), at t: their length, or -1 when the Python
 * path must decide (too long, not text) or -2 on an error. */
static Py_ssize_t put_properties(unsigned char *t, Py_ssize_t room, PyObject *props,
                                 PyObject *tags, PyObject *keys, PyObject *conf) {
    PyObject *all = props != NULL && props != Py_None ? PyDict_Copy(props) : PyDict_New();
    if (all == NULL) return -2;
    int tags_true = tags != NULL && tags != Py_None ? PyObject_IsTrue(tags) : 0;
    int keys_true = keys != NULL && keys != Py_None ? PyObject_IsTrue(keys) : 0;
    if (tags_true < 0 || keys_true < 0
        || (tags_true && PyDict_SetItem(all, PyTuple_GET_ITEM(conf, CONF_TAGS), tags) < 0)
        || (keys_true && PyDict_SetItem(all, PyTuple_GET_ITEM(conf, CONF_KEYS), keys) < 0)) {
        Py_DECREF(all);
        return -2;
    }
    /* an index key (KEYS, UNIQ_KEY) that starts with a broker-only property's name would sit
     * among the broker's own keys: decode_request refuses it before here, and one that
     * reaches here anyway is the Python path's to refuse (boundary.key_refusal) */
    int screened = keys_true && PyUnicode_CheckExact(keys) ? replog_key_screened(keys) : 0;
    if (screened == 0) screened = replog_uniq_screened(all);
    if (screened != 0) {
        Py_DECREF(all);
        return screened < 0 ? -2 : -1;
    }
    Py_ssize_t at = 0, it = 0, n;
    PyObject *name, *value;
    while (PyDict_Next(all, &it, &name, &value)) {
        if (value == Py_None) continue;
        if ((n = put_text(t + at, room - at, name)) < 0) goto not_plain;
        at += n;
        if (at >= room) goto not_plain;
        t[at++] = 0x01;
        if ((n = put_text(t + at, room - at, value)) < 0) goto not_plain;
        at += n;
        if (at >= room) goto not_plain;
        t[at++] = 0x02;
    }
    Py_DECREF(all);
    return at;
not_plain:
    Py_DECREF(all);
    return -1;
}

/* The born host's 4 bytes and port of ``identity``'s peer (the bytes cached by host text):
 * 1, or 0 for the Python path's (no peer known), or -1 on an error (set). */
static int born_host_of(PyObject *conf, PyObject *identity, unsigned char ip[4], int *port) {
    PyObject *peer = PyDict_GetItemWithError(PyTuple_GET_ITEM(conf, CONF_PEERS), identity);
    if (peer == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(peer) || PyTuple_GET_SIZE(peer) != 2) return 0;
    PyObject *host = PyTuple_GET_ITEM(peer, 0), *hosts = PyTuple_GET_ITEM(conf, CONF_HOSTS);
    long p = PyLong_AsLong(PyTuple_GET_ITEM(peer, 1));
    if (p == -1 && PyErr_Occurred()) return -1;
    PyObject *raw = PyDict_GetItemWithError(hosts, host);
    if (raw == NULL) {
        if (PyErr_Occurred()) return -1;
        raw = PyObject_CallOneArg(PyTuple_GET_ITEM(conf, CONF_HOST_BYTES), host);
        if (raw == NULL) return -1;
        if (PyDict_GET_SIZE(hosts) >= MAX_HOSTS) PyDict_Clear(hosts);
        int failed = PyDict_SetItem(hosts, host, raw);
        Py_DECREF(raw);  /* the dict holds it */
        if (failed < 0) return -1;
    }
    if (!PyBytes_CheckExact(raw) || PyBytes_GET_SIZE(raw) != 4) return 0;
    memcpy(ip, PyBytes_AS_STRING(raw), 4);
    *port = (int)p;
    return 1;
}

/* The topic's entry (topic part, queue count, FIFO) from the caller's table, asking ``learn``
 * for one it has not seen; NULL with no exception: the Python path's. Borrowed. */
static PyObject *topic_entry(PyObject *conf, PyObject *topic) {
    PyObject *topics = PyTuple_GET_ITEM(conf, CONF_TOPICS);
    PyObject *entry = PyDict_GetItemWithError(topics, topic);
    if (entry == NULL) {
        if (PyErr_Occurred()) return NULL;
        PyObject *learnt = PyObject_CallOneArg(PyTuple_GET_ITEM(conf, CONF_LEARN), topic);
        if (learnt == NULL) return NULL;
        Py_DECREF(learnt);
        entry = PyDict_GetItemWithError(topics, topic);  /* learn keeps what it found */
        if (entry == NULL) return NULL;
    }
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3
        || !PyBytes_CheckExact(PyTuple_GET_ITEM(entry, 0)))
        return NULL;  /* None: a topic the Python path serves */
    return entry;
}

/* 1: ``props`` (a dict or None) holds a screened name, or lacks the message group a FIFO
 * topic needs; 0: neither; -1: an error. */
static int screened(PyObject *conf, PyObject *props, int fifo) {
    if (props == NULL || props == Py_None || PyDict_GET_SIZE(props) == 0) return fifo;
    PyObject *screen = PyTuple_GET_ITEM(conf, CONF_SCREEN), *name, *value;
    Py_ssize_t it = 0;
    while (PyDict_Next(props, &it, &name, &value)) {
        int hit = PySet_Contains(screen, name);
        if (hit != 0) return hit;
    }
    if (!fifo) return 0;
    int has = PyDict_Contains(props, PyTuple_GET_ITEM(conf, CONF_SHARDING_KEY));
    return has < 0 ? -1 : !has;
}

/* The SEND_OK answer's ZMTP bytes, as the request server frames reply(req, SUCCESS, "",
 * fields): fields in master/role.py's order, ``offsets`` (a batch's records) when not NULL. */
static PyObject *answer_bytes(PyObject *opaque, PyObject *queue_id, long long queue_offset,
                              long long phy, PyObject *store_host, PyObject *offsets) {
    PyObject *fields = PyDict_New(), *qo = PyLong_FromLongLong(queue_offset);
    PyObject *offset = PyLong_FromLongLong(phy), *out = NULL;
    if (fields == NULL || qo == NULL || offset == NULL
        || PyDict_SetItem(fields, s_queue_id, queue_id) < 0
        || PyDict_SetItem(fields, s_queue_offset, qo) < 0
        || PyDict_SetItem(fields, s_commit_log_offset, offset) < 0
        || PyDict_SetItem(fields, s_store_host, store_host) < 0
        || (offsets != NULL && PyDict_SetItem(fields, s_offsets, offsets) < 0))
        goto done;
    PyObject *args[4] = {i_zero, opaque, s_empty, fields};
    PyObject *frames = replog_encode_response(args, 4);
    if (frames == NULL) goto done;
    out = replog_zmtp_encode(frames);
    Py_DECREF(frames);
done:
    Py_XDECREF(fields);
    Py_XDECREF(qo);
    Py_XDECREF(offset);
    return out;
}

/* The write's digest for reput (commit_log.WriteDigest): records without user properties, their
 * entries and ConsumeQueue bytes made by the caller. Steals ``entries`` and ``cq``. */
static PyObject *digest_of(PyObject *conf, PyObject *topic, PyObject *queue_id, long long phy,
                           long long end, long long queue_offset, PyObject *entries,
                           long long ts, PyObject *cq) {
    if (entries == NULL || cq == NULL) {
        Py_XDECREF(entries);
        Py_XDECREF(cq);
        return NULL;
    }
    PyObject *items = Py_BuildValue("(LLOOLNLN)", phy, end, topic, queue_id, queue_offset,
                                    entries, ts, cq);
    if (items == NULL) return NULL;
    PyObject *wrapped = PyTuple_Pack(1, items);  /* tuple.__new__(WriteDigest, items) */
    Py_DECREF(items);
    if (wrapped == NULL) return NULL;
    PyObject *digest = PyTuple_Type.tp_new(
        (PyTypeObject *)PyTuple_GET_ITEM(conf, CONF_DIGEST_TYPE), wrapped, NULL);
    Py_DECREF(wrapped);
    return digest;
}

/* One call's state: the conf's values, the mapping, where the run has got to. */
typedef struct {
    PyObject *conf, *table, *digests, *store_host, *answers;
    unsigned char *buf;
    Py_ssize_t pos, stop;
    long long base, fixed_ts, store_port, crc_len, max_body, max_props, max_record, prepared;
    long long segment_room, last_ts, messages;  /* room: a segment's bytes for records */
    unsigned char store_ip[4];
    unsigned char *tail;
} Run;

/* What a taken request leaves besides its records: its answer, its queue's next offset and its
 * digest (NULL: none), all or nothing: 0, or -1 with an exception and nothing kept. */
static int keep(Run *r, PyObject *identity, PyObject *answer, PyObject *key, PyObject *had,
                long long next_offset, PyObject *digest) {
    PyObject *pair = PyTuple_Pack(2, identity, answer);
    PyObject *next = PyLong_FromLongLong(next_offset);
    if (pair == NULL || next == NULL || PyList_Append(r->answers, pair) < 0) goto nothing;
    if (PyDict_SetItem(r->table, key, next) < 0) goto answer_kept;
    if (digest != NULL) {
        PyObject *appended = PyObject_CallMethodOneArg(r->digests, s_append, digest);
        if (appended == NULL) goto offset_kept;
        Py_DECREF(appended);
    }
    Py_DECREF(pair);
    Py_DECREF(next);
    return 0;
offset_kept: {
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);
        if ((had != NULL ? PyDict_SetItem(r->table, key, had) : PyDict_DelItem(r->table, key)) < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, trace);
    }
answer_kept:
    PyList_SetSlice(r->answers, PyList_GET_SIZE(r->answers) - 1, PyList_GET_SIZE(r->answers),
                    NULL);
nothing:
    Py_XDECREF(pair);
    Py_XDECREF(next);
    return -1;
}

/* The fields every write reads: topic, queue id (its object), born time; the topic's entry;
 * the peer's address. 1 with them, 0 when the Python path decides, -1 on an error. */
static int write_target(Run *r, PyObject *identity, PyObject *fields, PyObject **topic,
                        PyObject **queue_id_obj, long long *queue_id, long long *born,
                        PyObject **entry, int *fifo, unsigned char born_ip[4], int *born_port) {
    *topic = PyDict_GetItemWithError(fields, s_topic);
    *queue_id_obj = *topic ? PyDict_GetItemWithError(fields, s_queue_id) : NULL;
    if (*queue_id_obj == NULL || long_of(fields, s_queue_id, queue_id) < 0
        || long_of(fields, s_born, born) < 0)
        return -1;  /* the checked fields always hold these */
    *entry = topic_entry(r->conf, *topic);
    if (*entry == NULL) return PyErr_Occurred() ? -1 : 0;
    long long nums = PyLong_AsLongLong(PyTuple_GET_ITEM(*entry, 1));
    *fifo = PyObject_IsTrue(PyTuple_GET_ITEM(*entry, 2));
    if (*fifo < 0 || PyErr_Occurred()) return -1;
    Py_ssize_t part_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(*entry, 0));
    if (*queue_id >= nums || part_len < 2 || part_len > 256) return 0;
    return born_host_of(r->conf, identity, born_ip, born_port);
}

/* The whole-record CRC's entry with ten zeros for the digits (record.PROP_CRC_PLACEHOLDER):
 * write_one puts the CRC's digits in. */
static void put_crc_placeholder(unsigned char *at) {
    memcpy(at, CRC_PREFIX, 9);
    memset(at + 9, '0', 10);
    at[19] = 0x02;
}

/* What every record of one write shares (the record writer's Shared). */
static Shared shared_of(const Run *r, long long queue_offset, long long born, long long ts,
                        long long queue_id, const unsigned char born_ip[4], int born_port) {
    Shared s = {.base = r->base, .queue_offset = queue_offset, .born = born, .ts = ts,
                .queue_id = (int)queue_id, .born_port = born_port,
                .store_port = (int)r->store_port, .crc_len = (int)r->crc_len};
    memcpy(s.born_ip, born_ip, 4);
    memcpy(s.store_ip, r->store_ip, 4);
    return s;
}

/* A taken write's start: its first offset, store and born times (a born time of 0 is now),
 * the queue's key in the CommitLog's topic_queue_table (a new reference), its entry now
 * (``*had``, a new reference or NULL) and the next queue offset; NULL on an error. */
static PyObject *write_start(Run *r, PyObject *topic, PyObject *queue_id_obj, long long *born,
                             long long *phy, long long *ts, PyObject **had,
                             long long *queue_offset) {
    *phy = r->base + r->pos;
    *ts = r->fixed_ts > 0 ? r->fixed_ts : clock_ms();
    if (*born == 0) *born = clock_ms();
    *had = NULL;
    PyObject *key = PyTuple_Pack(2, topic, queue_id_obj);
    if (key == NULL) return NULL;
    *had = PyDict_GetItemWithError(r->table, key);
    Py_XINCREF(*had);
    *queue_offset = *had ? PyLong_AsLongLong(*had) : 0;
    if (PyErr_Occurred()) {
        Py_XDECREF(*had);
        Py_DECREF(key);
        return NULL;
    }
    return key;
}

/* A SEND: 1 taken, 0 the Python path's, -1 an error (nothing of it kept). */
static int take_send(Run *r, PyObject *identity, PyObject *req) {
    PyObject *conf = r->conf, *fields = PyTuple_GET_ITEM(req, 2);
    PyObject *bodies = PyTuple_GET_ITEM(req, 3), *topic, *queue_id_obj, *entry;
    long long queue_id, delay, sys_flag, flag, born;
    int fifo, born_port = 0;
    unsigned char born_ip[4];
    int target = write_target(r, identity, fields, &topic, &queue_id_obj, &queue_id, &born,
                              &entry, &fifo, born_ip, &born_port);
    if (target <= 0) return target;
    if (long_of(fields, s_delay, &delay) < 0 || long_of(fields, s_sys_flag, &sys_flag) < 0
        || long_of(fields, s_flag, &flag) < 0)
        return -1;
    if (delay != 0 || (sys_flag & r->prepared) || !PyList_CheckExact(bodies)
        || PyList_GET_SIZE(bodies) != 1)
        return 0;
    PyObject *props = PyDict_GetItemWithError(fields, s_properties);
    if (props == NULL && PyErr_Occurred()) return -1;
    int screen = screened(conf, props, fifo);
    if (screen != 0) return screen < 0 ? -1 : 0;
    PyObject *body = PyList_GET_ITEM(bodies, 0);
    if (!PyBytes_CheckExact(body) || PyBytes_GET_SIZE(body) > r->max_body) return 0;
    /* the tail: topic part, properties' length, properties (+ the CRC's placeholder) */
    PyObject *topic_part = PyTuple_GET_ITEM(entry, 0);
    Py_ssize_t part_len = PyBytes_GET_SIZE(topic_part);
    unsigned char *tail = r->tail;
    memcpy(tail, PyBytes_AS_STRING(topic_part), (size_t)part_len);
    unsigned char *props_at = tail + part_len + 2;
    Py_ssize_t props_len = 0;
    PyObject *tags = PyDict_GetItemWithError(fields, s_tags);
    PyObject *keys = PyErr_Occurred() ? NULL : PyDict_GetItemWithError(fields, s_keys);
    if (PyErr_Occurred()) return -1;
    if ((props != NULL && props != Py_None && PyDict_GET_SIZE(props))
        || (tags != NULL && tags != Py_None) || (keys != NULL && keys != Py_None)) {
        props_len = put_properties(props_at, (Py_ssize_t)r->max_props, props, tags, keys, conf);
        if (props_len < 0) return props_len == -2 ? -1 : 0;
    }
    if (r->crc_len) {
        if (props_len + CRC_ENTRY_BYTES > r->max_props) return 0;
        put_crc_placeholder(props_at + props_len);
        props_len += CRC_ENTRY_BYTES;
    }
    tail[part_len] = (unsigned char)(props_len >> 8);
    tail[part_len + 1] = (unsigned char)props_len;
    Py_ssize_t body_len = PyBytes_GET_SIZE(body), tail_len = part_len + 2 + props_len;
    Py_ssize_t size = HEADER_BYTES + body_len + tail_len;
    if (size > r->max_record || r->pos + size > r->stop) return 0;
    /* taken: everything that can fail first, the write last */
    long long phy, ts, queue_offset;
    PyObject *had;
    PyObject *key = write_start(r, topic, queue_id_obj, &born, &phy, &ts, &had, &queue_offset);
    if (key == NULL) return -1;
    PyObject *answer = answer_bytes(PyTuple_GET_ITEM(req, 1), queue_id_obj, queue_offset, phy,
                                    r->store_host, NULL);
    PyObject *digest = NULL;
    if (answer != NULL && props_len == r->crc_len) {  /* no user properties: reput's digest */
        unsigned char cq[CQ_ENTRY_BYTES];
        cq_entry(cq, phy, (int32_t)size);
        digest = digest_of(conf, topic, queue_id_obj, phy, phy + size, queue_offset,
                           Py_BuildValue("[(Lni)]", phy, size, 0), ts,
                           PyBytes_FromStringAndSize((const char *)cq, CQ_ENTRY_BYTES));
    }
    int failed = answer == NULL || (props_len == r->crc_len && digest == NULL)
                 || keep(r, identity, answer, key, had, queue_offset + 1, digest) < 0;
    Py_XDECREF(digest);
    Py_XDECREF(answer);
    Py_XDECREF(had);
    Py_DECREF(key);
    if (failed) return -1;
    Shared s = shared_of(r, queue_offset, born, ts, queue_id, born_ip, born_port);
    uLong body_crc = crc_of(0, (const unsigned char *)PyBytes_AS_STRING(body), body_len);
    write_one(r->buf + r->pos, phy, queue_offset, &s, (int32_t)size,
              (int32_t)(body_crc & 0x7FFFFFFFu), (int32_t)flag, 0, (int32_t)sys_flag, 0,
              PyBytes_AS_STRING(body), body_len, (const char *)tail, tail_len);
    r->pos += size;
    r->last_ts = ts;
    r->messages += 1;
    return 1;
}

/* A SEND_BATCH of bodies alone (no meta): 1 taken, 0 the Python path's, -1 an error. As the
 * CommitLog's put_batch writes plain bodies: one write, one tail, one digest. */
static int take_batch(Run *r, PyObject *identity, PyObject *req) {
    PyObject *conf = r->conf, *fields = PyTuple_GET_ITEM(req, 2);
    PyObject *bodies = PyTuple_GET_ITEM(req, 3), *topic, *queue_id_obj, *entry;
    long long queue_id, born;
    int fifo, born_port = 0;
    unsigned char born_ip[4];
    PyObject *meta = PyDict_GetItemWithError(fields, s_meta);
    if (meta == NULL && PyErr_Occurred()) return -1;
    if (meta != NULL && meta != Py_None) return 0;
    int target = write_target(r, identity, fields, &topic, &queue_id_obj, &queue_id, &born,
                              &entry, &fifo, born_ip, &born_port);
    if (target <= 0) return target;
    if (fifo || !PyList_CheckExact(bodies) || PyList_GET_SIZE(bodies) < 1) return 0;
    PyObject *topic_part = PyTuple_GET_ITEM(entry, 0);
    Py_ssize_t part_len = PyBytes_GET_SIZE(topic_part);
    Py_ssize_t fixed = HEADER_BYTES + part_len + 2 + (Py_ssize_t)r->crc_len;
    long long plain_max = r->max_body;
    if (r->segment_room - fixed < plain_max) plain_max = r->segment_room - fixed;
    if (r->max_record - fixed < plain_max) plain_max = r->max_record - fixed;
    Py_ssize_t n = PyList_GET_SIZE(bodies), total = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *body = PyList_GET_ITEM(bodies, k);
        if (!PyBytes_CheckExact(body) || PyBytes_GET_SIZE(body) > plain_max) return 0;
        total += fixed + PyBytes_GET_SIZE(body);
    }
    if (r->pos + total > r->stop) return 0;
    unsigned char *tail = r->tail;
    memcpy(tail, PyBytes_AS_STRING(topic_part), (size_t)part_len);
    tail[part_len] = (unsigned char)(r->crc_len >> 8);
    tail[part_len + 1] = (unsigned char)r->crc_len;
    if (r->crc_len) {
        put_crc_placeholder(tail + part_len + 2);
    }
    Py_ssize_t tail_len = part_len + 2 + (Py_ssize_t)r->crc_len;
    /* taken: everything that can fail first, the writes last */
    long long phy, ts, queue_offset;
    PyObject *had;
    PyObject *key = write_start(r, topic, queue_id_obj, &born, &phy, &ts, &had, &queue_offset);
    if (key == NULL) return -1;
    PyObject *entries = PyList_New(n);
    PyObject *offsets = entries && n > 1 ? PyList_New(n) : NULL;
    PyObject *cq = entries ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)CQ_ENTRY_BYTES * n) : NULL;
    int failed = entries == NULL || cq == NULL || (n > 1 && offsets == NULL);
    long long at = phy;
    for (Py_ssize_t k = 0; !failed && k < n; k++) {
        Py_ssize_t size = fixed + PyBytes_GET_SIZE(PyList_GET_ITEM(bodies, k));
        PyObject *e = Py_BuildValue("(Lni)", at, size, 0);
        PyObject *o = n > 1 ? PyLong_FromLongLong(at) : NULL;
        if (e == NULL || (n > 1 && o == NULL)) {
            Py_XDECREF(e);
            Py_XDECREF(o);
            failed = 1;
            break;
        }
        PyList_SET_ITEM(entries, k, e);
        if (o != NULL) PyList_SET_ITEM(offsets, k, o);
        cq_entry((unsigned char *)PyBytes_AS_STRING(cq) + CQ_ENTRY_BYTES * k, at, (int32_t)size);
        at += size;
    }
    PyObject *answer = failed ? NULL : answer_bytes(PyTuple_GET_ITEM(req, 1), queue_id_obj,
                                                    queue_offset, phy, r->store_host, offsets);
    PyObject *digest = NULL;
    if (answer != NULL) {
        Py_INCREF(entries);
        Py_INCREF(cq);
        digest = digest_of(conf, topic, queue_id_obj, phy, phy + total, queue_offset, entries,
                           ts, cq);
    }
    failed = answer == NULL || digest == NULL
             || keep(r, identity, answer, key, had, queue_offset + n, digest) < 0;
    Py_XDECREF(digest);
    Py_XDECREF(answer);
    Py_XDECREF(entries);
    Py_XDECREF(offsets);
    Py_XDECREF(cq);
    Py_XDECREF(had);
    Py_DECREF(key);
    if (failed) return -1;
    Shared s = shared_of(r, queue_offset, born, ts, queue_id, born_ip, born_port);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *body = PyList_GET_ITEM(bodies, k);
        Py_ssize_t body_len = PyBytes_GET_SIZE(body), size = fixed + body_len;
        uLong body_crc = crc_of(0, (const unsigned char *)PyBytes_AS_STRING(body), body_len);
        write_one(r->buf + r->pos, r->base + r->pos, queue_offset + k, &s, (int32_t)size,
                  (int32_t)(body_crc & 0x7FFFFFFFu), 0, 0, 0, 0, PyBytes_AS_STRING(body),
                  body_len, (const char *)tail, tail_len);
        r->pos += size;
    }
    r->last_ts = ts;
    r->messages += n;
    return 1;
}

/* decode_request's Request for ``frames``, or NULL: the Python path's (no exception), or an
 * error (set). A SEND_BATCH's sizes and meta are checked by the Python decode (conf's
 * DECODE), once per batch. */
static PyObject *request_of(Run *r, PyObject *frames, PyObject *request_type,
                            long long batch_code) {
    PyObject *limits = PyTuple_GET_ITEM(r->conf, CONF_LIMITS);
    PyObject *req = replog_decode_request(frames, limits);
    if (req == NULL || Py_TYPE(req) == (PyTypeObject *)request_type) return req;
    int overflow = 0;
    int batch = PyList_CheckExact(req) && PyList_GET_SIZE(req) == 4
                && PyLong_CheckExact(PyList_GET_ITEM(req, 1))
                && PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(req, 1), &overflow) == batch_code
                && !overflow;
    Py_DECREF(req);
    if (!batch) return NULL;  /* another code (any size): the Python path's */
    req = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(r->conf, CONF_DECODE), frames, limits,
                                       NULL);
    if (req == NULL || Py_TYPE(req) != (PyTypeObject *)request_type) {
        PyErr_Clear();  /* refused: the Python path answers the error */
        Py_XDECREF(req);
        return NULL;
    }
    return req;
}

static int conf_ll(PyObject *conf, int at, long long *out) {
    *out = PyLong_AsLongLong(PyTuple_GET_ITEM(conf, at));
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

PyObject *replog_put_sends(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "put_sends(conf, burst, start, buf, pos, stop, base, ts, limit)");
        return NULL;
    }
    PyObject *conf = args[0], *burst = args[1];
    if (!PyTuple_CheckExact(conf) || PyTuple_GET_SIZE(conf) != CONF_SIZE
        || !PyList_CheckExact(burst)) {
        PyErr_SetString(PyExc_TypeError, "put_sends: conf must be its tuple, burst a list");
        return NULL;
    }
    if (intern_names() < 0) return NULL;
    PyObject *request_type = replog_request_type();
    if (request_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "put_sends: the codec is not configured");
        return NULL;
    }
    Run r = {.conf = conf, .table = PyTuple_GET_ITEM(conf, CONF_TABLE),
             .digests = PyTuple_GET_ITEM(conf, CONF_DIGESTS),
             .store_host = PyTuple_GET_ITEM(conf, CONF_STORE_HOST)};
    long long send_code, batch_code, response_mark;
    Py_ssize_t start = PyLong_AsSsize_t(args[2]), limit = PyLong_AsSsize_t(args[8]);
    r.pos = PyLong_AsSsize_t(args[4]);
    r.stop = PyLong_AsSsize_t(args[5]);
    r.base = PyLong_AsLongLong(args[6]);
    r.fixed_ts = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred() || conf_ll(conf, CONF_STORE_PORT, &r.store_port) < 0
        || conf_ll(conf, CONF_CRC_LEN, &r.crc_len) < 0
        || conf_ll(conf, CONF_MAX_BODY, &r.max_body) < 0
        || conf_ll(conf, CONF_MAX_PROPS, &r.max_props) < 0
        || conf_ll(conf, CONF_MAX_RECORD, &r.max_record) < 0
        || conf_ll(conf, CONF_PREPARED, &r.prepared) < 0
        || conf_ll(conf, CONF_SEGMENT_ROOM, &r.segment_room) < 0
        || conf_ll(conf, CONF_SEND_CODE, &send_code) < 0
        || conf_ll(conf, CONF_BATCH_CODE, &batch_code) < 0
        || conf_ll(conf, CONF_RESPONSE_MARK, &response_mark) < 0)
        return NULL;
    PyObject *store_ip = PyTuple_GET_ITEM(conf, CONF_STORE_IP);
    if (!PyBytes_CheckExact(store_ip) || PyBytes_GET_SIZE(store_ip) != 4
        || (r.crc_len != 0 && r.crc_len != CRC_ENTRY_BYTES) || r.max_props > 65535
        || r.max_props < 0 || start < 0) {
        PyErr_SetString(PyExc_ValueError, "put_sends: a bad conf");
        return NULL;
    }
    memcpy(r.store_ip, PyBytes_AS_STRING(store_ip), 4);
    Py_buffer view;
    if (PyObject_GetBuffer(args[3], &view, PyBUF_WRITABLE) < 0) return NULL;
    if (r.pos < 0 || r.stop > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "put_sends: pos and stop must be within the buffer");
        return NULL;
    }
    r.buf = view.buf;
    r.tail = PyMem_Malloc(MAX_TAIL);
    r.answers = PyList_New(0);
    PyObject *result = NULL;
    Py_ssize_t i = start, n = PyList_GET_SIZE(burst);
    if (limit < n - start) n = start + (limit > 0 ? limit : 0);
    if (r.tail == NULL || r.answers == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(burst, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) break;
        PyObject *identity = PyTuple_GET_ITEM(item, 0), *frames = PyTuple_GET_ITEM(item, 1);
        if (!PyList_CheckExact(frames) || PyList_GET_SIZE(frames) < 1) break;
        PyObject *head = PyList_GET_ITEM(frames, 0);
        if (!PyBytes_CheckExact(head) || PyBytes_GET_SIZE(head) < 1
            || (unsigned char)PyBytes_AS_STRING(head)[0] == response_mark)
            break;
        PyObject *req = request_of(&r, frames, request_type, batch_code);
        if (req == NULL) {
            if (PyErr_Occurred()) goto fail;
            break;
        }
        long long code = PyLong_AsLongLong(PyTuple_GET_ITEM(req, 0));
        int taken = code == send_code ? take_send(&r, identity, req)
                    : code == batch_code ? take_batch(&r, identity, req) : 0;
        Py_DECREF(req);
        if (taken < 0) goto fail;
        if (taken == 0) break;
    }
    result = Py_BuildValue("(nnOLL)", i, r.pos, r.answers, r.last_ts, r.messages);
    goto done;
fail:
    /* an error on request i: what the run took before it is kept and returned, for the
     * caller to account and answer; request i goes to the Python path, which meets the same
     * condition and reports it. With nothing taken, the error is the caller's. */
    if (i > start && r.answers != NULL) {
        PyErr_Clear();
        result = Py_BuildValue("(nnOLL)", i, r.pos, r.answers, r.last_ts, r.messages);
    }
done:
    PyBuffer_Release(&view);
    PyMem_Free(r.tail);
    Py_XDECREF(r.answers);
    return result;
}
