/* CRC-32 (IEEE 802.3, reflected, as zlib.crc32) without linking zlib.
 *
 * The record CRC is on the append hot path, and a fresh build machine may not
 * have zlib.h, so the store carries its own: slicing-by-16 tables everywhere,
 * plus PCLMULQDQ folding on x86-64 CPUs that have it (checked at run time).
 */
#ifndef SPARKMQ_CRC32_H
#define SPARKMQ_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* Build the tables and pick the implementation; call once before crc32_update. */
void sparkmq_crc32_init(void);

/* Same contract as zlib's crc32(crc, buf, len): start with crc = 0. */
uint32_t sparkmq_crc32(uint32_t crc, const void *buf, size_t len);

/* Name of the implementation in use ("pclmul" or "slice16"), for diagnostics. */
const char *sparkmq_crc32_impl(void);

#endif
