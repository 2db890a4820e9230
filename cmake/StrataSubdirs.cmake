# SPDX-License-Identifier: Apache-2.0
# strata_add_subdirectories(): add every immediate subdirectory that has a
# CMakeLists.txt, in sorted order, so that a new plugin, host or test folder
# needs no edit of its parent.
macro(strata_add_subdirectories)
  file(GLOB _strata_children RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT _strata_children)
  foreach(_child IN LISTS _strata_children)
    if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${_child} AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${_child}/CMakeLists.txt)
      add_subdirectory(${_child})
    endif()
  endforeach()
endmacro()
