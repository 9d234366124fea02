# Plain Makefile: one object per source, dependency files for incremental rebuilds.
#   make            build ./train, ./bench, ./tokenize, the test binaries and the tiny configs' demo data (CUDA
#                   kernels too when nvcc exists); every core unless -jN is given
#   make test       full CPU test suite (+ GPU cases when a GPU is present), one summary line
#   make test-fast  the fast tier only (seconds)
#   make test-slow  make test plus the long sweeps (opt-in)
#   make deps       install missing Debian packages and fill .deps/include (header-only deps)
#   make demo       deps + ./train + demo data + a short tiny-llama training run + loss plot (the CPU
#                   backend only, in build-cpu/, when no GPU is visible and CUDA=1 is not given)
#   make CUDA=0     CPU-only build even where nvcc exists;  make SM=80  another GPU arch (SM="80 90":
#                   both in one binary; see GENCODE below)
#   make CUDNN=0    leave cuDNN out (model.attention_backend = "cudnn" then fails at config check)
#   make fuzz       libFuzzer targets (clang, ASan + UBSan, no CUDA) in build-fuzz/; opt-in, see scripts/fuzz.sh
SHELL := /bin/bash
# Every core unless the command line says otherwise (an explicit -jN wins); sub-makes share the
# top make's job slots.
ifeq ($(MAKELEVEL),0)
  MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif
BUILD ?= build
CXX ?= g++
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA ?= $(if $(NVCC),1,0)
CUDNN ?= 1
SM ?= 90
PYTHON ?= $(shell command -v /usr/bin/python3 2>/dev/null || command -v python3)

CXXFLAGS ?= -O2
CXXFLAGS += -std=c++20 -fopenmp -Wall -Wextra -Wno-unused-parameter -MMD -MP
CPPFLAGS += -I. -Icsrc -isystem .deps/include
# OpenMPI (make deps installs it); the fallback paths are Debian/Ubuntu's.
MPI_CFLAGS ?= $(shell mpicxx --showme:compile 2>/dev/null || echo -I/usr/lib/x86_64-linux-gnu/openmpi/include)
MPI_LIBS ?= $(filter-out -lmpi_cxx,$(shell mpicxx --showme:link 2>/dev/null || echo -L/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi))
CPPFLAGS += $(patsubst -I%,-isystem %,$(MPI_CFLAGS)) -DOMPI_SKIP_MPICXX
LDFLAGS += -fopenmp
LDLIBS += $(MPI_LIBS) -lpthread

CPP_ALL := $(shell find csrc comm -name '*.cpp' -not -path 'csrc/train/main_*' -not -path 'csrc/bench/*')
# core/device.h: the CUDA backend defines it; a build without CUDA links csrc/core/no_device.cpp.
NO_DEVICE_SRC := csrc/core/no_device.cpp
CPP_SRC := $(filter-out $(NO_DEVICE_SRC),$(CPP_ALL))
# Benchmark cases register themselves at static init: linked as objects, never from the archive.
BENCH_SRC := $(shell find csrc/bench -name '*.cpp')
MAIN_SRC := $(wildcard csrc/train/main_*.cpp)
TEST_SRC := $(shell find tests -name '*.cpp' -not -path 'tests/dist/*' -not -path 'tests/fuzz/*')
# The multi-rank suite (run under mpirun): its own cases, the shared test code, the same runner.
DIST_SRC := $(shell find tests/dist -name '*.cpp') $(filter-out tests/main.cpp,$(shell find tests/common -name '*.cpp')) tests/train/train_fixture.cpp
CU_SRC :=

ifneq ($(CUDA),1)
  CPP_SRC += $(NO_DEVICE_SRC)
endif
ifeq ($(CUDA),1)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  # NCCL and cuDNN: CUDA_HOME first, else the Python venv's nvidia/ packages (the GPU machine).
  NV_PY := $(firstword $(foreach py,python3 $(PYTHON),$(shell $(py) -c "import nvidia; print(nvidia.__path__[0])" 2>/dev/null)))
  NCCL_HOME ?= $(if $(wildcard $(CUDA_HOME)/include/nccl.h),$(CUDA_HOME),$(NV_PY)/nccl)
  CUDNN_HOME ?= $(if $(wildcard $(CUDA_HOME)/include/cudnn.h),$(CUDA_HOME),$(NV_PY)/cudnn)
  CU_SRC := $(shell find cuda -name '*.cu')
  # SM: the architectures to build for, one or several ("80 90": one binary holding both). Each
  # gets its -gencode: 90 is sm_90a (the Hopper kernels' wgmma and setmaxnreg), any other XX is
  # compute_XX/sm_XX; the lowest listed one (unless 90) also embeds its PTX, which the driver
  # compiles at load for a newer GPU than any cubin fits (an SM=80 build runs on an H200 so). The
  # kernels then choose by what the running code has (cuda/common/arch.h).
  SM_BAD := $(shell printf '%s\n' $(SM) | grep -Evx '[1-9][0-9]{1,2}')
  $(if $(strip $(SM)),,$(error SM is empty: give one or more architectures, e.g. SM=90 or SM="80 90"))
  $(if $(SM_BAD),$(error SM="$(SM)": "$(SM_BAD)" is not an architecture number such as 80, 86, 89 or 90))
  SM_LOWEST := $(firstword $(shell printf '%s\n' $(SM) | sort -n))
  gencode_of = $(if $(filter 90,$(1)),-gencode=arch=compute_90a$(comma)code=sm_90a,-gencode=arch=compute_$(1)$(comma)code=sm_$(1)$(if $(filter $(SM_LOWEST),$(1)), -gencode=arch=compute_$(1)$(comma)code=compute_$(1)))
  GENCODE ?= $(foreach a,$(sort $(SM)),$(call gencode_of,$(a)))
  NVCCFLAGS ?= -O3
  NVCCFLAGS += -std=c++20 $(GENCODE) -t=0 -MMD -MP --expt-relaxed-constexpr -Xcompiler -fopenmp
  NCCL_LIB ?= $(firstword $(dir $(wildcard $(NCCL_HOME)/lib64/libnccl.so.2 $(NCCL_HOME)/lib/libnccl.so.2)))
  CPPFLAGS += -DENGINE_CUDA -I$(CUDA_HOME)/include $(if $(filter-out $(CUDA_HOME),$(NCCL_HOME)),-I$(NCCL_HOME)/include)
  LDFLAGS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(if $(NCCL_LIB),-L$(NCCL_LIB) -Wl$(comma)-rpath$(comma)$(NCCL_LIB))
  LDLIBS += -l:libnccl.so.2 -lcublasLt -lcublas -lcudart
  # cuDNN (optional: model.attention_backend = "cudnn"): ENGINE_CUDNN when its header and
  # libcudnn.so.9 are found (CUDNN=0 leaves it out); without it the build has the flash kernels only.
  CUDNN_LIB ?= $(firstword $(dir $(wildcard $(CUDNN_HOME)/lib64/libcudnn.so.9 $(CUDNN_HOME)/lib/libcudnn.so.9)))
  ifeq ($(CUDNN)$(if $(wildcard $(CUDNN_HOME)/include/cudnn.h),$(if $(CUDNN_LIB),yes)),1yes)
    CPPFLAGS += -DENGINE_CUDNN $(if $(filter-out $(CUDA_HOME),$(CUDNN_HOME)),-isystem $(CUDNN_HOME)/include)
    LDFLAGS += $(if $(filter-out $(CUDA_HOME)/lib64/,$(CUDNN_LIB)),-L$(CUDNN_LIB) -Wl$(comma)-rpath$(comma)$(CUDNN_LIB))
    LDLIBS += -l:libcudnn.so.9
  endif
endif
comma := ,

OBJ := $(CPP_SRC:%.cpp=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.cpp=$(BUILD)/obj/%.o)
BENCH_OBJ := $(BENCH_SRC:%.cpp=$(BUILD)/obj/%.o)
DIST_OBJ := $(DIST_SRC:%.cpp=$(BUILD)/obj/%.o) $(BUILD)/obj/tests/main_dist.o
LIB := $(BUILD)/libengine.a
PROGRAMS := train bench tokenize

.PHONY: all test test-fast test-slow deps clean demo fuzz demo-data cuda-objects
all: $(PROGRAMS) $(BUILD)/engine_tests $(BUILD)/dist_tests demo-data

# The tiny configs' dataset (configs/tiny-*.toml train on data/demo/demo): a synthetic corpus,
# byte-level tokens, about a second; made by the first `make` so their README lines work.
DEMO_DATA := data/demo/demo.idx
demo-data: $(DEMO_DATA)
$(DEMO_DATA): scripts/make_demo_corpus.py
	@mkdir -p data/demo
	@if [ -z "$(PYTHON)" ]; then echo "make: no python3: data/demo not made (the tiny configs need it)"; else \
	  $(PYTHON) scripts/make_demo_corpus.py data/demo/corpus.jsonl >/dev/null && \
	  $(PYTHON) scripts/prepare_data.py data/demo/corpus.jsonl --output data/demo/demo >/dev/null && \
	  echo "made data/demo/demo (the tiny configs' dataset)"; fi

HEADER_DEPS := .deps/include/toml++/toml.h .deps/include/nlohmann/json.hpp

# Objects depend on the compile flags: switching CUDA=0/1, SM or -O rebuilds what they affect.
FLAGS_STAMP := $(BUILD)/flags.stamp
FLAGS_NOW := $(CXX) $(CPPFLAGS) $(CXXFLAGS) | $(NVCC) $(NVCCFLAGS) | $(LDFLAGS) $(LDLIBS)
$(shell mkdir -p $(BUILD); echo '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP))

$(BUILD)/obj/%.o: %.cpp $(FLAGS_STAMP) | $(HEADER_DEPS)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

# Test objects see tests/common/doctest_strings.h first (INFO's C strings print as text). They
# build at -O1 (a third less compile time; their run time is in the engine's -O2 code), except
# tests/common, whose element loops every check runs.
$(BUILD)/obj/tests/%.o: CPPFLAGS += -include tests/common/doctest_strings.h
$(BUILD)/obj/tests/%.o: CXXFLAGS += $(if $(findstring /tests/common/,$@),,-O1)

$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP) | $(HEADER_DEPS)
	@mkdir -p $(@D)
	$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) -c $< -o $@

# The CUDA objects alone, nothing linked: a compile check for an architecture, e.g.
# make BUILD=build-sm80 SM=80 cuda-objects (CI compiles .ci/arch_sources's files so).
cuda-objects: $(CU_SRC:%.cu=$(BUILD)/obj/%.o)

$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

# ./train and ./bench sit at the top whatever BUILD is: .programs-build names the folder they were
# linked from, and changes (so they are linked again) when another one builds them.
$(shell [ "$$(cat .programs-build 2>/dev/null)" = "$(BUILD)" ] || echo "$(BUILD)" > .programs-build)

train: $(BUILD)/obj/csrc/train/main_train.o $(LIB) $(FLAGS_STAMP) .programs-build
	$(CXX) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ $(LDLIBS)

bench: $(BUILD)/obj/csrc/train/main_bench.o $(BENCH_OBJ) $(LIB) $(FLAGS_STAMP) .programs-build
	$(CXX) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ $(LDLIBS)

# ./tokenize: the engine's tokenizer as a pipe server for scripts/prepare_data.py (its engine backend).
tokenize: $(BUILD)/obj/csrc/train/main_tokenize.o $(LIB) $(FLAGS_STAMP) .programs-build
	$(CXX) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ $(LDLIBS)

$(BUILD)/engine_tests: $(TEST_OBJ) $(BUILD)/obj/csrc/bench/kernel_profile.o $(LIB) $(FLAGS_STAMP)
	$(CXX) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ $(LDLIBS)

$(BUILD)/obj/tests/main_dist.o: tests/main.cpp $(FLAGS_STAMP) | $(HEADER_DEPS)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -DENGINE_DIST_TESTS $(CXXFLAGS) -c $< -o $@

$(BUILD)/dist_tests: $(DIST_OBJ) $(LIB) $(FLAGS_STAMP)
	$(CXX) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ $(LDLIBS)

# Header-only dependencies copied into the tree so a shipped copy builds where they are absent.
.deps/include/toml++/toml.h:
	@scripts/install_deps.sh --headers-only
.deps/include/nlohmann/json.hpp:
	@scripts/install_deps.sh --headers-only

deps:
	scripts/install_deps.sh

# test, test-fast and demo install missing dependencies first (a no-op when all are present).
test: deps
	@$(MAKE) --no-print-directory all
	BUILD=$(BUILD) PYTHON=$(PYTHON) scripts/run_tests.sh full

test-fast: deps
	@$(MAKE) --no-print-directory all
	BUILD=$(BUILD) PYTHON=$(PYTHON) scripts/run_tests.sh fast

test-slow: deps
	@$(MAKE) --no-print-directory all
	BUILD=$(BUILD) PYTHON=$(PYTHON) scripts/run_tests.sh slow

# The demo needs ./train alone. Where no GPU is visible and CUDA was not asked for, it builds the
# CPU backend only (into build-cpu/: build/ keeps what a CUDA build left there).
demo: deps
	@if [ "$(origin CUDA)" = file ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then \
	  echo "make demo: no GPU visible, so the CPU backend only (into build-cpu/; make demo CUDA=1 builds the CUDA kernels too)"; \
	  $(MAKE) --no-print-directory CUDA=0 BUILD=build-cpu train demo-data; \
	else $(MAKE) --no-print-directory train demo-data; fi
	PYTHON=$(PYTHON) scripts/demo.sh

# Fuzzing (opt-in, never part of `all` or `test`): libFuzzer targets of the readers of outside
# input, built with clang under AddressSanitizer + UndefinedBehaviorSanitizer, without CUDA, into
# $(FUZZ_BUILD)/ (never build/). Every target is tests/fuzz/fuzz_<name>.cpp; scripts/fuzz.sh runs
# them. FUZZ_CXX is only looked up when `make fuzz` runs, so `make` works without clang.
FUZZ_BUILD ?= build-fuzz
FUZZ_CXX ?= $(shell command -v clang++-14 2>/dev/null || command -v clang++ 2>/dev/null)
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CXXFLAGS := -std=c++20 -O1 -g $(FUZZ_SAN) -Wall -Wno-unused-parameter -Wno-unknown-pragmas -MMD -MP
FUZZ_CPPFLAGS := $(filter-out -DENGINE_CUDA,$(CPPFLAGS)) -UENGINE_CUDA
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.cpp)
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.cpp,$(FUZZ_BUILD)/fuzz_%,$(FUZZ_SRC))
FUZZ_LIB_OBJ := $(CPP_ALL)
FUZZ_LIB_OBJ := $(FUZZ_LIB_OBJ:%.cpp=$(FUZZ_BUILD)/obj/%.o)

fuzz:
	@test -n "$(FUZZ_CXX)" || { echo "make fuzz: needs clang++ with libFuzzer (FUZZ_CXX=...)"; exit 1; }
	@$(MAKE) --no-print-directory FUZZ_ACTIVE=1 $(FUZZ_TARGETS) $(FUZZ_BUILD)/make_seeds

ifeq ($(FUZZ_ACTIVE),1)
.PRECIOUS: $(FUZZ_BUILD)/obj/%.o
# A source clang cannot compile (clang 14 lacks some C++20, e.g. lambdas capturing structured
# bindings: the CPU reference ops) is built with $(CXX) without instrumentation, and said so; the
# readers themselves (csrc/config, csrc/data, csrc/checkpoint, csrc/tokenizer) must build with clang.
$(FUZZ_BUILD)/obj/%.o: %.cpp | $(HEADER_DEPS)
	@mkdir -p $(@D)
	@echo "$(FUZZ_CXX) -c $< (ASan, UBSan, fuzzer coverage)"
	@$(FUZZ_CXX) $(FUZZ_CPPFLAGS) $(FUZZ_CXXFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@ 2>$@.log || \
	  { case $< in csrc/config/*|csrc/data/*|csrc/checkpoint/*|csrc/core/*|csrc/tokenizer/*|tests/fuzz/*) cat $@.log; exit 1;; esac; \
	    echo "  $< does not build with $(FUZZ_CXX): $(CXX) without sanitizers ($@.log)"; \
	    $(CXX) $(FUZZ_CPPFLAGS) -std=c++20 -O1 -g -fopenmp -MMD -MP -c $< -o $@; }

$(FUZZ_BUILD)/libengine_fuzz.a: $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/obj/tests/fuzz/fuzz_%.o $(FUZZ_BUILD)/libengine_fuzz.a
	$(FUZZ_CXX) $(FUZZ_SAN) -fsanitize=fuzzer $^ -o $@ $(LDLIBS) -lgomp

# Writes the seed corpora (tests/fuzz/corpus/) with the engine's own writers.
$(FUZZ_BUILD)/make_seeds: $(FUZZ_BUILD)/obj/tests/fuzz/make_seeds.o $(FUZZ_BUILD)/libengine_fuzz.a
	$(FUZZ_CXX) $(FUZZ_SAN) $^ -o $@ $(LDLIBS) -lgomp

-include $(FUZZ_LIB_OBJ:.o=.d) $(FUZZ_TARGETS:$(FUZZ_BUILD)/fuzz_%=$(FUZZ_BUILD)/obj/tests/fuzz/fuzz_%.d) $(FUZZ_BUILD)/obj/tests/fuzz/make_seeds.d
endif

clean:
	rm -rf $(BUILD) $(PROGRAMS)

-include $(OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(BENCH_OBJ:.o=.d) $(DIST_OBJ:.o=.d) $(BUILD)/obj/csrc/train/main_train.d $(BUILD)/obj/csrc/train/main_bench.d $(BUILD)/obj/csrc/train/main_tokenize.d
