# Makefile for run.c. `make` builds ./run; `make test` runs every test.
CC ?= gcc
MODELS ?= ../shared/models
GOLDEN ?= ../shared/golden
PYTHON ?= /usr/bin/python3
# -ffp-contract=off: the kernels place their own fused multiply-adds (see mul_add in
# run.c), so that every path computes each dot product with the same roundings.
CFLAGS ?= -O3 -march=native
WARN = -Wall -Wextra
BASE_FLAGS = $(CFLAGS) -ffp-contract=off $(WARN)
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp)

run: run.c
	$(CC) $(BASE_FLAGS) $(OPENMP) -o $@ run.c -lm

.PHONY: clean
clean:
	rm -f run run-asan tests/test_rope
