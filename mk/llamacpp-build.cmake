# Included by llama.cpp's configure (CMAKE_PROJECT_INCLUDE, mk/llamacpp.mk): makes the build of llama-server
# cheaper on two cores, its behaviour unchanged. Unity builds (CMAKE_UNITY_BUILD) for every target but the two
# whose sources do not compile as one (mtmd: mtmd-helper refuses mtmd's internal headers; llama-common: json.cpp
# specialises a template after another file instantiates it); and -O0 for the code that runs once per request
# or per server (multimodal, common, the HTTP server), which the kit's tiny models never make hot: the tensor
# code (ggml, llama) keeps -O1. What it saves: benchmarks/llamacpp_build.py, docs/benchmarks.md.
include_guard(GLOBAL)
function(draftdoctor_tune_llama_build)
  set_target_properties(mtmd llama-common PROPERTIES UNITY_BUILD OFF)
  foreach(target mtmd llama-common server-context llama-server cpp-httplib)
    if(TARGET ${target})
      set_property(TARGET ${target} APPEND PROPERTY COMPILE_OPTIONS -O0)
    endif()
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL draftdoctor_tune_llama_build)
