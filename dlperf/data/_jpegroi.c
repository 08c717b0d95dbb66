/* Region-of-interest JPEG decoding with libjpeg-turbo (issue #3: "decode only the crop's region").
 *
 * decode_region(data, scale_num, x, y, w, h, fast, out) decodes the image at scale scale_num/8
 * (DCT-domain scaling), then only the rows y..y+h and, horizontally, only the iMCU columns that
 * cover x..x+w (jpeg_crop_scanline): rows above the region are skipped without IDCT or colour
 * conversion (jpeg_skip_scanlines) and rows below it are never decoded at all. Coordinates are
 * in the scaled image. RGB rows are written packed into `out` (a writable buffer of at least
 * h * (w + 64) * 3 bytes); returns (decoded_width, x_shift, w, h, cut_rows, cut_cols): the
 * region (w x h after clamping) starts x_shift pixels into each decoded row of decoded_width.
 *
 * Restart-marker cut: skipped rows and columns still cost their entropy (Huffman) decoding,
 * the dominant cost (two thirds of a corpus image's decode, results/profile-decode.json), as a
 * Huffman stream can only be read from its start. Restart markers cut the stream into
 * intervals that each start afresh (DC predictors reset). When the intervals line up with MCU
 * rows, either k whole rows each or an even split of every row (what `dlperf data prepare`
 * writes, see transcode()), the decoder reads a new stream instead: the header with the
 * sub-image's width and height, then only the intervals that cover the region, markers
 * renumbered from RST0: a lossless crop in the compressed domain. cut_rows and cut_cols are
 * the output rows and columns left out at the top and left (0, 0 without usable markers).
 * Output is bit-identical to decoding from the top: each interval depends only on its own
 * data, except for fancy chroma upsampling's one row/column of context on each side, which
 * the cut keeps (tests/test_data_restart.py).
 *
 * cut_region(data, x, y, w, h) returns that cut as a JPEG file of its own, at full scale and
 * with one MCU of context kept on every side of the region, for decoders that cannot crop
 * (nvJPEG on the GPU path): (bytes, rows_cut, cols_cut, height, width), or None where the file
 * cannot be cut.
 *
 * transcode(data, column_px) rewrites a YCbCr or grayscale JPEG losslessly (same DCT
 * coefficients and quantisation tables, so the same decoded pixels) as baseline sequential with
 * optimised Huffman tables and restart markers splitting every MCU row evenly into intervals
 * at most column_px wide (the largest such divisor of the row's MCU count, at worst one MCU;
 * column_px 0: one interval per row), keeping APPn/COM markers (EXIF orientation, ICC
 * profiles). Returns None for other colour spaces. Decoding such a file from the top is slower
 * (libjpeg-turbo leaves its fast Huffman path whenever markers exist: 883 vs 851 us per crop
 * in results/profile-decode.json), which the cut repays (567 us).
 *
 * The GIL is released for the whole decode. Errors and libjpeg warnings (corrupt data) raise
 * ValueError; CMYK/YCCK images raise ValueError("cmyk") so the caller can use Pillow.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>

struct roi_error {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int warned;
    char message[JMSG_LENGTH_MAX];
};

static void roi_error_exit(j_common_ptr cinfo) {
    struct roi_error *err = (struct roi_error *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void roi_emit_message(j_common_ptr cinfo, int level) {
    struct roi_error *err = (struct roi_error *)cinfo->err;
    if (level < 0 && !err->warned) { /* a warning: corrupt or truncated data */
        err->warned = 1;
        (*cinfo->err->format_message)(cinfo, err->message);
    }
}

enum { ROI_OK = 0, ROI_ERROR = 1, ROI_CMYK = 2, ROI_SMALL_BUFFER = 3, ROI_WARNING = 4 };

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

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    int scale_num, x, y, w, h, fast;
    if (!PyArg_ParseTuple(args, "y*iiiiiiw*", &data, &scale_num, &x, &y, &w, &h, &fast, &out))
        return NULL;
    if (scale_num < 1 || scale_num > 16 || x < 0 || y < 0 || w < 1 || h < 1) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "invalid scale or region");
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    struct roi_error err;
    volatile int status = ROI_OK;
    JDIMENSION xoff = 0, cw = 0;
    unsigned char *volatile cut_buf = NULL;
    volatile int cut_rows = 0, cut_cols = 0;
    memset(&err, 0, sizeof(err));

    Py_BEGIN_ALLOW_THREADS
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = roi_error_exit;
    err.pub.emit_message = roi_emit_message;
    if (setjmp(err.jump)) {
        status = ROI_ERROR;
    } else {
        jpeg_create_decompress(&cinfo);
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_read_header(&cinfo, TRUE);
        if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
            status = ROI_CMYK;
        } else {
            size_t cut_len = 0;
            int rows = 0, cols = 0;
            unsigned int cut_h = 0, cut_w = 0;
            if (!(fast & 4)) /* bit 2: never cut (benchmarks measure without) */
                cut_buf = cut_stream(&cinfo, (const unsigned char *)data.buf, (size_t)data.len,
                                     scale_num, x, y, w, h, !(fast & 2), &cut_len, &rows, &cols,
                                     &cut_h, &cut_w);
            if (cut_buf) { /* decode the shortened stream instead */
                jpeg_abort_decompress(&cinfo);
                jpeg_mem_src(&cinfo, cut_buf, (unsigned long)cut_len);
                jpeg_read_header(&cinfo, TRUE);
                y -= rows;
                x -= cols;
                cut_rows = rows;
                cut_cols = cols;
            }
            cinfo.out_color_space = JCS_RGB;
            cinfo.scale_num = (unsigned int)scale_num;
            cinfo.scale_denom = 8;
            /* fast: bit 0 = integer fast IDCT, bit 1 = plain (not fancy) chroma upsampling */
            cinfo.dct_method = (fast & 1) ? JDCT_IFAST : JDCT_ISLOW;
            cinfo.do_fancy_upsampling = (fast & 2) ? FALSE : TRUE;
            jpeg_start_decompress(&cinfo);
            /* clamp the region to the scaled image */
            if ((JDIMENSION)x >= cinfo.output_width) x = (int)cinfo.output_width - 1;
            if ((JDIMENSION)y >= cinfo.output_height) y = (int)cinfo.output_height - 1;
            if ((JDIMENSION)(x + w) > cinfo.output_width) w = (int)cinfo.output_width - x;
            if ((JDIMENSION)(y + h) > cinfo.output_height) h = (int)cinfo.output_height - y;
            xoff = (JDIMENSION)x;
            cw = (JDIMENSION)w;
            jpeg_crop_scanline(&cinfo, &xoff, &cw);
            if ((Py_ssize_t)cw * 3 * h > out.len) {
                status = ROI_SMALL_BUFFER;
            } else {
                if (y > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
                unsigned char *base = (unsigned char *)out.buf;
                JSAMPROW rows[32];
                while (cinfo.output_scanline < (JDIMENSION)(y + h)) {
                    /* several rows per call: the upsamplers emit 2 rows (h2v2) at a time */
                    JDIMENSION first = cinfo.output_scanline - (JDIMENSION)y;
                    JDIMENSION left = (JDIMENSION)(y + h) - cinfo.output_scanline;
                    JDIMENSION n = left < 32 ? left : 32;
                    for (JDIMENSION i = 0; i < n; i++) rows[i] = base + (size_t)(first + i) * cw * 3;
                    jpeg_read_scanlines(&cinfo, rows, n);
                }
            }
        }
        jpeg_abort_decompress(&cinfo); /* stop here: rows below the region are never decoded */
    }
    jpeg_destroy_decompress(&cinfo);
    free(cut_buf);
    if (status == ROI_OK && err.warned) status = ROI_WARNING;
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    switch (status) {
    case ROI_OK:
        return Py_BuildValue("(iiiiii)", (int)cw, x - (int)xoff, w, h, (int)cut_rows,
                             (int)cut_cols);
    case ROI_CMYK:
        PyErr_SetString(PyExc_ValueError, "cmyk");
        return NULL;
    case ROI_SMALL_BUFFER:
        PyErr_SetString(PyExc_ValueError, "output buffer too small");
        return NULL;
    default:
        PyErr_SetString(PyExc_ValueError, err.message[0] ? err.message : "corrupt JPEG");
        return NULL;
    }
}

static PyObject *cut_region(PyObject *self, PyObject *args) {
    Py_buffer data;
    int x, y, w, h;
    if (!PyArg_ParseTuple(args, "y*iiii", &data, &x, &y, &w, &h)) return NULL;
    if (x < 0 || y < 0 || w < 1 || h < 1) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "invalid region");
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    struct roi_error err;
    unsigned char *volatile buf = NULL;
    size_t len = 0;
    int rows = 0, cols = 0;
    unsigned int height = 0, width = 0;
    memset(&err, 0, sizeof(err));

    Py_BEGIN_ALLOW_THREADS
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = roi_error_exit;
    err.pub.emit_message = roi_emit_message;
    if (!setjmp(err.jump)) {
        jpeg_create_decompress(&cinfo);
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_read_header(&cinfo, TRUE);
        /* fancy = 1: keep one MCU of context on every side, enough for any chroma upsampler */
        buf = cut_stream(&cinfo, (const unsigned char *)data.buf, (size_t)data.len, 8, x, y, w,
                          h, 1, &len, &rows, &cols, &height, &width);
    }
    jpeg_destroy_decompress(&cinfo);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    if (!buf) Py_RETURN_NONE; /* no usable markers, nothing to cut, or a bad header */
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
    free(buf);
    if (!bytes) return NULL;
    return Py_BuildValue("(Niiii)", bytes, rows, cols, (int)height, (int)width);
}

static PyObject *transcode(PyObject *self, PyObject *args) {
    Py_buffer data;
    int column_px;
    if (!PyArg_ParseTuple(args, "y*i", &data, &column_px)) return NULL;
    if (column_px < 0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "column_px must be >= 0");
        return NULL;
    }
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    struct roi_error err; /* shared by both objects: one jump target, one message */
    volatile int status = ROI_OK, made_src = 0, made_dst = 0;
    unsigned char *volatile outbuf = NULL;
    unsigned long outsize = 0;
    memset(&err, 0, sizeof(err));

    Py_BEGIN_ALLOW_THREADS
    src.err = jpeg_std_error(&err.pub);
    dst.err = &err.pub;
    err.pub.error_exit = roi_error_exit;
    err.pub.emit_message = roi_emit_message;
    if (setjmp(err.jump)) {
        status = ROI_ERROR;
    } else {
        jpeg_create_decompress(&src);
        made_src = 1;
        jpeg_mem_src(&src, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
        for (int m = 0; m < 16; m++) jpeg_save_markers(&src, JPEG_APP0 + m, 0xFFFF);
        jpeg_read_header(&src, TRUE);
        if (src.jpeg_color_space != JCS_YCbCr && src.jpeg_color_space != JCS_GRAYSCALE) {
            status = ROI_CMYK;
        } else {
            jvirt_barray_ptr *coefs = jpeg_read_coefficients(&src);
            if (err.warned) { /* corrupt data: refuse rather than bake the damage in */
                status = ROI_WARNING;
            } else {
                jpeg_create_compress(&dst);
                made_dst = 1;
                jpeg_copy_critical_parameters(&src, &dst);
                dst.optimize_coding = TRUE;
                unsigned long mcu_w =
                    src.num_components == 1 ? 8 : 8 * (unsigned long)src.max_h_samp_factor;
                unsigned long per_row = (src.image_width + mcu_w - 1) / mcu_w, every = per_row;
                if (column_px > 0) { /* the largest even split of a row at most column_px wide */
                    for (every = per_row; every > 1; every--)
                        if (per_row % every == 0 && every * mcu_w <= (unsigned long)column_px)
                            break;
                }
                dst.restart_interval = (unsigned int)every;
                jpeg_mem_dest(&dst, (unsigned char **)&outbuf, &outsize);
                jpeg_write_coefficients(&dst, coefs);
                for (jpeg_saved_marker_ptr m = src.marker_list; m; m = m->next) {
                    /* the library writes its own JFIF (APP0) and Adobe (APP14) headers */
                    if (dst.write_JFIF_header && m->marker == JPEG_APP0 && m->data_length >= 5 &&
                        memcmp(m->data, "JFIF", 5) == 0)
                        continue;
                    if (dst.write_Adobe_marker && m->marker == JPEG_APP0 + 14 &&
                        m->data_length >= 5 && memcmp(m->data, "Adobe", 5) == 0)
                        continue;
                    jpeg_write_marker(&dst, m->marker, m->data, m->data_length);
                }
                jpeg_finish_compress(&dst);
                if (err.warned) status = ROI_WARNING;
            }
        }
    }
    if (made_dst) jpeg_destroy_compress(&dst);
    if (made_src) jpeg_destroy_decompress(&src);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    PyObject *result = NULL;
    if (status == ROI_OK) {
        result = PyBytes_FromStringAndSize((const char *)outbuf, (Py_ssize_t)outsize);
    } else if (status == ROI_CMYK) {
        Py_INCREF(Py_None);
        result = Py_None;
    } else {
        PyErr_SetString(PyExc_ValueError, err.message[0] ? err.message : "corrupt JPEG");
    }
    free(outbuf);
    return result;
}

/* ---- header reading: what dlperf.data.decode._jpeg_info_py reads, in C -------------------
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

static PyObject *jpeg_info(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    const unsigned char *d = (const unsigned char *)data.buf;
    size_t n = (size_t)data.len, pos = 2;
    int orientation = 1, adobe = -1, jfif = 0, sof = -1, scan = 0;
    unsigned restart = 0;
    const unsigned char *frame = NULL;
    size_t frame_len = 0;
    const char *error = NULL;
    while (pos + 4 <= n) {
        if (d[pos] != 0xFF) { error = "no marker where one belongs"; break; }
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
            if (len < 6) { error = "short frame header"; break; }
            sof = m, frame = seg, frame_len = len;
        }
        pos += 2 + length;
    }
    PyObject *result = NULL;
    if (!error && !frame) error = "no frame header";
    if (!error && !scan) error = "no scan: truncated"; /* cut inside the header, or EOI first */
    if (error) {
        PyErr_SetString(PyExc_ValueError, error);
    } else {
        int comps = frame[5], max_h = 0, max_v = 0, rgb_ids = comps == 3, specs = 0;
        for (int i = 0; i < comps && frame_len >= (size_t)(9 + 3 * i); i++, specs++) {
            const unsigned char *c = frame + 6 + 3 * i;
            if ((c[1] >> 4) > max_h) max_h = c[1] >> 4;
            if ((c[1] & 15) > max_v) max_v = c[1] & 15;
            if (i < 3 && c[0] != "RGB"[i]) rgb_ids = 0;
        }
        if (specs < 3) rgb_ids = 0;
        if (!specs) max_h = max_v = 1; /* max(..., default=1) */
        int ycc_or_gray = comps == 1 ||
                          (comps == 3 && (jfif || (adobe >= 0 ? adobe != 0 : !rgb_ids)));
        result = Py_BuildValue("(iiiiiiOiii)", (int)be16(frame + 1), (int)be16(frame + 3),
                               orientation, sof, frame[0], comps,
                               ycc_or_gray ? Py_True : Py_False, max_h, max_v, (int)restart);
    }
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"jpeg_info", jpeg_info, METH_VARARGS,
     "jpeg_info(data) -> (height, width, orientation, sof, precision, components, ycc_or_gray, "
     "max_h, max_v, restart_interval); ValueError(reason) for a corrupt header"},
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, scale_num, x, y, w, h, fast, out) -> (decoded_width, x_shift, w, h, "
     "cut_rows, cut_cols)"},
    {"cut_region", cut_region, METH_VARARGS,
     "cut_region(data, x, y, w, h) -> (jpeg bytes, rows_cut, cols_cut, height, width) or None"},
    {"transcode", transcode, METH_VARARGS,
     "transcode(data, column_px) -> bytes (lossless, restart markers) or None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegroi",
                                    "Region-of-interest JPEG decoding (libjpeg-turbo).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__jpegroi(void) { return PyModule_Create(&module); }
