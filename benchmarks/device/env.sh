# Source on the GPU machine after boot.sh, from the repository root: the TensorFlow in /tmp/site,
# the CUDA 12 names of /tmp/cu12shim, and the image's CUDA 13 ptxas and libdevice for XLA.
export PYTHONPATH=$PWD:/tmp/site
export LD_LIBRARY_PATH=/tmp/cu12shim:$(cat /tmp/cu12shim/dirs 2>/dev/null)
export TF_CPP_MIN_LOG_LEVEL=1
export PYTHONUNBUFFERED=1
CUDA_DIR=$(dirname "$(dirname "$(command -v ptxas 2>/dev/null || echo /usr/local/cuda/bin/ptxas)")")
export XLA_FLAGS="--xla_gpu_cuda_data_dir=$CUDA_DIR"
export PATH=$CUDA_DIR/bin:$PATH
