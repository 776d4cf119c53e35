"""The docs home page's scripting quick start on a GPU: dnn_conv, an activation, pooling."""

# GPU: runs as written (tests/tooling/test_docs_examples.py)
import numpy as np

import pycudnn

rng = np.random.default_rng(0)
x = pycudnn.to_device(rng.standard_normal((8, 3, 32, 32), dtype=np.float32))
w = pycudnn.to_device(rng.standard_normal((16, 3, 3, 3), dtype=np.float32))
y = pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross")  # as torch's conv2d
y = pycudnn.dnn_activation(y, "relu", out=y)  # in place
p = pycudnn.dnn_pool(y, (2, 2), stride=(2, 2))  # Theano's stride default is 1
print(p.shape, float(p.get().max()))  # (8, 16, 16, 16) ...
