"""What compiled decoding needs of the machine running the tests."""

import shutil

import pytest

# without a C++ compiler decoding falls back to eager
needs_compiler = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                    reason="no C++ compiler for torch.compile: compiled decoding falls back to eager")
