/* The integer division helpers clang calls on Hexagon (which has no divide instruction); compiler-rt's
 * builtins for Hexagon are not packaged with Debian's clang. Shift-and-subtract, no division inside. */
#include <stdint.h>

static uint64_t udivmod64(uint64_t n, uint64_t d, uint64_t *rem) {
    uint64_t q = 0, r = 0;
    if (d == 0) { *rem = 0; return ~(uint64_t)0; }
    for (int i = 63; i >= 0; i--) {
        r = (r << 1) | ((n >> i) & 1u);
        if (r >= d) { r -= d; q |= (uint64_t)1 << i; }
    }
    *rem = r;
    return q;
}

uint32_t __hexagon_udivsi3(uint32_t n, uint32_t d) { uint64_t r; return (uint32_t)udivmod64(n, d, &r); }
uint32_t __hexagon_umodsi3(uint32_t n, uint32_t d) { uint64_t r; udivmod64(n, d, &r); return (uint32_t)r; }
uint64_t __hexagon_udivdi3(uint64_t n, uint64_t d) { uint64_t r; return udivmod64(n, d, &r); }
uint64_t __hexagon_umoddi3(uint64_t n, uint64_t d) { uint64_t r; udivmod64(n, d, &r); return r; }
int32_t __hexagon_divsi3(int32_t n, int32_t d) {
    uint64_t r;
    uint32_t un = n < 0 ? 0u - (uint32_t)n : (uint32_t)n, ud = d < 0 ? 0u - (uint32_t)d : (uint32_t)d;
    uint32_t q = (uint32_t)udivmod64(un, ud, &r);
    return (int32_t)(((n < 0) != (d < 0)) ? 0u - q : q);
}
int32_t __hexagon_modsi3(int32_t n, int32_t d) {
    uint64_t r;
    uint32_t un = n < 0 ? 0u - (uint32_t)n : (uint32_t)n, ud = d < 0 ? 0u - (uint32_t)d : (uint32_t)d;
    udivmod64(un, ud, &r);
    return (int32_t)(n < 0 ? 0u - (uint32_t)r : (uint32_t)r);
}
