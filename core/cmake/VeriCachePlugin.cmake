# vericache_add_plugin(<name> SOURCES <files...> [OUTPUT_DIRECTORY <dir>])
#
# Builds the compressor plugin vc_plugin_<name>.so against VeriCache::core: hidden visibility
# (only the descriptor and factory are exported), no undefined symbols left to load time.
# Used in-tree and, through find_package(VeriCache), by plugins built outside the tree.
function(vericache_add_plugin name)
  cmake_parse_arguments(P "" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
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
endfunction()
