/* Internal: Philox4x32-10 and the transforms of the device random kernels, written once for both
 * implementations: sim.c compiles it as C on the host, kernels.cu as CUDA device code, so the two
 * run the same algorithm (results may still differ in the last bits where the libraries' log, sin
 * and cos do). It includes nothing of tdist (kernels.cu sees no tdist headers).
 *
 * The layout follows curand's Philox as PyTorch's CUDA generator drives it: the key is the
 * generator's 64-bit seed, the counter's low 64 bits are the generator's offset / 4 and its high
 * 64 bits a subsequence, here the element group. A random call fills element i from the four
 * words of block (seed, offset / 4, i / per) with per = 4 values per block (2 for float64, which
 * uses two words per uniform), so an element's value depends only on (seed, offset, i): not on the
 * grid, the thread count or the stream. Each call uses one counter value of every subsequence, so
 * it advances the generator's offset by PHILOX_OFFSET_PER_CALL (a multiple of 4, as the offset
 * must be) and a restored state replays bit for bit. */
#ifndef TDIST_DEVICE_PHILOX_H
#define TDIST_DEVICE_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define PHILOX_FN static __host__ __device__ __forceinline__
#else
#define PHILOX_FN static inline
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define PHILOX_ROUNDS 10

/* How far one random call advances the generator's offset. */
#define PHILOX_OFFSET_PER_CALL 4

/* The distributions of a random call (device_impl.h's random entry). */
#define PHILOX_DIST_UNIFORM 0 /* a + (b - a) * u, u in [0, 1) */
#define PHILOX_DIST_NORMAL 1  /* a + b * z, z standard normal (Box-Muller) */

typedef struct philox_block {
    uint32_t w[4];
} philox_block;

/* The 10-round Philox4x32 of Salmon et al. (Random123), key bumped before rounds 2..10. */
PHILOX_FN philox_block philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
    }
    philox_block b = {{c0, c1, c2, c3}};
    return b;
}

/* The block of element group `group` of a call at (seed, offset). */
PHILOX_FN philox_block philox_group_block(uint64_t seed, uint64_t offset, uint64_t group)
{
    uint64_t counter = offset / 4;
    return philox4x32_10((uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)group, (uint32_t)(group >> 32),
                         (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* Elements per block: 4 for the 32-bit-or-narrower float types, 2 for float64. */
PHILOX_FN int philox_per_block(int is_double) { return is_double ? 2 : 4; }

/* [0, 1) from 24 bits (what a float holds exactly) / from 53 bits of two words. */
PHILOX_FN double philox_u24(uint32_t x) { return (double)(x >> 8) * (1.0 / 16777216.0); }
PHILOX_FN double philox_u53(uint32_t hi, uint32_t lo)
{
    return ((double)(hi >> 5) * 67108864.0 + (double)(lo >> 6)) * (1.0 / 9007199254740992.0);
}

/* Lane `lane` (0 .. per-1) of a block as a value of the distribution, in double. */
PHILOX_FN double philox_value(philox_block b, int lane, int is_double, int dist, double a, double bparam)
{
    const double two_pi = 6.283185307179586476925286766559;
    if (dist == PHILOX_DIST_UNIFORM) {
        double u = is_double ? philox_u53(b.w[2 * lane], b.w[2 * lane + 1]) : philox_u24(b.w[lane]);
        return a + (bparam - a) * u;
    }
    /* Box-Muller on a pair of uniforms, u1 in (0, 1] so that log(u1) is finite. */
    double u1, u2;
    int second;
    if (is_double) {
        u1 = philox_u53(b.w[0], b.w[1]) + 1.0 / 9007199254740992.0;
        u2 = philox_u53(b.w[2], b.w[3]);
        second = lane;
    } else {
        int pair = lane / 2;
        u1 = ((double)b.w[2 * pair] + 1.0) * (1.0 / 4294967296.0);
        u2 = (double)b.w[2 * pair + 1] * (1.0 / 4294967296.0);
        second = lane % 2;
    }
    double r = sqrt(-2.0 * log(u1));
    double z = second ? r * sin(two_pi * u2) : r * cos(two_pi * u2);
    return a + bparam * z;
}

#endif
