#!/usr/bin/env bash
# Installs a build of ctrax into a temporary prefix and checks that an outside
# program can use it through pkg-config alone: tests/install/main.c is built
# against the installed headers and linked twice, against libctrax.a and
# against libctrax.so, and both programs run; examples/custom_layer.c (a layer
# written through ctrax/layers/layer_author.h) and examples/train_in_memory.c
# are built and run the shared way.
# Registered with ctest.
#
#   tests/install_test.sh CMAKE BUILD_DIR CC [EXTRA_FLAGS]
#
# EXTRA_FLAGS (one word or several) go to both compiles (a sanitized library needs -fsanitize=...).
set -euo pipefail

cmake=$1 build=$2 cc=$3
read -ra extra <<<"${4:-}"
src=$(cd "$(dirname "$0")" && pwd)/install/main.c
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

fail() {
    echo "install_test: FAIL: $*" >&2
    exit 1
}

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || {
    cat "$tmp/install.log"
    fail "cmake --install"
}

pc=$(find "$prefix" -name ctrax.pc)
[[ -n $pc ]] || fail "no ctrax.pc installed"
PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export PKG_CONFIG_PATH
libdir=$(pkg-config --variable=libdir ctrax)
for f in "$prefix/bin/ctrax" "$prefix/include/ctrax/ctrax.h" "$libdir/libctrax.a" "$libdir/libctrax.so"; do
    [[ -e $f ]] || fail "$f was not installed"
done
echo "installed into $prefix; pkg-config --cflags --libs ctrax: $(pkg-config --cflags --libs ctrax)"

# The public headers must compile as strict C17 with no warnings.
cflags=(-std=c17 -Wall -Wextra -Wpedantic -Werror "${extra[@]}")

# Shared: what pkg-config gives, nothing else.
# shellcheck disable=SC2046  # pkg-config output is meant to be split into words
"$cc" "${cflags[@]}" "$src" -o "$tmp/main_shared" $(pkg-config --cflags --libs ctrax)
readelf -d "$tmp/main_shared" | grep -q 'NEEDED.*libctrax\.so' || fail "main_shared does not load libctrax.so"
LD_LIBRARY_PATH=$libdir "$tmp/main_shared" || fail "main_shared exited with $?"

# The examples a reader copies: custom_layer.c (a layer of one's own, through
# ctrax/layers/layer_author.h and its gradient check) and train_in_memory.c
# (the Loop on arrays in memory), built from the installed headers the same way.
for example in custom_layer train_in_memory; do
    # shellcheck disable=SC2046
    "$cc" "${cflags[@]}" "$(dirname "$src")/../../examples/$example.c" -o "$tmp/$example" \
        $(pkg-config --cflags --libs ctrax) -lm
    LD_LIBRARY_PATH=$libdir "$tmp/$example" >/dev/null || fail "$example exited with $?"
done

# Static: libctrax.a in place of -lctrax, and the private dependencies that
# pkg-config --static adds (OpenBLAS, OpenMP, libm). The README shows this line.
# shellcheck disable=SC2046
"$cc" "${cflags[@]}" "$src" -o "$tmp/main_static" $(pkg-config --cflags ctrax) \
    $(pkg-config --static --libs ctrax | sed 's/-lctrax/-Wl,-Bstatic -lctrax -Wl,-Bdynamic/')
if readelf -d "$tmp/main_static" | grep -q 'NEEDED.*libctrax'; then
    fail "main_static still loads libctrax.so"
fi
"$tmp/main_static" || fail "main_static exited with $?"

echo "install_test: ok (static and shared)"
