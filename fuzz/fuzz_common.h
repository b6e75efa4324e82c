// Shared by the libFuzzer harnesses: run.c without its CLI, and CHECK, which
// aborts (a crash libFuzzer records, with the input) when an invariant fails.
#define RUN_TESTING
#include "../run.c"

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s: check failed: %s (line %d)\n", __FILE__, #cond, __LINE__); \
            abort();                                                                     \
        }                                                                                \
    } while (0)
