# The commands the README names. Each target does its own set-up (scripts/deps.sh), so any one of
# them works alone on a fresh machine. The real build is CMake; this file only drives it.
JOBS ?= $(shell nproc)
BUILD ?= build
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 30
SOAK_MINUTES ?= 30
SOAK_BACKENDS ?=
TEST_CONFIGS ?=

.PHONY: all deps build asan tsan demo test bench soak fuzz clean

all: build

deps:
	@bash scripts/deps.sh

$(BUILD)/plain/CMakeCache.txt:
	cmake -S . -B $(BUILD)/plain -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTDIST_WERROR=ON $(CMAKE_FLAGS)

build: deps $(BUILD)/plain/CMakeCache.txt
	cmake --build $(BUILD)/plain -j $(JOBS)

$(BUILD)/asan/CMakeCache.txt:
	cmake -S . -B $(BUILD)/asan -DCMAKE_BUILD_TYPE=Debug -DTDIST_WERROR=ON \
	  -DTDIST_SANITIZE=address,undefined -DTDIST_BUILD_BENCH=OFF $(CMAKE_FLAGS)

asan: deps $(BUILD)/asan/CMakeCache.txt
	cmake --build $(BUILD)/asan -j $(JOBS)

# The main job: see README.md.
demo: build
	@bash scripts/demo.sh $(BUILD)/plain

# Plain, ASan+UBSan and ThreadSanitizer builds, CTest in each, one summary (TEST_CONFIGS picks).
test: deps
	@bash scripts/test.sh $(BUILD) $(TEST_CONFIGS)

$(BUILD)/tsan/CMakeCache.txt:
	cmake -S . -B $(BUILD)/tsan -DCMAKE_BUILD_TYPE=Debug -DTDIST_WERROR=ON -DTDIST_SANITIZE=thread \
	  -DTDIST_BUILD_BENCH=OFF $(CMAKE_FLAGS)

tsan: deps $(BUILD)/tsan/CMakeCache.txt
	cmake --build $(BUILD)/tsan -j $(JOBS)

bench: build
	@bash bench/run.sh $(BUILD)/plain

# Random collectives on 4 ranks for SOAK_MINUTES on each backend (SOAK_BACKENDS: default all),
# every result checked, memory flat (bench/soak/run.sh; not part of `make test`: it takes hours).
soak: build
	@bash bench/soak/run.sh $(BUILD)/plain $(SOAK_MINUTES) $(SOAK_BACKENDS)

fuzz: deps
	@bash scripts/fuzz.sh $(BUILD)/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD)
