/* What miniz, the ZIP reader under torch.load, extracts from archives: an oracle for the
 * scanner's tests, never part of airlock. Built by scripts/miniz-reader.sh from the miniz
 * source of the miniz-sys crate.
 *
 * Reads archives on stdin, each an 8-byte little-endian length and then its bytes, and
 * writes for each one line per member and way of reading it, then a line ".":
 *   "I <error>"                    the archive does not open (mz_zip_reader_init, as torch)
 *   "mem <offset> ok <hex>"        mz_zip_reader_extract_to_mem into a buffer of the
 *   "mem <offset> err <error>"     member's uncompressed size (torch's getRecord)
 *   "iter <offset> ok <hex>"       mz_zip_reader_extract_iter_* (torch's chunked reading
 *   "iter <offset> err <error>"    of large records)
 * where <offset> is the member's local header offset. The archive is read through a read
 * callback, as torch's PyTorchStreamReader reads it (mz_zip_reader_init), not as one buffer
 * in memory: miniz takes other paths for the two. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "miniz.h"

/* Members larger than this are not extracted (the tests' archives are small). */
#define MOST (64u << 20)

static void hex(const unsigned char *p, size_t n) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        putchar(digits[p[i] >> 4]);
        putchar(digits[p[i] & 15]);
    }
}

static const char *why(mz_zip_archive *zip) {
    return mz_zip_get_error_string(mz_zip_get_last_error(zip));
}

static void by_memory(mz_zip_archive *zip, mz_uint i, const mz_zip_archive_file_stat *st) {
    unsigned long long off = (unsigned long long)st->m_local_header_ofs;
    if (st->m_uncomp_size > MOST) {
        printf("mem %llu err too large for the test\n", off);
        return;
    }
    size_t size = (size_t)st->m_uncomp_size;
    unsigned char *out = calloc(size ? size : 1, 1);
    if (!out)
        abort();
    if (mz_zip_reader_extract_to_mem(zip, i, out, size, 0)) {
        printf("mem %llu ok ", off);
        hex(out, size);
        putchar('\n');
    } else {
        printf("mem %llu err %s\n", off, why(zip));
    }
    free(out);
}

static void by_chunks(mz_zip_archive *zip, mz_uint i, const mz_zip_archive_file_stat *st) {
    unsigned long long off = (unsigned long long)st->m_local_header_ofs;
    mz_zip_reader_extract_iter_state *it = mz_zip_reader_extract_iter_new(zip, i, 0);
    if (!it) {
        printf("iter %llu err %s\n", off, why(zip));
        return;
    }
    size_t cap = 4096, len = 0;
    unsigned char *out = malloc(cap);
    if (!out)
        abort();
    for (;;) {
        if (len == cap) {
            if (cap >= MOST)
                break;
            cap *= 2;
            out = realloc(out, cap);
            if (!out)
                abort();
        }
        size_t n = mz_zip_reader_extract_iter_read(it, out + len, cap - len);
        if (n == 0)
            break;
        len += n;
    }
    if (mz_zip_reader_extract_iter_free(it)) {
        printf("iter %llu ok ", off);
        hex(out, len);
        putchar('\n');
    } else {
        printf("iter %llu err %s\n", off, why(zip));
    }
    free(out);
}

struct buffer {
    const unsigned char *data;
    size_t len;
};

static size_t read_at(void *opaque, mz_uint64 at, void *out, size_t n) {
    const struct buffer *b = opaque;
    if (at >= b->len)
        return 0;
    if (n > b->len - at)
        n = b->len - at;
    memcpy(out, b->data + at, n);
    return n;
}

int main(void) {
    unsigned char head[8];
    while (fread(head, 1, 8, stdin) == 8) {
        uint64_t n = 0;
        for (int k = 7; k >= 0; k--)
            n = n << 8 | head[k];
        unsigned char *data = malloc(n ? n : 1);
        if (!data || fread(data, 1, n, stdin) != n)
            return 1;
        struct buffer buf = {data, (size_t)n};
        mz_zip_archive zip;
        memset(&zip, 0, sizeof zip);
        zip.m_pRead = read_at;
        zip.m_pIO_opaque = &buf;
        if (!mz_zip_reader_init(&zip, n, 0)) {
            printf("I %s\n", why(&zip));
        } else {
            mz_uint count = mz_zip_reader_get_num_files(&zip);
            for (mz_uint i = 0; i < count; i++) {
                mz_zip_archive_file_stat st;
                if (!mz_zip_reader_file_stat(&zip, i, &st)) {
                    printf("mem ? err %s\n", why(&zip));
                    continue;
                }
                if (st.m_is_directory)
                    continue;
                by_memory(&zip, i, &st);
                by_chunks(&zip, i, &st);
            }
            mz_zip_reader_end(&zip);
        }
        puts(".");
        fflush(stdout);
        free(data);
    }
    return 0;
}
