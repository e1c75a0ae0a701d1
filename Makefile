# The two commands of the README, and the steps they are made of.
#
#   make train    install missing packages, build (Release, build/), run ./build/ctrax train
#   make test     install missing packages, build and test Release (build/) and
#                 ASan+UBSan Debug (build-asan/); ends with "make test: N passed, N failed"
#   make install PREFIX=/usr/local    library, headers, ctrax.pc, the ctrax program
#   make bench-deps                   what the benchmarks need besides (python3-torch)
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

train: build
	./build/ctrax train

test: deps
	@JOBS=$(JOBS) bash scripts/test.sh

install: build
	cmake --install build --prefix "$(PREFIX)"

clean:
	rm -rf build build-asan
