# SPDX-License-Identifier: Apache-2.0
# Small helpers shared by every target of the build.

function(strata_check_tristate var)
  if(NOT ${var} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${var} must be AUTO, ON or OFF (got '${${var}}')")
  endif()
endfunction()

# Sanitizers apply to everything built here (core, plugins, tests) so that a
# plugin's memory errors show up in the host's tests too.
# `skip`: checks to leave out (-fno-sanitize=, after the -fsanitize= that
# enabled them; GCC and clang take vptr for C too and ignore it there).
macro(strata_apply_sanitizers list skip)
  if(NOT "${list}" STREQUAL "")
    if("${list}" MATCHES "thread" AND "${list}" MATCHES "address")
      message(FATAL_ERROR "STRATA_SANITIZE: thread and address sanitizers cannot be combined")
    endif()
    # Host compilers only: nvcc (the core's .cu file) takes no -fsanitize.
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${list}>
                        $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>
                        $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=all>)
    add_link_options(-fsanitize=${list})
    if(NOT "${skip}" STREQUAL "")
      add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize=${skip}>)
    endif()
  endif()
endmacro()

# Warnings for our own targets (not for third-party headers).
function(strata_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Wno-unused-parameter>)
  # A unity build includes each source into a batch file, so GCC takes a
  # class that holds a type of the source's anonymous namespace for one
  # declared in a header (-Wsubobject-linkage, 78 lines in .ci/run's log);
  # the one-object-per-source build keeps the warning.
  if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
  endif()
endfunction()
