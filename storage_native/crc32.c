/* CRC-32 (zlib.crc32-compatible) -- see crc32.h for why the store has its own.
 *
 * Both paths work on the "internal" register (the complemented CRC); the public
 * function does the pre/post complement exactly like zlib, so results chain.
 */
#include "crc32.h"

#include <string.h>

#define CRC_POLY 0xEDB88320u /* reflected IEEE polynomial */

static uint32_t tab[16][256];

/* Slicing-by-16: 16 table look-ups per 16 input bytes, no data-dependent branch. */
static uint32_t crc_slice16(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ tab[0][(crc ^ *p++) & 0xff];
        n--;
    }
    while (n >= 16) {
        uint64_t a, b;
        memcpy(&a, p, 8);
        memcpy(&b, p + 8, 8);
        a ^= crc; /* little-endian: the register meets the first 4 bytes */
        crc = tab[15][a & 0xff] ^ tab[14][(a >> 8) & 0xff] ^ tab[13][(a >> 16) & 0xff] ^
              tab[12][(a >> 24) & 0xff] ^ tab[11][(a >> 32) & 0xff] ^ tab[10][(a >> 40) & 0xff] ^
              tab[9][(a >> 48) & 0xff] ^ tab[8][a >> 56] ^ tab[7][b & 0xff] ^ tab[6][(b >> 8) & 0xff] ^
              tab[5][(b >> 16) & 0xff] ^ tab[4][(b >> 24) & 0xff] ^ tab[3][(b >> 32) & 0xff] ^
              tab[2][(b >> 40) & 0xff] ^ tab[1][(b >> 48) & 0xff] ^ tab[0][b >> 56];
        p += 16;
        n -= 16;
    }
    while (n--)
        crc = (crc >> 8) ^ tab[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_PCLMUL_PATH 1

/* Carry-less multiplication folding (Intel, "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ", 2009), in the layout used by Chromium's zlib.
 * Folds 64 bytes per iteration; needs len >= 64 and len % 16 == 0. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_pclmul(uint32_t crc, const unsigned char *buf,
                                                                      size_t len)
{
    static const uint64_t __attribute__((aligned(16))) k1k2[] = {0x0154442bd4, 0x01c6e41596};
    static const uint64_t __attribute__((aligned(16))) k3k4[] = {0x01751997d0, 0x00ccaa009e};
    static const uint64_t __attribute__((aligned(16))) k5k0[] = {0x0163cd6124, 0x0000000000};
    static const uint64_t __attribute__((aligned(16))) poly[] = {0x01db710641, 0x01f7011641};
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = _mm_load_si128((const __m128i *)k1k2);
    buf += 64;
    len -= 64;

    while (len >= 64) { /* four independent 128-bit lanes */
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64;
        len -= 64;
    }

    /* fold the four lanes into one */
    x0 = _mm_load_si128((const __m128i *)k3k4);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);

    while (len >= 16) { /* remaining 16-byte blocks */
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }

    /* 128 -> 64 bits */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_loadl_epi64((const __m128i *)k5k0);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);

    /* Barrett reduction to 32 bits */
    x0 = _mm_load_si128((const __m128i *)poly);
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static int use_pclmul;

void sparkmq_crc32_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC_POLY : c >> 1;
        tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 16; t++)
            tab[t][i] = (tab[t - 1][i] >> 8) ^ tab[0][tab[t - 1][i] & 0xff];
#ifdef HAVE_PCLMUL_PATH
    __builtin_cpu_init();
    use_pclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

uint32_t sparkmq_crc32(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    uint32_t c = ~crc;
#ifdef HAVE_PCLMUL_PATH
    if (use_pclmul && len >= 64) {
        size_t chunk = len & ~(size_t)15;
        c = crc_pclmul(c, p, chunk);
        p += chunk;
        len -= chunk;
    }
#endif
    return ~crc_slice16(c, p, len);
}

const char *sparkmq_crc32_impl(void)
{
    return use_pclmul ? "pclmul" : "slice16";
}
