#!/usr/bin/env bash
# The GPU machine's build done on this (CPU) machine, so that a call on a fresh GPU machine spends
# its device time on the GPU rather than on the 175 s scripts/setup.sh takes there. CUDA compiles
# here; the programs link libquintet.so and the system's CUDA, NCCL, cuDNN, MPI and fmt libraries,
# whose sonames the GPU machine's Ubuntu has too. The device tool copies /work/main's tree to the
# same path there, plus the ignored paths it carries.
#
#   scripts/device_prebuilt.sh pack [TARGET...]   # here, from /work/main or any worktree of it:
#       builds (nice, JOBS=2 cores) the targets (default: every program a `ctest -L gpu` test
#       runs, scripts' ones included, and 04/05/09's programs for device_session.sh's benchmarks,
#       and EXTRA_TARGETS, e.g. "hf_import_tool hf_io_bench" for phase 11)
#       in this checkout's build/, then mirrors into <main worktree>/prebuilt/build/ (PREBUILT_ROOT
#       overrides; ignored through .git/info/exclude) the parts of build/ they need, at their
#       build/ paths: libquintet.so* (links kept), the programs and every CTestTestfile.cmake.
#       Paths under this checkout become the main worktree's, in the CTestTestfiles and the
#       programs' RUNPATH (patchelf), as does this machine's CUDA library folder (HERE_CUDA_LIB,
#       /usr/local/cuda/lib) the GPU machine's (CUDA_LIB, /usr/local/cuda/lib64); the test python
#       becomes `python3` on the PATH. Refuses above 60 MiB (the tool carries 64 MiB at most).
#       PREBUILT_COMMIT records the commit, `git status` and a sha256 of the source files (tracked
#       and untracked-not-ignored, as the tool copies them), PREBUILT_FILES their list.
#   scripts/device_prebuilt.sh unpack             # there (device_session.sh does it): exits
#       non-zero, saying why, unless the pack matches the tree (the packed list of files, hashed
#       there, and no source file outside it: the device copy's .git may be stale, its HEAD and
#       index older than its files, so neither its HEAD nor its index decides), build/ holds no
#       real build (a CMakeCache.txt from setup.sh on a warm machine: copied programs newer than
#       its objects would hide changes from make, so setup.sh updates it instead), the absolute
#       programs the tests name exist (mpiexec) and, after copying prebuilt/build/. into build/,
#       `ldd` finds every library of every packed program as the steps will run it (through the
#       rewritten RUNPATH, LD_LIBRARY_PATH left as it is). A failed check removes the programs it
#       copied.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
mode=${1:?usage: scripts/device_prebuilt.sh pack [TARGET...] | unpack}
shift
cuda_lib=${CUDA_LIB:-/usr/local/cuda/lib64}
limit_mib=60

source_list() {  # NUL-separated: the files the device tool copies, less build/ and prebuilt/
  git ls-files -z --cached --others --exclude-standard 2>/dev/null | grep -zv -e '^build/' -e '^prebuilt/'
}
tree_hash() {  # tree_hash LIST: sha256 over the contents of LIST's files (a missing one changes it)
  xargs -0 -r sha256sum -- <"$1" 2>/dev/null | sha256sum | cut -d' ' -f1
}

case $mode in
  pack)
    dest=${PREBUILT_ROOT:-$(git worktree list --porcelain | sed -n '1s/^worktree //p')}
    [ -e "$dest/.git" ] || { echo "pack: $dest is not a checkout" >&2; exit 1; }
    out=$dest/prebuilt
    here_cuda=${HERE_CUDA_LIB:-/usr/local/cuda/lib}
    command -v patchelf >/dev/null || { echo "pack: needs patchelf (apt-get install patchelf)" >&2; exit 1; }
    if [ ! -f build/CMakeCache.txt ]; then
      CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache nice cmake -S . -B build \
        -DCMAKE_BUILD_TYPE=Release -DQUINTET_BUILD_TESTS=ON -DQUINTET_BUILD_EXAMPLES=ON >/dev/null || exit 1
    fi
    targets=("$@")
    if [ ${#targets[@]} -eq 0 ]; then
      # Every build/ path a gpu test's command names (its program, or what its script runs) that
      # is a target; ctest's JSON leaves out the commands of programs not built yet.
      mapfile -t names < <(ctest --test-dir build -N -L gpu 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p')
      mapfile -t known < <(cmake --build build --target help | sed -n 's/^\.\.\. //p')
      mapfile -t targets < <(find build -name CTestTestfile.cmake -print0 | xargs -0 grep -h '^add_test(' |
        grep -F -f <(printf 'add_test([=[%s]=] \n' "${names[@]}") | grep -o "\"$root/build/[^\"]*\"" |
        sed 's|.*/||; s|"$||' | sort -u | grep -Fx -f <(printf '%s\n' "${known[@]}"))
      # shellcheck disable=SC2206  # EXTRA_TARGETS: more programs, split on spaces
      targets+=(04_gpt_train 05_moe_train 09_op_bench ${EXTRA_TARGETS:-})
    fi
    mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u)
    nice cmake --build build -j "${JOBS:-2}" --target "${targets[@]}" || exit 1
    exes=()
    for t in "${targets[@]}"; do
      f=$( (find build/tests build/examples -maxdepth 2 -type f -name "$t" -perm -u+x
        find build -maxdepth 1 -type f -name "$t" -perm -u+x) | head -n 1)
      [ -n "$f" ] || { echo "pack: no program for target $t under build/" >&2; exit 1; }
      exes+=("${f#build/}")
    done
    # The shared libraries of build/ they load (libquintet.so.0), with their links.
    mapfile -t libs < <(for e in "${exes[@]}"; do ldd "build/$e"; done |
      awk -v b="$root/build/" 'index($3, b) == 1 { print substr($3, length(b) + 1) }' | sort -u)
    exclude="$(cd "$dest" && cd "$(git rev-parse --git-common-dir)" && pwd)/info/exclude"  # a worktree's too
    mkdir -p "$(dirname "$exclude")"
    grep -qx "/prebuilt/" "$exclude" 2>/dev/null || echo "/prebuilt/" >>"$exclude"
    rm -rf "$out"  # an older pack's files too (the flat prebuilt/ of before): all of it is carried
    mkdir -p "$out/build"
    (
      cd build || exit 1
      for l in "${libs[@]}"; do cp -a --parents "${l%.so*}".so* "$out/build/"; done
      cp -a --parents "${exes[@]}" "$out/build/"
      find . -name CTestTestfile.cmake -print0 | xargs -0 cp --parents -t "$out/build/"
    ) || exit 1
    # This checkout's paths become the device's (the main worktree's); the python found here
    # (pyenv's) is not there: the PATH's python3 runs the tests' scripts.
    find "$out/build" -name CTestTestfile.cmake -exec sed -i -e "s#$root\([/\";]\|\$\)#$dest\1#g" \
      -e 's#"/[^"]*/python3"#"python3"#g' {} +
    elfs=("${exes[@]}")
    for l in "${libs[@]}"; do elfs+=("$(cd build && readlink -f "$l" | sed "s|^$root/build/||")"); done
    for e in "${elfs[@]}"; do
      old=$(patchelf --print-rpath "$out/build/$e") || exit 1
      new=$(tr ':' '\n' <<<"$old" | sed -e "s#^$root/#$dest/#" -e "s#^$here_cuda\$#$cuda_lib#" |
        grep -v '^$' | paste -sd: -)
      [ "$new" = "$old" ] || patchelf --set-rpath "$new" "$out/build/$e" || exit 1
    done
    printf '%s\n' "${elfs[@]}" >"$out/build/PREBUILT_EXES"
    source_list >"$out/build/PREBUILT_FILES"
    hash=$(tree_hash "$out/build/PREBUILT_FILES")
    {
      echo "commit $(git rev-parse HEAD)"
      echo "packed $(date -u +%Y-%m-%dT%H:%MZ) from $root"
      echo "sources_sha256 $hash"
      echo "status:"
      git status --porcelain
    } >"$out/build/PREBUILT_COMMIT"
    mib=$(du -sb "$out" | awk '{ printf "%d", $1 / 1048576 + 0.999 }')
    echo "pack: ${#exes[@]} programs, ${#libs[@]} libraries, $(find "$out/build" -name CTestTestfile.cmake | wc -l) CTestTestfiles: $mib MiB in $out"
    if [ "$mib" -gt "$limit_mib" ]; then
      rm -rf "$out/build"
      echo "pack: $mib MiB is over $limit_mib MiB (the device tool carries 64 MiB): removed; pack fewer targets" >&2
      exit 1
    fi
    if [ "$(cd "$dest" && tree_hash "$out/build/PREBUILT_FILES")" != "$hash" ]; then
      echo "pack: warning: $dest's files differ from $root's: the device would build instead (land first)" >&2
    fi
    echo "run it with: run(command=\"OUT=\$OUT bash scripts/device_session.sh 0\", carry=[\"prebuilt\"])"
    ;;
  unpack)
    src=prebuilt/build
    [ -f "$src/PREBUILT_COMMIT" ] || { echo "unpack: no $src/PREBUILT_COMMIT: pack it here first" >&2; exit 1; }
    want=$(sed -n 's/^sources_sha256 //p' "$src/PREBUILT_COMMIT")
    have=$(tree_hash "$src/PREBUILT_FILES")
    if [ "$have" != "$want" ]; then
      echo "unpack: the sources differ from the packed ones (sha256 $have, packed $want): build instead" >&2
      exit 1
    fi
    # A source file here that was not packed (new, or untracked then) changes no hash: name it.
    extra=$(comm -23 <(source_list | tr '\0' '\n' | while read -r f; do [ -e "$f" ] && echo "$f"; done |
      sort) <(tr '\0' '\n' <"$src/PREBUILT_FILES" | sort) | head -n 3 | paste -sd' ' -)
    if [ -n "$extra" ]; then
      echo "unpack: files not in the pack: $extra: build instead" >&2
      exit 1
    fi
    if [ -f build/CMakeCache.txt ]; then
      echo "unpack: build/ holds a real build (CMakeCache.txt): scripts/setup.sh updates it instead" >&2
      exit 1
    fi
    # The programs outside this tree that the gpu tests start (mpiexec) must be where they were.
    mapfile -t testfiles < <(find "$src" -name CTestTestfile.cmake)
    missing=$(grep -h '^set_tests_properties(' "${testfiles[@]}" | grep -E 'LABELS "([^"]*;)?gpu[;"]' |
      sed 's/^set_tests_properties(\[=\[\([^]]*\)\]=\].*/add_test([=[\1]=] /' |
      grep -hF -f - "${testfiles[@]}" | sed -n 's/^add_test(\[=\[[^]]*\]=\] "\(\/[^"]*\)".*/\1/p' |
      grep -v "^$root/" | sort -u | while read -r p; do [ -x "$p" ] || echo "$p"; done)
    if [ -n "$missing" ]; then
      echo "unpack: the tests' programs are missing here: $(echo "$missing" | paste -sd' ' -)" >&2
      exit 1
    fi
    mkdir -p build
    cp -a "$src/." build/ || exit 1
    mapfile -t elfs <"$src/PREBUILT_EXES"
    bad=0
    for e in "${elfs[@]}"; do
      nf=$(ldd "build/$e" 2>&1 | sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p' | paste -sd' ' -)
      if [ -n "$nf" ]; then echo "unpack: build/$e: not found: $nf" >&2; bad=1; fi
    done
    if [ "$bad" != 0 ]; then
      (cd build && rm -f -- "${elfs[@]}" PREBUILT_COMMIT)
      echo "unpack: removed the copied programs (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})" >&2
      exit 1
    fi
    echo "unpack: ${#elfs[@]} programs load, $(sed -n '1p;2p' "$src/PREBUILT_COMMIT" | paste -sd' ' -)"
    ;;
  *) echo "usage: scripts/device_prebuilt.sh pack [TARGET...] | unpack" >&2; exit 2 ;;
esac
