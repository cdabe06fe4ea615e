# The commands the README names. Each target does its own set-up (scripts/deps.sh), so any one of
# them works alone on a fresh machine. The real build is CMake; this file only drives it.
JOBS ?= $(shell nproc)
BUILD ?= build
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 30

.PHONY: all deps build asan demo test bench fuzz clean

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

# Plain and ASan+UBSan builds, CTest in both, one summary.
test: deps
	@bash scripts/test.sh $(BUILD)

bench: build
	@bash bench/run.sh $(BUILD)/plain

fuzz: deps
	@bash scripts/fuzz.sh $(BUILD)/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD)
