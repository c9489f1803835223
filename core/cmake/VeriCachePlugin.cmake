# vericache_add_plugin(<name> SOURCES <files...> [OUTPUT_DIRECTORY <dir>] [CONFORMANCE <spec.json>])
#
# Builds the compressor plugin vc_plugin_<name>.so against VeriCache::core: hidden visibility
# (only the descriptor and factory are exported), no undefined symbols left to load time. With
# CONFORMANCE, the plugin's conformance spec is copied beside it as vc_plugin_<name>.conformance.json,
# where `vericache conformance` looks for it.
# Used in-tree and, through find_package(VeriCache), by plugins built outside the tree.
function(vericache_add_plugin name)
  cmake_parse_arguments(P "" "OUTPUT_DIRECTORY;CONFORMANCE" "SOURCES" ${ARGN})
  if(NOT P_SOURCES)
    message(FATAL_ERROR "vericache_add_plugin(${name}): no SOURCES")
  endif()
  set(target vc_plugin_${name})
  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE VeriCache::core)
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    CXX_STANDARD 20
    CXX_STANDARD_REQUIRED ON
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
  if(P_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${P_OUTPUT_DIRECTORY})
  endif()
  if(P_CONFORMANCE)
    get_filename_component(spec ${P_CONFORMANCE} ABSOLUTE)
    add_custom_command(TARGET ${target} POST_BUILD
      COMMAND ${CMAKE_COMMAND} -E copy ${spec} $<TARGET_FILE_DIR:${target}>/${target}.conformance.json
      COMMENT "conformance spec of ${target}")
    set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${spec})  # an edited spec is copied again
  endif()
endfunction()

# vericache_add_conformance_test(<name> [PARAMS <json>] [ARGS <vericache conformance options...>])
#
# A CTest test, conformance_<name>, that runs `vericache conformance` on the plugin target
# vc_plugin_<name> (made by vericache_add_plugin) by path: it passes when the plugin keeps every
# rule of the contract and of its spec. VERICACHE_EXECUTABLE names the binary (set by
# find_package(VeriCache); in-tree, the `vericache` target).
function(vericache_add_conformance_test name)
  cmake_parse_arguments(P "" "PARAMS" "ARGS" ${ARGN})
  if(NOT VERICACHE_EXECUTABLE)
    message(FATAL_ERROR "vericache_add_conformance_test(${name}): VERICACHE_EXECUTABLE is not set")
  endif()
  if(NOT P_PARAMS)
    set(P_PARAMS "{}")
  endif()
  add_test(NAME conformance_${name}
           COMMAND ${VERICACHE_EXECUTABLE} conformance --compressor $<TARGET_FILE:vc_plugin_${name}> --params ${P_PARAMS}
                   ${P_ARGS})
endfunction()
