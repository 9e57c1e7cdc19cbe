# metal-emu: builds the real ggml-metal backend (host code + the pinned kernels translated to C++)
# on a non-Apple host. Included from ggml/src/ggml-metal/CMakeLists.txt when GGML_METAL_EMU is ON
# (patch 0010); GGML_METAL_EMU_DIR points at this directory (one source of truth: the emulator
# sources are not copied into the llama.cpp tree).
#
# Options:
#   GGML_METAL_EMU_KERNELS   list of kernels/<name>.metal files to translate (default: all); files
#                            holding fused kernels for ops of a listed file are added (EMU_FUSION_DEPS)
#   GGML_METAL_EMU_SANITIZE  build the kernels and the runtime with -fsanitize=address,undefined
#   GGML_METAL_EMU_STRICT_ALIGN  natural (GPU) alignment for vector types, reported by checked casts
#   GGML_METAL_EMU_BF16      translate the bfloat kernels (GGML_METAL_HAS_BF16, as for a Metal 3.1
#                            device) and report has_bfloat (default ON; OFF: has_bfloat = false)

if (NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang" OR CMAKE_CXX_COMPILER_VERSION VERSION_LESS 19)
    message(FATAL_ERROR "GGML_METAL_EMU needs clang >= 19 as the C++ compiler (_Float16/__bf16 on x86-64, "
                        "ext_vector_type); configure with -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19")
endif()
if (NOT CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    message(FATAL_ERROR "GGML_METAL_EMU: the fiber runtime supports x86-64 only")
endif()

find_package(Python3 REQUIRED COMPONENTS Interpreter)

set(EMU_DIR ${GGML_METAL_EMU_DIR})
get_filename_component(EMU_DIR "${EMU_DIR}" ABSOLUTE)
if (NOT EXISTS ${EMU_DIR}/msl2cpp.py)
    message(FATAL_ERROR "GGML_METAL_EMU_DIR=${GGML_METAL_EMU_DIR} does not contain msl2cpp.py")
endif()

set(EMU_GEN ${CMAKE_CURRENT_BINARY_DIR}/emu)
file(MAKE_DIRECTORY ${EMU_GEN})

# kernel file -> number of translation units its instantiations are split into (compile time)
set(EMU_ALL_KERNELS
    mul_mv:4 mul_mm:4 quantize:2 softmax:1 norm:1 unary:1 binbcast:1 reduce:1 tri:1 ssm:1 wkv:1
    gated_delta_net:1 solve_tri:1 rope:1 conv:1 upscale:1 argsort:1 pool:1 misc:1
    fa_aux:1 fa_f16:2 fa_f32:2 fa_q4_0:2 fa_q4_1:2 fa_q5_0:2 fa_q5_1:2 fa_q8_0:2
    fa_vec_f16:2 fa_vec_f32:2 fa_vec_q4_0:2 fa_vec_q4_1:2 fa_vec_q5_0:2 fa_vec_q5_1:2 fa_vec_q8_0:2)

set(GGML_METAL_EMU_KERNELS "" CACHE STRING "metal-emu: kernel files to translate (empty: all)")
option(GGML_METAL_EMU_SANITIZE     "metal-emu: ASan+UBSan for kernels and runtime" OFF)
option(GGML_METAL_EMU_STRICT_ALIGN "metal-emu: natural alignment of vector types" OFF)
option(GGML_METAL_EMU_BF16         "metal-emu: bfloat kernels and has_bfloat" ON)

set(EMU_KERNEL_DEPS
    ${CMAKE_CURRENT_SOURCE_DIR}/kernels/common.h
    ${CMAKE_CURRENT_SOURCE_DIR}/kernels/dequantize.h
    ${CMAKE_CURRENT_SOURCE_DIR}/kernels/quantize.h
    ${CMAKE_CURRENT_SOURCE_DIR}/kernels/fa_common.metal
    ${CMAKE_CURRENT_SOURCE_DIR}/kernels/fa_vec_common.metal
    ${CMAKE_CURRENT_SOURCE_DIR}/../ggml-common.h
    ${CMAKE_CURRENT_SOURCE_DIR}/ggml-metal-impl.h
    ${EMU_DIR}/msl2cpp.py)

# kernels that the host code's fusions (ggml-metal-fusion.cpp) encode for ops of another file: a
# selection with the ops must translate the fused kernel's file too, or the first fused graph aborts
# ("kernel ... is not in the translated kernel set"). supports_op cannot decline a fusion.
#   binbcast -> argsort: MUL + expert VIEWs + ADD chain -> kernel_moe_reduce_f32 (MoE output reduction)
set(EMU_FUSION_DEPS binbcast:argsort)
set(EMU_KERNELS_SEL ${GGML_METAL_EMU_KERNELS})
if (EMU_KERNELS_SEL)
    foreach(dep ${EMU_FUSION_DEPS})
        string(REPLACE ":" ";" kv ${dep})
        list(GET kv 0 kops)
        list(GET kv 1 kfused)
        if (kops IN_LIST EMU_KERNELS_SEL AND NOT kfused IN_LIST EMU_KERNELS_SEL)
            message(STATUS "metal-emu: translating kernels/${kfused}.metal too (fused kernels for ops of ${kops})")
            list(APPEND EMU_KERNELS_SEL ${kfused})
        endif()
    endforeach()
endif()

set(EMU_GEN_SRCS "")
set(EMU_INDEX_ITEMS "")
foreach(item ${EMU_ALL_KERNELS})
    string(REPLACE ":" ";" kv ${item})
    list(GET kv 0 kname)
    list(GET kv 1 kparts)
    if (EMU_KERNELS_SEL AND NOT kname IN_LIST EMU_KERNELS_SEL)
        continue()
    endif()
    list(APPEND EMU_INDEX_ITEMS "${kname}:${kparts}")
    math(EXPR klast "${kparts} - 1")
    foreach(part RANGE ${klast})
        set(out ${EMU_GEN}/${kname}_p${part}.cpp)
        add_custom_command(
            OUTPUT ${out}
            COMMAND ${Python3_EXECUTABLE} ${EMU_DIR}/msl2cpp.py --ggml-metal-dir ${CMAKE_CURRENT_SOURCE_DIR}
                    --kernel ${kname} --parts ${kparts} --part ${part} --out ${out}
            DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/kernels/${kname}.metal ${EMU_KERNEL_DEPS}
            COMMENT "metal-emu: translating kernels/${kname}.metal (part ${part}/${kparts})"
            VERBATIM)
        list(APPEND EMU_GEN_SRCS ${out})
    endforeach()
endforeach()

# the Gemma decode megakernel (stq-metal ggml-metal/mk): its kernel is translated from the same assembled
# source a Mac compiles at run time (mk.cmake), registered like the ggml kernels
if (GGML_MEGAKERNEL_DIR)
    include(${EMU_DIR}/../mk/mk.cmake)
    add_custom_command(
        OUTPUT ${EMU_GEN}/mk_kernel_p0.cpp
        COMMAND ${Python3_EXECUTABLE} ${EMU_DIR}/msl2cpp.py --source ${MK_METAL_SOURCE} --kernel mk_kernel --out ${EMU_GEN}/mk_kernel_p0.cpp
        DEPENDS ${MK_METAL_SOURCE} ${EMU_DIR}/msl2cpp.py
        COMMENT "metal-emu: translating the megakernel (ggml-metal/mk/mk-kernel.metal)"
        VERBATIM)
    list(APPEND EMU_GEN_SRCS ${EMU_GEN}/mk_kernel_p0.cpp)
    list(APPEND EMU_INDEX_ITEMS "mk_kernel:1")
endif()

add_custom_command(
    OUTPUT ${EMU_GEN}/emu-kernels-index.cpp
    COMMAND ${Python3_EXECUTABLE} ${EMU_DIR}/msl2cpp.py --index --out ${EMU_GEN}/emu-kernels-index.cpp ${EMU_INDEX_ITEMS}
    DEPENDS ${EMU_DIR}/msl2cpp.py
    COMMENT "metal-emu: kernel index"
    VERBATIM)

add_custom_command(
    OUTPUT ${EMU_GEN}/emu-supports-op.inc
    COMMAND ${Python3_EXECUTABLE} ${EMU_DIR}/msl2cpp.py --extract-supports-op ${CMAKE_CURRENT_SOURCE_DIR}/ggml-metal-device.m
            --out ${EMU_GEN}/emu-supports-op.inc
    DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ggml-metal-device.m ${EMU_DIR}/msl2cpp.py
    COMMENT "metal-emu: extracting ggml_metal_device_supports_op"
    VERBATIM)

ggml_add_backend_library(ggml-metal
                         ggml-metal.cpp
                         ggml-metal-device.cpp
                         ggml-metal-common.cpp
                         ggml-metal-fusion.cpp
                         ggml-metal-ops.cpp
                         ggml-metal-tuning.cpp
                         ${EMU_DIR}/ggml-metal-device-emu.cpp
                         ${EMU_DIR}/emu-runtime.cpp
                         ${EMU_GEN}/emu-kernels-index.cpp
                         ${EMU_GEN}/emu-supports-op.inc
                         ${EMU_GEN_SRCS}
                        )

if (GGML_MEGAKERNEL_DIR)
    ggml_metal_mk_add(ggml-metal)
endif()

set_target_properties(ggml-metal PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON)
target_include_directories(ggml-metal PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${EMU_DIR} ${EMU_GEN})
target_compile_definitions(ggml-metal PRIVATE GGML_METAL_EMU)
# the host sources rely on headers that Apple's libc++ includes transitively
set_source_files_properties(ggml-metal.cpp ggml-metal-device.cpp ggml-metal-ops.cpp ggml-metal-common.cpp
                            ggml-metal-fusion.cpp ggml-metal-tuning.cpp
                            PROPERTIES COMPILE_OPTIONS "-include;memory;-include;cstring;-include;cmath")

# -fmax-type-align=8: vector types lose their element-alignment typedef attribute when they are
# template arguments; never let clang assume 16-byte alignment (aligned moves fault on x86)
set(EMU_KERNEL_FLAGS -O2 -march=native -fmax-type-align=8 -Wno-everything)
if (GGML_METAL_EMU_STRICT_ALIGN)
    list(APPEND EMU_KERNEL_FLAGS -DEMU_STRICT_ALIGN)
endif()
if (GGML_METAL_EMU_BF16)
    # what the Objective-C library init passes to Apple's compiler when the device has bfloat
    list(APPEND EMU_KERNEL_FLAGS -DGGML_METAL_HAS_BF16=1 -D__METAL_VERSION__=310)
    target_compile_definitions(ggml-metal PRIVATE GGML_METAL_EMU_HAS_BF16)
    # without AVX512-BF16, float -> bfloat conversions are calls to __truncsfbf2, which GCC 12's libgcc
    # lacks (executables linking libggml-metal then fail): take it from compiler-rt's builtins
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} --rtlib=compiler-rt -print-libgcc-file-name
                    OUTPUT_VARIABLE EMU_RT_BUILTINS OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if (EMU_RT_BUILTINS AND EXISTS "${EMU_RT_BUILTINS}")
        target_link_libraries(ggml-metal PRIVATE "${EMU_RT_BUILTINS}")
    endif()
endif()
if (GGML_METAL_EMU_SANITIZE)
    list(APPEND EMU_KERNEL_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer)
    set_source_files_properties(${EMU_DIR}/emu-runtime.cpp PROPERTIES COMPILE_OPTIONS "-fsanitize=address,undefined;-fno-omit-frame-pointer")
    target_link_options(ggml-metal PUBLIC -fsanitize=address,undefined)
endif()
set_source_files_properties(${EMU_GEN_SRCS} PROPERTIES COMPILE_OPTIONS "${EMU_KERNEL_FLAGS}")

if (GGML_METAL_NDEBUG)
    add_compile_definitions(GGML_METAL_NDEBUG)
endif()
