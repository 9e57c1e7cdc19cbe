set -o pipefail; W=/tmp/b17; B=$OUT/b17; mkdir -p $W $B
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
tar -xJf .dev/cuda/src.tar.xz -C $W ggml/include ggml/src
( (time nvcc -std=c++17 -O3 -arch=sm_90 -DGGML_USE_CUDA -I$W/ggml/src/ggml-cuda -I$W/ggml/src -I$W/ggml/include -Xptxas -v bench/stq1_0_repack/bulk.cu -o $W/bulk) > $B/nvcc.log 2>&1; echo $? > $W/nvcc.rc ) &
NP=$!
MK_JOBS=15 MK_MODELS=e4b-mtp bash megakernel/device.sh build; echo "mk build rc=$?"
wait $NP; echo "bulk nvcc rc=$(cat $W/nvcc.rc)"; tail -3 $B/nvcc.log
if [ "$(cat $W/nvcc.rc)" = 0 ]; then timeout 200 $W/bulk 15 > $B/bulk.log 2>&1; echo "bulk rc=$?"; grep -E "PASSED|FAIL|^copy" $B/bulk.log | head; fi
MK_NCU_LONG=1 MK_MODELS=e4b-mtp bash megakernel/device.sh models ncusrc; echo "ncusrc rc=$?"
