"""Copy speeds of ~592 MB of GPU variables, each way an asynchronous save could take them to the
host, and what a copy in a background thread costs computation on the GPU meanwhile.

    python benchmarks/device/d2h.py
"""

from __future__ import annotations

import threading
import time

N = 74_000_000  # floats per variable; two variables


def main() -> None:
    import tensorflow as tf

    with tf.device("/gpu:0"):
        state = [tf.Variable(tf.random.normal([N])) for _ in range(2)]
        snapshots = [tf.Variable(tf.zeros([N])) for _ in range(2)]
        a = tf.random.normal([8192, 8192])
    with tf.device("/cpu:0"):
        host = [tf.Variable(tf.zeros([N])) for _ in range(2)]
    megabytes = 2 * N * 4 / 1e6

    @tf.function
    def device_to_device():
        for s, v in zip(snapshots, state):
            s.assign(v)

    @tf.function
    def to_host(source):  # what TensorFlow's AsyncCheckpointHelper._copy_to_cpu does
        for h, v in zip(host, source):
            with tf.device(h.device):
                h.assign(v.read_value())

    def median_ms(name, f, n=5):
        f()
        f()
        times = []
        for _ in range(n):
            start = time.perf_counter()
            f()
            host[0][0].numpy(), snapshots[0][0].numpy()  # waits for the copies
            times.append(time.perf_counter() - start)
        t = sorted(times)[n // 2]
        print(f"{name}: {t * 1e3:.1f} ms ({megabytes / t / 1e3:.2f} GB/s)", flush=True)

    median_ms("device-to-device snapshot (tf.function assign)", device_to_device)
    median_ms("device-to-host, tf.function assign to CPU variables (TensorFlow's async save)", lambda: to_host(state))
    median_ms("device-to-host, eager .numpy()", lambda: [v.numpy() for v in state])

    @tf.function
    def work():
        x = a
        for _ in range(10):
            x = tf.matmul(x, a) * 1e-4
        return tf.reduce_sum(x)

    work().numpy()
    start = time.perf_counter()
    for _ in range(20):
        work().numpy()
    alone = time.perf_counter() - start
    device_to_device()
    copier = threading.Thread(target=lambda: (to_host(snapshots), host[0][0].numpy()))
    start = time.perf_counter()
    copier.start()
    for _ in range(20):
        work().numpy()
    shared = time.perf_counter() - start
    copier.join()
    print(f"20 matmul chains alone {alone:.3f} s; with a device-to-host copy of the snapshot in a thread "
          f"{shared:.3f} s", flush=True)


if __name__ == "__main__":
    main()
