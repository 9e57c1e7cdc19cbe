# session 19's device calls share one build (megakernel/device.sh's, with llama.cpp's tests on, so that
# harness/cuda_device.sh's sanitize stage runs in the same tree: STQ_CUDA_WORK=/tmp/stq-mk): sourced by s19-call*.sh
export MK_CMAKE_ARGS="-DLLAMA_BUILD_TESTS=ON"
export MK_TARGETS="llama-bench test-backend-ops test-stq1_0-rp16 test-mul-mat-batch-invariance"
export MK_MODELS="small-f16 e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
