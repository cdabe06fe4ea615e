/* Number formatting that matches what the Python harness prints, so that the verdict texts
 * ("... timed out after 2.0034 seconds") read the same as c10d's: Python's repr() of a float is
 * the shortest digit string that reads back to the same double, in positional notation for
 * exponents from -4 to 15 and in scientific notation ("1e-05", "1.5e+16") otherwise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testing/harness.h"

void pyfmt_float(double v, char *out, size_t size)
{
    if (isnan(v)) {
        snprintf(out, size, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(out, size, v < 0 ? "-inf" : "inf");
        return;
    }
    if (v == 0) {
        snprintf(out, size, signbit(v) ? "-0.0" : "0.0");
        return;
    }
    char sci[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec - 1, v);
        if (strtod(sci, NULL) == v)
            break;
    }
    /* sci is "-d.ddde+XX": collect the digits and the exponent. */
    const char *p = sci;
    bool neg = *p == '-';
    if (neg)
        p++;
    char digits[32];
    size_t nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < sizeof digits - 1)
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    int exp = *p == 'e' ? atoi(p + 1) : 0;

    char buf[96];
    size_t n = 0;
    if (neg)
        buf[n++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            buf[n++] = '0';
            buf[n++] = '.';
            for (int i = -1; i > exp; i--)
                buf[n++] = '0';
            memcpy(buf + n, digits, nd);
            n += nd;
        } else {
            for (int i = 0; i <= exp; i++)
                buf[n++] = (size_t)i < nd ? digits[i] : '0';
            buf[n++] = '.';
            if ((size_t)exp + 1 < nd) {
                memcpy(buf + n, digits + exp + 1, nd - (size_t)exp - 1);
                n += nd - (size_t)exp - 1;
            } else {
                buf[n++] = '0';
            }
        }
        buf[n] = '\0';
    } else {
        buf[n++] = digits[0];
        if (nd > 1) {
            buf[n++] = '.';
            memcpy(buf + n, digits + 1, nd - 1);
            n += nd - 1;
        }
        snprintf(buf + n, sizeof buf - n, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    snprintf(out, size, "%s", buf);
}

void pyfmt_seconds_ms(int64_t ms, char *out, size_t size)
{
    if (ms % 1000 == 0)
        snprintf(out, size, "%lld", (long long)(ms / 1000));
    else
        pyfmt_float((double)ms / 1000.0, out, size);
}
