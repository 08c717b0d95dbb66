/* Python bindings of dlperf's JPEG fast path: the work is in jpegroi.c (plain C, fuzzed under
 * sanitizers by tests/fuzz/fuzz_jpegroi.c); this file only converts arguments and results.
 *
 * decode_region(data, scale_num, x, y, w, h, fast, out) -> (decoded_width, x_shift, w, h,
 *   cut_rows, cut_cols): RGB rows of the region packed into the writable buffer out (at least
 *   h * (w + 64) * 3 bytes); the region (w x h after clamping) starts x_shift pixels into each
 *   decoded row of decoded_width; cut_rows/cut_cols are what a restart-marker cut left out.
 * cut_region(data, x, y, w, h) -> (bytes, rows_cut, cols_cut, height, width) or None.
 * transcode(data, column_px) -> bytes, or None where the file cannot be rewritten (not
 *   YCbCr/gray, or coefficients baseline cannot code): the caller stores it as it is.
 * jpeg_info(data) -> (height, width, orientation, sof, precision, components, ycc_or_gray,
 *   max_h, max_v, restart_interval).
 *
 * The GIL is released around every call into jpegroi.c. Corrupt data raises ValueError with
 * libjpeg's reason; CMYK/YCCK images raise ValueError("cmyk") so the caller can use Pillow.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

#include "jpegroi.h"

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    int scale_num, x, y, w, h, fast;
    if (!PyArg_ParseTuple(args, "y*iiiiiiw*", &data, &scale_num, &x, &y, &w, &h, &fast, &out))
        return NULL;
    struct roi_region r = {0};
    char message[ROI_MESSAGE_LEN] = {0};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = roi_decode_region((const unsigned char *)data.buf, (size_t)data.len, scale_num, x,
                               y, w, h, fast, (unsigned char *)out.buf, (size_t)out.len, &r,
                               message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (status != ROI_OK) {
        PyErr_SetString(PyExc_ValueError, message[0] ? message : "corrupt JPEG");
        return NULL;
    }
    return Py_BuildValue("(iiiiii)", r.decoded_width, r.x_shift, r.w, r.h, r.cut_rows,
                         r.cut_cols);
}

static PyObject *cut_region(PyObject *self, PyObject *args) {
    Py_buffer data;
    int x, y, w, h;
    if (!PyArg_ParseTuple(args, "y*iiii", &data, &x, &y, &w, &h)) return NULL;
    struct roi_cut cut = {0};
    char message[ROI_MESSAGE_LEN] = {0};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = roi_cut_region((const unsigned char *)data.buf, (size_t)data.len, x, y, w, h, &cut,
                            message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (status == ROI_ARGS) {
        PyErr_SetString(PyExc_ValueError, message);
        return NULL;
    }
    if (status != ROI_OK) Py_RETURN_NONE; /* no usable markers, nothing to cut, or a bad header */
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)cut.data, (Py_ssize_t)cut.len);
    free(cut.data);
    if (!bytes) return NULL;
    return Py_BuildValue("(Niiii)", bytes, cut.rows_cut, cut.cols_cut, (int)cut.height,
                         (int)cut.width);
}

static PyObject *transcode(PyObject *self, PyObject *args) {
    Py_buffer data;
    int column_px;
    if (!PyArg_ParseTuple(args, "y*i", &data, &column_px)) return NULL;
    unsigned char *out = NULL;
    size_t out_len = 0;
    char message[ROI_MESSAGE_LEN] = {0};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = roi_transcode((const unsigned char *)data.buf, (size_t)data.len, column_px, &out,
                           &out_len, message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (status == ROI_OK) {
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)out_len);
        free(out);
        return bytes;
    }
    if (status == ROI_CMYK || status == ROI_ENCODE) Py_RETURN_NONE;
    PyErr_SetString(PyExc_ValueError, message[0] ? message : "corrupt JPEG");
    return NULL;
}

static PyObject *jpeg_info(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    struct roi_info i = {0};
    const char *error = roi_jpeg_info((const unsigned char *)data.buf, (size_t)data.len, &i);
    PyBuffer_Release(&data);
    if (error) {
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    return Py_BuildValue("(iiiiiiOiii)", i.height, i.width, i.orientation, i.sof, i.precision,
                         i.components, i.ycc_or_gray ? Py_True : Py_False, i.max_h, i.max_v,
                         (int)i.restart_interval);
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
