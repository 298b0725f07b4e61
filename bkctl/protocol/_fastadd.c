/* The v3 add fast path in C: `wire_v3.v3_add_reference` in one call.
 *
 * A bookie under a Java client (v3 by default) spends most of its reactor thread on adds. In Python,
 * recognising one (`wire_v3.match_add`: a regular expression, then length checks) and building its EOK
 * reply (`wire_v3.add_reply`) cost more than the v2 add's whole path. This module does both in one
 * C call over the connection's buffer and must agree with the Python definitions byte for byte: the
 * tests compare them on arbitrary, Java-shaped and mutated frames. It is optional (setup.py): without a
 * C compiler the Python definitions serve.
 *
 * The shape recognised (Java's client writes its adds exactly so; anything else is None):
 *   0a <header size: 1 byte < 0x80>  08 03  10 02  18 <txnId>  [20 <priority>]
 *   aa 06 <addRequest size>  08 <ledgerId>  10 <entryId>  1a 14 <master key: 20 bytes>
 *   22 <body size> <body: 16 bytes or more>  [28 <writeFlags>]  [a0 06 <flag>]
 * where every <...> without a size is a varint of 1-10 bytes, the header's size covers its fields and
 * the addRequest runs to the frame's end.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define VARINT_SIZE_MAX 10
#define MASTER_KEY_SIZE 20
#define ENTRY_IDS_SIZE 16  /* a packaged entry starts with its ledger and entry ids */
#define FLAG_RECOVERY_ADD 1

/* A varint as the request spells it: the reply copies these bytes instead of re-encoding values. */
typedef struct {
    const unsigned char *bytes;
    Py_ssize_t size;
} Raw;

/* What one matched add request holds. */
typedef struct {
    Raw txn, ledger, entry;
    Py_ssize_t key_start, body_start, body_end;
    int recovery;
} Add;

/* The next `size` bytes at *pos are `expected` (all before `end`): step over them. */
static int
expect(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, const char *expected, Py_ssize_t size)
{
    if (end - *pos < size || memcmp(buf + *pos, expected, (size_t)size) != 0) {
        return 0;
    }
    *pos += size;
    return 1;
}

/* A varint at *pos, as the Python pattern [\x80-\xff]{0,9}[\x00-\x7f]: up to 9 bytes with the high bit
 * set, then one without, all before `end`. Non-canonical spellings (0x80 0x00) match, as in Python. */
static int
scan_varint(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, Raw *raw)
{
    Py_ssize_t at = *pos;
    Py_ssize_t limit = end - at > VARINT_SIZE_MAX ? at + VARINT_SIZE_MAX : end;

    for (; at < limit; at++) {
        if (buf[at] < 0x80) {
            raw->bytes = buf + *pos;
            raw->size = at + 1 - *pos;
            *pos = at + 1;
            return 1;
        }
    }
    return 0;
}

/* A length varint's value, or -1 when it exceeds `bound` (the bytes left in the frame: nothing longer
 * can match, and so a 10-byte varint of up to 70 bits never has to fit a C integer). */
static Py_ssize_t
length_value(Raw raw, Py_ssize_t bound)
{
    uint64_t value = 0;

    for (Py_ssize_t i = 0; i < raw.size; i++) {
        uint64_t chunk = raw.bytes[i] & 0x7f;
        unsigned shift = 7 * (unsigned)i; /* at most 63: a varint has 10 bytes at most */
        if (chunk > (UINT64_MAX >> shift)) {
            return -1; /* bits beyond 64: far more than any buffer */
        }
        value |= chunk << shift;
    }
    return value > (uint64_t)bound ? -1 : (Py_ssize_t)value;
}

/* After the body: an optional writeFlags (field 5), then an optional flag (field 100), then the end.
 * Like the Python pattern (two greedy optional groups, then a check of where they ended). */
static int
match_tail(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, int *recovery)
{
    Py_ssize_t after;
    Raw raw;

    *recovery = 0;
    after = pos;
    if (expect(buf, &after, end, "\x28", 1) && scan_varint(buf, &after, end, &raw)) {
        pos = after;
    }
    after = pos;
    if (expect(buf, &after, end, "\xa0\x06", 2) && scan_varint(buf, &after, end, &raw)) {
        pos = after;
        /* Only the one-byte spelling counts, as `tail.group(1) == b"\x01"` in Python. */
        *recovery = raw.size == 1 && raw.bytes[0] == FLAG_RECOVERY_ADD;
    }
    return pos == end;
}

/* The packet header: 0a <size> 08 03 10 02 18 <txnId> [20 <priority>], its size covering its fields. */
static int
match_header(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, Add *add)
{
    Py_ssize_t start = *pos;
    Py_ssize_t header_size;
    Raw priority;

    if (!expect(buf, pos, end, "\x0a", 1) || *pos >= end || buf[*pos] >= 0x80) {
        return 0;
    }
    header_size = buf[(*pos)++];
    if (!expect(buf, pos, end, "\x08\x03\x10\x02\x18", 5) || !scan_varint(buf, pos, end, &add->txn)) {
        return 0;
    }
    if (expect(buf, pos, end, "\x20", 1) && !scan_varint(buf, pos, end, &priority)) {
        return 0; /* 0x20 without a varint: the Python pattern cannot skip it either */
    }
    return header_size == *pos - start - 2;
}

/* The whole request in buf[start:end]: 1 and `add` filled, or 0 (not an add of Java's shape). */
static int
match_add(const unsigned char *buf, Py_ssize_t start, Py_ssize_t end, Add *add)
{
    Py_ssize_t pos = start, op_start, body_size;
    Raw op_size, body_size_raw;

    if (!match_header(buf, &pos, end, add)) {
        return 0;
    }
    if (!expect(buf, &pos, end, "\xaa\x06", 2) || !scan_varint(buf, &pos, end, &op_size)) {
        return 0;
    }
    op_start = pos;
    if (!expect(buf, &pos, end, "\x08", 1) || !scan_varint(buf, &pos, end, &add->ledger)
        || !expect(buf, &pos, end, "\x10", 1) || !scan_varint(buf, &pos, end, &add->entry)
        || !expect(buf, &pos, end, "\x1a\x14", 2) || end - pos < MASTER_KEY_SIZE) {
        return 0;
    }
    add->key_start = pos;
    pos += MASTER_KEY_SIZE;
    if (!expect(buf, &pos, end, "\x22", 1) || !scan_varint(buf, &pos, end, &body_size_raw)) {
        return 0;
    }
    /* The addRequest runs to the frame's end; the body fits and holds at least the entry's ids. */
    if (length_value(op_size, end - op_start) != end - op_start) {
        return 0;
    }
    body_size = length_value(body_size_raw, end - pos);
    if (body_size < ENTRY_IDS_SIZE) {
        return 0; /* -1 (too long) included */
    }
    add->body_start = pos;
    add->body_end = pos + body_size;
    return match_tail(buf, add->body_end, end, &add->recovery);
}

static void
put_raw(unsigned char **out, Raw raw)
{
    memcpy(*out, raw.bytes, (size_t)raw.size);
    *out += raw.size;
}

/* The length-prefixed EOK addResponse, byte for byte `wire_v3.add_reply(txn, ledger, entry)`:
 *   <length: 4 bytes big-endian> 0a <5 + txn size> 08 03 10 02 18 <txn>  10 00
 *   aa 06 <4 + ids size> 08 00 10 <ledger> 18 <entry> */
static PyObject *
eok_reply(const Add *add)
{
    static const unsigned char header_fields[] = {0x08, 0x03, 0x10, 0x02, 0x18};
    Py_ssize_t ids_size = add->ledger.size + add->entry.size;
    Py_ssize_t size = 20 + add->txn.size + ids_size;
    uint32_t payload_size = (uint32_t)(size - 4);
    PyObject *reply = PyBytes_FromStringAndSize(NULL, size);
    unsigned char *out;

    if (reply == NULL) {
        return NULL;
    }
    out = (unsigned char *)PyBytes_AS_STRING(reply);
    *out++ = (unsigned char)(payload_size >> 24);
    *out++ = (unsigned char)(payload_size >> 16);
    *out++ = (unsigned char)(payload_size >> 8);
    *out++ = (unsigned char)payload_size;
    *out++ = 0x0a;
    *out++ = (unsigned char)(5 + add->txn.size);
    memcpy(out, header_fields, sizeof header_fields);
    out += sizeof header_fields;
    put_raw(&out, add->txn);
    *out++ = 0x10; /* status EOK */
    *out++ = 0x00;
    *out++ = 0xaa; /* addResponse: status EOK, ledgerId, entryId */
    *out++ = 0x06;
    *out++ = (unsigned char)(4 + ids_size);
    *out++ = 0x08;
    *out++ = 0x00;
    *out++ = 0x10;
    put_raw(&out, add->ledger);
    *out++ = 0x18;
    put_raw(&out, add->entry);
    return reply;
}

static int64_t
big_endian_int64(const unsigned char *bytes)
{
    uint64_t value = 0;
    int64_t signed_value;

    for (int i = 0; i < 8; i++) {
        value = value << 8 | bytes[i];
    }
    memcpy(&signed_value, &value, sizeof signed_value); /* two's complement, without an overflowing cast */
    return signed_value;
}

/* (ledger id, entry id, master key, body start, body end, recovery, EOK reply) of a matched add. */
static PyObject *
add_tuple(const unsigned char *buf, const Add *add)
{
    PyObject *items[7];
    PyObject *result;

    items[0] = PyLong_FromLongLong(big_endian_int64(buf + add->body_start));
    items[1] = PyLong_FromLongLong(big_endian_int64(buf + add->body_start + 8));
    items[2] = PyBytes_FromStringAndSize((const char *)buf + add->key_start, MASTER_KEY_SIZE);
    items[3] = PyLong_FromSsize_t(add->body_start);
    items[4] = PyLong_FromSsize_t(add->body_end);
    items[5] = PyBool_FromLong(add->recovery);
    items[6] = eok_reply(add);
    result = PyTuple_New(7);
    for (int i = 0; i < 7; i++) {
        if (items[i] == NULL || result == NULL) {
            for (int j = 0; j < 7; j++) {
                Py_XDECREF(items[j]);
            }
            Py_XDECREF(result);
            return NULL;
        }
    }
    for (int i = 0; i < 7; i++) {
        PyTuple_SET_ITEM(result, i, items[i]); /* steals the reference */
    }
    return result;
}

static int
offset_arg(PyObject *arg, Py_ssize_t *offset)
{
    *offset = PyLong_AsSsize_t(arg);
    return !(*offset == -1 && PyErr_Occurred());
}

PyDoc_STRVAR(v3_add_doc,
"v3_add(buffer, start, end, /)\n--\n\n"
"A Java-shaped v3 add request in buffer[start:end] as (ledger_id, entry_id, master_key, body_start,\n"
"body_end, recovery, eok_reply), or None: wire_v3.v3_add_reference in C. ValueError unless\n"
"0 <= start <= end <= len(buffer).");

static PyObject *
v3_add(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t start, end;
    Add add;
    PyObject *result;

    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "v3_add expected 3 arguments, got %zd", nargs);
        return NULL;
    }
    if (!offset_arg(args[1], &start) || !offset_arg(args[2], &end)) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (start < 0 || start > end || end > view.len) {
        PyErr_Format(PyExc_ValueError, "v3_add: [%zd, %zd) is not inside a buffer of %zd bytes", start, end,
                     view.len);
        result = NULL;
    } else if (match_add((const unsigned char *)view.buf, start, end, &add)) {
        result = add_tuple((const unsigned char *)view.buf, &add);
    } else {
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef fastadd_methods[] = {
    {"v3_add", (PyCFunction)(void (*)(void))v3_add, METH_FASTCALL, v3_add_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastadd_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "bkctl.protocol._fastadd",
    .m_doc = "The v3 add fast path of wire_v3 in C (optional: the Python definitions are the reference).",
    .m_size = 0,
    .m_methods = fastadd_methods,
};

PyMODINIT_FUNC
PyInit__fastadd(void)
{
    return PyModuleDef_Init(&fastadd_module);
}
