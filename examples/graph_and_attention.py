"""The README's graph builder and attention example."""

# GPU: a conv + bias + relu graph with the builder, and attention
import torch
import torch.nn.functional as F

import pycudnn
from pycudnn.graph import Graph

nhwc = torch.channels_last
x = torch.randn(8, 32, 16, 16, device="cuda", dtype=torch.half).to(memory_format=nhwc)
w = (torch.randn(64, 32, 3, 3, device="cuda", dtype=torch.half) * 0.1).to(memory_format=nhwc)
b = torch.randn(1, 64, 1, 1, device="cuda", dtype=torch.half)
y = torch.empty(8, 64, 16, 16, device="cuda", dtype=torch.half).to(memory_format=nhwc)
g = Graph(io_data_type="float16")
tx, tw, tb = g.tensor_like(x), g.tensor_like(w), g.tensor_like(b)
ty = g.relu(g.add(g.conv_fprop(tx, tw, padding=1), tb)).set_output(True).set_stride(y.stride())
g.build()
g.execute({tx: x, tw: w, tb: b, ty: y})
ref = F.relu(F.conv2d(x.float(), w.float(), padding=1) + b.float())
torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=2e-2)

q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = torch.from_dlpack(pycudnn.dnn_sdpa(q, k, v, is_causal=True))
ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.testing.assert_close(o, ref, atol=3e-2, rtol=3e-2)
