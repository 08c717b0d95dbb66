/* Region-of-interest JPEG decoding with libjpeg-turbo (issue #3: "decode only the crop's region").
 *
 * decode_region(data, scale_num, x, y, w, h, fast, out) decodes the image at scale scale_num/8
 * (DCT-domain scaling), then only the rows y..y+h and, horizontally, only the iMCU columns that
 * cover x..x+w (jpeg_crop_scanline): rows above the region are skipped without IDCT or colour
 * conversion (jpeg_skip_scanlines) and rows below it are never decoded at all. Coordinates are
 * in the scaled image. RGB rows are written packed into `out` (a writable buffer of at least
 * h * (w + 64) * 3 bytes); returns (decoded_width, x_shift, w, h, seek_rows): the region
 * (w x h after clamping) starts x_shift pixels into each decoded row of decoded_width pixels.
 *
 * Restart-marker seek: rows above the region still cost their entropy (Huffman) decoding, the
 * dominant cost (~70% of a corpus image's decode, results/profile-decode.json), because a
 * Huffman stream can only be read from its start. A file with a restart marker at the start of
 * every MCU row (what `dlperf data prepare` writes, see transcode() below) can be entered at any
 * row: DC predictors reset at each marker. The decoder then reads a shortened stream, the header
 * with a smaller image height followed by the entropy data from the marker before the region's
 * first MCU row (markers renumbered so the stream starts at RST0), and skips only the rows within
 * that MCU row. seek_rows is how many output rows were never entropy-decoded (0 without markers).
 * Output is bit-identical: each MCU row depends only on its own data, except fancy chroma
 * upsampling's one context row, for which the seek starts one MCU row earlier.
 *
 * transcode(data, restart_rows) rewrites a YCbCr or grayscale JPEG losslessly (same DCT
 * coefficients and quantisation tables, so the same decoded pixels) as baseline sequential with
 * optimised Huffman tables and a restart marker every restart_rows MCU rows, keeping APPn/COM
 * markers (EXIF orientation, ICC profiles). Returns None for other colour spaces.
 *
 * The GIL is released for the whole decode. Errors and libjpeg warnings (corrupt data) raise
 * ValueError; CMYK/YCCK images raise ValueError("cmyk") so the caller can use Pillow.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
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

enum { ROI_OK = 0, ROI_ERROR = 1, ROI_CMYK = 2, ROI_SMALL_BUFFER = 3, ROI_WARNING = 4,
       ROI_NO_MEMORY = 5 };

/* Where libjpeg's header reader stopped: the first byte of the scan's entropy-coded data. */
static size_t entropy_offset(j_decompress_ptr cinfo, const unsigned char *start) {
    return (size_t)(cinfo->src->next_input_byte - start);
}

/* The position just after the k-th (1-based) RSTn marker in entropy data [p, end), or NULL if
 * the data ends, another marker comes first, or the markers are not numbered 0, 1, ..., 7, 0... */
static const unsigned char *find_restart(const unsigned char *p, const unsigned char *end,
                                         unsigned long k) {
    unsigned long seen = 0;
    while (p + 1 < end) {
        const unsigned char *ff = memchr(p, 0xFF, (size_t)(end - p - 1));
        if (!ff) return NULL;
        unsigned char m = ff[1];
        if (m == 0x00 || m == 0xFF) { /* stuffed 0xFF data byte, or a fill byte */
            p = ff + 1 + (m == 0x00);
            continue;
        }
        if (m < 0xD0 || m > 0xD7 || (unsigned long)(m - 0xD0) != seen % 8) return NULL;
        if (++seen == k) return ff + 2;
        p = ff + 2;
    }
    return NULL;
}

/* Patch the frame header's height in the header bytes [0, len); 0 if no baseline/extended
 * sequential SOF is found there. */
static int patch_height(unsigned char *buf, size_t len, unsigned int height) {
    size_t i = 2;
    while (i + 4 <= len) {
        if (buf[i] != 0xFF) return 0;
        unsigned char m = buf[i + 1];
        if (m == 0xFF) { i++; continue; }
        size_t seg = ((size_t)buf[i + 2] << 8) | buf[i + 3];
        if (m == 0xC0 || m == 0xC1) {
            if (i + 7 > len) return 0;
            buf[i + 5] = (unsigned char)(height >> 8);
            buf[i + 6] = (unsigned char)(height & 0xFF);
            return 1;
        }
        if (m == 0xDA) return 0;
        i += 2 + seg;
    }
    return 0;
}

/* Subtract `shift` (mod 8) from every RSTn marker's number in entropy data [p, end). */
static void renumber_restarts(unsigned char *p, unsigned char *end, unsigned int shift) {
    while (p + 1 < end) {
        unsigned char *ff = memchr(p, 0xFF, (size_t)(end - p - 1));
        if (!ff) return;
        unsigned char m = ff[1];
        if (m >= 0xD0 && m <= 0xD7) ff[1] = (unsigned char)(0xD0 + ((m - 0xD0 + 8 - shift % 8) % 8));
        p = ff + 1 + (m != 0xFF);
    }
}

/* A shortened stream (malloc'd, *out_len bytes) that starts at the restart interval holding
 * the output row `y` at scale scale_num/8, or NULL when the file cannot be entered there.
 * *rows_cut receives the number of output rows the new stream leaves out at the top. */
static unsigned char *seek_stream(j_decompress_ptr cinfo, const unsigned char *data, size_t len,
                                  int scale_num, int y, int fancy, size_t *out_len,
                                  int *rows_cut) {
    if (cinfo->restart_interval == 0 || cinfo->progressive_mode || cinfo->arith_code ||
        jpeg_has_multiple_scans(cinfo) || cinfo->comps_in_scan != cinfo->num_components)
        return NULL;
    unsigned int max_h = (unsigned int)cinfo->max_h_samp_factor;
    unsigned int max_v = (unsigned int)cinfo->max_v_samp_factor;
    if (cinfo->num_components == 1) max_h = max_v = 1; /* one block per MCU */
    unsigned long mcus_per_row = (cinfo->image_width + 8 * max_h - 1) / (8 * max_h);
    if (cinfo->restart_interval % mcus_per_row) return NULL;
    unsigned long rows_per_interval = cinfo->restart_interval / mcus_per_row;
    unsigned int out_rows_per_mcu_row = max_v * (unsigned int)scale_num;
    unsigned long row = (unsigned long)y / out_rows_per_mcu_row;
    if (fancy && row > 0) row--; /* fancy upsampling reads one chroma row of context above */
    unsigned long k = row / rows_per_interval;
    if (k == 0) return NULL;
    size_t head = entropy_offset(cinfo, data);
    const unsigned char *start = find_restart(data + head, data + len, k);
    if (!start) return NULL;
    unsigned long cut_px = k * rows_per_interval * 8 * max_v; /* full-scale rows left out */
    if (cut_px >= cinfo->image_height) return NULL;
    size_t tail = (size_t)(data + len - start);
    unsigned char *buf = malloc(head + tail);
    if (!buf) return NULL;
    memcpy(buf, data, head);
    if (!patch_height(buf, head, (unsigned int)(cinfo->image_height - cut_px))) {
        free(buf);
        return NULL;
    }
    memcpy(buf + head, start, tail);
    if (k % 8) renumber_restarts(buf + head, buf + head + tail, (unsigned int)(k % 8));
    *out_len = head + tail;
    *rows_cut = (int)(cut_px * (unsigned long)scale_num / 8);
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
    unsigned char *volatile seek_buf = NULL;
    volatile int seek_rows = 0;
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
            size_t seek_len = 0;
            int cut = 0;
            if (y > 0 && !(fast & 4)) /* bit 2: never seek (benchmarks measure without) */
                seek_buf = seek_stream(&cinfo, (const unsigned char *)data.buf,
                                       (size_t)data.len, scale_num, y, !(fast & 2), &seek_len,
                                       &cut);
            if (seek_buf) { /* restart from the shortened stream */
                jpeg_abort_decompress(&cinfo);
                jpeg_mem_src(&cinfo, seek_buf, (unsigned long)seek_len);
                jpeg_read_header(&cinfo, TRUE);
                y -= cut;
                seek_rows = cut;
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
    free(seek_buf);
    if (status == ROI_OK && err.warned) status = ROI_WARNING;
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    switch (status) {
    case ROI_OK:
        return Py_BuildValue("(iiiii)", (int)cw, x - (int)xoff, w, h, (int)seek_rows);
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

static PyObject *transcode(PyObject *self, PyObject *args) {
    Py_buffer data;
    int restart_rows;
    if (!PyArg_ParseTuple(args, "y*i", &data, &restart_rows)) return NULL;
    if (restart_rows < 0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "restart_rows must be >= 0");
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
                dst.restart_in_rows = restart_rows;
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

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, scale_num, x, y, w, h, fast, out) -> (decoded_width, x_shift, w, h, "
     "seek_rows)"},
    {"transcode", transcode, METH_VARARGS,
     "transcode(data, restart_rows) -> bytes (lossless, restart markers) or None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegroi",
                                    "Region-of-interest JPEG decoding (libjpeg-turbo).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__jpegroi(void) { return PyModule_Create(&module); }
