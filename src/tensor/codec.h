/* Internal constants of the td_value wire format (codec.c; documented in docs/protocols.md,
 * "td_value codec"), for layers that frame or peek at encoded values. */
#ifndef TDIST_TENSOR_CODEC_H
#define TDIST_TENSOR_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>

#define TD_VALUE_CODEC_MAGIC 0x4c565444u /* "TDVL" as little-endian bytes */
#define TD_VALUE_CODEC_VERSION 1
#define TD_VALUE_CODEC_HEADER_SIZE 32
#define TD_VALUE_CODEC_ALIGN 64 /* tensor buffers start at multiples of this from the message start */
#define TD_VALUE_CODEC_TABLE_ENTRY 16

/* Node tags of the structure section. */
enum {
    TD_VTAG_NONE = 0x00,
    TD_VTAG_FALSE = 0x01,
    TD_VTAG_TRUE = 0x02,
    TD_VTAG_INT = 0x03,
    TD_VTAG_DOUBLE = 0x04,
    TD_VTAG_COMPLEX = 0x05,
    TD_VTAG_STRING = 0x06,
    TD_VTAG_BYTES = 0x07,
    TD_VTAG_TENSOR = 0x08,
    TD_VTAG_TENSOR_REF = 0x09,
    TD_VTAG_LIST = 0x0a,
    TD_VTAG_TUPLE = 0x0b,
    TD_VTAG_DICT = 0x0c,
    TD_VTAG_RECORD = 0x0d,
    TD_VTAG_TENSOR_STRIDED = 0x0e, /* a non-contiguous view: its strides and the storage span it covers */
};

/* Reads the total message length from the first len bytes of a message (at least the header),
 * checking magic and version, so that a reader can size its buffer before reading the rest. */
td_status value_codec_message_size(const void *data, size_t len, size_t *total);

#endif
