# Sanitizer builds (issue 10, item 10): -DUROCE_SANITIZE=<list> instruments every target of
# the tree (libraries, tools, tests) with the given GCC/Clang sanitizers, e.g.
#
#   cmake -S . -B build-asan -DUROCE_SANITIZE=address,undefined   # ASan + UBSan
#   cmake -S . -B build-tsan -DUROCE_SANITIZE=thread              # TSan
#
# scripts/sanitize.sh configures, builds and runs both. Reports must fail the tests:
# UBSan is built with -fno-sanitize-recover=all (every report aborts the process); ASan
# stops at its first report by default; TSan exits with status 66 after reporting.
#
# liburoce.so then depends on the sanitizer runtime (DT_NEEDED libasan.so.8, libubsan.so.1 or
# libtsan.so.2). Programs that are not instrumented (Debian's ibv_rc_pingpong, perftest)
# need that runtime loaded before anything else: `uroce run` reads liburoce's DT_NEEDED
# entries and puts the sanitizer runtimes first in LD_PRELOAD (tools/uroce.cc).

set(UROCE_SANITIZE "" CACHE STRING
  "Comma-separated sanitizers to build everything with (address,undefined | thread | empty)")

if(UROCE_SANITIZE)
  if(UROCE_SANITIZE MATCHES "thread" AND UROCE_SANITIZE MATCHES "address")
    message(FATAL_ERROR "UROCE_SANITIZE: ThreadSanitizer cannot be combined with AddressSanitizer")
  endif()
  set(uroce_san_flags -fsanitize=${UROCE_SANITIZE} -fno-omit-frame-pointer)
  if(UROCE_SANITIZE MATCHES "undefined")
    # Every UBSan report is fatal, so that it fails the test that triggered it.
    list(APPEND uroce_san_flags -fno-sanitize-recover=all)
  endif()
  add_compile_options(${uroce_san_flags})
  add_link_options(-fsanitize=${UROCE_SANITIZE})
  message(STATUS "uroce: building with -fsanitize=${UROCE_SANITIZE}")
endif()

# uroce_suite_target(NAME DIRS...): a target building every target that the tests of the
# given source directories (relative to the top) need, plus liburoce and the launcher they
# run through, so that a sanitizer build need not build the whole tree
# (scripts/sanitize.sh: `cmake --build build-tsan --target uroce_tsan_suite`).
function(uroce_suite_target name)
  set(deps uroce uroce_launcher)
  foreach(dir IN LISTS ARGN)
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/${dir}/CMakeLists.txt)
      continue()
    endif()
    get_property(targets DIRECTORY ${PROJECT_SOURCE_DIR}/${dir} PROPERTY BUILDSYSTEM_TARGETS)
    list(APPEND deps ${targets})
  endforeach()
  add_custom_target(${name})
  add_dependencies(${name} ${deps})
endfunction()
