// `ctrax sample`'s choice of the next byte from one row of logits (pick, a
// static function of tools/cmd_sample.c, compiled in here), against CDFs
// computed by hand: greedy at temperature 0 with equal logits going to the
// lowest id, softmax(logits / T) over the top-k likeliest (equal logits by
// id), u inverted on the CDF, non-finite logits never drawn, and -1 when
// no logit is finite. Through a trained model (tests/cli_driver.c) logits
// are never equal nor NaN, so these cases are only reachable here.
#include "../tools/cmd_common.c"
#include "../tools/cmd_sample.c"

#include "check.h"

// pick over the n logits of l (at most 8).
static int pick8(const float *l, int n, double temperature, int64_t top_k, float u) {
    scored buf[8];
    return pick(l, n, temperature, top_k, u, buf);
}

int main(void) {
    // {0, ln 3} at T = 1: id 1 with p 3/4, then id 0 (the CDF is 0.75, 1).
    const float two[] = {0.0f, (float)log(3.0)};
    CHECK(pick8(two, 2, 1.0, 0, 0.0f) == 1);
    CHECK(pick8(two, 2, 1.0, 0, 0.74f) == 1);
    CHECK(pick8(two, 2, 1.0, 0, 0.76f) == 0);
    CHECK(pick8(two, 2, 1.0, 0, 0.999f) == 0);
    // The temperature divides: {0, ln 3 / 2} at T = 1/2 is the same CDF (at T
    // = 1 it would be 0.634, 1; multiplied, 0.568, 1).
    const float half[] = {0.0f, (float)(log(3.0) / 2)};
    CHECK(pick8(half, 2, 0.5, 0, 0.74f) == 1);
    CHECK(pick8(half, 2, 0.5, 0, 0.76f) == 0);

    // {ln 1, ln 3, ln 6}: all three, the CDF is 0.6 (id 2), 0.9 (id 1), 1 (id 0);
    // top-k 2: 2/3 (id 2), 1 (id 1), id 0 never.
    const float three[] = {0.0f, (float)log(3.0), (float)log(6.0)};
    for (int64_t k = 0; k <= 5; k += 5) {  // 0 and past V: all
        CHECK(pick8(three, 3, 1.0, k, 0.59f) == 2);
        CHECK(pick8(three, 3, 1.0, k, 0.61f) == 1);
        CHECK(pick8(three, 3, 1.0, k, 0.89f) == 1);
        CHECK(pick8(three, 3, 1.0, k, 0.91f) == 0);
    }
    CHECK(pick8(three, 3, 1.0, 3, 0.91f) == 0);
    CHECK(pick8(three, 3, 1.0, 2, 0.66f) == 2);
    CHECK(pick8(three, 3, 1.0, 2, 0.67f) == 1);
    CHECK(pick8(three, 3, 1.0, 2, 0.999f) == 1);
    CHECK(pick8(three, 3, 1.0, 1, 0.999f) == 2);

    // Equal logits: greedy takes the lowest id; top-k keeps the lowest ids
    // (each of ids 0 and 1 with p 1/2 among three equal, id 2 never).
    const float ties[] = {1.0f, 2.0f, 2.0f, 0.0f};
    CHECK(pick8(ties, 4, 0.0, 0, 0.5f) == 1);
    const float equal[] = {2.0f, 2.0f, 2.0f};
    CHECK(pick8(equal, 3, 1.0, 2, 0.49f) == 0);
    CHECK(pick8(equal, 3, 1.0, 2, 0.51f) == 1);
    CHECK(pick8(equal, 3, 1.0, 2, 0.999f) == 1);
    // Each byte's share of [0, 1) is half-open: u on the edge, 1/2, is id 1's.
    CHECK(pick8(equal, 3, 1.0, 2, 0.5f) == 1);

    // A NaN logit is never drawn nor greedy: {NaN, 1, 0} is {1, 0}'s draw
    // (CDF e / (e + 1) = 0.731 for id 1, then id 2).
    const float nan3[] = {NAN, 1.0f, 0.0f};
    CHECK(pick8(nan3, 3, 0.0, 0, 0.5f) == 1);
    CHECK(pick8(nan3, 3, 1.0, 0, 0.0f) == 1);
    CHECK(pick8(nan3, 3, 1.0, 0, 0.72f) == 1);
    CHECK(pick8(nan3, 3, 1.0, 0, 0.74f) == 2);
    CHECK(pick8(nan3, 3, 1.0, 0, 0.999f) == 2);
    const float nan_last[] = {1.0f, 0.0f, NAN};
    CHECK(pick8(nan_last, 3, 1.0, 0, 0.999f) == 1);
    // An overflow to inf is not drawn either: {inf, 0} is {0}'s draw.
    const float inf2[] = {INFINITY, 0.0f};
    CHECK(pick8(inf2, 2, 0.0, 0, 0.5f) == 1);
    CHECK(pick8(inf2, 2, 1.0, 0, 0.999f) == 1);
    // No finite logit: nothing to draw (-1), at any temperature and top-k,
    // never byte 0 as if the model had chosen it.
    const float none[] = {NAN, INFINITY, -INFINITY};
    CHECK(pick8(none, 3, 0.0, 0, 0.5f) == -1);
    CHECK(pick8(none, 3, 1.0, 0, 0.5f) == -1);
    CHECK(pick8(none, 3, 1.0, 1, 0.0f) == -1);
    const float one_nan[] = {NAN};
    CHECK(pick8(one_nan, 1, 1.0, 0, 0.0f) == -1);
    return check_summary("test_cli_sample_pick");
}
