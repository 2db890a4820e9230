# SPDX-License-Identifier: Apache-2.0
# strata_add_plugin(<target> KIND <kind> NAME <name> SOURCES ... [LIBRARIES ...]
#                   [OUTPUT_DIRECTORY dir] [NO_SDK] [NO_INSTALL])
#
# Builds a Strata plugin: a MODULE library named libstrata-<kind>-<name>.so
# with hidden visibility whose only exported symbol is strata_plugin_entry_v1
# (enforced by a linker version script). Links strata::sdk unless NO_SDK
# (plain C plugins need only strata::abi). Works in-tree and from an
# installed Strata (find_package(Strata)).
include_guard(GLOBAL)
set(_STRATA_PLUGIN_MAP "${CMAKE_CURRENT_LIST_DIR}/strata_plugin.map" CACHE INTERNAL "")

function(strata_add_plugin target)
  cmake_parse_arguments(P "NO_SDK;NO_INSTALL" "KIND;NAME;OUTPUT_DIRECTORY" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT P_KIND OR NOT P_NAME OR NOT P_SOURCES)
    message(FATAL_ERROR "strata_add_plugin(${target}): KIND, NAME and SOURCES are required")
  endif()
  add_library(${target} MODULE ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME "libstrata-${P_KIND}-${P_NAME}"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LINK_DEPENDS "${_STRATA_PLUGIN_MAP}")
  if(P_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${P_OUTPUT_DIRECTORY}")
  elseif(DEFINED STRATA_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${STRATA_PLUGIN_OUTPUT_DIR}")
  endif()
  target_link_options(${target} PRIVATE "LINKER:--version-script=${_STRATA_PLUGIN_MAP}")
  if(P_NO_SDK)
    target_link_libraries(${target} PRIVATE strata::abi ${P_LIBRARIES})
  else()
    target_link_libraries(${target} PRIVATE strata::sdk ${P_LIBRARIES})
  endif()
  if(COMMAND strata_set_warnings)
    strata_set_warnings(${target})
  endif()
  if(NOT P_NO_INSTALL AND DEFINED STRATA_PLUGIN_INSTALL_DIR)
    install(TARGETS ${target} LIBRARY DESTINATION ${STRATA_PLUGIN_INSTALL_DIR} COMPONENT runtime)
  endif()
endfunction()
