# The two commands of the README, and the steps they are made of.
#
#   make train    install missing packages, build (Release, build/), train the default
#                 config (a ReformerLM on Debian's fortunes), then print a sample of its text
#   make test     install missing packages, build and test Release (build/) and
#                 ASan+UBSan at -O2 -g (build-asan/), fuzz briefly (build-fuzz/);
#                 ends with "make test: N passed, N failed"
#   make install PREFIX=/usr/local    library, headers, ctrax.pc, the ctrax program
#   make bench-deps                   what the benchmarks need besides (python3-torch, libdnnl-dev)
#
# CMake does the building; this file only strings the steps together.

PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_RELEASE = -DCMAKE_BUILD_TYPE=Release -DCTRAX_SANITIZE=OFF -DCTRAX_WERROR=ON

.PHONY: all deps bench-deps build train test install clean

all: build

deps:
	@bash scripts/install-deps.sh

bench-deps:
	@bash scripts/install-deps.sh bench

build: deps
	cmake -S . -B build $(CMAKE_RELEASE)
	cmake --build build -j $(JOBS)

DEFAULT_CONFIG = configs/fortunes_reformer.gin
DEFAULT_RUN = runs/fortunes_reformer

train: build
	./build/ctrax train $(DEFAULT_CONFIG) --output-dir $(DEFAULT_RUN)
	./build/ctrax sample $(DEFAULT_RUN) --prompt 'The ' --length 400 --temperature 0.8 --seed 1

test: deps
	@JOBS=$(JOBS) bash scripts/test.sh

install: build
	cmake --install build --prefix "$(PREFIX)"

clean:
	rm -rf build build-asan build-fuzz
