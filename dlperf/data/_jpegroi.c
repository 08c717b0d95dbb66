/* Region-of-interest JPEG decoding with libjpeg-turbo (issue #3: "decode only the crop's region").
 *
 * decode_region(data, scale_num, x, y, w, h, fast, out) decodes the image at scale scale_num/8
 * (DCT-domain scaling), then only the rows y..y+h and, horizontally, only the iMCU columns that
 * cover x..x+w (jpeg_crop_scanline): rows above the region are skipped without IDCT or colour
 * conversion (jpeg_skip_scanlines) and rows below it are never decoded at all. Coordinates are
 * in the scaled image. RGB rows are written packed into `out` (a writable buffer of at least
 * h * (w + 64) * 3 bytes); returns (decoded_width, x_shift): the region starts x_shift pixels
 * into each decoded row of decoded_width pixels.
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

enum { ROI_OK = 0, ROI_ERROR = 1, ROI_CMYK = 2, ROI_SMALL_BUFFER = 3, ROI_WARNING = 4 };

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
    if (status == ROI_OK && err.warned) status = ROI_WARNING;
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    switch (status) {
    case ROI_OK:
        return Py_BuildValue("(iiii)", (int)cw, x - (int)xoff, w, h);
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

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, scale_num, x, y, w, h, fast, out) -> (decoded_width, x_shift, w, h)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegroi",
                                    "Region-of-interest JPEG decoding (libjpeg-turbo).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__jpegroi(void) { return PyModule_Create(&module); }
