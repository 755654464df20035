"""Does TensorFlow see the GPU, and do matmul (float32/TF32, float16, bfloat16), a convolution (cuDNN)
and an XLA-compiled function run on it?  python benchmarks/device/smoke.py"""

import time

import tensorflow as tf

print("tf", tf.__version__, "built with cuda", tf.test.is_built_with_cuda(), tf.sysconfig.get_build_info().get("cuda_version"),
      "cudnn", tf.sysconfig.get_build_info().get("cudnn_version"))
gpus = tf.config.list_physical_devices("GPU")
print("GPUs:", gpus)
for g in gpus:
    print(tf.config.experimental.get_device_details(g))
with tf.device("/gpu:0"):
    for dtype in (tf.float32, tf.float16, tf.bfloat16):
        a = tf.random.normal([4096, 4096], dtype=tf.float32)
        a = tf.cast(a, dtype)
        b = tf.matmul(a, a)
        _ = b.numpy()
        t = time.perf_counter()
        for _ in range(20):
            b = tf.matmul(a, a)
        _ = b.numpy()
        dt = (time.perf_counter() - t) / 20
        print(f"matmul {dtype.name}: {2 * 4096**3 / dt / 1e12:.1f} TFLOP/s", b.device)
    x = tf.random.normal([64, 32, 32, 64])
    k = tf.random.normal([3, 3, 64, 64])
    y = tf.nn.conv2d(x, k, 1, "SAME")
    print("conv ok", float(tf.reduce_sum(y)), y.device)
    ref = tf.matmul(tf.cast(a[:256, :256], tf.float32), tf.cast(a[:256, :256], tf.float32))
    with tf.device("/cpu:0"):
        cpu = tf.matmul(tf.cast(a[:256, :256], tf.float32), tf.cast(a[:256, :256], tf.float32))
    print("gpu vs cpu max abs diff", float(tf.reduce_max(tf.abs(ref - cpu))))


@tf.function(jit_compile=True)
def f(x):
    return tf.reduce_sum(tf.nn.relu(x @ x))


print("xla", float(f(tf.ones([128, 128]))))
