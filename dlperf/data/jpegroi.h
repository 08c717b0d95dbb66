/* The C core of dlperf's JPEG fast path, without Python: jpegroi.c implements it against
 * libjpeg-turbo, _jpegroi.c wraps it for Python, and tests/fuzz/fuzz_jpegroi.c drives every
 * entry point under AddressSanitizer and UndefinedBehaviorSanitizer (issue #10). Each entry
 * point takes untrusted bytes and must never crash, leak or read outside them, whatever they
 * hold; failures come back as a status and a one-line reason.
 */
#ifndef DLPERF_JPEGROI_H
#define DLPERF_JPEGROI_H

#include <stddef.h>

#define ROI_MESSAGE_LEN 200 /* libjpeg's JMSG_LENGTH_MAX */

enum roi_status {
    ROI_OK = 0,
    ROI_ERROR = 1,        /* corrupt or unsupported data; the reason is in message */
    ROI_CMYK = 2,         /* CMYK/YCCK (decode) or not YCbCr/gray (transcode): use Pillow */
    ROI_SMALL_BUFFER = 3, /* the caller's output buffer cannot hold the region */
    ROI_ENCODE = 4,       /* transcode: decodes cleanly but cannot be written as baseline */
    ROI_NOT_CUT = 5,      /* cut_region: no usable restart markers, or nothing to save */
    ROI_ARGS = 6          /* invalid arguments (scale, region, column width) */
};

struct roi_region {
    int decoded_width; /* width of each row written to out */
    int x_shift;       /* the region starts this many pixels into each row */
    int w, h;          /* the region after clamping to the image */
    int cut_rows, cut_cols; /* output rows/columns a restart-marker cut left out */
};

/* Decode the region x, y, w, h (in the image scaled by scale_num/8) into out (out_len bytes,
 * at least h * (w + 64) * 3). fast: bit 0 fast integer IDCT, bit 1 plain chroma upsampling,
 * bit 2 never cut along restart markers. Any libjpeg warning (corrupt data) is an error. */
int roi_decode_region(const unsigned char *data, size_t len, int scale_num, int x, int y,
                      int w, int h, int fast, unsigned char *out, size_t out_len,
                      struct roi_region *result, char message[ROI_MESSAGE_LEN]);

struct roi_cut {
    unsigned char *data; /* malloc'd JPEG file; the caller frees it */
    size_t len;
    int rows_cut, cols_cut;
    unsigned int height, width;
};

/* The part of the file under x, y, w, h (full scale) as a JPEG of its own, one MCU of context
 * kept on every side, cut along restart intervals. ROI_OK (cut->data set), ROI_NOT_CUT, or
 * ROI_ERROR for a header libjpeg refuses. */
int roi_cut_region(const unsigned char *data, size_t len, int x, int y, int w, int h,
                   struct roi_cut *cut, char message[ROI_MESSAGE_LEN]);

/* Rewrite a YCbCr/grayscale JPEG losslessly as baseline with optimised Huffman tables and
 * restart markers splitting each MCU row into intervals at most column_px wide (0: one per
 * row), APPn/COM kept. ROI_OK (*out malloc'd, the caller frees it), ROI_CMYK, ROI_ENCODE or
 * ROI_ERROR. */
int roi_transcode(const unsigned char *data, size_t len, int column_px, unsigned char **out,
                  size_t *out_len, char message[ROI_MESSAGE_LEN]);

struct roi_info {
    int height, width, orientation, sof, precision, components, ycc_or_gray, max_h, max_v;
    unsigned int restart_interval;
};

/* The header fields dlperf.data.decode.JpegInfo holds; NULL, or the reason it is refused. */
const char *roi_jpeg_info(const unsigned char *data, size_t len, struct roi_info *info);

#endif
