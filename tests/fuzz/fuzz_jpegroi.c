/* Fuzz every entry point of dlperf's JPEG core (dlperf/data/jpegroi.c) on mutated real JPEGs
 * and crafted cases, built with AddressSanitizer and UndefinedBehaviorSanitizer (issue #10).
 *
 *   gcc -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all -Idlperf/data \
 *       tests/fuzz/fuzz_jpegroi.c dlperf/data/jpegroi.c -ljpeg -o fuzz_jpegroi
 *   ./fuzz_jpegroi [--seconds S] [--iterations N] [--seed K] FILE...
 *
 * Every FILE is first run as it is (seeds and regression cases), then each iteration takes a
 * random seed file, applies one to four mutators and runs the result through jpeg_info,
 * decode_region (several scales, regions from ordinary to hostile: INT_MAX widths, regions
 * past the image), cut_region (and a decode of the cut), and transcode (and a decode, cut and
 * header read of the rewritten file, so the restart-marker paths see hostile input too). Each
 * input is an exact-size heap copy, so reading one byte past it is caught; output buffers are
 * exactly the size the entry point is told. A sanitizer report ends the run with a non-zero
 * status; at the end a line per entry point says how often it succeeded, so a harness that
 * only ever exercises the header checks shows as such (tests/test_fuzz_native.py checks it).
 *
 * Mutators (what the issue asks for): scan-byte flips; random byte overwrites; header field
 * edits (frame height/width/precision/component count/sampling factors, segment lengths);
 * truncation; degenerate Huffman tables (no codes, an over-full code space, 255 codes of
 * length 16, DC symbols above 15); out-of-range coefficients (Huffman symbols remapped to the
 * largest categories); restart markers spliced into the scan and DRI segments inserted; large
 * APPn segments (up to 64 KB, several); segment deletion and duplication; splicing two files.
 *
 * With -DLIBFUZZER the same exercise is LLVMFuzzerTestOneInput for clang's libFuzzer.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jpegroi.h"

/* ---- deterministic random numbers (xorshift64*) ------------------------------------------ */
static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}
static uint64_t seed_state(uint64_t seed) { /* SplitMix64: never the all-zero state */
    uint64_t z = seed + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z ? z : 1;
}
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* ---- what the entry points returned ----------------------------------------------------- */
enum { E_INFO, E_DECODE, E_CUT, E_TRANSCODE, E_RESTART_DECODE, E_COUNT };
static const char *entry_names[E_COUNT] = {"jpeg_info", "decode_region", "cut_region",
                                           "transcode", "decode_transcoded"};
static unsigned long calls[E_COUNT], successes[E_COUNT];

static void note(int entry, int ok) {
    calls[entry]++;
    successes[entry] += ok != 0;
}

static int hostile_coordinate(int size) {
    switch (below(8)) {
    case 0: return 0;
    case 1: return INT_MAX;
    case 2: return INT_MAX - (int)below(64);
    case 3: return size > 0 ? size - 1 : 0;
    case 4: return size + (int)below(64);
    default: return size > 1 ? (int)below((size_t)size) : 0;
    }
}

static int hostile_extent(int size) {
    switch (below(8)) {
    case 0: return 1;
    case 1: return INT_MAX;
    case 2: return size + 1 + (int)below(64);
    default: return 1 + (size > 1 ? (int)below((size_t)size) : 0);
    }
}

static void decode_once(const unsigned char *data, size_t len, int height, int width, int entry) {
    static const int scales[] = {1, 2, 4, 8, 3, 16};
    int scale = scales[below(6)];
    int sw = (int)(((long long)width * scale + 7) / 8), sh = (int)(((long long)height * scale + 7) / 8);
    int x, y, w, h;
    if (below(3) == 0) { /* the whole (scaled) image */
        x = y = 0;
        w = sw > 0 ? sw : 1;
        h = sh > 0 ? sh : 1;
    } else {
        x = hostile_coordinate(sw), y = hostile_coordinate(sh);
        w = hostile_extent(sw), h = hostile_extent(sh);
    }
    /* what the loader allocates, capped at 32 MB: a larger region must be refused, not
     * written past the buffer */
    unsigned long long want = (unsigned long long)(h < 4096 ? h : 4096) *
                              ((unsigned long long)(w < 4096 ? w : 4096) + 64) * 3;
    if (below(8) == 0) want /= 2; /* sometimes too small on purpose */
    if (want > (32u << 20)) want = 32u << 20;
    if (want == 0) want = 1;
    unsigned char *out = malloc((size_t)want);
    if (!out) return;
    struct roi_region r;
    char message[ROI_MESSAGE_LEN];
    int status = roi_decode_region(data, len, scale, x, y, w, h, (int)below(8), out, (size_t)want,
                                   &r, message);
    if (status == ROI_OK) { /* the promise the Python side relies on */
        if (r.w < 1 || r.h < 1 || r.x_shift < 0 || r.x_shift + r.w > r.decoded_width ||
            (unsigned long long)r.decoded_width * 3 * (unsigned long long)r.h > want) {
            fprintf(stderr, "decode_region returned an inconsistent region\n");
            abort();
        }
    }
    note(entry, status == ROI_OK);
    free(out);
}

static unsigned char *exact_copy(const unsigned char *data, size_t len) {
    unsigned char *copy = malloc(len ? len : 1);
    if (copy && len) memcpy(copy, data, len);
    return copy;
}

/* Every entry point on one input (an exact-size heap copy is made by the caller). */
static void exercise(const unsigned char *data, size_t len) {
    struct roi_info info;
    const char *why = roi_jpeg_info(data, len, &info);
    note(E_INFO, why == NULL);
    int height = why ? 64 : info.height, width = why ? 64 : info.width;
    for (int k = 0; k < 2; k++) decode_once(data, len, height, width, E_DECODE);

    struct roi_cut cut;
    char message[ROI_MESSAGE_LEN];
    int status = roi_cut_region(data, len, hostile_coordinate(width), hostile_coordinate(height),
                                hostile_extent(width), hostile_extent(height), &cut, message);
    note(E_CUT, status == ROI_OK);
    if (status == ROI_OK) {
        unsigned char *part = exact_copy(cut.data, cut.len);
        free(cut.data);
        if (part) {
            decode_once(part, cut.len, (int)cut.height, (int)cut.width, E_RESTART_DECODE);
            free(part);
        }
    }

    static const int columns[] = {0, 8, 16, 32, 64, INT_MAX};
    unsigned char *out = NULL;
    size_t out_len = 0;
    status = roi_transcode(data, len, columns[below(6)], &out, &out_len, message);
    note(E_TRANSCODE, status == ROI_OK);
    if (status == ROI_OK) {
        unsigned char *copy = exact_copy(out, out_len);
        free(out);
        if (copy) {
            struct roi_info again;
            if (roi_jpeg_info(copy, out_len, &again) == NULL) height = again.height, width = again.width;
            decode_once(copy, out_len, height, width, E_RESTART_DECODE);
            if (roi_cut_region(copy, out_len, hostile_coordinate(width), hostile_coordinate(height),
                               hostile_extent(width), hostile_extent(height), &cut,
                               message) == ROI_OK)
                free(cut.data);
            free(copy);
        }
    } else if (out) {
        fprintf(stderr, "transcode failed but returned a buffer\n");
        abort();
    }
}

/* ---- mutators ------------------------------------------------------------------------------
 * Each edits buf[0..*len) in place (capacity cap) and may change *len. */

/* Offset of the first segment with this marker (its 0xFF), or 0. */
static size_t find_marker(const unsigned char *b, size_t len, int marker) {
    size_t pos = 2;
    while (pos + 4 <= len && b[pos] == 0xFF) {
        int m = b[pos + 1];
        if (m == marker) return pos;
        if (m == 0xD8 || m == 0xFF || (m >= 0xD0 && m <= 0xD7)) { pos += m == 0xFF ? 1 : 2; continue; }
        if (m == 0xDA || m == 0xD9) return 0;
        pos += 2 + (((size_t)b[pos + 2] << 8) | b[pos + 3]);
    }
    return 0;
}

/* Start of the entropy-coded data of the first scan, or len. */
static size_t scan_start(const unsigned char *b, size_t len) {
    size_t pos = 2;
    while (pos + 4 <= len && b[pos] == 0xFF) {
        int m = b[pos + 1];
        if (m == 0xD8 || m == 0xFF || (m >= 0xD0 && m <= 0xD7)) { pos += m == 0xFF ? 1 : 2; continue; }
        size_t seg = 2 + (((size_t)b[pos + 2] << 8) | b[pos + 3]);
        if (m == 0xDA) return pos + seg < len ? pos + seg : len;
        if (m == 0xD9) return len;
        pos += seg;
    }
    return len;
}

static int insert(unsigned char *b, size_t *len, size_t cap, size_t at, const unsigned char *what,
                  size_t n) {
    if (*len + n > cap || at > *len) return 0;
    memmove(b + at + n, b + at, *len - at);
    memcpy(b + at, what, n);
    *len += n;
    return 1;
}

static void m_scan_flip(unsigned char *b, size_t *len, size_t cap) {
    (void)cap;
    size_t s = scan_start(b, *len);
    if (s >= *len) return;
    for (size_t k = 1 + below(8); k; k--) b[s + below(*len - s)] ^= (unsigned char)(1u << below(8));
}

static void m_overwrite(unsigned char *b, size_t *len, size_t cap) {
    (void)cap;
    for (size_t k = 1 + below(16); k && *len; k--) b[below(*len)] = (unsigned char)rnd();
}

static void m_frame_field(unsigned char *b, size_t *len, size_t cap) {
    (void)cap;
    static const int sofs[] = {0xC0, 0xC1, 0xC2};
    size_t at = find_marker(b, *len, sofs[below(3)]);
    if (!at) at = find_marker(b, *len, 0xC0);
    if (!at) at = find_marker(b, *len, 0xC2);
    if (!at || at + 19 > *len) return;
    static const unsigned sizes[] = {0, 1, 7, 8, 9, 15, 16, 17, 255, 256, 4095, 65535};
    unsigned v = below(4) ? sizes[below(12)] : (unsigned)below(65536);
    switch (below(6)) {
    case 0: b[at + 5] = (unsigned char)(v >> 8), b[at + 6] = (unsigned char)v; break; /* height */
    case 1: b[at + 7] = (unsigned char)(v >> 8), b[at + 8] = (unsigned char)v; break; /* width */
    case 2: b[at + 4] = (unsigned char[]){0, 8, 12, 16, 255}[below(5)]; break; /* precision */
    case 3: b[at + 9] = (unsigned char[]){0, 1, 2, 3, 4, 255}[below(6)]; break; /* components */
    case 4: b[at + 11 + 3 * below(3)] = (unsigned char)rnd(); break; /* sampling factors */
    default: b[at + 12 + 3 * below(3)] = (unsigned char)below(6); break; /* quant table id */
    }
}

static void m_segment_length(unsigned char *b, size_t *len, size_t cap) {
    (void)cap;
    static const int markers[] = {0xC0, 0xC2, 0xC4, 0xDB, 0xDA, 0xDD, 0xE0, 0xE1, 0xEE};
    size_t at = find_marker(b, *len, markers[below(9)]);
    if (!at || at + 4 > *len) return;
    size_t old = ((size_t)b[at + 2] << 8) | b[at + 3];
    size_t v = (size_t[]){0, 1, 2, 3, old - 1, old + 1, 65535, below(65536)}[below(8)];
    b[at + 2] = (unsigned char)(v >> 8);
    b[at + 3] = (unsigned char)v;
}

static void m_truncate(unsigned char *b, size_t *len, size_t cap) {
    (void)b, (void)cap;
    if (*len > 2) *len = 2 + below(*len - 2);
}

static void m_huffman(unsigned char *b, size_t *len, size_t cap) {
    (void)cap;
    size_t at = find_marker(b, *len, 0xC4);
    if (!at || at + 21 > *len) return;
    unsigned char *counts = b + at + 5; /* one table: class/id, 16 counts, symbols */
    switch (below(5)) {
    case 0: memset(counts, 0, 16); break;                     /* no codes at all */
    case 1: counts[0] = 3; break;                             /* 3 codes of length 1 */
    case 2: memset(counts, 0, 16), counts[15] = 255; break;   /* 255 codes of length 16 */
    case 3: for (int i = 0; i < 16; i++) counts[i] = 0xFF; break; /* sum far past 256 */
    default: { /* symbols remapped: DC categories above 15, AC sizes above 10 */
        size_t n = 0;
        for (int i = 0; i < 16; i++) n += counts[i];
        unsigned char *sym = counts + 16;
        for (size_t i = 0; i < n && sym + i < b + *len; i++)
            if (below(2)) sym[i] = (unsigned char)(b[at + 4] & 0x10 ? 0xF0 | below(16) : 11 + below(8));
    }
    }
}

static void m_big_coefficients(unsigned char *b, size_t *len, size_t cap) {
    /* valid-looking tables whose symbols are the largest categories: every decoded value is
     * out of the range baseline allows (the class of the double-free file) */
    (void)cap;
    size_t at = find_marker(b, *len, 0xC4);
    if (!at || at + 21 > *len) return;
    size_t n = 0;
    for (int i = 0; i < 16; i++) n += b[at + 5 + i];
    unsigned char *sym = b + at + 21;
    int dc = !(b[at + 4] & 0x10);
    for (size_t i = 0; i < n && sym + i < b + *len; i++)
        sym[i] = dc ? (unsigned char)(11 + below(5)) : (unsigned char)((below(16) << 4) | (10 + below(6)));
}

static void m_restart(unsigned char *b, size_t *len, size_t cap) {
    if (below(2)) { /* an RSTn marker spliced into the scan */
        size_t s = scan_start(b, *len);
        if (s >= *len) return;
        unsigned char rst[2] = {0xFF, (unsigned char)(0xD0 + below(8))};
        insert(b, len, cap, s + below(*len - s), rst, 2);
    } else { /* a DRI segment before the scan */
        size_t sos = find_marker(b, *len, 0xDA);
        if (!sos) return;
        unsigned v = (unsigned[]){0, 1, 2, 3, 7, 8, 16, 65535}[below(8)];
        unsigned char dri[6] = {0xFF, 0xDD, 0, 4, (unsigned char)(v >> 8), (unsigned char)v};
        insert(b, len, cap, sos, dri, 6);
    }
}

static void m_big_app(unsigned char *b, size_t *len, size_t cap) {
    for (size_t k = 1 + below(3); k; k--) {
        size_t n = 16 + below(65533 - 16); /* payload; the length field counts itself too */
        unsigned char *seg = malloc(n + 4);
        if (!seg) return;
        seg[0] = 0xFF, seg[1] = (unsigned char)(0xE0 + below(16));
        seg[2] = (unsigned char)((n + 2) >> 8), seg[3] = (unsigned char)(n + 2);
        for (size_t i = 0; i < n; i++) seg[4 + i] = (unsigned char)rnd();
        if (seg[1] == 0xE1 && below(2)) memcpy(seg + 4, "Exif\0\0MM\0\x2a\0\0\0\x08", 14);
        if (seg[1] == 0xE2 && below(2)) memcpy(seg + 4, "ICC_PROFILE\0", 12);
        insert(b, len, cap, 2, seg, n + 4);
        free(seg);
    }
}

static void m_segments(unsigned char *b, size_t *len, size_t cap) {
    static const int markers[] = {0xC4, 0xDB, 0xC0, 0xDD, 0xE0};
    size_t at = find_marker(b, *len, markers[below(5)]);
    if (!at || at + 4 > *len) return;
    size_t n = 2 + (((size_t)b[at + 2] << 8) | b[at + 3]);
    if (at + n > *len) return;
    if (below(2)) { /* delete it */
        memmove(b + at, b + at + n, *len - at - n);
        *len -= n;
    } else { /* duplicate it */
        unsigned char *copy = malloc(n);
        if (!copy) return;
        memcpy(copy, b + at, n);
        insert(b, len, cap, at, copy, n);
        free(copy);
    }
}

static unsigned char **seeds;
static size_t *seed_lens, seed_count;

static void m_splice(unsigned char *b, size_t *len, size_t cap) {
    size_t other = below(seed_count);
    if (!seed_lens[other]) return;
    size_t cut = below(*len + 1), from = below(seed_lens[other]);
    size_t n = seed_lens[other] - from;
    if (cut + n > cap) n = cap - cut;
    memcpy(b + cut, seeds[other] + from, n);
    *len = cut + n;
}

typedef void (*mutator)(unsigned char *, size_t *, size_t);
static const mutator mutators[] = {m_scan_flip, m_scan_flip,      m_overwrite, m_frame_field,
                                   m_segment_length, m_truncate,  m_huffman,   m_big_coefficients,
                                   m_restart,   m_restart,        m_big_app,   m_segments,
                                   m_splice};
#define N_MUTATORS (sizeof(mutators) / sizeof(mutators[0]))

#ifdef LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rng_state = seed_state(size); /* regions depend on the input only */
    exercise(data, size);
    return 0;
}
#else
static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            unsigned char *bigger = realloc(buf, cap *= 2);
            if (!bigger) { free(buf); buf = NULL; }
            else buf = bigger;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

int main(int argc, char **argv) {
    double seconds = 60;
    unsigned long iterations = ULONG_MAX;
    int first_file = 1;
    for (; first_file < argc && argv[first_file][0] == '-'; first_file += 2) {
        if (first_file + 1 >= argc) break;
        const char *flag = argv[first_file], *value = argv[first_file + 1];
        if (!strcmp(flag, "--seconds")) seconds = atof(value);
        else if (!strcmp(flag, "--iterations")) iterations = strtoul(value, NULL, 10);
        else if (!strcmp(flag, "--seed")) rng_state = seed_state(strtoull(value, NULL, 10));
        else { fprintf(stderr, "unknown flag %s\n", flag); return 2; }
    }
    seed_count = (size_t)(argc - first_file);
    if (!seed_count) {
        fprintf(stderr, "usage: %s [--seconds S] [--iterations N] [--seed K] FILE...\n", argv[0]);
        return 2;
    }
    seeds = calloc(seed_count, sizeof(*seeds));
    seed_lens = calloc(seed_count, sizeof(*seed_lens));
    size_t largest = 0;
    for (size_t i = 0; i < seed_count; i++) {
        seeds[i] = read_file(argv[first_file + i], &seed_lens[i]);
        if (!seeds[i]) { fprintf(stderr, "cannot read %s\n", argv[first_file + i]); return 2; }
        if (seed_lens[i] > largest) largest = seed_lens[i];
        unsigned char *copy = exact_copy(seeds[i], seed_lens[i]);
        exercise(copy, seed_lens[i]); /* every file as it is first: seeds and regressions */
        free(copy);
    }
    size_t cap = 2 * largest + 4 * 65540;
    unsigned char *buf = malloc(cap);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long done = 0;
    while (done < iterations) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec) >= seconds)
            break;
        size_t s = below(seed_count), len = seed_lens[s];
        memcpy(buf, seeds[s], len);
        for (size_t k = 1 + below(4); k; k--) mutators[below(N_MUTATORS)](buf, &len, cap);
        unsigned char *copy = exact_copy(buf, len);
        if (!copy) break;
        exercise(copy, len);
        free(copy);
        done++;
    }
    printf("iterations %lu\n", done);
    for (int e = 0; e < E_COUNT; e++)
        printf("%s calls %lu ok %lu\n", entry_names[e], calls[e], successes[e]);
    free(buf);
    for (size_t i = 0; i < seed_count; i++) free(seeds[i]);
    free(seeds);
    free(seed_lens);
    return 0;
}
#endif
