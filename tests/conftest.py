"""Test setup: Triton kernels run in the interpreter on the CPU (set before triton is imported)."""
import os
import sys
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))  # tests/openai_stub.py, tests/mutants.py
warnings.filterwarnings("ignore", message="divide by zero encountered", category=RuntimeWarning)
warnings.filterwarnings("ignore", message="invalid value encountered", category=RuntimeWarning)
