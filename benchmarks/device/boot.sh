#!/usr/bin/env bash
# On the GPU machine, once per machine: unpacks what stage.py prepared (copied to $STAGE, default
# /root/stage) into /tmp/site, and makes /tmp/cu12shim: the CUDA 12 library names TensorFlow 2.21's
# wheel opens, pointing at the CUDA 13 libraries of the image's PyTorch environment (cuBLAS 13 exports
# every cuBLAS 12 symbol TensorFlow looks up; cuDNN 9 and NCCL 2 keep their names). cuFFT and cuSOLVER
# only need to load for TensorFlow to register the GPU: nothing here calls them, so their CUDA 13
# versions stand in under the CUDA 12 names. Then: `. benchmarks/device/env.sh`.
set -e
ST=${STAGE:-/root/stage}
S=/tmp/site
mkdir -p $S /tmp/cu12shim
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $S $ST/whl/*.whl
Z="env LD_LIBRARY_PATH=$ST/bin $ST/bin/zstd"
command -v zstd >/dev/null && Z=zstd
cat $ST/rest.part.* | $Z -d --long=30 -c | tar -x -C $S
cat $ST/cc.part.* | $Z -d --long=30 -c > $S/tensorflow/libtensorflow_cc.so.2
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
find_lib() { find $SP/nvidia /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu -name "$1" 2>/dev/null | sort | head -1; }
link() {
  f=$(find_lib "$1")
  if [ -n "$f" ]; then ln -sf "$f" /tmp/cu12shim/$2; echo "$2 -> $f"; else echo "MISSING $1" >&2; exit 1; fi
}
link 'libcublas.so.13' libcublas.so.12
link 'libcublasLt.so.13' libcublasLt.so.12
link 'libcufft.so.12' libcufft.so.11
link 'libcusolver.so.12' libcusolver.so.11
link 'libcusparse.so.12' libcusparse.so.12
link 'libcudnn.so.9' libcudnn.so.9
link 'libnccl.so.2' libnccl.so.2
cp $ST/libcudart.so.12 /tmp/cu12shim/
find $SP/nvidia -name "lib*.so*" -printf '%h\n' 2>/dev/null | sort -u | paste -sd: > /tmp/cu12shim/dirs
echo "boot: $(( $(date +%s) - t0 )) s; $(du -sh $S | cut -f1) in $S"
