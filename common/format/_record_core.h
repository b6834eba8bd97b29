/* The CommitLog record's bytes, shared by the record writer (_record_writer.c), the native put
 * path (_put_path.c) and the gRPC front end's reader (common/proxy/_received.c): one record
 * written at a pointer, its ConsumeQueue entry, its fields read.
 * Callers check every argument first; nothing here can fail. */
#ifndef REPLOG_RECORD_CORE_H
#define REPLOG_RECORD_CORE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define HEADER_BYTES 88
#define MAGIC_V1 0xDAA320A7u
#define CRC_ENTRY_BYTES 20
#define CQ_ENTRY_BYTES 20
static const char CRC_PREFIX[] = "__CRC32#\x01"; /* 9 bytes */

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static inline void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static inline uint32_t get32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t get64(const unsigned char *p) {
    return ((uint64_t)get32(p) << 32) | get32(p + 4);
}

static inline uLong crc_of(uLong crc, const unsigned char *p, Py_ssize_t n) {
    while (n > 0) { /* zlib takes a uInt length */
        uInt step = n > (Py_ssize_t)0x40000000 ? 0x40000000u : (uInt)n;
        crc = crc32(crc, p, step);
        p += step;
        n -= step;
    }
    return crc;
}

/* What every record of one write shares. */
typedef struct {
    long long base, queue_offset, born, ts;
    int queue_id, born_port, store_port, crc_len;
    unsigned char born_ip[4], store_ip[4];
} Shared;

/* One record at out; returns its size. Arguments were checked by the caller. */
static inline Py_ssize_t write_one(unsigned char *out, long long phy, long long queue_offset,
                            const Shared *s, int32_t size, int32_t body_crc, int32_t flag,
                            int32_t reconsume, int32_t sys_flag, long long prepared,
                            const char *body,
                            Py_ssize_t body_len, const char *tail, Py_ssize_t tail_len) {
    unsigned char *h = out;
    put32(h, (uint32_t)size);
    put32(h + 4, MAGIC_V1);
    put32(h + 8, (uint32_t)body_crc);
    put32(h + 12, (uint32_t)s->queue_id);
    put32(h + 16, (uint32_t)flag);
    put64(h + 20, (uint64_t)queue_offset);
    put64(h + 28, (uint64_t)phy);
    put32(h + 36, (uint32_t)sys_flag);
    put64(h + 40, (uint64_t)s->born);
    memcpy(h + 48, s->born_ip, 4);
    put32(h + 52, (uint32_t)s->born_port);
    put64(h + 56, (uint64_t)s->ts);
    memcpy(h + 64, s->store_ip, 4);
    put32(h + 68, (uint32_t)s->store_port);
    put32(h + 72, (uint32_t)reconsume);
    put64(h + 76, (uint64_t)prepared);
    put32(h + 84, (uint32_t)body_len);
    memcpy(out + HEADER_BYTES, body, (size_t)body_len);
    unsigned char *t = out + HEADER_BYTES + body_len;
    if (s->crc_len) {
        Py_ssize_t front = tail_len - CRC_ENTRY_BYTES;
        memcpy(t, tail, (size_t)front);
        uLong whole = crc_of(0, out, HEADER_BYTES + body_len + front) & 0x7FFFFFFFu;
        unsigned char *e = t + front;
        memcpy(e, CRC_PREFIX, 9);
        for (int i = 0; i < 10; i++) {
            e[9 + i] = (unsigned char)('0' + whole % 10);
            whole /= 10;
        }
        e[19] = 0x02;
    } else {
        memcpy(t, tail, (size_t)tail_len);
    }
    return HEADER_BYTES + body_len + tail_len;
}

/* The record's ConsumeQueue entry (phy offset q, size i, tagsCode q 0): 20 bytes at cq. */
static inline void cq_entry(unsigned char *cq, long long phy, int32_t size) {
    put64(cq, (uint64_t)phy);
    put32(cq + 8, (uint32_t)size);
    put64(cq + 12, 0);
}

#endif
