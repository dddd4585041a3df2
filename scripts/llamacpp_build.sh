#!/usr/bin/env bash
# Sourced by the serve benches: sets `llama_bench` and `llama_quantize` to binaries built from the llama.cpp tree
# that the PyPI source package llama-cpp-python carries (what a user would install instead of hearth), building
# them once into $HEARTH_LLAMACPP_DIR (default ~/.cache/hearth-llamacpp), with libllama.so beside them
# (build/bin). cmake comes from PyPI too. ~10 minutes on 2 cores.
llamacpp_dir=${HEARTH_LLAMACPP_DIR:-$HOME/.cache/hearth-llamacpp}
llamacpp_version=${HEARTH_LLAMACPP_VERSION:-0.3.36}
llama_bench=$llamacpp_dir/build/bin/llama-bench
llama_quantize=$llamacpp_dir/build/bin/llama-quantize
if [ ! -x "$llama_bench" ] || [ ! -x "$llama_quantize" ]; then
    echo "== building llama-bench and llama-quantize from llama-cpp-python==$llamacpp_version into $llamacpp_dir" >&2
    mkdir -p "$llamacpp_dir"
    python3 -m venv "$llamacpp_dir/venv"
    "$llamacpp_dir/venv/bin/pip" install -q cmake==4.4.5
    # The source archive straight from the package index: `pip download --no-binary` would build its metadata,
    # and with it every build dependency from source.
    url=$(curl -fsS https://pypi.org/simple/llama-cpp-python/ \
        | grep -o "https://[^\"]*/llama_cpp_python-$llamacpp_version.tar.gz#sha256=[0-9a-f]*" | head -1)
    [ -n "$url" ] || { echo "llama-cpp-python $llamacpp_version not found on PyPI" >&2; exit 1; }
    mkdir -p "$llamacpp_dir/sdist"
    archive=$llamacpp_dir/sdist/llama_cpp_python-$llamacpp_version.tar.gz
    curl -fsSL -o "$archive" "${url%#*}"
    echo "${url##*sha256=}  $archive" | sha256sum -c - >&2
    rm -rf "$llamacpp_dir/src" && mkdir -p "$llamacpp_dir/src"
    tar -xzf "$archive" -C "$llamacpp_dir/src" --strip-components=1
    # GGML_NATIVE: the same CPU features hearth detects at run time; no CURL, no server, only the two tools.
    "$llamacpp_dir/venv/bin/cmake" -S "$llamacpp_dir/src/vendor/llama.cpp" -B "$llamacpp_dir/build" \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON >&2
    "$llamacpp_dir/venv/bin/cmake" --build "$llamacpp_dir/build" --target llama-bench llama-quantize -j "$(nproc)" >&2
fi
