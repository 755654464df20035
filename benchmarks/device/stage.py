"""Prepares TensorFlow 2.21 for a GPU machine that has no network and no TensorFlow, in parts small
enough for a transfer limit (64 MiB a call for this workplace's device tool).

Run here, where pip works:

    python benchmarks/device/stage.py            # writes .gpu0/ .. .gpuN/ in the repository root

Each folder is copied to the GPU machine's /root/stage in its own call (``.gpu0`` first), then
``bash /root/stage/boot.sh`` there unpacks them (see README.md beside this file). The folders must
be git-ignored (``/.gpu*/`` in ``.git/info/exclude``): they are build output, ~310 MB in all.

What travels: the ``tensorflow`` wheel without its C++ headers, recompressed with zstd (547 MB of
wheel -> ~305 MB); the pure-Python wheels TensorFlow, tf_keras and Keras 3 need that the image
lacks; CUDA 12's runtime library (TensorFlow 2.21 is built against CUDA 12.5); a zstd binary.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:", "--no-deps",
            *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                          "manylinux2014_x86_64") for a in ("--platform", p)]]
TENSORFLOW = "tensorflow==2.21.0"
CUDART = "nvidia-cuda-runtime-cu12==12.9.79"
WHEELS = ["tf-keras==2.21.0", "keras==3.15.1", "namex==0.1.0", "optree==0.20.0", "protobuf==7.36.2",
          "tensorboard==2.21.0", "astunparse==1.6.3", "gast==0.7.0", "google-pasta==0.2.0", "termcolor==3.3.0"]


def download(specs: list[str], into: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", *PLATFORM, "-d", into, *specs], check=True)


def zstd(src: str, dst: str) -> None:
    subprocess.run(["zstd", "-q", "-T0", "-19", "--long=30", "-f", src, "-o", dst], check=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk-mib", type=int, default=60, help="the most each folder holds (default 60)")
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "tfdist-device-stage"),
                   help="where the downloads and the compressed parts are kept between runs")
    args = p.parse_args()
    if shutil.which("zstd") is None:
        print("stage.py: needs the zstd program here (apt-get install zstd)", file=sys.stderr)
        return 2
    if subprocess.run(["git", "check-ignore", "-q", ".gpu0/"], cwd=REPO).returncode != 0:
        print("stage.py: .gpu0/ is not git-ignored; add the line /.gpu*/ to .git/info/exclude first", file=sys.stderr)
        return 2
    cache, limit = args.cache, args.chunk_mib * 2**20
    os.makedirs(os.path.join(cache, "whl"), exist_ok=True)
    download([TENSORFLOW, CUDART], cache)
    download(WHEELS, os.path.join(cache, "whl"))
    tf_wheel = glob.glob(os.path.join(cache, "tensorflow-2.21.0-*.whl"))[0]
    cc, rest = os.path.join(cache, "cc.zst"), os.path.join(cache, "rest.tar.zst")
    if not (os.path.exists(cc) and os.path.exists(rest)):
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            zipfile.ZipFile(tf_wheel).extractall(tmp)
            shutil.rmtree(os.path.join(tmp, "tensorflow", "include"))  # C++ headers: 431 MB, not needed to run
            zstd(os.path.join(tmp, "tensorflow", "libtensorflow_cc.so.2"), cc + ".tmp")
            os.remove(os.path.join(tmp, "tensorflow", "libtensorflow_cc.so.2"))
            with tarfile.open(os.path.join(tmp, "rest.tar"), "w") as tar:
                for name in sorted(os.listdir(tmp)):
                    if name != "rest.tar":
                        tar.add(os.path.join(tmp, name), arcname=name)
            zstd(os.path.join(tmp, "rest.tar"), rest + ".tmp")
        os.replace(cc + ".tmp", cc)
        os.replace(rest + ".tmp", rest)
    for old in glob.glob(os.path.join(REPO, ".gpu[0-9]*")):
        shutil.rmtree(old)
    first = os.path.join(REPO, ".gpu0")
    shutil.copytree(os.path.join(cache, "whl"), os.path.join(first, "whl"))
    os.makedirs(os.path.join(first, "bin"))
    shutil.copy2(shutil.which("zstd"), os.path.join(first, "bin"))
    for lib in ("liblz4.so.1",):  # zstd's one library an image may lack
        found = glob.glob(f"/lib/x86_64-linux-gnu/{lib}") + glob.glob(f"/usr/lib/x86_64-linux-gnu/{lib}")
        if found:
            shutil.copy2(found[0], os.path.join(first, "bin"))
    with zipfile.ZipFile(glob.glob(os.path.join(cache, "nvidia_cuda_runtime_cu12-*.whl"))[0]) as z:
        with z.open("nvidia/cuda_runtime/lib/libcudart.so.12") as src, open(os.path.join(first, "libcudart.so.12"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    shutil.copy2(os.path.join(HERE, "boot.sh"), first)

    def used(d: str) -> int:
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)

    folders = [first]
    for stream, src in (("rest", rest), ("cc", cc)):
        with open(src, "rb") as fh:
            for index in range(10_000):
                room = limit - used(folders[-1])
                if room < 2**20:
                    folders.append(os.path.join(REPO, f".gpu{len(folders)}"))
                    os.makedirs(folders[-1])
                    room = limit
                data = fh.read(room)
                if not data:
                    break
                with open(os.path.join(folders[-1], f"{stream}.part.{index:03d}"), "wb") as out:
                    out.write(data)
    for d in folders:
        print(f"{os.path.relpath(d, REPO)}: {used(d) / 2**20:.1f} MiB")
    print(f"copy each to /root/stage in order ({len(folders)} calls), then: bash /root/stage/boot.sh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
