# Plain Makefile: one object per source, dependency files for incremental rebuilds.
#   make            build ./train, ./bench and the test binary (CUDA kernels too when nvcc exists)
#   make test       full CPU test suite (+ GPU cases when a GPU is present), one summary line
#   make test-fast  the fast tier only (seconds)
#   make deps       install missing Debian packages and fill .deps/include (header-only deps)
#   make demo       deps + build + demo data + a short tiny-llama training run + loss plot
#   make CUDA=0     CPU-only build even where nvcc exists;  make SM=80  another GPU arch
SHELL := /bin/bash
BUILD ?= build
CXX ?= g++
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA ?= $(if $(NVCC),1,0)
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

CPP_SRC := $(shell find csrc comm -name '*.cpp' -not -path 'csrc/train/main_*' -not -path 'csrc/bench/*')
# Benchmark cases register themselves at static init: linked as objects, never from the archive.
BENCH_SRC := $(shell find csrc/bench -name '*.cpp')
MAIN_SRC := $(wildcard csrc/train/main_*.cpp)
TEST_SRC := $(shell find tests -name '*.cpp' -not -path 'tests/dist/*')
# The multi-rank suite (run under mpirun): its own cases, the shared test code, the same runner.
DIST_SRC := $(shell find tests/dist -name '*.cpp') $(filter-out tests/main.cpp,$(shell find tests/common -name '*.cpp')) tests/train/train_fixture.cpp
CU_SRC :=

ifeq ($(CUDA),1)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  # NCCL and cuDNN: CUDA_HOME first, else the Python venv's nvidia/ packages (the GPU machine).
  NV_PY := $(firstword $(foreach py,python3 $(PYTHON),$(shell $(py) -c "import nvidia; print(nvidia.__path__[0])" 2>/dev/null)))
  NCCL_HOME ?= $(if $(wildcard $(CUDA_HOME)/include/nccl.h),$(CUDA_HOME),$(NV_PY)/nccl)
  CUDNN_HOME ?= $(if $(wildcard $(CUDA_HOME)/include/cudnn.h),$(CUDA_HOME),$(NV_PY)/cudnn)
  CU_SRC := $(shell find cuda -name '*.cu')
  GENCODE ?= $(if $(filter 90,$(SM)),-gencode=arch=compute_90a$(comma)code=sm_90a,-gencode=arch=compute_$(SM)$(comma)code=sm_$(SM))
  NVCCFLAGS ?= -O3
  NVCCFLAGS += -std=c++20 $(GENCODE) -t=0 -MMD -MP --expt-relaxed-constexpr -Xcompiler -fopenmp
  NCCL_LIB ?= $(firstword $(dir $(wildcard $(NCCL_HOME)/lib64/libnccl.so.2 $(NCCL_HOME)/lib/libnccl.so.2)))
  CPPFLAGS += -DENGINE_CUDA -I$(CUDA_HOME)/include $(if $(filter-out $(CUDA_HOME),$(NCCL_HOME)),-I$(NCCL_HOME)/include)
  LDFLAGS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(if $(NCCL_LIB),-L$(NCCL_LIB) -Wl$(comma)-rpath$(comma)$(NCCL_LIB))
  LDLIBS += -l:libnccl.so.2 -lcublasLt -lcublas -lcudart
endif
comma := ,

OBJ := $(CPP_SRC:%.cpp=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.cpp=$(BUILD)/obj/%.o)
BENCH_OBJ := $(BENCH_SRC:%.cpp=$(BUILD)/obj/%.o)
DIST_OBJ := $(DIST_SRC:%.cpp=$(BUILD)/obj/%.o) $(BUILD)/obj/tests/main_dist.o
LIB := $(BUILD)/libengine.a
PROGRAMS := train bench

.PHONY: all test test-fast deps clean demo
all: $(PROGRAMS) $(BUILD)/engine_tests $(BUILD)/dist_tests

HEADER_DEPS := .deps/include/toml++/toml.h .deps/include/nlohmann/json.hpp

# Objects depend on the compile flags: switching CUDA=0/1, SM or -O rebuilds what they affect.
FLAGS_STAMP := $(BUILD)/flags.stamp
FLAGS_NOW := $(CXX) $(CPPFLAGS) $(CXXFLAGS) | $(NVCC) $(NVCCFLAGS) | $(LDFLAGS) $(LDLIBS)
$(shell mkdir -p $(BUILD); echo '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP))

$(BUILD)/obj/%.o: %.cpp $(FLAGS_STAMP) | $(HEADER_DEPS)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP) | $(HEADER_DEPS)
	@mkdir -p $(@D)
	$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) -c $< -o $@

$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

train: $(BUILD)/obj/csrc/train/main_train.o $(LIB) $(FLAGS_STAMP)
	$(CXX) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ $(LDLIBS)

bench: $(BUILD)/obj/csrc/train/main_bench.o $(BENCH_OBJ) $(LIB) $(FLAGS_STAMP)
	$(CXX) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ $(LDLIBS)

$(BUILD)/engine_tests: $(TEST_OBJ) $(LIB) $(FLAGS_STAMP)
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
	PYTHON=$(PYTHON) scripts/run_tests.sh full

test-fast: deps
	@$(MAKE) --no-print-directory all
	PYTHON=$(PYTHON) scripts/run_tests.sh fast

demo: deps
	@$(MAKE) --no-print-directory all
	PYTHON=$(PYTHON) scripts/demo.sh

clean:
	rm -rf $(BUILD) $(PROGRAMS)

-include $(OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(BENCH_OBJ:.o=.d) $(DIST_OBJ:.o=.d) $(BUILD)/obj/csrc/train/main_train.d $(BUILD)/obj/csrc/train/main_bench.d
