/* Flat JSON arrays of numbers, parsed into float32 without the GIL (protocol/json_scan.py loads it).
 *
 * Why: a V2 request carrying an image as JSON is mostly one long array of numbers (1.6 MB for
 * 3x224x224 floats). Parsing it holds the GIL for milliseconds in every Python JSON library, so the
 * event loop reads nothing else meanwhile. This file is plain C with no Python API: called through
 * ctypes, which releases the GIL for the call, it runs on a worker thread while the loop goes on.
 *
 * What: every array of at least `min_count` numbers (and nothing else: no nesting, strings or literals)
 * that is not inside a string is parsed into `out`, and its place recorded in `spans`. The caller
 * replaces those spans and parses the small rest with an ordinary JSON parser. Anything this code is
 * not sure of leaves the array unrecorded (the caller's ordinary decoder then handles it, errors and
 * all), so what it does record is exactly what parsing the number to the nearest double and rounding
 * that to float32 gives (the ordinary decoder's result):
 *   - a mantissa of at most 19 digits below 2^53 with a power of ten up to 22 is converted exactly
 *     (one correctly rounded operation on exact operands: Clinger's fast path);
 *   - any other value is computed within about 2 units in the last place of a double, and kept only
 *     when that is far enough from a halfway point between two float32 values that both roundings
 *     agree; subnormal and out-of-range float32 values are left to the caller.
 * Nothing here depends on the locale or on the machine's speed.
 */
#include <stdint.h>
#include <string.h>

static const uint64_t POW10_INT[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};
static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

#define FLT_MIN_NORMAL 1.1754943508222875e-38 /* 2^-126 */
#define FLT_MAX_VALUE 3.4028234663852886e38
#define HALFWAY_GUARD 16 /* double ulps kept clear of a float32 halfway point */

/* Eight ASCII digits at once (as in simdjson and fast_float): how many of the bytes are digits, and
 * their value. The bytes are read as a little- or big-endian integer alike through memcpy. */
static uint64_t load_eight(const unsigned char *p) {
    uint64_t value;
    memcpy(&value, p, sizeof value);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    value = __builtin_bswap64(value);
#endif
    return value;
}

/* How many of the eight bytes, from the first, are digits. A byte's carry into the next (from a byte
 * of 0xFA or more, not a digit) only changes what is said of bytes after a non-digit. */
static int leading_digits(uint64_t v) {
    uint64_t high = UINT64_C(0xF0F0F0F0F0F0F0F0), threes = UINT64_C(0x3030303030303030);
    uint64_t not_digit = ((v & high) ^ threes) | (((v + UINT64_C(0x0606060606060606)) & high) ^ threes);
    return not_digit ? __builtin_ctzll(not_digit) >> 3 : 8;
}

static uint64_t eight_digits_value(uint64_t v) {
    const uint64_t mask = UINT64_C(0x000000FF000000FF);
    v -= UINT64_C(0x3030303030303030);
    v = (v * 10) + (v >> 8);
    v = (((v & mask) * UINT64_C(0x000F424000000064)) + (((v >> 16) & mask) * UINT64_C(0x0000271000000001))) >> 32;
    return v;
}

/* The value of the first `run` (1 to 8) digits of the eight bytes: moved to the end, zeros before. */
static uint64_t digits_value(uint64_t v, int run) {
    if (run == 8) return eight_digits_value(v);
    int gap = 8 * (8 - run);
    return eight_digits_value((v << gap) | (UINT64_C(0x3030303030303030) >> (64 - gap)));
}

static int is_space(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* One JSON number at *pos into *value: 2 for an integer (no fraction, no exponent), 1 for any other
 * number, 0 when it is not a number by JSON's grammar or not one this code converts with certainty
 * (then the array is left to the caller). */
static int parse_number(const unsigned char *text, int64_t len, int64_t *pos, float *value) {
    int64_t i = *pos;
    int negative = 0, digits = 0, truncated = 0, integer = 1;
    uint64_t mantissa = 0;
    int64_t exponent = 0;
    negative = i < len && text[i] == '-';
    i += negative;
    if (i >= len || !is_digit(text[i])) return 0;
    if (text[i] == '0') {
        i++;
        if (i < len && is_digit(text[i])) return 0; /* a leading zero */
    } else {
        for (; i < len && is_digit(text[i]); i++) {
            if (digits < 19) {
                mantissa = mantissa * 10 + (uint64_t)(text[i] - '0');
                digits++;
            } else {
                exponent++;
                truncated |= text[i] != '0';
            }
        }
    }
    if (i < len && text[i] == '.') {
        integer = 0;
        i++;
        if (i >= len || !is_digit(text[i])) return 0;
        /* up to eight at a time while they fit in the 19 digits kept (leading zeros counted: that
         * only keeps fewer digits exact, never more) */
        while (digits <= 11 && i + 8 <= len) {
            uint64_t word = load_eight(text + i);
            int run = leading_digits(word);
            if (run == 0) break;
            mantissa = mantissa * POW10_INT[run] + digits_value(word, run);
            digits += run;
            exponent -= run;
            i += run;
            if (run < 8) break;
        }
        for (; i < len && is_digit(text[i]); i++) {
            if (mantissa == 0 && text[i] == '0') {
                exponent--; /* leading zeros of a fraction are not significant digits */
            } else if (digits < 19) {
                mantissa = mantissa * 10 + (uint64_t)(text[i] - '0');
                digits++;
                exponent--;
            } else {
                truncated |= text[i] != '0';
            }
        }
    }
    if (i < len && (text[i] == 'e' || text[i] == 'E')) {
        int64_t written = 0;
        int exponent_negative = 0;
        integer = 0;
        i++;
        if (i < len && (text[i] == '+' || text[i] == '-')) {
            exponent_negative = text[i] == '-';
            i++;
        }
        if (i >= len || !is_digit(text[i])) return 0;
        for (; i < len && is_digit(text[i]); i++) {
            if (written < 100000) written = written * 10 + (text[i] - '0');
        }
        exponent += exponent_negative ? -written : written;
    }
    *pos = i;
    if (integer && (digits > 15 || truncated)) return 0; /* a large integer: the caller's parser types it */
    if (mantissa == 0) {
        *value = negative && !integer ? -0.0f : 0.0f; /* -0 is the integer 0; -0.0 a negative zero */
        return 1 + integer;
    }
    double result = (double)mantissa;
    if (!truncated && mantissa <= (UINT64_C(1) << 53) && exponent >= -22 && exponent <= 22) {
        result = exponent < 0 ? result / POW10[-exponent] : result * POW10[exponent];
        if (result > FLT_MAX_VALUE) return 0;
        *value = (float)(negative ? -result : result);
        return 1 + integer;
    }
    if (exponent < -44 - 19 || exponent > 44) return 0; /* beyond two steps of 1e22: out of range */
    for (; exponent > 22; exponent -= 22) result *= 1e22;
    for (; exponent < -22; exponent += 22) result /= 1e22;
    result = exponent < 0 ? result / POW10[-exponent] : result * POW10[exponent];
    if (!(result >= FLT_MIN_NORMAL && result <= FLT_MAX_VALUE)) return 0;
    uint64_t bits;
    memcpy(&bits, &result, sizeof bits);
    /* the 29 bits a float32 drops from a double's mantissa: halfway is 2^28 */
    int64_t from_halfway = (int64_t)(bits & ((UINT64_C(1) << 29) - 1)) - (INT64_C(1) << 28);
    if (from_halfway <= HALFWAY_GUARD && from_halfway >= -HALFWAY_GUARD) return 0;
    *value = (float)(negative ? -result : result);
    return 1;
}

static int64_t skip_space(const unsigned char *text, int64_t len, int64_t i) {
    while (i < len && is_space(text[i])) i++;
    return i;
}

/* The array opening at text[start] ('['): its numbers into out from out[0], their count returned,
 * *end set past its ']' and *integers to whether every number in it is an integer; -1 when it is not
 * a flat array of numbers this code converts. */
static int64_t parse_array(const unsigned char *text, int64_t len, int64_t start, float *out,
                           int64_t out_cap, int64_t *end, int64_t *integers) {
    int64_t i = skip_space(text, len, start + 1), count = 0;
    int kinds = 2;
    if (i < len && text[i] == ']') return -1; /* empty: nothing worth taking out */
    for (;;) {
        int kind = count < out_cap ? parse_number(text, len, &i, out + count) : 0;
        if (!kind) return -1;
        kinds &= kind;
        count++;
        i = skip_space(text, len, i);
        if (i >= len) return -1;
        if (text[i] == ']') {
            *end = i + 1;
            *integers = kinds == 2;
            return count;
        }
        if (text[i] != ',') return -1;
        i = skip_space(text, len, i + 1);
    }
}

/* Every flat numeric array of at least min_count numbers outside strings: numbers into out (out_cap
 * floats; len / 2 + 1 always suffices), and per array five values into spans: the offset of its '[',
 * the offset past its ']', the offset of its first number in out, its count, and 1 if every number
 * in it is an integer (no fraction, no exponent: JSON's integers), else 0. Returns how many
 * arrays were found, or -1 when more than spans_cap were (the caller then decodes it all the ordinary
 * way). The text need not be valid JSON: whatever is not recorded is left to the caller's parser. */
int64_t edgeinfer_float32_arrays(const unsigned char *text, int64_t len, int64_t min_count, float *out,
                                 int64_t out_cap, int64_t *spans, int64_t spans_cap) {
    int64_t i = 0, found = 0, used = 0;
    while (i < len) {
        unsigned char c = text[i];
        if (c == '"') {
            for (i++; i < len; i++) {
                if (text[i] == '\\') {
                    i++;
                } else if (text[i] == '"') {
                    break;
                }
            }
            i++;
        } else if (c == '[') {
            int64_t end = 0, integers = 0;
            int64_t count = parse_array(text, len, i, out + used, out_cap - used, &end, &integers);
            if (count >= min_count && count > 0) {
                if (found == spans_cap) return -1;
                int64_t *span = spans + 5 * found;
                span[0] = i;
                span[1] = end;
                span[2] = used;
                span[3] = count;
                span[4] = integers;
                found++;
                used += count;
                i = end;
            } else {
                i++; /* not one: its contents are scanned like any other text */
            }
        } else {
            i++;
        }
    }
    return found;
}
