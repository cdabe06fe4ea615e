# Compiler flags shared by every target: warnings, visibility, sanitizers.
set(TDIST_WARNINGS -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
    -Wno-unused-parameter -Wformat=2 -Wvla)
if(TDIST_WERROR)
  list(APPEND TDIST_WARNINGS -Werror)
endif()
add_compile_options(${TDIST_WARNINGS})
add_compile_definitions(_GNU_SOURCE)

# Only the TD_API symbols of the public headers are exported from libtdist.so.
set(CMAKE_C_VISIBILITY_PRESET hidden)

if(TDIST_SANITIZE)
  string(REPLACE ";" "," _san "${TDIST_SANITIZE}")
  add_compile_options(-fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_san})
  add_compile_definitions(TDIST_SANITIZED=1)
  # A Debug build's -O0 makes instrumented code several times slower than it need be; -O1 is the
  # level the sanitizers' own documentation recommends, and keeps the reports' stacks readable.
  if(CMAKE_BUILD_TYPE STREQUAL "Debug")
    add_compile_options(-O1)
  endif()
  if(_san MATCHES "thread")
    add_compile_definitions(TDIST_TSAN=1) # stress counts scaled down where ThreadSanitizer crawls
  endif()
  if(_san MATCHES "address|leak")
    add_compile_definitions(TDIST_LEAK_CHECKED=1) # LeakSanitizer runs at exit
  endif()
endif()

# Test binaries and tools print backtraces of hung ranks; -rdynamic gives them symbol names.
set(TDIST_EXE_LINK_OPTIONS -rdynamic)

if(TDIST_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
