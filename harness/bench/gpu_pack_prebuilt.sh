#!/usr/bin/env bash
# Packs this machine's CUDA build (build/, configured by harness/setup.sh: sm_90 code from
# TORCH_CUDA_ARCH_LIST=9.0) into .gpu/prebuilt/ for gpu_check.sh, which then runs it instead of
# building on the GPU machine: device minutes are scarce, and the binaries are the ones tested here.
# (That machine's image, seen 2026-12-04, has Boost, HDF5 and nlohmann/json headers too, but another
# Boost: libboost_program_options.so.1.74.0 had to be carried.)
# Carried: the vericache binary, gpu_tests, the core library, the bundled plugins, and
# the system libraries they link that are neither glibc nor torch's (gpu_check.sh links only those
# the GPU machine lacks). The binaries load the GPU machine's own torch 2.11.0+cu130 libraries.
#
#   harness/bench/gpu_pack_prebuilt.sh [BUILD_DIR]   (default build; the build directory's name travels
#                                                    too: binaries look for plugins there)
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
cmake --build "$build" --target vericache gpu_tests vc_plugin_snapkv vc_plugin_expected_attention vc_plugin_kvzip \
  vc_plugin_kvzap vc_plugin_kivi vc_plugin_kvquant vc_plugin_rotatekv >/dev/null
grep -q 'arch=compute_90' "$build/build.ninja" || { echo "gpu_pack_prebuilt: $build/ has no sm_90 code"; exit 1; }
rm -rf .gpu/prebuilt && mkdir -p .gpu/prebuilt/plugins .gpu/prebuilt/lib
cp "$build"/vericache "$build"/tests/gpu_tests "$build"/core/libvericache_core.so .gpu/prebuilt/
cp "$build"/plugins/vc_plugin_*.so "$build"/plugins/vc_plugin_*.conformance.json .gpu/prebuilt/plugins/
echo "$build" > .gpu/prebuilt/build_dir
git rev-parse --short HEAD > .gpu/prebuilt/commit
git status --porcelain --untracked-files=no | sed 's/^/uncommitted: /' >> .gpu/prebuilt/commit
# System libraries outside glibc, libstdc++/libgcc and torch's tree.
ldd "$build"/vericache "$build"/tests/gpu_tests .gpu/prebuilt/plugins/*.so | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|libutil|libresolv|libstdc\+\+|libgcc_s)\.so|site-packages|/build/' |
  while read -r lib; do cp -L "$lib" .gpu/prebuilt/lib/; done
du -sh .gpu/prebuilt
