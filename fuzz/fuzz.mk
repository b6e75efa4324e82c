# libFuzzer harnesses for run.c's input parsing (included by the top Makefile).
#
#   make fuzz          build the four harnesses, run each for FUZZ_SECONDS (60)
#   make fuzz-short    the same, 20 seconds each
#   make fuzz-build    only build them
#   make fuzz-corpus   regenerate the seed corpora (fuzz/make_corpus.py)
#   make fuzz-clean    remove the binaries and the work directory
#
# Each harness starts from a copy of its seed corpus (fuzz/corpus/NAME, in git) in
# fuzz/corpus-work/NAME (not in git), which keeps what the runs find. A crash, a
# leak, a timeout or an out-of-memory fails the target; the input that caused it
# is saved as fuzz/corpus-work/NAME-crash-* (or -leak-, -timeout-, -oom-), and
# ./fuzz/fuzz_NAME THAT_FILE replays it. The log of each run is
# fuzz/corpus-work/NAME.log; the summary prints libFuzzer's "Done N runs in S
# second(s)" line for each harness.

MODELS ?= models
PYTHON ?= /usr/bin/python3
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
# FUZZ_CC's flag for this CPU (native_flag, from the top Makefile), probed once and
# only when a harness is built
FUZZ_NATIVE = $(eval FUZZ_NATIVE := $(call native_flag,$(FUZZ_CC)))$(FUZZ_NATIVE)
FUZZ_CFLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
              -ffp-contract=off $(FUZZ_NATIVE) -Wall -Wextra -Wno-unused-function -Wno-unknown-pragmas
FUZZ_DEFS ?=
FUZZ_NAMES = header tokenizer encode tokn
FUZZ_BINS = $(FUZZ_NAMES:%=fuzz/fuzz_%)
FUZZ_WORK = fuzz/corpus-work
FUZZ_TOKENIZER ?= $(MODELS)/tok512.bin
# per harness: the largest input (tiny models and tokenizers fit, the q8_0 one of rows of 32 and the
# per-piece one of 15 KB too; encode is quadratic)
FUZZ_MAX_LEN_header = 16384
FUZZ_MAX_LEN_tokenizer = 8192
FUZZ_MAX_LEN_encode = 1024
FUZZ_MAX_LEN_tokn = 16384
FUZZ_RUN_FLAGS = -timeout=30 -rss_limit_mb=2048 -print_final_stats=1

# rebuild the harnesses when the compiler or the flags change (e.g. FUZZ_DEFS)
FUZZ_BUILD_FLAGS = $(FUZZ_WORK)/build-flags
$(FUZZ_BUILD_FLAGS): fuzz-force
	@mkdir -p $(FUZZ_WORK)
	@echo '$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_DEFS)' | cmp -s - $@ || echo '$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_DEFS)' > $@

fuzz/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_common.h run.c $(FUZZ_BUILD_FLAGS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_DEFS) -o $@ $< -lm

.PHONY: fuzz fuzz-short fuzz-build fuzz-corpus fuzz-clean fuzz-force
fuzz-force:
fuzz-build: $(FUZZ_BINS)

fuzz: $(FUZZ_BINS)
	@failed=""; summary=""; \
	for name in $(FUZZ_NAMES); do \
	    work=$(FUZZ_WORK)/$$name; log=$(FUZZ_WORK)/$$name.log; \
	    mkdir -p $$work; \
	    for f in fuzz/corpus/$$name/*; do \
	        [ -e "$$work/$${f##*/}" ] || cp "$$f" "$$work/"; \
	    done; \
	    case $$name in header) max=$(FUZZ_MAX_LEN_header);; tokenizer) max=$(FUZZ_MAX_LEN_tokenizer);; \
	        tokn) max=$(FUZZ_MAX_LEN_tokn);; \
	        *) max=$(FUZZ_MAX_LEN_encode);; esac; \
	    echo "fuzz: $$name for $(FUZZ_SECONDS) s (corpus $$work, log $$log)"; \
	    if FUZZ_TOKENIZER=$(FUZZ_TOKENIZER) ./fuzz/fuzz_$$name $(FUZZ_RUN_FLAGS) -max_len=$$max \
	            -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=$(FUZZ_WORK)/$$name- $$work >$$log 2>&1; then \
	        summary="$$summary$$name: $$(grep -E '^Done [0-9]+ runs' $$log | tail -1)\n"; \
	    else \
	        failed="$$failed $$name"; \
	        summary="$$summary$$name: FAILED after $$(grep -Eo 'stat::number_of_executed_units: [0-9]+' $$log | grep -Eo '[0-9]+$$') runs, see $$log\n"; \
	        echo "---- fuzz_$$name failed; the end of $$log:"; \
	        grep -E 'ERROR|check failed' $$log | head -3; grep -m 6 -E '^ +#[0-9]+ 0x' $$log; \
	        grep -E 'SUMMARY|Test unit written' $$log; \
	    fi; \
	done; \
	printf "fuzz summary ($(FUZZ_SECONDS) s each):\n$$summary"; \
	if [ -n "$$failed" ]; then echo "fuzz: FAILED:$$failed"; exit 1; fi

# fuzz-short: two harnesses at a time where there are two CPUs (each then gets a CPU of its own
# for its 20 seconds, as when they ran one after another), each pair's logs and summary as fuzz's
FUZZ_SHORT_PAIRS = fuzz-short-header-tokenizer fuzz-short-encode-tokn
fuzz-short: $(FUZZ_BINS)
	@$(MAKE) --no-print-directory --output-sync=target -j$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) \
	    $(FUZZ_SHORT_PAIRS)

.PHONY: $(FUZZ_SHORT_PAIRS)
$(FUZZ_SHORT_PAIRS): fuzz-short-%:
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=20 FUZZ_NAMES="$(subst -, ,$*)"

fuzz-corpus:
	$(PYTHON) fuzz/make_corpus.py $(MODELS)

fuzz-clean:
	rm -rf $(FUZZ_BINS) $(FUZZ_WORK)
