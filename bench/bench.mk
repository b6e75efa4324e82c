# bench/bench.mk: `make bench`, included by the top-level Makefile (which defines
# CC, NATIVE, OPENMP, PYTHON and MODELS). Writes random 15M and 110M checkpoints
# into bench/ on first use (gitignored), then prints a Markdown table of prefill and
# decode tok/s, decode's weight traffic against the measured read bandwidth, and
# prefill's GFLOP/s against the measured peak (bench/peak).
#   make bench                          both models, 1 and 2 threads (about 4 min on idle cores;
#                                       it waits, within limits, while other work holds them)
#   make bench BENCH_ARGS=--quick       15M only, one run each, no waiting for free cores (a smoke test)
#   make bench BENCH_ARGS="--models 110M --threads 1"
#   make bench PEER=/path/to/llama2.c/run LLAMA_BENCH=/path/to/llama-bench
#                                       side by side with llama2.c and llama.cpp on the same
#                                       weights (see bench/bench.py); either may be left out
#   LLAMA_BENCH (or LLAMA_QUANTIZE and LLAMA_CONVERT, llama.cpp's llama-quantize and
#   llama-convert-llama2c-to-ggml, else found beside llama-bench) also gives the Q4_0 and
#   Q4_K_M rows: llama-quantize's GGUFs of the same weights, converted by export.py
BENCH_ARGS ?=
BENCH_MOE ?= 1
BENCH_MOE_ARGS ?=
PEER ?=
LLAMA_BENCH ?=
LLAMA_QUANTIZE ?=
LLAMA_CONVERT ?=

bench/stream: bench/stream.c
	$(CC) -O3 $(NATIVE) $(OPENMP) -Wall -Wextra -o $@ bench/stream.c

# peak single-precision GFLOP/s; -ffp-contract=fast makes its x * m + x one FMA
bench/peak: bench/peak.c
	$(CC) -O3 $(NATIVE) -ffp-contract=fast $(OPENMP) -Wall -Wextra -o $@ bench/peak.c

# where decode's reads lose speed against bench/stream (see bench/read_order.c)
bench/read_order: bench/read_order.c run.c
	$(CC) $(BUILD_FLAGS) -Wno-unused-function $(OPENMP) -o $@ bench/read_order.c -lm

# decode's arithmetic ceiling for each weight type, matrices held in cache (see bench/in_cache.c)
bench/in_cache: bench/in_cache.c run.c
	$(CC) $(BUILD_FLAGS) -Wno-unused-function $(OPENMP) -o $@ bench/in_cache.c -lm

.PHONY: bench bench-moe
bench: run bench/stream bench/peak bench/in_cache bench/read_order
	MODELS=$(MODELS) PEER=$(PEER) LLAMA_BENCH=$(LLAMA_BENCH) LLAMA_QUANTIZE=$(LLAMA_QUANTIZE) \
	    LLAMA_CONVERT=$(LLAMA_CONVERT) $(PYTHON) bench/bench.py $(BENCH_ARGS)
	$(if $(filter 0,$(BENCH_MOE))$(findstring --quick,$(BENCH_ARGS)),,$(MAKE) --no-print-directory bench-moe)

# a mixture of experts against a dense model reading the same bytes a token, and with
# LLAMA_BENCH a Mixtral against llama.cpp on the same weights (bench/moe.py; about 3 min,
# and 7 GB of random checkpoints written into bench/ on first use). BENCH_MOE=0 leaves
# it out of `make bench`, as does BENCH_ARGS=--quick.
bench-moe: run
	LLAMA_BENCH=$(LLAMA_BENCH) $(PYTHON) bench/moe.py $(BENCH_MOE_ARGS)
