/* INCRBYFLOAT and HINCRBYFLOAT in C's long double, as redis-server does
 * them (t_string.c incrbyfloatCommand, t_hash.c hincrbyfloatCommand,
 * util.c string2ld and ld2string in LD_STR_HUMAN mode): parse both
 * operands with strtold, add, and format with "%.17Lf" minus trailing
 * zeros. Rust has no long double, and emulating the x87 80-bit format
 * (or binary128 on aarch64) by hand would be a second, subtly different
 * implementation; compiling the same C expressions gives the same bits
 * as redis-server on the same platform. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NIBBLE_LD_MAX_CHARS (5 * 1024)

/* redis's string2ld: 1 and *dp on success, 0 if not a valid float. */
static int nibble_string2ld(const char *s, size_t slen, long double *dp) {
    char buf[NIBBLE_LD_MAX_CHARS];
    long double value;
    char *eptr;
    if (slen == 0 || slen >= sizeof(buf)) return 0;
    memcpy(buf, s, slen);
    buf[slen] = '\0';
    errno = 0;
    value = strtold(buf, &eptr);
    if (isspace((unsigned char)buf[0]) || eptr[0] != '\0' || (size_t)(eptr - buf) != slen ||
        ((errno == ERANGE) &&
         (value == HUGE_VALL || value == -HUGE_VALL || fpclassify(value) == FP_ZERO)) ||
        errno == EINVAL || isnan(value))
        return 0;
    *dp = value;
    return 1;
}

/* cur (NULL: the key or field is missing, value 0) plus incr, written to
 * out as redis formats it. Returns the length written, or
 *   -1  cur is not a valid float
 *   -2  incr is not a valid float
 *   -3  incr is NaN or infinite (checked only when check_incr is set)
 *   -4  the sum is NaN or infinite
 *   -5  out is too small */
long nibble_ld_incr(const char *cur, size_t cur_len, const char *incr, size_t incr_len,
                    int check_incr, char *out, size_t cap) {
    long double value = 0, by = 0;
    if (!nibble_string2ld(incr, incr_len, &by)) return -2;
    if (check_incr && (isnan(by) || isinf(by))) return -3;
    if (cur && !nibble_string2ld(cur, cur_len, &value)) return -1;
    value += by;
    if (isnan(value) || isinf(value)) return -4;
    int l = snprintf(out, cap, "%.17Lf", value);
    if (l < 0 || (size_t)l + 1 > cap) return -5;
    if (strchr(out, '.') != NULL) {
        char *p = out + l - 1;
        while (*p == '0') {
            p--;
            l--;
        }
        if (*p == '.') l--;
    }
    if (l == 2 && out[0] == '-' && out[1] == '0') {
        out[0] = '0';
        l = 1;
    }
    return l;
}
