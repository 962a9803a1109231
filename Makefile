# GPT-2 training in C++/CUDA.
#
#   make                  CPU programs, tools and unit tests
#   make train_gpt2cu     the CUDA trainer (PRECISION=BF16 by default, or FP32)
#   make cuda             every CUDA program: the trainers, test and profile programs, the kernel
#                         tests (build/test_kernels, test_kernels_fp32) and timings (build/bench_kernels)
#   make test             every test: CPU tests, all CUDA builds, GPU tests when a GPU is present
#
# Targets build in parallel, one job per core (make -jN for N). Each prints "building NAME" as it
# starts and "built NAME (N s)" when it ends; V=1 shows the compiler commands too.
# Variables: PRECISION=BF16|FP32, GPU_COMPUTE_CAPABILITY=90 (read from nvidia-smi when a GPU is
# visible), USE_MPI=0 to build without OpenMPI, PYTHON=python with torch for the reference.

# One job per core unless a -j was given. A -j on the command line wins over this one (make 4.3
# and newer); a -j or a parent make's jobserver in the MAKEFLAGS this make inherited is kept by
# adding none.
ifeq ($(filter -j% --jobs% --jobserver%,$(MAKEFLAGS) $(shell printenv MAKEFLAGS)),)
  MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif

CXX ?= g++
CXXFLAGS ?= -O3 -std=c++17 -Wall -Wextra
OMPFLAGS = -fopenmp
BUILD = build

NVCC ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
PRECISION ?= BF16
GPU_COMPUTE_CAPABILITY ?= $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')
ifeq ($(strip $(GPU_COMPUTE_CAPABILITY)),)
  override GPU_COMPUTE_CAPABILITY = 90
endif

ifeq ($(PRECISION),BF16)
  PRECISION_FLAG = -DENABLE_BF16
else ifeq ($(PRECISION),FP32)
  PRECISION_FLAG = -DENABLE_FP32
else
  $(error PRECISION must be BF16 or FP32, not '$(PRECISION)')
endif

# Hopper (compute capability 90) builds for sm_90a: the flash attention kernels use its wgmma.
GPU_ARCH = $(GPU_COMPUTE_CAPABILITY)$(if $(filter 90,$(GPU_COMPUTE_CAPABILITY)),a)
GENCODE = -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH)
NVCC_FLAGS = -O3 -std=c++17 -lineinfo --expt-relaxed-constexpr $(GENCODE) \
  -Xcompiler -fopenmp -Xcompiler -Wall
NVCC_LDLIBS = -lcublas -lcublasLt -lnccl -lgomp

# OpenMPI is compiled in when mpi.h is found (USE_MPI=0 leaves it out).
USE_MPI ?= 1
MPI_INCLUDE := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/openmpi/include /usr/include/openmpi /usr/local/include/openmpi))
ifeq ($(USE_MPI),1)
  ifneq ($(MPI_INCLUDE),)
    NVCC_FLAGS += -DUSE_MPI -I$(MPI_INCLUDE)
    NVCC_LDLIBS += -L$(abspath $(MPI_INCLUDE)/../lib) -lmpi
  endif
endif

PYTHON ?= $(shell for p in python3 /usr/bin/python3; do $$p -c 'import torch' 2>/dev/null && echo $$p && break; done)

LLMC_HEADERS = $(wildcard llmc/*.h)
UNIT_TEST_SOURCES = $(wildcard dev/test/test_*.cpp)
UNIT_TESTS = $(patsubst dev/test/%.cpp,$(BUILD)/%,$(UNIT_TEST_SOURCES))
TOOL_SOURCES = $(wildcard dev/data/*.cpp dev/tools/*.cpp)
TOOLS = $(patsubst %.cpp,$(BUILD)/%,$(notdir $(TOOL_SOURCES)))
KERNEL_SUITE_SOURCES = $(filter-out dev/cuda/test_kernels.cu,$(wildcard dev/cuda/test_*.cu))
BENCHMARK_SOURCES = $(filter-out dev/cuda/bench_kernels.cu,$(wildcard dev/cuda/bench_*.cu))
CUDA_TARGETS = train_gpt2cu test_gpt2cu profile_gpt2cu train_gpt2fp32cu test_gpt2fp32cu
KERNEL_PROGRAMS = $(BUILD)/test_kernels $(BUILD)/test_kernels_fp32 $(BUILD)/test_attention_mma_sync \
                  $(BUILD)/bench_kernels

# $(call build_step,COMMAND), the recipe of every compiled target: "building TARGET" as it starts,
# "built TARGET (N s)" or "failed TARGET (N s):" when it ends, COMMAND itself only with V=1. The
# compiler's messages are held until it ends and shown in full under that line, so that parallel
# builds' messages do not interleave; its exit status is the recipe's. make -s leaves out the
# building/built lines.
build_say = $(if $(findstring s,$(firstword -$(MAKEFLAGS))),:,echo)
build_step = @$(build_say) "building $@"; start=$$(date +%s); \
  $(if $(filter 1,$(V)),echo '$(subst ','\'',$(1))';) \
  if out=$$($(1) 2>&1); then status=0; else status=$$?; fi; \
  took="($$(( $$(date +%s) - start )) s)"; \
  if [ $$status -eq 0 ]; then $(build_say) "built $@ $$took"; else echo "failed $@ $$took:" >&2; fi; \
  [ -z "$$out" ] || printf '%s\n' "$$out" >&2; \
  exit $$status

.PHONY: all cpu cuda test clean
.DEFAULT_GOAL := all

all: cpu
cpu: train_gpt2 test_gpt2 $(UNIT_TESTS) $(TOOLS)
cuda: $(CUDA_TARGETS) $(KERNEL_PROGRAMS)

train_gpt2: train_gpt2.cpp $(LLMC_HEADERS)
	$(call build_step,$(CXX) $(CXXFLAGS) $(OMPFLAGS) -I. $< -o $@)

test_gpt2: test_gpt2.cpp train_gpt2.cpp $(LLMC_HEADERS) dev/test/testing.h
	$(call build_step,$(CXX) $(CXXFLAGS) $(OMPFLAGS) -I. $< -o $@)

$(BUILD)/test_%: dev/test/test_%.cpp $(LLMC_HEADERS) dev/test/testing.h | $(BUILD)
	$(call build_step,$(CXX) $(CXXFLAGS) $(OMPFLAGS) -I. $< -o $@)

$(BUILD)/%: dev/data/%.cpp $(LLMC_HEADERS) | $(BUILD)
	$(call build_step,$(CXX) $(CXXFLAGS) $(OMPFLAGS) -I. $< -o $@)

$(BUILD)/%: dev/tools/%.cpp $(LLMC_HEADERS) | $(BUILD)
	$(call build_step,$(CXX) $(CXXFLAGS) $(OMPFLAGS) -I. $< -o $@)

$(BUILD):
	@mkdir -p $(BUILD)

# CUDA programs. train_gpt2.cu holds everything; test and profile mains include it.
train_gpt2cu: train_gpt2.cu $(LLMC_HEADERS)
	$(call build_step,$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAG) -I. $< $(NVCC_LDLIBS) -o $@)

test_gpt2cu: test_gpt2.cu train_gpt2.cu $(LLMC_HEADERS) dev/test/testing.h
	$(call build_step,$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAG) -I. $< $(NVCC_LDLIBS) -o $@)

profile_gpt2cu: profile_gpt2.cu train_gpt2.cu $(LLMC_HEADERS)
	$(call build_step,$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAG) -I. $< $(NVCC_LDLIBS) -o $@)

# FP32 builds under their own names, so one `make test` checks both precisions.
train_gpt2fp32cu: train_gpt2.cu $(LLMC_HEADERS)
	$(call build_step,$(NVCC) $(NVCC_FLAGS) -DENABLE_FP32 -I. $< $(NVCC_LDLIBS) -o $@)

test_gpt2fp32cu: test_gpt2.cu train_gpt2.cu $(LLMC_HEADERS) dev/test/testing.h
	$(call build_step,$(NVCC) $(NVCC_FLAGS) -DENABLE_FP32 -I. $< $(NVCC_LDLIBS) -o $@)

KERNEL_TEST_DEPS = train_gpt2.cu train_gpt2.cpp dev/cuda/kernel_test.h dev/cuda/qk_rotary_reference.h $(LLMC_HEADERS) \
                   dev/test/testing.h

# A compile of train_gpt2.cu takes about a minute, so every suite of dev/cuda/test_*.cu is in one
# kernel test program a precision (build/test_kernels [SUITE...]), and every timing program of
# dev/cuda/bench_*.cu in one (build/bench_kernels NAME [ARGS...], BF16: the flash and FP8 kernels
# are BF16's).
$(BUILD)/test_kernels: dev/cuda/test_kernels.cu $(KERNEL_SUITE_SOURCES) $(KERNEL_TEST_DEPS) | $(BUILD)
	$(call build_step,$(NVCC) $(NVCC_FLAGS) -DENABLE_BF16 -I. $< $(NVCC_LDLIBS) -o $@)

$(BUILD)/test_kernels_fp32: dev/cuda/test_kernels.cu $(KERNEL_SUITE_SOURCES) $(KERNEL_TEST_DEPS) | $(BUILD)
	$(call build_step,$(NVCC) $(NVCC_FLAGS) -DENABLE_FP32 -I. $< $(NVCC_LDLIBS) -o $@)

# The tile kernels' mma.sync path (GPUs before Hopper), which any GPU can test: the attention
# suites built for the plain compute capability, without sm_90a's wgmma.
$(BUILD)/test_attention_mma_sync: GENCODE = -gencode arch=compute_$(GPU_COMPUTE_CAPABILITY),code=sm_$(GPU_COMPUTE_CAPABILITY)
$(BUILD)/test_attention_mma_sync: dev/cuda/attention_mma_sync.cu dev/cuda/test_attention.cu \
                                  dev/cuda/test_composed_attention.cu $(KERNEL_TEST_DEPS) | $(BUILD)
	$(call build_step,$(NVCC) $(NVCC_FLAGS) -DENABLE_BF16 -I. $< $(NVCC_LDLIBS) -o $@)

$(BUILD)/bench_kernels: dev/cuda/bench_kernels.cu $(BENCHMARK_SOURCES) $(KERNEL_TEST_DEPS) | $(BUILD)
	$(call build_step,$(NVCC) $(NVCC_FLAGS) -DENABLE_BF16 -I. $< $(NVCC_LDLIBS) -o $@)

test: cpu cuda
	PYTHON="$(PYTHON)" bash scripts/run_tests.sh

clean:
	rm -rf $(BUILD) train_gpt2 test_gpt2 $(CUDA_TARGETS)

# Fuzz targets: libFuzzer with AddressSanitizer and UndefinedBehaviorSanitizer (any UB report
# aborts), built with clang and its fuzzer runtime (Debian: clang and, for clang N, libclang-rt-N-dev,
# which scripts/install_deps.sh installs).
# `make fuzz` builds build/fuzz_NAME from each dev/fuzz/fuzz_NAME.cpp; dev/test/test_fuzz.sh
# builds and runs them (see dev/fuzz/README.md).
FUZZ_CXX ?= clang++
FUZZ_FLAGS = -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -g -O1 -std=c++17 \
  -Wall -Wextra
FUZZ_SOURCES = $(wildcard dev/fuzz/fuzz_*.cpp)
FUZZ_TARGETS = $(patsubst dev/fuzz/%.cpp,$(BUILD)/%,$(FUZZ_SOURCES))

.PHONY: fuzz
fuzz: $(FUZZ_TARGETS)

$(BUILD)/fuzz_%: dev/fuzz/fuzz_%.cpp dev/fuzz/fuzz_file.h $(LLMC_HEADERS) | $(BUILD)
	$(call build_step,$(FUZZ_CXX) $(FUZZ_FLAGS) -I. $< -o $@)
