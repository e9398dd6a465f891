/* BLAKE2b (RFC 7693), for the outgoing delivery tag of a guaranteed topic (eo_tag.pxi).
 *
 * Written from the RFC's text: section 2 (parameters, IV, SIGMA, G), section 3.2 (F, the
 * compression) and 3.3 (padding, the byte counter and the final-block flag), with the
 * parameter block of the BLAKE2 paper (digest length, key length, fanout = depth = 1, salt,
 * personalisation), which is what hashlib.blake2b(digest_size, key, person) computes.
 *
 * Why our own: a tag is hashed once per guaranteed message, and the hashlib path (copy the
 * publisher's prefixed object, update, digest, a bytes concat) costs several allocations and
 * calls. Here the state after the key block and the publisher's prefix is a plain struct that
 * is copied on the stack; a tag of at most 32 bytes (AMQP 1.0 2.8.7) and its 4 length bytes
 * then cost one compression when they fit the prefix's last block, two when they cross it.
 *
 * The state keeps the last block unprocessed until more input arrives (RFC 7693 3.3: only the
 * last block is compressed with the final flag, and the message may end exactly at a block
 * boundary), so `buflen` is 1..128 once anything was absorbed, 0 only before.
 */
#ifndef QROUTER_EO_BLAKE2B_H
#define QROUTER_EO_BLAKE2B_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define QR_B2B_BLOCK 128
#define QR_B2B_OUT_MAX 64
#define QR_B2B_KEY_MAX 64
#define QR_B2B_PERSON_MAX 16

typedef struct {
    uint64_t h[8];     /* chained state */
    uint64_t t0, t1;   /* bytes compressed so far (a 128-bit counter, RFC 7693 2.1) */
    uint8_t buf[QR_B2B_BLOCK];  /* the block not yet compressed */
    size_t buflen;
    size_t outlen;     /* digest length in bytes, 1..64 */
} qr_b2b;

/* RFC 7693 2.6: the IV is SHA-512's (the first 64 bits of the fractional parts of the square
 * roots of the first eight primes) */
static const uint64_t qr_b2b_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
    0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
    0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

/* RFC 7693 2.7: the message word schedule, one row a round; rounds 10 and 11 use rows 0 and 1
 * again (QR_B2B_ROUND takes the row, r % 10) */
static const uint8_t qr_b2b_sigma[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

static inline uint64_t qr_b2b_rotr(uint64_t x, unsigned n) {
    return (x >> n) | (x << (64 - n));
}

/* words are little-endian (RFC 7693 2.4); byte by byte, which compilers turn into one load */
static inline uint64_t qr_b2b_load(const uint8_t *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16)
        | ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40)
        | ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

/* RFC 7693 3.1, the mixing function G, with rotations R1..R4 = 32, 24, 16, 63 */
#define QR_B2B_G(a, b, c, d, x, y)              \
    do {                                        \
        a = a + b + (x);                        \
        d = qr_b2b_rotr(d ^ a, 32);             \
        c = c + d;                              \
        b = qr_b2b_rotr(b ^ c, 24);             \
        a = a + b + (y);                        \
        d = qr_b2b_rotr(d ^ a, 16);             \
        c = c + d;                              \
        b = qr_b2b_rotr(b ^ c, 63);             \
    } while (0)

/* one round of F (RFC 7693 3.2): G on the columns, then on the diagonals */
#define QR_B2B_ROUND(r)                                               \
    do {                                                              \
        const uint8_t *z = qr_b2b_sigma[(r) % 10];                    \
        QR_B2B_G(v[0], v[4], v[8], v[12], m[z[0]], m[z[1]]);          \
        QR_B2B_G(v[1], v[5], v[9], v[13], m[z[2]], m[z[3]]);          \
        QR_B2B_G(v[2], v[6], v[10], v[14], m[z[4]], m[z[5]]);         \
        QR_B2B_G(v[3], v[7], v[11], v[15], m[z[6]], m[z[7]]);         \
        QR_B2B_G(v[0], v[5], v[10], v[15], m[z[8]], m[z[9]]);         \
        QR_B2B_G(v[1], v[6], v[11], v[12], m[z[10]], m[z[11]]);       \
        QR_B2B_G(v[2], v[7], v[8], v[13], m[z[12]], m[z[13]]);        \
        QR_B2B_G(v[3], v[4], v[9], v[14], m[z[14]], m[z[15]]);        \
    } while (0)

/* RFC 7693 3.2, the compression function F over the block `block`, the counter already
 * advanced to include it; `last`: the final block (v[14] inverted) */
static void qr_b2b_compress(qr_b2b *s, const uint8_t *block, int last) {
    uint64_t m[16], v[16];
    int i;
    for (i = 0; i < 16; i++)
        m[i] = qr_b2b_load(block + 8 * i);
    for (i = 0; i < 8; i++) {
        v[i] = s->h[i];
        v[i + 8] = qr_b2b_iv[i];
    }
    v[12] ^= s->t0;
    v[13] ^= s->t1;
    if (last)
        v[14] = ~v[14];
    /* twelve rounds, written out: with a constant round number the schedule's indices are
     * constants, and the message words stay in registers */
    QR_B2B_ROUND(0); QR_B2B_ROUND(1); QR_B2B_ROUND(2); QR_B2B_ROUND(3);
    QR_B2B_ROUND(4); QR_B2B_ROUND(5); QR_B2B_ROUND(6); QR_B2B_ROUND(7);
    QR_B2B_ROUND(8); QR_B2B_ROUND(9); QR_B2B_ROUND(10); QR_B2B_ROUND(11);
    for (i = 0; i < 8; i++)
        s->h[i] ^= v[i] ^ v[i + 8];
}

static inline void qr_b2b_count(qr_b2b *s, size_t n) {
    s->t0 += n;
    if (s->t0 < n)
        s->t1++;
}

/* Absorb `n` bytes. A full buffer is compressed only once more input follows (3.3). */
static void qr_b2b_update(qr_b2b *s, const uint8_t *in, size_t n) {
    while (n > 0) {
        size_t room;
        if (s->buflen == QR_B2B_BLOCK) {
            qr_b2b_count(s, QR_B2B_BLOCK);
            qr_b2b_compress(s, s->buf, 0);
            s->buflen = 0;
        }
        room = QR_B2B_BLOCK - s->buflen;
        if (room > n)
            room = n;
        memcpy(s->buf + s->buflen, in, room);
        s->buflen += room;
        in += room;
        n -= room;
    }
}

/* Start a hash: digest length `outlen` (1..64), `key` (at most 64 bytes; its zero-padded block
 * is the first block, RFC 7693 3.3), `person` (at most 16 bytes, zero-padded: parameter block
 * bytes 48..63, words 6 and 7). -1 if a length is out of range. */
static int qr_b2b_init(qr_b2b *s, size_t outlen, const uint8_t *key, size_t keylen,
                       const uint8_t *person, size_t personlen) {
    uint8_t p[QR_B2B_PERSON_MAX];
    int i;
    if (outlen == 0 || outlen > QR_B2B_OUT_MAX || keylen > QR_B2B_KEY_MAX
            || personlen > QR_B2B_PERSON_MAX)
        return -1;
    for (i = 0; i < 8; i++)
        s->h[i] = qr_b2b_iv[i];
    /* parameter block word 0: digest length, key length, fanout 1, depth 1 (2.5) */
    s->h[0] ^= 0x01010000ULL ^ ((uint64_t)keylen << 8) ^ (uint64_t)outlen;
    memset(p, 0, sizeof p);
    if (personlen)
        memcpy(p, person, personlen);
    s->h[6] ^= qr_b2b_load(p);
    s->h[7] ^= qr_b2b_load(p + 8);
    s->t0 = s->t1 = 0;
    s->buflen = 0;
    s->outlen = outlen;
    memset(s->buf, 0, QR_B2B_BLOCK);
    if (keylen) {
        memcpy(s->buf, key, keylen);
        s->buflen = QR_B2B_BLOCK;  /* the key block, compressed when the message follows */
    }
    return 0;
}

/* Finish: pad the last block with zeros, count only its real bytes, compress it with the
 * final flag (3.3), and write the first `outlen` bytes of h, little-endian, to `out`. */
static void qr_b2b_final(qr_b2b *s, uint8_t *out) {
    uint8_t full[QR_B2B_OUT_MAX];
    int i, j;
    qr_b2b_count(s, s->buflen);
    memset(s->buf + s->buflen, 0, QR_B2B_BLOCK - s->buflen);
    qr_b2b_compress(s, s->buf, 1);
    for (i = 0; i < 8; i++)
        for (j = 0; j < 8; j++)
            full[8 * i + j] = (uint8_t)(s->h[i] >> (8 * j));
    memcpy(out, full, s->outlen);
}

#endif
