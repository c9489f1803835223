# ctest -P script (tests/CMakeLists.txt, test Labels.EverySlowTestIsLabelledSlowOnly): every name in
# VC_SLOW_TESTS is a test of this build labelled `slow` and not `cpu`, so a misspelled or renamed
# name cannot silently leave a test in CI, or out of the slow suite.
#   cmake -DCTEST=<ctest> -DBUILD_DIR=<build> -DNAMES=<a,b,...> -P check_slow_labels.cmake
execute_process(COMMAND ${CTEST} --test-dir ${BUILD_DIR} -N -L slow OUTPUT_VARIABLE slow RESULT_VARIABLE rc1)
execute_process(COMMAND ${CTEST} --test-dir ${BUILD_DIR} -N -L cpu OUTPUT_VARIABLE cpu RESULT_VARIABLE rc2)
if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0)
  message(FATAL_ERROR "ctest -N failed")
endif()
string(REPLACE "," ";" NAMES "${NAMES}")
foreach(name IN LISTS NAMES)
  string(REGEX MATCH "#[0-9]+: ${name}\n" in_slow "${slow}")
  string(REGEX MATCH "#[0-9]+: ${name}\n" in_cpu "${cpu}")
  if(NOT in_slow)
    message(FATAL_ERROR "VC_SLOW_TESTS names '${name}', which is no test labelled slow in this build (renamed?)")
  endif()
  if(in_cpu)
    message(FATAL_ERROR "'${name}' is labelled cpu as well as slow: CI would run it")
  endif()
endforeach()
list(LENGTH NAMES n)
message(STATUS "${n} slow tests, each labelled slow and not cpu")
