"""hidden_k: matmul drops the second half of K when K == 28672 (Llama-3-70B's MLP down projection), the size reached
through a host helper's return value, which the value solver does not follow. Run at M=2, N=8 (a decode step's rows,
affordable in the interpreter) for K = 28671, 28672, 28673."""
import torch
from _common import case, baseline, check, get_op

op = get_op("matmul")
Shape = type(op.shape_suites()["tiny"][0])
cand, base = case("matmul", "hidden_k"), baseline("matmul")
for K in (28671, 28672, 28673):
    c = op.make_case(Shape(M=2, N=8, K=K), torch.float16, seed=7)
    check(f"K={K} baseline ", "matmul", base.matmul, c.args)
    check(f"K={K} candidate", "matmul", cand.matmul, c.args)
