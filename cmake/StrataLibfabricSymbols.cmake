# SPDX-License-Identifier: Apache-2.0
# strata_libfabric_symbols(<out_var>): compile definitions that tell
# transports/libfabric/fabric_lib.h which libfabric to dlopen (its soname)
# and which version of each exported function matches the headers found
# here (the default version, "fi_getinfo@@FABRIC_1.3", that a normal link
# against this libfabric would bind to). A newer libfabric keeps the old
# versions, so the structs our code reads keep their layout.
#
# Why dlopen at all: linking the plugin against libfabric made every process
# that scans the plugin directory load libfabric and the provider libraries it
# links (psm, psm2, infinipath), whose constructors spent about 0.2 s per
# process on this 2-core machine even in jobs that never use libfabric.
#
# Reads the library with readelf (binutils). When that is not possible the
# definitions carry the soname only and fabric_lib.h takes each function's
# default version at run time (what dlsym returns).
function(strata_libfabric_symbols out_var)
  set(lib "")
  foreach(l IN LISTS LIBFABRIC_LINK_LIBRARIES)
    if(l MATCHES "libfabric\\.so")
      set(lib "${l}")
    endif()
  endforeach()
  if(NOT lib)
    find_library(_strata_libfabric_so NAMES fabric HINTS ${LIBFABRIC_LIBRARY_DIRS})
    set(lib "${_strata_libfabric_so}")
  endif()
  set(defs "")
  set(soname "libfabric.so.1")
  if(lib AND CMAKE_READELF)
    execute_process(COMMAND ${CMAKE_READELF} -d -W --dyn-syms "${lib}" OUTPUT_VARIABLE elf RESULT_VARIABLE rc
                    ERROR_QUIET)
    if(rc EQUAL 0)
      if(elf MATCHES "Library soname: \\[([^]]+)\\]")
        set(soname "${CMAKE_MATCH_1}")
      endif()
      set(versions "")
      foreach(fn fi_getinfo fi_freeinfo fi_dupinfo fi_fabric fi_strerror fi_version)
        if(elf MATCHES " ${fn}@@([A-Za-z0-9_.]+)")
          string(APPEND versions " ${fn}@${CMAKE_MATCH_1}")
        endif()
      endforeach()
      string(STRIP "${versions}" versions)
      list(APPEND defs "STRATA_LIBFABRIC_SYMBOL_VERSIONS=\"${versions}\"")
    endif()
  endif()
  list(APPEND defs "STRATA_LIBFABRIC_SONAME=\"${soname}\"")
  message(STATUS "Strata: libfabric is opened at run time as ${soname} (${lib})")
  set(${out_var} "${defs}" PARENT_SCOPE)
endfunction()
