/* Internal: branch-free float16 / bfloat16 <-> float32 conversions, inline so that the copy and
 * reduce loops that use them can be vectorized.
 *
 * These are the algorithms PyTorch uses (c10/util/Half.h, after Maratyszcza's FP16 library, and
 * c10/util/BFloat16.h), so tdist rounds exactly as torch does: round to nearest even, overflow to
 * infinity, NaN kept a quiet NaN with its sign (float16) or the canonical 0x7FC0 (bfloat16). They
 * rely on the default floating-point environment (round to nearest) and on IEEE semantics, so no
 * file including this may be built with -ffast-math. */
#ifndef TDIST_TENSOR_HALF_H
#define TDIST_TENSOR_HALF_H

#include <stdint.h>
#include <string.h>

static inline float f32_from_bits(uint32_t w)
{
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}

static inline uint32_t f32_to_bits(float f)
{
    uint32_t w;
    memcpy(&w, &f, sizeof w);
    return w;
}

static inline float h2f(uint16_t h)
{
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    /* Normal (and inf / NaN) halves: shift the exponent and mantissa into place and rescale the
     * exponent bias with one multiplication (which also turns the half's max exponent into inf). */
    const uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float normalized = f32_from_bits((two_w >> 4) + exp_offset) * 0x1.0p-112f;
    /* Subnormal halves: build 0.5 + mantissa * 2^-24 exactly and subtract the 0.5. */
    const uint32_t magic_mask = UINT32_C(126) << 23;
    const float denormalized = f32_from_bits((two_w >> 17) | magic_mask) - 0.5f;
    const uint32_t denormalized_cutoff = UINT32_C(1) << 27;
    /* A mask rather than ?: so that gcc computes both candidates and blends them; with a ?: it
     * branches (it may not speculate float operations that could trap) and the loops that call
     * this do not vectorize. */
    const uint32_t is_denormal = (uint32_t)0 - (uint32_t)(two_w < denormalized_cutoff);
    const uint32_t result =
        sign | (f32_to_bits(denormalized) & is_denormal) | (f32_to_bits(normalized) & ~is_denormal);
    return f32_from_bits(result);
}

static inline uint16_t f2h(float f)
{
    /* Scaling up then down by powers of two lets the FPU do the rounding to the half's mantissa
     * width (nearest even) and saturates values beyond the half range to inf. */
    float abs_f = f32_from_bits(f32_to_bits(f) & UINT32_C(0x7FFFFFFF));
    float base = (abs_f * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = f32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    bias = bias < UINT32_C(0x71000000) ? UINT32_C(0x71000000) : bias;
    base = f32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = f32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    const uint32_t is_nan = (uint32_t)0 - (uint32_t)(shl1_w > UINT32_C(0xFF000000)); /* a mask: see h2f */
    return (uint16_t)((sign >> 16) | (UINT32_C(0x7E00) & is_nan) | (nonsign & ~is_nan));
}

static inline float bf2f(uint16_t b) { return f32_from_bits((uint32_t)b << 16); }

static inline uint16_t f2bf(float f)
{
    const uint32_t w = f32_to_bits(f);
    const uint32_t rounded = (w + (((w >> 16) & 1u) + UINT32_C(0x7FFF))) >> 16;
    const uint32_t is_nan = (uint32_t)0 - (uint32_t)(f != f); /* a mask: see h2f */
    return (uint16_t)((UINT32_C(0x7FC0) & is_nan) | (rounded & ~is_nan));
}

#endif
