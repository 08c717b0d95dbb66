/* The C core of dlperf's JPEG fast path (jpegroi.h), against libjpeg-turbo; no Python here.
 *
 * roi_decode_region decodes the image at scale scale_num/8 (DCT-domain scaling), then only the
 * rows y..y+h and, horizontally, only the iMCU columns that cover x..x+w (jpeg_crop_scanline):
 * rows above the region are skipped without IDCT or colour conversion (jpeg_skip_scanlines)
 * and rows below it are never decoded at all (issue #3: "decode only the crop's region").
 *
 * Restart-marker cut: skipped rows and columns still cost their entropy (Huffman) decoding,
 * the dominant cost (two thirds of a corpus image's decode, results/profile-decode.json), as a
 * Huffman stream can only be read from its start. Restart markers cut the stream into
 * intervals that each start afresh (DC predictors reset). When the intervals line up with MCU
 * rows, either k whole rows each or an even split of every row (what `dlperf data prepare`
 * writes, see roi_transcode), the decoder reads a new stream instead: the header with the
 * sub-image's width and height, then only the intervals that cover the region, markers
 * renumbered from RST0: a lossless crop in the compressed domain. Output is bit-identical to
 * decoding from the top: each interval depends only on its own data, except for fancy chroma
 * upsampling's one row/column of context on each side, which the cut keeps
 * (tests/test_data_restart.py). roi_cut_region returns that cut as a file of its own for
 * decoders that cannot crop (nvJPEG on the GPU path).
 *
 * roi_transcode rewrites a YCbCr or grayscale JPEG losslessly (same DCT coefficients and
 * quantisation tables, so the same decoded pixels) as baseline sequential with optimised
 * Huffman tables and restart markers splitting every MCU row evenly into intervals at most
 * column_px wide (the largest such divisor of the row's MCU count, at worst one MCU), keeping
 * APPn/COM markers (EXIF orientation, ICC profiles). Decoding such a file from the top is
 * slower (libjpeg-turbo leaves its fast Huffman path whenever markers exist), which the cut
 * repays (results/profile-decode.json).
 *
 * Safety rules (issue #10; tests/fuzz/fuzz_jpegroi.c holds every entry point to them under
 * AddressSanitizer and UndefinedBehaviorSanitizer):
 * - every libjpeg object lives in a zeroed job struct owned by the caller of the function that
 *   calls setjmp, so nothing read after a longjmp is an indeterminate local, and destroying an
 *   object that was never created is a no-op (its memory manager pointer is still NULL);
 * - one error manager set-up (roi_error_init) for every object: errors longjmp, and so do
 *   warnings (corrupt data), which the caller refuses anyway, so a damaged file stops at the
 *   first bad byte instead of decoding the rest of a possibly huge frame as grey;
 * - roi_transcode writes into a destination manager this file owns (libjpeg's jpeg_mem_dest
 *   frees its first buffer when it grows and reports the new one only at the end, which made
 *   the error path free a freed pointer: a crafted 100-byte file behind an 8 KB APP2 segment
 *   aborted `dlperf data prepare`);
 * - region arithmetic on caller-controlled values is done in 64 bits and clamped first;
 * - allocations are bounded by the input's size (a restart interval needs a marker: no more
 *   intervals than half the file's bytes), never by a header's claims alone.
 */
#include "jpegroi.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

struct roi_error {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

static void roi_error_exit(j_common_ptr cinfo) {
    struct roi_error *err = (struct roi_error *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void roi_emit_message(j_common_ptr cinfo, int level) {
    if (level < 0) { /* a warning: corrupt or truncated data, refused by every caller */
        struct roi_error *err = (struct roi_error *)cinfo->err;
        (*cinfo->err->format_message)(cinfo, err->message);
        longjmp(err->jump, 1);
    }
}

static void roi_output_message(j_common_ptr cinfo) { (void)cinfo; /* never print */ }

/* The one error-manager set-up, shared by every libjpeg object of a job. */
static struct jpeg_error_mgr *roi_error_init(struct roi_error *err) {
    memset(err, 0, sizeof(*err));
    jpeg_std_error(&err->pub);
    err->pub.error_exit = roi_error_exit;
    err->pub.emit_message = roi_emit_message;
    err->pub.output_message = roi_output_message;
    return &err->pub;
}

static void copy_message(char *dst, const struct roi_error *err, const char *fallback) {
    if (!dst) return;
    const char *src = err->message[0] ? err->message : fallback;
    size_t n = strlen(src);
    if (n >= ROI_MESSAGE_LEN) n = ROI_MESSAGE_LEN - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

static void set_message(char *dst, const char *text) {
    struct roi_error none;
    none.message[0] = 0;
    copy_message(dst, &none, text);
}

/* Where libjpeg's header reader stopped: the first byte of the scan's entropy-coded data. */
static size_t entropy_offset(j_decompress_ptr cinfo, const unsigned char *start) {
    return (size_t)(cinfo->src->next_input_byte - start);
}

/* Byte ranges of restart intervals first..last of the entropy data [p, end): interval i spans
 * [starts[i - first], ends[i - first]), its terminating RSTn marker excluded. Interval 0
 * starts at p; the image's final interval ends at the next non-RST marker (EOI). Returns 0 if
 * the data ends early or the markers are not numbered 0, 1, ..., 7, 0, ... */
static int find_intervals(const unsigned char *p, const unsigned char *end, unsigned long first,
                          unsigned long last, const unsigned char **starts,
                          const unsigned char **ends) {
    const unsigned char *begin = p; /* start of the current interval */
    unsigned long seen = 0;         /* markers passed = index of the current interval */
    while (p + 1 < end) {
        const unsigned char *ff = memchr(p, 0xFF, (size_t)(end - p - 1));
        if (!ff) return 0;
        unsigned char m = ff[1];
        if (m == 0x00 || m == 0xFF) { /* stuffed 0xFF data byte, or a fill byte */
            p = ff + 1 + (m == 0x00);
            continue;
        }
        int rst = m >= 0xD0 && m <= 0xD7;
        if (rst && (unsigned long)(m - 0xD0) != seen % 8) return 0;
        if (seen >= first) {
            starts[seen - first] = begin;
            ends[seen - first] = ff;
        }
        if (seen == last) return 1;
        if (!rst) return 0; /* EOI (or another marker) before the last interval */
        seen++;
        begin = p = ff + 2;
    }
    return 0;
}

/* Patch the frame header's height and width in the header bytes [0, len); 0 if no
 * baseline/extended sequential SOF is found there. */
static int patch_frame(unsigned char *buf, size_t len, unsigned int height, unsigned int width) {
    size_t i = 2;
    while (i + 4 <= len) {
        if (buf[i] != 0xFF) return 0;
        unsigned char m = buf[i + 1];
        if (m == 0xFF) { i++; continue; }
        size_t seg = ((size_t)buf[i + 2] << 8) | buf[i + 3];
        if (m == 0xC0 || m == 0xC1) {
            if (i + 9 > len) return 0;
            buf[i + 5] = (unsigned char)(height >> 8);
            buf[i + 6] = (unsigned char)(height & 0xFF);
            buf[i + 7] = (unsigned char)(width >> 8);
            buf[i + 8] = (unsigned char)(width & 0xFF);
            return 1;
        }
        if (m == 0xDA) return 0;
        i += 2 + seg;
    }
    return 0;
}

/* A stream (malloc'd, *out_len bytes) holding only the restart intervals that cover the output
 * region x, y, w, h at scale scale_num/8, or NULL when the file cannot be entered that way or
 * nothing would be saved. Intervals are whole MCU rows (a marker every k rows) or an even split
 * of each row (k markers per row): then the stream is also cut to the region's columns, a
 * lossless crop in the compressed domain. *rows_cut and *cols_cut receive the output rows and
 * columns the new stream leaves out at the top and left, *cut_h and *cut_w its full-scale size. */
static unsigned char *cut_stream(j_decompress_ptr cinfo, const unsigned char *data, size_t len,
                                  int scale_num, int x, int y, int w, int h, int fancy,
                                  size_t *out_len, int *rows_cut, int *cols_cut,
                                  unsigned int *cut_h, unsigned int *cut_w) {
    if (cinfo->restart_interval == 0 || cinfo->progressive_mode || cinfo->arith_code ||
        jpeg_has_multiple_scans(cinfo) || cinfo->comps_in_scan != cinfo->num_components)
        return NULL;
    unsigned long max_h = (unsigned long)cinfo->max_h_samp_factor;
    unsigned long max_v = (unsigned long)cinfo->max_v_samp_factor;
    if (cinfo->num_components == 1) max_h = max_v = 1; /* one block per MCU */
    unsigned long mcu_w = 8 * max_h, mcu_h = 8 * max_v; /* full-scale pixels */
    unsigned long mcus_per_row = (cinfo->image_width + mcu_w - 1) / mcu_w;
    unsigned long mcu_rows = (cinfo->image_height + mcu_h - 1) / mcu_h;
    unsigned long ri = cinfo->restart_interval, rows_per = 1, per_row = 1, cols_per = mcus_per_row;
    if (ri % mcus_per_row == 0) {
        rows_per = ri / mcus_per_row;
    } else if (mcus_per_row % ri == 0) {
        per_row = mcus_per_row / ri;
        cols_per = ri;
    } else {
        return NULL; /* intervals do not line up with rows */
    }
    /* the region in MCUs (output MCUs are max_h * scale_num by max_v * scale_num pixels) */
    unsigned long out_w = (cinfo->image_width * (unsigned long)scale_num + 7) / 8;
    unsigned long out_h = (cinfo->image_height * (unsigned long)scale_num + 7) / 8;
    if ((unsigned long)x >= out_w || (unsigned long)y >= out_h) return NULL;
    unsigned long x1 = (unsigned long)x + (unsigned long)w, y1 = (unsigned long)y + (unsigned long)h;
    if (x1 > out_w) x1 = out_w;
    if (y1 > out_h) y1 = out_h;
    unsigned long ow = max_h * (unsigned long)scale_num, oh = max_v * (unsigned long)scale_num;
    unsigned long row0 = (unsigned long)y / oh, row1 = (y1 + oh - 1) / oh;
    unsigned long col0 = (unsigned long)x / ow, col1 = (x1 + ow - 1) / ow;
    if (fancy) { /* fancy upsampling reads one chroma row/column of context on each side */
        if (row0 > 0) row0--;
        if (col0 > 0) col0--;
        if (row1 < mcu_rows) row1++;
        if (col1 < mcus_per_row) col1++;
    }
    unsigned long g0 = row0 / rows_per, g1 = (row1 + rows_per - 1) / rows_per; /* row groups */
    unsigned long c0 = col0 / cols_per, c1 = (col1 + cols_per - 1) / cols_per; /* columns */
    if (g0 == 0 && c0 == 0 && c1 == per_row) return NULL; /* nothing saved at the top or sides */
    unsigned long first = g0 * per_row + c0, last = (g1 - 1) * per_row + c1 - 1;
    size_t count = (size_t)(last - first + 1);
    /* every interval but the last ends at a 2-byte marker: a header claiming more intervals
     * than the data can hold is refused before anything is allocated for them */
    if (count > len / 2 + 1) return NULL;
    const unsigned char **starts = malloc(2 * count * sizeof(*starts));
    if (!starts) return NULL;
    const unsigned char **ends = starts + count;
    size_t head = entropy_offset(cinfo, data);
    unsigned char *buf = NULL;
    if (!find_intervals(data + head, data + len, first, last, starts, ends)) goto done;
    size_t total = head + 2;
    for (unsigned long g = g0; g < g1; g++)
        for (unsigned long c = c0; c < c1; c++) {
            size_t i = (size_t)(g * per_row + c - first);
            total += (size_t)(ends[i] - starts[i]) + 2;
        }
    unsigned long r0 = g0 * rows_per, r1 = g1 * rows_per;
    unsigned int new_h = (unsigned int)(r1 >= mcu_rows ? cinfo->image_height - r0 * mcu_h
                                                       : (r1 - r0) * mcu_h);
    unsigned int new_w = (unsigned int)(c1 == per_row ? cinfo->image_width - c0 * cols_per * mcu_w
                                                      : (c1 - c0) * cols_per * mcu_w);
    buf = malloc(total);
    if (!buf) goto done;
    memcpy(buf, data, head);
    if (!patch_frame(buf, head, new_h, new_w)) {
        free(buf);
        buf = NULL;
        goto done;
    }
    unsigned char *q = buf + head;
    unsigned int seq = 0;
    for (unsigned long g = g0; g < g1; g++)
        for (unsigned long c = c0; c < c1; c++) {
            size_t i = (size_t)(g * per_row + c - first);
            size_t n = (size_t)(ends[i] - starts[i]);
            memcpy(q, starts[i], n);
            q += n;
            *q++ = 0xFF; /* the next marker: RSTn renumbered from 0, EOI after the last */
            *q++ = (i + 1 == count) ? 0xD9 : (unsigned char)(0xD0 + seq++ % 8);
        }
    *out_len = (size_t)(q - buf);
    *rows_cut = (int)(r0 * oh);
    *cols_cut = (int)(c0 * cols_per * ow);
    *cut_h = new_h;
    *cut_w = new_w;
done:
    free((void *)starts);
    return buf;
}

/* ---- roi_decode_region ------------------------------------------------------------------ */

struct region_job {
    struct jpeg_decompress_struct cinfo; /* zeroed: destroying it uncreated is a no-op */
    struct roi_error err;
    unsigned char *cut_buf;
    const unsigned char *data;
    size_t len, out_len;
    int scale_num, x, y, w, h, fast;
    unsigned char *out;
    struct roi_region result;
};

static int region_run(struct region_job *j) {
    struct jpeg_decompress_struct *cinfo = &j->cinfo;
    cinfo->err = roi_error_init(&j->err);
    if (setjmp(j->err.jump)) return ROI_ERROR;
    jpeg_create_decompress(cinfo);
    jpeg_mem_src(cinfo, j->data, (unsigned long)j->len);
    jpeg_read_header(cinfo, TRUE);
    if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK)
        return ROI_CMYK;
    long long x = j->x, y = j->y, w = j->w, h = j->h; /* 64 bits: x + w cannot overflow */
    if (!(j->fast & 4)) { /* bit 2: never cut (benchmarks measure without) */
        size_t cut_len = 0;
        int rows = 0, cols = 0;
        unsigned int cut_h = 0, cut_w = 0;
        j->cut_buf = cut_stream(cinfo, j->data, j->len, j->scale_num, j->x, j->y, j->w, j->h,
                                !(j->fast & 2), &cut_len, &rows, &cols, &cut_h, &cut_w);
        if (j->cut_buf) { /* decode the shortened stream instead */
            jpeg_abort_decompress(cinfo);
            jpeg_mem_src(cinfo, j->cut_buf, (unsigned long)cut_len);
            jpeg_read_header(cinfo, TRUE);
            y -= rows;
            x -= cols;
            j->result.cut_rows = rows;
            j->result.cut_cols = cols;
        }
    }
    cinfo->out_color_space = JCS_RGB;
    cinfo->scale_num = (unsigned int)j->scale_num;
    cinfo->scale_denom = 8;
    /* fast: bit 0 = integer fast IDCT, bit 1 = plain (not fancy) chroma upsampling */
    cinfo->dct_method = (j->fast & 1) ? JDCT_IFAST : JDCT_ISLOW;
    cinfo->do_fancy_upsampling = (j->fast & 2) ? FALSE : TRUE;
    jpeg_start_decompress(cinfo);
    /* clamp the region to the scaled image: 0 <= x < width, 1 <= w <= width - x */
    long long ow = (long long)cinfo->output_width, oh = (long long)cinfo->output_height;
    if (ow < 1 || oh < 1) return ROI_ERROR;
    if (x < 0) x = 0;
    if (y < 0) y = 0;
    if (x >= ow) x = ow - 1;
    if (y >= oh) y = oh - 1;
    if (w > ow - x) w = ow - x;
    if (h > oh - y) h = oh - y;
    JDIMENSION xoff = (JDIMENSION)x, cw = (JDIMENSION)w;
    jpeg_crop_scanline(cinfo, &xoff, &cw);
    if ((unsigned long long)cw * 3 * (unsigned long long)h > (unsigned long long)j->out_len)
        return ROI_SMALL_BUFFER;
    if (y > 0) jpeg_skip_scanlines(cinfo, (JDIMENSION)y);
    JDIMENSION stop = (JDIMENSION)(y + h);
    JSAMPROW rows[32];
    while (cinfo->output_scanline < stop) {
        /* several rows per call: the upsamplers emit 2 rows (h2v2) at a time */
        JDIMENSION first = cinfo->output_scanline - (JDIMENSION)y;
        JDIMENSION left = stop - cinfo->output_scanline;
        JDIMENSION n = left < 32 ? left : 32;
        for (JDIMENSION i = 0; i < n; i++) rows[i] = j->out + (size_t)(first + i) * cw * 3;
        if (jpeg_read_scanlines(cinfo, rows, n) == 0) { /* cannot happen with a memory source */
            set_message(j->err.message, "decoder made no progress");
            return ROI_ERROR;
        }
    }
    j->result.decoded_width = (int)cw;
    j->result.x_shift = (int)(x - (long long)xoff);
    j->result.w = (int)w;
    j->result.h = (int)h;
    return ROI_OK; /* rows below the region are never decoded: destroy without finishing */
}

int roi_decode_region(const unsigned char *data, size_t len, int scale_num, int x, int y,
                      int w, int h, int fast, unsigned char *out, size_t out_len,
                      struct roi_region *result, char message[ROI_MESSAGE_LEN]) {
    if (!data || !out || scale_num < 1 || scale_num > 16 || x < 0 || y < 0 || w < 1 || h < 1) {
        set_message(message, "invalid scale or region");
        return ROI_ARGS;
    }
    struct region_job *j = calloc(1, sizeof(*j));
    if (!j) {
        set_message(message, "out of memory");
        return ROI_ERROR;
    }
    j->data = data, j->len = len, j->scale_num = scale_num, j->x = x, j->y = y, j->w = w;
    j->h = h, j->fast = fast, j->out = out, j->out_len = out_len;
    int status = region_run(j);
    jpeg_destroy_decompress(&j->cinfo);
    free(j->cut_buf);
    if (status == ROI_OK && result) *result = j->result;
    if (status == ROI_ERROR) copy_message(message, &j->err, "corrupt JPEG");
    if (status == ROI_SMALL_BUFFER) set_message(message, "output buffer too small");
    if (status == ROI_CMYK) set_message(message, "cmyk");
    free(j);
    return status;
}

/* ---- roi_cut_region --------------------------------------------------------------------- */

struct cut_job {
    struct jpeg_decompress_struct cinfo;
    struct roi_error err;
    const unsigned char *data;
    size_t len;
    int x, y, w, h;
    struct roi_cut cut;
};

static int cut_run(struct cut_job *j) {
    j->cinfo.err = roi_error_init(&j->err);
    if (setjmp(j->err.jump)) return ROI_ERROR;
    jpeg_create_decompress(&j->cinfo);
    jpeg_mem_src(&j->cinfo, j->data, (unsigned long)j->len);
    jpeg_read_header(&j->cinfo, TRUE);
    /* fancy = 1: keep one MCU of context on every side, enough for any chroma upsampler */
    j->cut.data = cut_stream(&j->cinfo, j->data, j->len, 8, j->x, j->y, j->w, j->h, 1,
                             &j->cut.len, &j->cut.rows_cut, &j->cut.cols_cut, &j->cut.height,
                             &j->cut.width);
    return j->cut.data ? ROI_OK : ROI_NOT_CUT;
}

int roi_cut_region(const unsigned char *data, size_t len, int x, int y, int w, int h,
                   struct roi_cut *cut, char message[ROI_MESSAGE_LEN]) {
    if (!data || !cut || x < 0 || y < 0 || w < 1 || h < 1) {
        set_message(message, "invalid region");
        return ROI_ARGS;
    }
    struct cut_job *j = calloc(1, sizeof(*j));
    if (!j) {
        set_message(message, "out of memory");
        return ROI_ERROR;
    }
    j->data = data, j->len = len, j->x = x, j->y = y, j->w = w, j->h = h;
    int status = cut_run(j);
    jpeg_destroy_decompress(&j->cinfo);
    if (status == ROI_OK) {
        *cut = j->cut;
    } else {
        free(j->cut.data); /* NULL unless a longjmp came after the cut (it cannot today) */
        if (status == ROI_ERROR) copy_message(message, &j->err, "corrupt JPEG");
    }
    free(j);
    return status;
}

/* ---- roi_transcode ---------------------------------------------------------------------- */

/* A growing output buffer the job owns: one pointer, freed in one place on every path. */
struct grow_dest {
    struct jpeg_destination_mgr pub;
    unsigned char *buf;
    size_t cap, len;
};

static void grow_init(j_compress_ptr cinfo) {
    struct grow_dest *d = (struct grow_dest *)cinfo->dest;
    if (!d->buf) {
        d->cap = 1 << 16;
        d->buf = malloc(d->cap);
        if (!d->buf) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 10);
    }
    d->pub.next_output_byte = d->buf;
    d->pub.free_in_buffer = d->cap;
}

static boolean grow_empty(j_compress_ptr cinfo) {
    /* called when the whole buffer is full: double it and carry on after the old end */
    struct grow_dest *d = (struct grow_dest *)cinfo->dest;
    size_t old = d->cap;
    if (old > ((size_t)-1) / 2) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 11);
    unsigned char *bigger = realloc(d->buf, 2 * old);
    if (!bigger) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 12); /* d->buf still owned and freed */
    d->buf = bigger;
    d->cap = 2 * old;
    d->pub.next_output_byte = d->buf + old;
    d->pub.free_in_buffer = d->cap - old;
    return TRUE;
}

static void grow_term(j_compress_ptr cinfo) {
    struct grow_dest *d = (struct grow_dest *)cinfo->dest;
    d->len = d->cap - d->pub.free_in_buffer;
}

struct transcode_job {
    struct jpeg_decompress_struct src; /* zeroed: destroying either uncreated is a no-op */
    struct jpeg_compress_struct dst;
    struct roi_error err; /* shared by both objects: one jump target, one message */
    struct grow_dest dest;
    const unsigned char *data;
    size_t len;
    int column_px, encoding;
};

static int transcode_run(struct transcode_job *j) {
    struct jpeg_error_mgr *em = roi_error_init(&j->err);
    j->src.err = em;
    j->dst.err = em;
    if (setjmp(j->err.jump)) {
        /* a coefficient that decodes but that baseline cannot code (a DC difference of
         * category > 11, say): the file is readable, only not rewritable */
        return j->encoding && j->err.pub.msg_code == JERR_BAD_DCT_COEF ? ROI_ENCODE : ROI_ERROR;
    }
    jpeg_create_decompress(&j->src);
    jpeg_mem_src(&j->src, j->data, (unsigned long)j->len);
    jpeg_save_markers(&j->src, JPEG_COM, 0xFFFF);
    for (int m = 0; m < 16; m++) jpeg_save_markers(&j->src, JPEG_APP0 + m, 0xFFFF);
    jpeg_read_header(&j->src, TRUE);
    if (j->src.jpeg_color_space != JCS_YCbCr && j->src.jpeg_color_space != JCS_GRAYSCALE)
        return ROI_CMYK;
    /* every coefficient entropy-decoded: a warning (corrupt data) has jumped out by now */
    jvirt_barray_ptr *coefs = jpeg_read_coefficients(&j->src);
    j->encoding = 1;
    jpeg_create_compress(&j->dst);
    jpeg_copy_critical_parameters(&j->src, &j->dst);
    j->dst.optimize_coding = TRUE;
    unsigned long mcu_w = j->src.num_components == 1 ? 8 : 8 * (unsigned long)j->src.max_h_samp_factor;
    unsigned long per_row = (j->src.image_width + mcu_w - 1) / mcu_w, every = per_row;
    if (j->column_px > 0) { /* the largest even split of a row at most column_px wide */
        for (every = per_row; every > 1; every--)
            if (per_row % every == 0 && every * mcu_w <= (unsigned long)j->column_px) break;
    }
    if (every > 65535) every = 65535; /* the DRI field is 16 bits (widths < 65536 cannot get here) */
    j->dst.restart_interval = (unsigned int)every;
    j->dest.pub.init_destination = grow_init;
    j->dest.pub.empty_output_buffer = grow_empty;
    j->dest.pub.term_destination = grow_term;
    j->dst.dest = &j->dest.pub;
    jpeg_write_coefficients(&j->dst, coefs);
    for (jpeg_saved_marker_ptr m = j->src.marker_list; m; m = m->next) {
        /* the library writes its own JFIF (APP0) and Adobe (APP14) headers */
        if (j->dst.write_JFIF_header && m->marker == JPEG_APP0 && m->data_length >= 5 &&
            memcmp(m->data, "JFIF", 5) == 0)
            continue;
        if (j->dst.write_Adobe_marker && m->marker == JPEG_APP0 + 14 && m->data_length >= 5 &&
            memcmp(m->data, "Adobe", 5) == 0)
            continue;
        jpeg_write_marker(&j->dst, m->marker, m->data, m->data_length);
    }
    jpeg_finish_compress(&j->dst);
    return ROI_OK;
}

int roi_transcode(const unsigned char *data, size_t len, int column_px, unsigned char **out,
                  size_t *out_len, char message[ROI_MESSAGE_LEN]) {
    if (!data || !out || !out_len || column_px < 0) {
        set_message(message, "column_px must be >= 0");
        return ROI_ARGS;
    }
    *out = NULL;
    *out_len = 0;
    struct transcode_job *j = calloc(1, sizeof(*j));
    if (!j) {
        set_message(message, "out of memory");
        return ROI_ERROR;
    }
    j->data = data, j->len = len, j->column_px = column_px;
    int status = transcode_run(j);
    jpeg_destroy_compress(&j->dst);
    jpeg_destroy_decompress(&j->src);
    if (status == ROI_OK) {
        *out = j->dest.buf;
        *out_len = j->dest.len;
    } else {
        free(j->dest.buf);
        if (status == ROI_ERROR || status == ROI_ENCODE)
            copy_message(message, &j->err, "corrupt JPEG");
    }
    free(j);
    return status;
}

/* ---- roi_jpeg_info: what dlperf.data.decode._jpeg_info_py reads, in C --------------------
 * The loader reads every sample's header under the GIL before it can draw the crop; in Python
 * that is ~10 us a file (~6 us through simplejpeg plus the EXIF walk), here ~1 us. Same rules
 * as the Python reader, which stays the reference (tests compare the two on mutated files):
 * marker segments from offset 2 up to SOS/EOI, fill bytes skipped, payload = the declared
 * length clamped to the file, the last JFIF/EXIF/Adobe/DRI/SOF segment wins, and a header
 * that ends before a start of scan is refused. */

static unsigned be16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

static unsigned rd16(const unsigned char *p, int little) {
    return little ? ((unsigned)p[1] << 8) | p[0] : be16(p);
}

static int tiff_orientation(const unsigned char *t, size_t n) {
    /* EXIF IFD0's orientation tag (0x0112, SHORT), 1 when absent or unreadable */
    if (n < 8) return 1;
    int little;
    if (t[0] == 'I' && t[1] == 'I') little = 1;
    else if (t[0] == 'M' && t[1] == 'M') little = 0;
    else return 1;
    size_t ifd = little ? ((size_t)t[7] << 24 | (size_t)t[6] << 16 | (size_t)t[5] << 8 | t[4])
                        : ((size_t)t[4] << 24 | (size_t)t[5] << 16 | (size_t)t[6] << 8 | t[7]);
    if (ifd > n || n - ifd < 2) return 1;
    unsigned count = rd16(t + ifd, little);
    for (unsigned i = 0; i < count; i++) {
        size_t at = ifd + 2 + 12 * (size_t)i;
        if (at > n || n - at < 4) return 1;
        unsigned tag = rd16(t + at, little), type = rd16(t + at + 2, little);
        if (tag == 0x0112 && type == 3) {
            if (n - at < 10) return 1;
            unsigned v = rd16(t + at + 8, little);
            return (v >= 1 && v <= 8) ? (int)v : 1;
        }
    }
    return 1;
}

static int is_sof(int m) {
    return (m >= 0xC0 && m <= 0xC3) || (m >= 0xC5 && m <= 0xC7) || (m >= 0xC9 && m <= 0xCB) ||
           (m >= 0xCD && m <= 0xCF);
}

const char *roi_jpeg_info(const unsigned char *d, size_t n, struct roi_info *info) {
    size_t pos = 2;
    int orientation = 1, adobe = -1, jfif = 0, sof = -1, scan = 0;
    unsigned restart = 0;
    const unsigned char *frame = NULL;
    size_t frame_len = 0;
    if (!d) return "no data";
    while (pos + 4 <= n) {
        if (d[pos] != 0xFF) return "no marker where one belongs";
        int m = d[pos + 1];
        if (m == 0xFF) { pos += 1; continue; }
        if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) { pos += 2; continue; }
        if (m == 0xDA || m == 0xD9) { scan = m == 0xDA; break; }
        size_t length = be16(d + pos + 2), end = pos + 2 + length;
        if (end > n) end = n;
        const unsigned char *seg = d + pos + 4;
        size_t len = end > pos + 4 ? end - (pos + 4) : 0;
        if (m == 0xE0 && len >= 5 && !memcmp(seg, "JFIF\0", 5)) jfif = 1;
        else if (m == 0xE1 && len >= 6 && !memcmp(seg, "Exif\0\0", 6))
            orientation = tiff_orientation(seg + 6, len - 6);
        else if (m == 0xEE && len >= 12 && !memcmp(seg, "Adobe", 5)) adobe = seg[11];
        else if (m == 0xDD && len >= 2) restart = be16(seg);
        else if (is_sof(m)) {
            if (len < 6) return "short frame header";
            sof = m, frame = seg, frame_len = len;
        }
        pos += 2 + length;
    }
    if (!frame) return "no frame header";
    if (!scan) return "no scan: truncated"; /* cut inside the header, or EOI first */
    int comps = frame[5], max_h = 0, max_v = 0, rgb_ids = comps == 3, specs = 0;
    for (int i = 0; i < comps && frame_len >= (size_t)(9 + 3 * i); i++, specs++) {
        const unsigned char *c = frame + 6 + 3 * i;
        if ((c[1] >> 4) > max_h) max_h = c[1] >> 4;
        if ((c[1] & 15) > max_v) max_v = c[1] & 15;
        if (i < 3 && c[0] != "RGB"[i]) rgb_ids = 0;
    }
    if (specs < 3) rgb_ids = 0;
    if (!specs) max_h = max_v = 1; /* max(..., default=1) */
    info->height = (int)be16(frame + 1);
    info->width = (int)be16(frame + 3);
    info->orientation = orientation;
    info->sof = sof;
    info->precision = frame[0];
    info->components = comps;
    info->ycc_or_gray = comps == 1 ||
                        (comps == 3 && (jfif || (adobe >= 0 ? adobe != 0 : !rgb_ids)));
    info->max_h = max_h;
    info->max_v = max_v;
    info->restart_interval = restart;
    return NULL;
}
