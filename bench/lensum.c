/* The anchor of bench/kernel_ingest.py: the least a program can do to total the fence lines
 * of a kern.log -- find "kernel: " and the prefix, sum the first LEN= and count the lines.
 * No flows, no validation, no ticks.  Compiled by the bench with gcc -O2 at run time.
 *   lensum FILE  ->  "<packets> <bytes>" */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f)
        return 1;
    static char buf[1 << 20];
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long long packets = 0, bytes = 0;
    setvbuf(f, buf, _IOFBF, sizeof(buf));
    while ((n = getline(&line, &cap, f)) > 0) {
        char *k = memmem(line, (size_t)n, " kernel: ", 9);
        if (!k)
            continue;
        char *p = memmem(k, (size_t)(line + n - k), "EGRESS_FENCE", 12);
        if (!p)
            continue;
        char *len = memmem(p, (size_t)(line + n - p), " LEN=", 5);
        if (!len || len[5] < '0' || len[5] > '9')
            continue;
        /* the corpus's malformed lines: DST= must come before LEN= */
        char *dst = memmem(p, (size_t)(len - p), " DST=", 5);
        if (!dst || dst[5] == ' ')
            continue;
        packets++;
        bytes += strtoll(len + 5, NULL, 10);
    }
    printf("%lld %lld\n", packets, bytes);
    free(line);
    return 0;
}
