// metrics.jsonl, as `ctrax plot` reads it (tools/cmd_plot.c) and as a
// resumed run cuts it back (ct_metrics_truncate_after, src/train/summary.c).
// The input is
//   byte 0   the step to truncate after: byte - 16, so -16..239
//   the rest metrics.jsonl
// The SVG goes to stdout, which the harness points at /dev/null.
#include <stdint.h>
#include <stdio.h>

#include "commands.h"
#include "ctrax/train/summary.h"
#include "common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (!freopen("/dev/null", "w", stdout)) perror("/dev/null");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t step = (int64_t)fuzz_take(&data, &size, 1) - 16;
    char path[1024];
    fuzz_write(path, sizeof path, "metrics.jsonl", data, size);
    char *argv[] = {"plot", path, "-o", "-", NULL};
    ctrax_cmd_plot(4, argv);
    char *panels[] = {"plot", path, "-o", "-", "--metrics", "loss,accuracy", NULL};
    ctrax_cmd_plot(6, panels);
    ct_error err;
    int64_t n_dropped;
    if (ct_metrics_truncate_after(path, step, &n_dropped, &err) == CT_OK) {
        char *after[] = {"plot", path, "-o", "-", NULL};
        ctrax_cmd_plot(4, after);
    }
    return 0;
}
