"""Builds the Python module quintet_data for `pip install .` (pyproject.toml).

CMake configures Quintet without tests and examples, for the Python that runs pip, and builds
the module's target (quintet_python) and the library. The wheel holds quintet_data.*.so and the
libquintet.so it links, found beside it through the module's $ORIGIN run path. The C++ toolchain,
MPI and (if wanted) CUDA are those of the machine, as for any Quintet build. CMAKE_ARGS adds
configure arguments (e.g. CMAKE_ARGS=-DQUINTET_WITH_CUDA=OFF); CMAKE_BUILD_PARALLEL_LEVEL sets
the build's jobs (all cores by default).
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        out_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        os.makedirs(build_dir, exist_ok=True)
        os.makedirs(out_dir, exist_ok=True)
        subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                        "-DQUINTET_BUILD_TESTS=OFF", "-DQUINTET_BUILD_EXAMPLES=OFF",
                        "-DQUINTET_BUILD_PYTHON=ON", f"-DPython3_EXECUTABLE={sys.executable}"]
                       + shlex.split(os.environ.get("CMAKE_ARGS", "")), check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", build_dir, "--target", "quintet_python", "-j", jobs],
                       check=True)
        modules = glob.glob(os.path.join(build_dir, "python", "quintet_data*.so"))
        libraries = glob.glob(os.path.join(build_dir, "libquintet.so*"))
        if len(modules) != 1 or not libraries:
            raise RuntimeError(f"quintet build: expected the module and libquintet.so in "
                               f"{build_dir}, found {modules + libraries}")
        shutil.copyfile(modules[0], self.get_ext_fullpath(ext.name))
        for lib in libraries:  # the versioned file and its soname, as real files
            shutil.copyfile(lib, os.path.join(out_dir, os.path.basename(lib)))


setup(packages=[], py_modules=[],  # no Python packages: the repository is not one
      ext_modules=[Extension("quintet_data", sources=[])], cmdclass={"build_ext": CMakeBuild})
