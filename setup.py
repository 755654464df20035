"""Packaging for tfdist."""

import pathlib
import re

from setuptools import find_packages, setup

here = pathlib.Path(__file__).parent
version = re.search(r'__version__ = "([^"]+)"', (here / "tfdist" / "_version.py").read_text()).group(1)

setup(
    name="tfdist",
    version=version,
    description="Distributed Keras training on TensorFlow in one call, resumable at the exact step.",
    long_description=(here / "README.md").read_text() if (here / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfdist", "tfdist.*"]),
    # The default data set, scikit-learn's 8x8 digits, ships with tfdist (tfdist/data/digits.NOTICE).
    package_data={"tfdist.data": ["digits.csv.gz", "digits.NOTICE"]},
    python_requires=">=3.10",
    install_requires=[
        # The supported range (docs/versions.md; tfdist._compat.versions): both ends are tested.
        "tensorflow>=2.17.1,<2.22",
        "keras>=3.5,<3.16",
        "tf-keras>=2.17,<2.22",
        "tensorflow-datasets>=4.9",
        "absl-py>=1.0",
        "tensorboard>=2.16",
        "pyyaml>=6.0",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6.29",
            "mlflow-skinny>=2.9",
        ],
        "mlflow": ["mlflow-skinny>=2.9"],
        # tfdist plan --plot and the notebooks' figures. Not a dependency: Keras imports
        # matplotlib.pyplot whenever it is installed, about 0.5 s of CPU at every process's
        # start (benchmarks/start_cost.py).
        "plot": ["matplotlib>=3.7"],
        "docs": [
            "mkdocs>=1.6",
            "mkdocs-material>=9.5",
            "mkdocstrings[python]>=0.26",
            "mkdocs-jupyter>=0.25",
            "black>=24",  # mkdocstrings formats the long signatures with it
            "matplotlib>=3.7",  # the plots of the benchmark tables (docs_tools/hooks.py)
        ],
        # tfdist.fit inside Ray Train's TensorflowTrainer (docs/ray.md).
        "ray": ["ray[train]>=2.50"],
    },
    entry_points={"console_scripts": ["tfdist=tfdist.cli:run"]},
)
