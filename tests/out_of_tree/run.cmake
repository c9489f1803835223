# Installs the build into a scratch prefix, builds tests/out_of_tree/streaming_llm against the
# installed package (find_package(VeriCache)), runs the conformance kit on it through the package's
# CMake helper (ctest), and runs the installed `vericache compress` on the plugin by path.
# Arguments: BUILD_DIR, SOURCE_DIR, WORK_DIR, TORCH_PREFIX, GENERATOR.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run_step("configure the out-of-tree plugin" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/out_of_tree/streaming_llm
         -B ${WORK_DIR}/build -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}\;${TORCH_PREFIX}")
run_step("build the out-of-tree plugin" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step("run the conformance kit on it (ctest: vericache_add_conformance_test)" ${CMAKE_CTEST_COMMAND}
         --test-dir ${WORK_DIR}/build --output-on-failure)
string(FIND "${step_output}" "100% tests passed" found)
if(found EQUAL -1)
  message(FATAL_ERROR "the conformance test did not run: ${step_output}")
endif()
set(plugin ${WORK_DIR}/build/vc_plugin_streaming_llm.so)
run_step("run it by path" ${prefix}/bin/vericache compress --compressor ${plugin} --params "{\"sinks\": 4}"
         -c 0.25 --no-chat-template --json -p "The out-of-tree plugin compresses this prompt, a real cache of a real model.")
string(FIND "${step_output}" "\"compressor\":\"streaming_llm\"" found)
if(found EQUAL -1)
  message(FATAL_ERROR "unexpected output: ${step_output}")
endif()
run_step("list it" ${prefix}/bin/vericache plugins --plugin-dir ${WORK_DIR}/build --json)
string(FIND "${step_output}" "\"name\": \"streaming_llm\"" found)
if(found EQUAL -1)
  message(FATAL_ERROR "vericache plugins did not list the plugin: ${step_output}")
endif()
message(STATUS "out-of-tree plugin built against ${prefix}, conforming, and run by path")
